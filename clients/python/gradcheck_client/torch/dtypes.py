"""The user's dtype in the torch door (issue 42, item 3): beside the float64 check, the function run as the user
runs it -- float32, bfloat16, float16 inputs and parameters as given -- against float64.

Two parts, both against float64 references, each an entry of report.data["dtypes"] (gradcheck_core.dtypes
with_dtypes: the report's first line says what ran in which dtype):

1. torch's gradient in the user's dtype: the function run with its inputs and the module's parameters in
   their own dtypes (a float64 input given to a float32 module in the module's: _own), torch's backward
   from the output on in that dtype (hooks and custom Functions as
   registered), against torch's float64 gradient at the same values (the one the float64 check verified).
   Each checked tensor's worst element must lie within sqrt(eps_d) max|g64| (norm-wise: float32 3.5e-4,
   bfloat16 0.088, float16 0.031 of the tensor's largest gradient); a NaN or Inf fails (a float32-only
   overflow in a backward).
2. The function's values in that dtype (gradcheck_core.dtypes.values_in_dtype): the float64 check does
   not speak for a function whose float32 values do not resolve its derivative (undecided, never pass) --
   unless torch's Jacobian check of those values (the drop-in's) passed at a tolerance below every gradient
   (_separated), which a function whose values lose a dependence fails.

The module is the user's own (modules.in_float64 for the float64 runs); its data, dtypes and .grad are put
back after each run.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from gradcheck_core.check_call import _argument_names
from gradcheck_core.dtypes import EPS, values_in_dtype, with_dtypes
from . import modules, values

MAX_ROWS = 1024  # output elements _separated differentiates one by one (torch's slow mode did as many)


def in_user_dtype(fn, inputs: tuple, picks, report, seed: int, torch_passed: tuple | None = None):
    """The report with the dtype entries added (unchanged when everything checked is float64). torch_passed:
    (atol, rtol) where torch's Jacobian check (slow mode) passed on the inputs as given (the drop-in), which
    decides an undecided values entry where those tolerances separate each gradient from zero (_separated)."""
    narrow = sorted({str(t.dtype).replace("torch.", "") for t in _checked_tensors(fn, inputs, picks)} - {"float64"})
    if not narrow:
        return report
    dtype = max(narrow, key=lambda d: EPS[d])  # the coarsest one sets the tolerance
    try:
        wide = _evaluate(fn, inputs, picks, {}, wide=True, seed=seed)
        own = _evaluate(fn, inputs, picks, {}, wide=False, seed=seed)
    except RuntimeError as exc:  # the function as given fails in torch itself (mixed dtypes): say so, undecided
        with_dtypes(report, [{"dtype": dtype, "verdict": "undecided", "detail": "not checked: running it as given "
                              f"raised: {(str(exc).strip().splitlines() or [''])[0][:300]}"}],
                    f"the check below ran in float64; the function as given, in {', '.join(narrow)}, did not run")
        return report
    rng = np.random.default_rng([seed, 7])
    v = {n: torch.from_numpy(rng.standard_normal(tuple(g.shape))) for n, g in wide[2].items()}
    size = max([1.0] + [float(t.detach().abs().max()) for t in _checked_tensors(fn, inputs, picks) if t.numel()])
    h = float(np.cbrt(EPS[dtype]) * size)

    def loss(t: float, is_narrow: bool):
        return _evaluate(fn, inputs, picks, {n: t * d for n, d in v.items()}, wide=not is_narrow, seed=seed,
                         backward=False)[:2]
    upcast = report.data.get("check", {}).get("upcast", [])
    ran = (f"the check below ran in float64 (upcast: {', '.join(upcast) or 'none'}); torch's gradient and the "
           f"function's values were also run in {', '.join(narrow)}, as given, against float64")
    entry = values_in_dtype(loss, dtype, h)
    if entry["verdict"] == "undecided" and torch_passed and _separated(fn, inputs, picks, *torch_passed):
        entry = {"dtype": dtype, "verdict": "pass", "detail": (
            f"torch's Jacobian check of your {dtype} values passed at atol={torch_passed[0]:g}, "
            f"rtol={torch_passed[1]:g}, which separate every nonzero element of the float64 Jacobian from zero; "
            f"alone, {entry['detail'].replace('its values do not', 'they do not')}")}
    with_dtypes(report, [_gradient_entry(own[2], wide[2], dtype), entry], ran)
    return report


def _separated(fn, inputs, picks, atol: float, rtol: float) -> bool:
    """Whether torch's Jacobian check passing at atol, rtol resolves the function's values in the user's dtype:
    it compared torch's gradient with finite differences of those values, element by element within
    atol + rtol |J|; where that tolerance is below |J| for every nonzero element J of the (float64) Jacobian,
    a dtype whose values lose a dependence (differences 0 where J is not) fails it. Where it is not (atol at
    least a gradient: `sum((x + 1e8) - 1e8)` in float32 at atol=2), torch's pass says nothing: False. False too
    for a module's parameters, which torch's check does not see, and past MAX_ROWS output elements."""
    if isinstance(fn, torch.nn.Module) and any(p.requires_grad and p.is_floating_point() for p in fn.parameters()):
        return False
    args = [a.detach().double().requires_grad_(True) if i in picks and isinstance(a, torch.Tensor)
            and a.is_floating_point() else a for i, a in enumerate(inputs)]
    leaves = [a for i, a in enumerate(args) if i in picks and isinstance(a, torch.Tensor) and a.requires_grad]
    with _module_at(fn, {}, wide=True), torch.enable_grad():
        try:
            outs = [o.reshape(-1) for o in values.output_tensors(fn(*args))
                    if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad]
        except RuntimeError:  # a function that does not run in float64 as called here: nothing resolved
            return False
        if not leaves or sum(o.numel() for o in outs) > MAX_ROWS:
            return False
        for o in outs:
            for k in range(o.numel()):  # a row of the Jacobian: output element k against every checked input
                for g in torch.autograd.grad(o[k], leaves, retain_graph=True, allow_unused=True):
                    if g is not None and bool(((1 - rtol) * g.abs() <= atol)[g != 0].any()):
                        return False
    return True


def _checked_tensors(fn, inputs, picks) -> list:
    params = [p for p in fn.parameters() if p.requires_grad] if isinstance(fn, torch.nn.Module) else []
    return [a for i, a in enumerate(inputs) if i in picks and isinstance(a, torch.Tensor)
            and a.is_floating_point()] + [p for p in params if p.is_floating_point()]


def _gradient_entry(own: dict, wide: dict, dtype: str) -> dict:
    tol = float(np.sqrt(EPS[dtype]))
    worst = None
    for name, g in own.items():
        ref = wide[name]
        err = (g - ref).abs()
        bad = float(err.max()) if torch.isfinite(g).all() else float("inf")
        ratio = bad / max(float(ref.abs().max()), 1e-300)
        if worst is None or ratio > worst[0]:
            k = int(torch.nan_to_num(err, nan=float("inf")).reshape(-1).argmax()) if g.numel() else 0
            worst = (ratio, name, k, g.reshape(-1)[k:k + 1], ref.reshape(-1)[k:k + 1])
    if worst is None:
        return {"dtype": dtype, "verdict": "pass", "detail": "no gradient to compare"}
    ratio, name, k, got, ref = worst
    where = (f"torch's {dtype} gradient of {name} (worst element {k}: {float(got[0]):.6g} vs float64's "
             f"{float(ref[0]):.6g}; error {ratio:.2g} of its largest gradient, tolerance sqrt(eps) = {tol:.2g})")
    verdict = "pass" if ratio <= tol else "fail"
    return {"dtype": dtype, "verdict": verdict,
            "detail": ("agrees with float64: " if verdict == "pass" else "disagrees with float64: ") + where}


def _evaluate(fn, inputs, picks, shift: dict, wide: bool, seed: int, backward: bool = True):
    """(the reduced loss, its sum of |terms|, {name: torch's gradient in float64}) of fn at its inputs and
    parameters moved by shift (rounded to their own dtype first), run in float64 (wide) or as given."""
    names = _argument_names(fn.forward if isinstance(fn, torch.nn.Module) else fn, len(inputs))
    leaves, args = {}, []
    for i, a in enumerate(inputs):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = _moved(a.detach(), shift.get(names[i])).to(torch.float64 if wide else _own(fn, a)).clone()
            if i in picks:
                leaves[names[i]] = a.requires_grad_(backward)
        args.append(a)
    with _module_at(fn, shift, wide) as params:
        leaves.update(params)
        with torch.set_grad_enabled(backward or torch.is_grad_enabled()):
            out = fn(*args)
        outs = [o for o in values.output_tensors(out)
                if isinstance(o, torch.Tensor) and o.is_floating_point()]
        rng = np.random.default_rng(seed)
        terms = [o.double() * torch.from_numpy(rng.standard_normal(tuple(o.shape))).to(o.device) for o in outs]
        loss = sum(t.sum() for t in terms)
        grads = {}
        if backward and isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
            grads = {n: (t.grad if t.grad is not None else torch.zeros_like(t)).detach().double().cpu().clone()
                     for n, t in leaves.items()}
        return float(loss.detach()), float(sum(t.detach().abs().sum() for t in terms)), grads


def _own(fn, a: torch.Tensor):
    """The dtype an input runs in as given: its own, or a narrower module's (a float64 input given to a float32
    module, as one does for torch's gradcheck, runs in the module's dtype)."""
    dtypes = {p.dtype for p in fn.parameters() if p.is_floating_point()} if isinstance(fn, torch.nn.Module) else set()
    if a.dtype == torch.float64 and len(dtypes) == 1 and torch.float64 not in dtypes:
        return dtypes.pop()
    return a.dtype


def _moved(t: torch.Tensor, step):
    return t if step is None else (t.double() + step.to(t.device)).to(t.dtype)


@contextlib.contextmanager
def _module_at(fn, shift: dict, wide: bool):
    """The module's parameters moved by shift (in their own dtype), in float64 when wide; {name: parameter}.
    Everything is put back afterwards (its data and .grad)."""
    if not isinstance(fn, torch.nn.Module):
        yield {}
        return
    own = {n: (p, p.data, p.grad) for n, p in fn.named_parameters()}
    try:
        with torch.no_grad():
            for n, (p, data, _) in own.items():
                p.grad = None
                if data.is_floating_point():
                    p.data = _moved(data, shift.get(n)).clone()
        with modules.in_float64(fn) if wide else contextlib.nullcontext():
            yield {n: p for n, (p, _, _) in own.items() if p.requires_grad and p.is_floating_point()}
    finally:
        for p, data, grad in own.values():
            p.data = data
            p.grad = grad
