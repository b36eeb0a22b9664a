"""torch.autograd.gradcheck and gradgradcheck, drop-in: torch's signature, and torch's outcome or a stricter one.

    from gradcheck_client.torch import gradcheck, gradgradcheck   # instead of torch.autograd's

torch 2.13's documented semantics are the spec (torch/autograd/gradcheck.py). A call does what torch's does,
in torch's order, and adds gradcheck's own check of the gradients:

1. torch's preconditions, by torch's own code: both AD modes off, check_batched_grad without backward AD,
   check_batched_forward_grad without forward AD (AssertionError); no input requiring grad (ValueError); an
   input with a stride-0 dimension (RuntimeError); a sparse or MKLDNN output (ValueError).
2. fn runs once on the inputs, as torch runs it: an error fn raises propagates, whatever raise_exception says.
3. torch's own checks, by torch's own functions, with the caller's options: the Jacobian against torch's
   finite differences (fast_mode, eps, atol, rtol, masked, complex inputs and outputs in torch's Wirtinger
   convention, outputs whose shape or dtype changes when perturbed), the reentrancy check (nondet_tol),
   check_grad_dtypes, check_forward_ad, check_batched_forward_grad, check_batched_grad, the "backward
   multiplied by grad_output" check and check_undefined_grad. They are the torch-defined behaviours gradcheck's
   references do not decide (machinery of torch's, not derivatives), and running them keeps the outcome
   never laxer than torch's.
4. gradcheck's check (check.py) of torch's backward w.r.t. the inputs that require grad: the exact references
   (symbolic, float64 finite differences), each custom autograd.Function checked on its own and named
   (class, file and line of its backward, the input), torch.library ops as opaque nodes. Not run where it
   has nothing to add: check_backward_ad=False, complex or sparse tensors, a complex intermediate the capture
   refuses (then torch's check alone decides and a warning says so, naming the op), no differentiable output (torch's check that the numerical Jacobian is zero).
   Its screen of the function's values (values.py) is skipped where torch's Jacobian check of step 3 has
   compared the function's values with torch's gradient of every tensor it checks, in float64, and passed:
   the screen would repeat that comparison (a plain function or Function; a module's parameters, which torch
   does not check, are screened); after torch's failure it runs, to name the line where the graph was cut.
   A declared surrogate (surrogate.py) found here waives torch's Jacobian comparison -- the declaration says
   the backward is not the derivative -- and nothing else: where step 3 failed, torch's checks run again
   without it; a warning names it.

A gradient failure of either raises GradcheckError, a subclass of torch.autograd.gradcheck.GradcheckError (so
`pytest.raises(torch.autograd.gradcheck.GradcheckError)` holds), whose first line names the culprit (the
Function, op or torch check) and whose message is gradcheck's report (torch's message after it); with
raise_exception=False that is False, as torch's. A function gradcheck cannot capture is a GradcheckError
"not checked: ..." (never a pass). Any other exception torch's checks raise propagates, as in torch.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import warnings

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _dispatch_modes

from gradcheck_core.errors import GradientsNotVerified
from gradcheck_core.report import Report
from gradcheck_core.trace_errors import TracerError
from .capture import Capture, ComplexIntermediate
from .check import _function_applied, check
from .culprits import culprit

tg = importlib.import_module("torch.autograd.gradcheck")  # the module (torch.autograd.gradcheck is the function)

# what each torch check's failure message holds -> the check's name, for the first line of ours (first match)
_TORCH_CHECKS = (
    ("Jacobian mismatch", "Jacobian check"),
    ("Jacobian computed with forward mode", "check_forward_ad"),
    ("Backward is not reentrant", "reentrancy check (nondet_tol)"),
    ("Gradient has dtype mismatch", "check_grad_dtypes"),
    ("Forward AD gradient has dtype", "check_grad_dtypes"),
    ("grad is incorrect", "gradient layout, dtype, device and size check"),
    ("Analytical gradient has incorrect size", "gradient size check"),
    ("backward not multiplied by grad_output", "backward multiplied by grad_output check"),
    ("Expected backward function to handle undefined output grads", "check_undefined_grad"),
    ("Expected all input grads to be undefined or zero", "check_undefined_grad"),
    ("Expected forward AD to handle undefined", "check_undefined_grad"),
    ("batched gradient computation with forward-mode AD", "check_batched_forward_grad"),
    ("batched gradient computation", "check_batched_grad"),
    ("Numerical gradient for function expected to be zero", "non-differentiable outputs check"),
)


class GradcheckError(GradientsNotVerified, tg.GradcheckError):
    """The gradients did not verify (or could not be checked): the message is the localized report.
    A torch.autograd.gradcheck.GradcheckError, hence a RuntimeError, as torch's; and the house's
    gradcheck_core.errors.GradientsNotVerified (exit 1) -- not invalid input."""


def gradcheck(func, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, nondet_tol: float = 0.0, check_undefined_grad: bool = True,
              check_grad_dtypes: bool = False, check_batched_grad: bool = False,
              check_batched_forward_grad: bool = False, check_forward_ad: bool = False,
              check_backward_ad: bool = True, fast_mode: bool = False, masked: bool | None = None,
              server=None) -> bool:
    """torch.autograd.gradcheck's signature and semantics (the module docstring): True, or raises
    GradcheckError (False with raise_exception=False). `server`: verify gradcheck's part on a server."""
    options = {k: v for k, v in locals().items() if k not in ("func", "inputs", "raise_exception", "server")}
    _preconditions(options)
    try:
        return _helper(func, inputs, options, server)
    except tg.GradcheckError as exc:
        if raise_exception:
            raise (exc if isinstance(exc, GradcheckError) else GradcheckError(str(exc))) from None
        return False


def _preconditions(o: dict) -> None:
    """torch's own assertions on the options, with its messages."""
    if not (o["check_forward_ad"] or o["check_backward_ad"]):
        raise AssertionError("Expected at least one of check_forward_ad or check_backward_ad to be True")
    if o["check_batched_grad"] and not o["check_backward_ad"]:
        raise AssertionError("Setting check_batched_grad=True requires check_backward_ad to be True")
    if o["check_batched_forward_grad"] and not o["check_forward_ad"]:
        raise AssertionError("Setting check_batched_forward_grad=True requires check_forward_ad to be True")


def _helper(fn, inputs, o: dict, server) -> bool:
    """Steps 1-4 of the module docstring; a gradient failure is a GradcheckError. torch's checks run first: where
    they compared torch's gradient with the function's values already (_values_compared), ours skips its own
    screen of the values (values.py) unless they failed, when it names where torch's graph was cut."""
    tupled = tg._as_tuple(inputs)
    tg._check_inputs(tupled)
    func_out = fn(*tupled)  # fn's own errors propagate, as torch's
    outputs = tg._differentiable_outputs(func_out)
    tg._check_outputs(outputs)
    alone = _torch_alone(tupled, func_out, outputs, o)
    if alone:
        _torch_only(alone)
    failed = _torch_failure(fn, tupled, func_out, outputs, o, jacobian=True)
    ours = None
    if alone is None:
        try:
            ours = _ours(fn, tupled, o, server, failed is None, _values_compared(fn, tupled, o))
        except ComplexIntermediate as exc:  # as a complex input or output: torch's checks decide alone
            _torch_only(str(exc))
    declared = [e for e in (ours.data.get("opaque", []) if isinstance(ours, Report) else [])
                if e["verdict"] == "surrogate"]
    for e in declared:
        warnings.warn(f"gradcheck_client.torch.gradcheck: {e['op']} ({e['source']}): {e['detail']}; torch's "
                      "Jacobian comparison waived for it, its other checks kept", stacklevel=3)
    if declared and failed is not None:  # torch's checks again, all but the Jacobian comparison
        # on a fresh output: our check ran the function again (a module with float64 copies of its data swapped
        # in and back), and torch's checks must not differentiate one whose saved tensors that swap touched
        func_out = fn(*tupled)
        failed = _torch_failure(fn, tupled, func_out, tg._differentiable_outputs(func_out), o, jacobian=False)
    return _verdict(fn, ours, failed)


def _torch_only(why: str) -> None:
    """The warning that gradcheck's own check was not run, torch's checks deciding alone (why: what it lacks)."""
    warnings.warn(f"gradcheck_client.torch.gradcheck: {why}: checked by torch's own gradcheck only (not "
                  "gradcheck's references)", stacklevel=4)


def _torch_failure(fn, tupled, func_out, outputs, o: dict, jacobian: bool):
    """torch's checks (_torch_checks): their GradcheckError, or None; any other exception propagates, as from
    torch's gradcheck."""
    try:
        _torch_checks(fn, tupled, func_out, outputs, o, jacobian=jacobian)
    except tg.GradcheckError as exc:
        return exc
    return None


def _values_compared(fn, tupled, o: dict) -> bool:
    """Whether torch's Jacobian check compares torch's gradient with the function's values (its numerical
    Jacobian) for every tensor ours checks, as precisely as our values screen: backward AD on, no module
    parameter (ours checks those too, torch does not), every input checked in float64 (a narrower dtype's
    differences are coarser than the screen's float64 ones)."""
    if not o["check_backward_ad"] or (isinstance(fn, torch.nn.Module)
                                      and any(p.requires_grad for p in fn.parameters())):
        return False
    return all(t.dtype == torch.float64 for t in tupled if isinstance(t, torch.Tensor) and t.requires_grad)


def _torch_alone(tupled, func_out, outputs, o: dict):
    """Why gradcheck's own check is not run ("" where nothing needs saying), or None where it is."""
    if not o["check_backward_ad"]:
        return ""  # forward AD only: torch's numerical Jacobian against torch's forward mode
    if not outputs:
        return ""  # no differentiable output: torch checks that the numerical Jacobian is zero
    for kind, tensors in (("input", tupled), ("output", tg._as_tuple(func_out))):
        for k, t in enumerate(tensors):
            if isinstance(t, torch.Tensor) and (kind == "output" or t.requires_grad):
                if t.is_complex():
                    return f"complex {kind} {k} (torch's Wirtinger convention)"
                if t.layout != torch.strided:
                    return f"{kind} {k} of layout {t.layout} (masked={o['masked']})"
    return None


def _ours(fn, tupled, o: dict, server, torch_passed: bool, values_compared: bool):
    """gradcheck's check of torch's backward (_checks). Where torch's checks passed (a pass is then likely), first
    without the report's memory profile (an inference forward and a checkpointed what-if of the engine's, which
    decide nothing the drop-in reads of a passing report: only a failure's message prints them); anything but a
    pass is checked again as before, profile included, so that a failure's outcome and message are those of the
    one full check. Where torch's failed, the full check at once (a failure would pay twice)."""
    if torch_passed:
        ours = _checks(fn, tupled, o, server, torch_passed, values_compared, memory_profile=False)
        if isinstance(ours, Report) and ours.passed:
            return ours
    return _checks(fn, tupled, o, server, torch_passed, values_compared)


def _checks(fn, tupled, o: dict, server, torch_passed: bool, values_compared: bool, **options):
    """gradcheck's check of torch's backward: the Report, or the reason it could not be checked (str).
    Its screen of the function's values (check.py, values.py) runs only where it can add to torch's Jacobian
    check: where that check did not compare the values of every tensor ours checks (not values_compared), or
    where it failed and ours, without the screen, does not fail -- the screen then names the line where torch's
    graph was cut. A first, lighter check has no symbolic oracle either: float64 finite differences (complex
    steps: exact to rounding on analytic ops) decide the graph; of it only a clean pass
    (_finite_differences_decided) where torch passed, or a failure where torch failed, is kept. Anything else is
    the full check, so the outcome is what it was without the lighter one."""
    if values_compared or torch_passed:
        first = _our_check(fn, tupled, o, server, torch_passed, screen=not values_compared, symbolic=False,
                           **options)
        if isinstance(first, Report) and (first.verdict == "fail" if not torch_passed else
                                          first.passed and _finite_differences_decided(first)):
            return first
    return _our_check(fn, tupled, o, server, torch_passed, screen=True, **options)


def _finite_differences_decided(report: Report) -> bool:
    """Whether a check without the symbolic oracle was decided by finite differences alone: every parameter row
    passed and none rests on an unrefined, undecidable or unconfirmed difference, and no finding was raised."""
    rows = report.data.get("parameters", [])
    return not report.findings and all(p.get("status", "ok") == "ok" for p in rows)


def _our_check(fn, tupled, o: dict, server, torch_passed: bool, screen: bool, **options):
    """check() of torch's backward w.r.t. the inputs that require grad: the Report, or the reason it could not be
    checked (str). screen: with check's screen of the function's values (check.py)."""
    wrt = [k for k, a in enumerate(tupled) if isinstance(a, torch.Tensor) and a.requires_grad]
    # torch's tolerances apply to torch's finite differences; ours (per dtype, from rounding analysis) stay
    # unless the caller chose others
    tolerances = {k: o[k] for k, default in (("atol", 1e-5), ("rtol", 1e-3)) if o[k] != default}
    # torch's Jacobian check (slow mode: element by element) passed on the inputs as given: it may decide the
    # function's values in a narrow dtype (dtypes.py _separated)
    passed = (o["atol"], o["rtol"]) if torch_passed and not o["fast_mode"] else None
    try:
        return check(fn, *tupled, wrt=wrt, server=server, values_screen=screen, torch_passed=passed, **tolerances,
                     **options)
    except ComplexIntermediate:
        raise  # torch's checks alone decide (_helper)
    except TracerError as exc:
        return str(exc)
    except Exception as exc:  # a graph the verification refuses (in process, or the server's answer)
        if server is None:
            from gradcheck_svc.errors import GradcheckError as Refused
        else:
            from gradcheck_core.client import VerifyError as Refused
        if not isinstance(exc, Refused):
            raise
        return f"{type(exc).__name__}: {exc}"


def _torch_checks(fn, tupled, func_out, outputs, o: dict, jacobian: bool) -> None:
    """torch's _gradcheck_helper after fn's first run, step for step, by torch's own functions; jacobian=False
    (a declared surrogate) keeps all but the comparison with torch's finite differences."""
    gradcheck_fn = functools.partial(tg._fast_gradcheck if o["fast_mode"] else tg._slow_gradcheck,
                                     masked=o["masked"])
    common = (o["eps"], o["rtol"], o["atol"], o["check_grad_dtypes"])
    modes = {"check_forward_ad": o["check_forward_ad"], "check_backward_ad": o["check_backward_ad"],
             "nondet_tol": o["nondet_tol"], "check_undefined_grad": o["check_undefined_grad"]}
    if jacobian:
        tg._gradcheck_real_imag(gradcheck_fn, fn, func_out, tupled, outputs, *common, **modes)
    else:
        if o["check_backward_ad"]:  # reentrancy, dtypes and sizes: torch's checks beside the comparison
            for out in outputs:
                tg._check_analytical_jacobian_attributes(tupled, out, o["nondet_tol"], o["check_grad_dtypes"])
        if o["check_forward_ad"]:
            tg._gradcheck_real_imag(gradcheck_fn, fn, func_out, tupled, outputs, *common,
                                    **{**modes, "check_backward_ad": False})
    if o["check_batched_forward_grad"]:
        tg._test_batched_grad_forward_ad(fn, tupled)
    if not o["check_backward_ad"]:
        return
    if o["check_batched_grad"]:
        for k, out in enumerate(outputs):
            tg._test_batched_grad(tupled, out, k)
    tg._test_backward_mul_by_grad_output(outputs, tupled, o["masked"])
    if o["check_undefined_grad"]:
        tg._test_undefined_backward_mode(fn, outputs, tupled)


def _verdict(fn, ours, failed) -> bool:
    """True, or the GradcheckError: gradcheck's report first (its culprit line first), torch's message after."""
    also = f"\ntorch's gradcheck: {failed}" if failed is not None else ""
    if isinstance(ours, str):
        raise GradcheckError(f"{_named(fn)}not checked: {ours}{also}")
    if isinstance(ours, Report) and not ours.passed:
        lines = str(ours).splitlines()
        head = culprit(ours)
        rest = [line for line in lines if line.strip() != head]
        raise GradcheckError("\n".join([_unless_named(fn, head) + head] + rest)
                             + also)
    if failed is not None:
        message = str(failed).strip()
        name = next((n for text, n in _TORCH_CHECKS if text in message), "check")
        raise GradcheckError(f"{_named(fn)}torch's gradcheck {name} failed"
                             f"{' (gradcheck: ' + ours.verdict.upper() + ')' if ours is not None else ''}: "
                             f"{message}")
    return True


def _unless_named(fn, head: str) -> str:
    """_named(fn), where the culprit's line does not name it already (`custom autograd.Function MyFn (...)`)."""
    name = _named(fn)
    plain = name.removesuffix(": ").removeprefix("custom op ").removeprefix("torch op ").split(" (")[0]
    plain = plain.removesuffix(".apply")
    direct = not name.startswith("the gradient of ")
    return "" if direct and plain and (f" {plain} (" in head or f" {plain}: " in head) else name


def _named(fn) -> str:
    """'MyFn.apply (file.py:LINE): ' for an autograd.Function's apply, 'custom op mylib::f: ' for a
    torch.library op, '' otherwise (the report names what fn calls)."""
    if hasattr(fn, "gradient_of"):
        inner = _named(fn.gradient_of)
        return f"the gradient of {inner[:-2]}: " if inner else ""
    cls = getattr(fn, "__self__", None)
    if isinstance(cls, type) and issubclass(cls, torch.autograd.Function):
        from .opaque import backward_line
        return f"{cls.__name__}.apply ({backward_line(cls)}): "
    op = getattr(fn, "_qualname", None) or (fn.name() if isinstance(fn, torch._ops.OpOverload) else None)
    if isinstance(fn, torch._ops.OpOverloadPacket):
        op = fn._qualified_op_name
    if not op:
        return ""
    return f"{'torch' if op.startswith('aten::') else 'custom'} op {op}: "


def gradgradcheck(func, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True, nondet_tol: float = 0.0,
                  check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
                  check_batched_grad: bool = False, check_fwd_over_rev: bool = False,
                  check_rev_over_rev: bool = True, fast_mode: bool = False, masked: bool = False,
                  server=None) -> bool:
    """torch.autograd.gradgradcheck's signature and semantics: gradcheck (above) of the function torch builds,
    (inputs, grad_outputs) -> the gradients of fn's differentiable outputs at grad_outputs, with
    create_graph=True -- so the double backward checked is the user's, and a failing Function in it is named
    as in gradcheck."""
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError("Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True")
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_undefined_grad=True requires check_rev_over_rev to be True")
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_batched_grad=True requires check_rev_over_rev to be True")
    fn, tupled = func, tg._as_tuple(inputs)
    if grad_outputs is None:  # random, as torch's: the outputs' shape, dtype and device, in [-1, 1]
        grad_outputs = tuple(torch.testing.make_tensor(
            x.shape, dtype=x.dtype if x.is_floating_point() or x.is_complex() else torch.double, device=x.device,
            low=-1, high=1, requires_grad=True, noncontiguous=gen_non_contig_grad_outputs)
            for x in tg._differentiable_outputs(fn(*tupled)))
    cotangents = tg._as_tuple(grad_outputs)
    return gradcheck(_gradient_of(fn, tupled, cotangents), tupled + cotangents, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol,
                     check_undefined_grad=check_undefined_grad, check_grad_dtypes=check_grad_dtypes,
                     check_batched_grad=check_batched_grad, fast_mode=fast_mode, check_forward_ad=check_fwd_over_rev,
                     check_backward_ad=check_rev_over_rev, masked=masked, server=server)


def _capturing() -> bool:
    """Whether our capture (capture.Capture, a dispatch mode) is running."""
    return any(isinstance(m, Capture) for m in _dispatch_modes())


def _packed(t):
    return t, t._version


def _unpacked(packed):
    """The saved tensor itself, as long as it was not written in place since it was saved: the hooks would
    otherwise skip autograd's own version check, and a backward reading a value modified since the forward
    must raise as torch's gradgradcheck raises (not be checked on the modified value)."""
    t, version = packed
    if t._version != version:
        raise RuntimeError("one of the variables needed for gradient computation has been modified by an inplace "
                           f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                           f"{version} instead")
    return t


def _gradient_of(fn, tupled: tuple, cotangents: tuple):
    """torch's gradgradcheck new_func: (*inputs, *grad_outputs) -> fn's input gradients at grad_outputs, with
    create_graph=True, requires_grad restored as the caller set it (gradcheck detaches for forward AD)."""
    n, user, fn = len(cotangents), fn, _function_applied(fn)  # (MyFn.apply recorded and named: check.py)
    wanted = {k for k, x in enumerate(tupled) if tg.is_tensor_like(x) and x.requires_grad}
    wanted_out = {k for k, x in enumerate(cotangents) if x.requires_grad}

    def gradient(*args):
        xs = tuple(x.requires_grad_() if k in wanted else x for k, x in enumerate(args[:-n]))
        # while our capture runs, saved tensors unpacked as themselves: an op that saves its output (tanh) hands
        # the backward that very tensor, which the capture knows, not a copy it would take for a constant
        # (check.py); autograd's version check kept (_unpacked). Not while torch's checks run: as torch's
        # new_func, so torch.func transforms (which refuse saved-tensor hooks) work in fn as in torch's
        with torch.autograd.graph.saved_tensors_hooks(_packed, _unpacked) if _capturing() else contextlib.nullcontext():
            outs = tg._differentiable_outputs(fn(*xs))
            gs = tuple(x.requires_grad_() if k in wanted_out else x for k, x in enumerate(args[-n:]))
            grads = torch.autograd.grad(outs, tuple(x for k, x in enumerate(xs) if k in wanted), gs,
                                        create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)
    name = getattr(fn, "__name__", type(fn).__name__)
    gradient.__name__ = gradient.__qualname__ = f"gradient_of_{name}".replace(".", "_")
    gradient.gradient_of = user  # (named by what it differentiates: _named)
    return gradient


__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]
