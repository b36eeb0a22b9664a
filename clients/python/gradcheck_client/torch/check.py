"""Check the gradients PyTorch computes for a function or module, in one call (torch is an optional extra):

    import torch
    from gradcheck_client.torch import check, gradcheck
    report = check(my_fn, torch.randn(4, 5))      # torch's own autograd, custom Functions and hooks included
    assert gradcheck(my_fn, (torch.randn(4, 5),))  # torch.autograd.gradcheck's signature: True, or raises

torch runs the function in float64 on the tensors' own device (inputs and a module's parameters
converted; CUDA when they are there) and its autograd computes the gradients -- custom autograd.Function backwards, tensor hooks and all. The forward is
captured op by op as a gradcheck graph (capture.py); torch's gradients, and torch's adjoints at the
captured intermediates autograd keeps, are sent with it as claimed gradients (the report's subject
is "claimed"), so the references judge torch's backward, not the engine's. A non-scalar output is
reduced with a seeded cotangent, as gradcheck_client.check does. Each custom autograd.Function the
forward calls is also checked on its own (its forward alone, captured the same way, against its
backward; its arguments that do not require grad -- a mask, a table -- are constants there, so a
backward returning None for them is right): report.data["custom_functions"] names each one's class and
source line and its verdict. A Function declared a surrogate (surrogate.py) is an opaque node whose own
check is waived. torch.autograd's gradcheck/gradgradcheck drop-ins are drop_in.py.
An op the capture cannot replay (or a Function whose forward calls one) is an opaque node, checked on
its own in process and cut out of the graph without leaving anything unverified (opaque.py):
report.data["opaque"] says what was checked how.

Float64, then the user's dtype: torch runs the function in float64 -- float32 (and half) inputs upcast, a
module's own parameters holding float64 copies of their data while the check runs (modules.py: no copy
of the module, so hooks registered on its parameters run), the report's data["check"]["upcast"] naming
them; then, where anything checked is narrower, torch's gradient and the function's values are run as
given against float64 (dtypes.py). The function's values, re-run along seeded directions, are the
reference beside the captured graph (values.py): a path autograd does not see fails.
One check at a time per process (it replaces Function.apply while
the forward runs): a second one started meanwhile -- another thread, or a check called inside the
function checked -- is refused with a TracerError saying so.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import threading
import weakref

import numpy as np
import torch

from gradcheck_core.check_call import _argument_names, check_options, stated
from gradcheck_core.claims import claims_message, with_claims
from gradcheck_core.report import Report
from gradcheck_core.trace_errors import TracerError
from gradcheck_core.tracer import Tracer
from . import culprits, dtypes, modules, opaque, surrogate, values
from .capture import Capture, nonfinite_constants, raised_at

_RUNNING = threading.Lock()  # one check at a time per process (the module docstring)
# The symbolic oracle's default budget here (scalar elements: inputs plus node outputs), unless the caller sets
# symbolic_budget: the exact SymPy/mpmath reference costs ~5 ms per hundred elements of matmul -- 3.5 s of a
# 3.5 s check on an 8-32-4 MLP, where the complex-step differences (exact to rounding on analytic ops, the
# verdict's basis without it) take 40 ms. Within it (a small custom Function) it still runs; beyond it the
# report's warning says it was skipped and that the verdict uses finite differences.
SYMBOLIC_BUDGET = 256

def check(fn, *inputs, wrt=None, server=None, seed: int = 0, values_screen: bool = True,
          torch_passed: tuple | None = None, **options) -> Report:
    """Verify torch's gradients of fn(*inputs) (fn a function of tensors or an nn.Module) with respect to the
    float inputs (or those `wrt` names) and a module's parameters; in process, or on `server`.
    values_screen=False: no screen of the function's values (values.py), for a caller that compared torch's
    gradient of every tensor checked with the function's values itself (the drop-in, by torch's Jacobian check).
    torch_passed: (atol, rtol) of torch's passing Jacobian check on the inputs as given (the drop-in; dtypes.py)."""
    options = check_options({"symbolic_budget": SYMBOLIC_BUDGET, **options, "seed": seed})
    fn = _function_applied(fn)
    if not _RUNNING.acquire(blocking=False):
        raise TracerError("gradcheck_client.torch.check is already running in this process (another thread, or a "
                          "check called inside the function being checked): it replaces torch.autograd.Function."
                          "apply while it runs, so checks run one at a time")
    try:
        # (inspect.signature of a module's forward: milliseconds, so once per check)
        names = _argument_names(fn.forward if isinstance(fn, torch.nn.Module) else fn, len(inputs))
        with modules.in_float64(fn) as upcast:  # the user's own module: its hooks run (modules.py)
            report = _checked(fn, inputs, wrt, server, options, upcast, names, values_screen)
        picks = _picks(names, wrt)
        return dtypes.in_user_dtype(fn, inputs, picks, report, options["seed"], torch_passed)  # (dtypes.py)
    finally:
        _RUNNING.release()


def _function_applied(fn):
    """`MyFn.apply` (torch's idiom for gradcheck) bound before the check began: a function that looks apply up
    when called, so the call is recorded and MyFn checked and named as any Function the forward calls."""
    cls = getattr(fn, "__self__", None)
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)
            and getattr(fn, "__func__", None) is torch.autograd.Function.__dict__["apply"].__func__):
        return fn

    def applied(*args):
        return cls.apply(*args)
    applied.__name__ = applied.__qualname__ = f"{cls.__name__}.apply"
    applied.function_class = cls  # (its own check is the whole check's: _same_as_whole)
    signature = _forward_signature(cls)
    if signature is not None:  # its inputs named as its forward names them (x, not arg0)
        applied.__signature__ = signature
    return applied


def _forward_signature(cls):
    """The signature of a Function's forward without its ctx (none with setup_context), or None."""
    return _signature_of(cls.forward, cls.setup_context is torch.autograd.function._SingleLevelFunction.setup_context)


_SIGNATURES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # forward -> {with_ctx: signature}


def _signature_of(forward, with_ctx: bool):
    """_forward_signature's, once per forward (inspect.signature: a tenth of a millisecond, every check of a
    tiny Function); keyed by the forward itself (weakly), so a Function whose forward is replaced is read again."""
    try:
        known = _SIGNATURES.setdefault(forward, {})
    except TypeError:  # (not weakly referable: read each time)
        known = {}
    if with_ctx not in known:
        try:
            signature = inspect.signature(forward)
        except (TypeError, ValueError):
            signature = None
        known[with_ctx] = signature and signature.replace(
            parameters=list(signature.parameters.values())[1 if with_ctx else 0:])
    return known[with_ctx]


def _name(fn) -> str:
    """fn's name in the report: a function's, a torch.library op's (mylib::f), else its class's."""
    return getattr(fn, "__name__", None) or getattr(fn, "_qualname", None) or type(fn).__name__


def _input_names(cls, n: int) -> list:
    """A Function's inputs as its forward names them (x, y), `inputK` where it does not (*args)."""
    signature = _forward_signature(cls)
    params = [p for p in (signature.parameters.values() if signature else ())
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [params[k].name if k < len(params) else f"input{k}" for k in range(n)]


def _checked(fn, inputs, wrt, server, options: dict, module_upcast: list, names: list,
             screen: bool = True) -> Report:
    run, named, paths, upcast = _prepared(fn, inputs, wrt, names)
    upcast += module_upcast
    calls: list = []
    traced, note, where, opaque_nodes = _captured(run, named, options["seed"], calls, _name(fn), paths, screen)
    if upcast:
        note["upcast"] = upcast
    report = stated(_verify(traced, server, options), _Stated(note))
    graph_verdict = report.verdict
    _unreached(report, note)
    report.data["sources"] = {f.node: where[f.node] for f in report.findings if f.node in where}
    for node, at in report.data["sources"].items():  # the culprit in the user's terms
        report.text = f"{culprits.source_line(node, at)}\n{report.text}"
    whole = _function_entry(calls[0][0], report, note, []) if _same_as_whole(fn, calls, named, opaque_nodes) else None
    report.data["custom_functions"] = [{**(whole or _function_check(cls, args, server, options)), "module": module,
                                        "checked": _where(server)} for cls, args, module in calls
                                       if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)]
    for c in report.data["custom_functions"]:
        if c["verdict"] != "pass":
            report.text = f"{culprits.function_line(c)}\n{report.text}"
        if c["verdict"] == "fail":  # a wrong backward fails the check even where this call's gradients hide it
            report.verdict = report.data["verdict"] = "fail"
    report = _with_opaque(report, opaque_nodes)
    values.judged(report)  # the function's values, re-run (values.py): a path autograd does not see fails
    _say_where(report, server, opaque_nodes)
    if report.verdict != graph_verdict:  # the server's text below states the captured graph's verdict only
        report.text = (f"verdict {report.verdict.upper()} (the captured graph's own verdict below is "
                       f"{graph_verdict.upper()})\n{report.text}")
    return report


def _unreached(report: Report, note: dict) -> None:
    """A checked tensor the output does not depend on has a gradient of zero: torch's nonzero one fails."""
    if note.get("unreached"):
        report.verdict = report.data["verdict"] = "fail"
        report.text = (f"torch's gradient of {', '.join(note['unreached'])} is nonzero, but the output of "
                       f"{note['function']} does not depend on it\n{report.text}")


def _where(server) -> str:
    """Where a graph is verified: "in process", or "on server HOST:PORT"."""
    if server is None:
        return "in process"
    return f"on server {getattr(server, 'target', server)}"


def _say_where(report: Report, server, opaque_nodes: list) -> None:
    """report.data["checked"]: where each part was checked -- the captured graph (and each custom Function's
    own graph) where the verification ran, the opaque nodes always in this process: a server cannot run the
    user's Python (their forward and backward), so their float64 differences are taken here; one verdict
    covers both (_with_opaque). With a server and opaque nodes, the text says so first."""
    report.data["checked"] = {"graph": _where(server), "opaque": "in process" if opaque_nodes else None}
    if server is not None and opaque_nodes:
        report.text = (f"checked: the captured graph {_where(server)}; {len(opaque_nodes)} opaque node(s) in this "
                       "process (the server cannot run their Python); one verdict for both\n" + report.text)


def _with_opaque(report: Report, entries: list) -> Report:
    """The opaque nodes' own checks in the report: each one's line heads the text (what was checked how); a
    failing one fails the report, an undecided one leaves a passing report "undecided"."""
    report.data["opaque"] = entries
    for e in reversed(entries):
        report.text = f"{culprits.opaque_line(e)}\n{report.text}"
    verdicts = {e["verdict"] for e in entries}
    if "fail" in verdicts:
        report.verdict = report.data["verdict"] = "fail"
    elif "undecided" in verdicts and report.verdict == "pass":
        report.verdict = report.data["verdict"] = "undecided"
    return report


class _Stated:
    """What check_call.stated reads of a trace: the note, the parameters, and the loss the captured graph
    must reproduce -- torch's own (a capture that mis-replays an op is refused, as a mis-trace is)."""

    def __init__(self, note: dict):
        self.note, self.parameters = note, note["parameters"]
        self.loss, self.terms = note.pop("torch_loss"), note.pop("torch_terms")
        self.known = False  # no trace-time values confirmed the output: the loss is the whole check


def _picks(names: list, wrt):
    """The positions of the inputs checked (names: fn's argument names): every one, or those `wrt` names (by
    position or name)."""
    return range(len(names)) if wrt is None else [names.index(w) if isinstance(w, str) else w for w in
                                                    (wrt if isinstance(wrt, (list, tuple)) else [wrt])]


def _prepared(fn, inputs, wrt, names: list):
    """(the function over float64 tensors, {name: float64 leaf tensor checked} -- the inputs first, then a
    module's parameters by their module path (`layer.1.weight`) --, {submodule run: its path}, the names of
    the tensors upcast to float64 from a narrower float)."""
    picks = _picks(names, wrt)
    leaves, args, upcast = {}, [], []
    for i, a in enumerate(inputs):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            if a.dtype != torch.float64:
                upcast.append(names[i])
            a = a.detach().to(torch.float64).clone()  # on its own device: torch runs there
            if i in picks:
                a.requires_grad_(True)
                leaves[names[i]] = a
        args.append(a)
    paths = {}
    if isinstance(fn, torch.nn.Module):
        paths = {m: path for path, m in fn.named_modules()}
        for name, p in fn.named_parameters():
            if p.requires_grad:
                leaves[name] = p
    if not leaves:
        raise TracerError("no parameters: nothing to check (no float tensor input, and no module parameter)")
    return (lambda: fn(*args)), leaves, paths, upcast


def _captured(run, leaves: dict, seed: int, calls: list, name: str, paths: dict | None = None, screen: bool = True):
    """fn's forward captured as a graph carrying torch's gradients and adjoints as claims, the note, where
    each node was made (module path, source line), and the opaque nodes' own checks (opaque.py); with the
    screen of the function's values (values.py) unless screen=False."""
    t = Tracer(name)
    capture = Capture(t)
    for n, leaf in leaves.items():
        capture.bind(leaf, t.param(n, _host(leaf)))
    with _recording_functions(calls, capture), _module_paths(capture, paths or {}), capture:
        try:
            out = run()
        except RuntimeError as exc:  # torch's own error outside an op (an op's is a TracerError already)
            raise TracerError(f"torch raised while running {name}{raised_at(exc, capture)}: "
                              f"{(str(exc).strip().splitlines() or [''])[0][:300]}") from None
        outs = _outputs(out, capture, name)
        note = {"function": name, "parameters": list(leaves), "output_shape": [list(o.shape) for o in outs]}
        if len(outs) == 1:
            note["output_shape"] = note["output_shape"][0]
        rng = np.random.default_rng(seed)
        weights = [None if o.numel() == 1 and len(outs) == 1 else
                   torch.from_numpy(rng.standard_normal(tuple(o.shape))).to(o.device) for o in outs]
        terms = [o.reshape(()) if c is None else (o * c).sum() for o, c in zip(outs, weights)]
        loss = functools.reduce(operator.add, terms)
        if any(c is not None for c in weights):
            note["cotangent"] = {"distribution": "normal(0, 1)", "seed": int(seed)}
    # torch's own loss, read outside the capture: the graph must compute it (check_call.stated ->
    # faithful.confirm_loss), so a capture that mis-replays an op is refused as a mis-trace is
    with torch.no_grad():
        note["torch_loss"] = float(loss)
        note["torch_terms"] = float(sum((o.abs() * (1.0 if c is None else c.abs())).sum()
                                        for o, c in zip(outs, weights)))
    capture.settle()
    kept = _adjoint_tensors(capture)
    for tensor, _ in kept + [pair for node in capture.opaque for pair in node.outputs]:
        tensor.retain_grad()
    try:
        loss.backward()
    except RuntimeError as exc:  # torch's own error, in one line
        raise TracerError(f"torch's backward of {name} raised: "
                          f"{(str(exc).strip().splitlines() or [''])[0][:300]}") from None
    loss_value, opaque_grads, entries = _cut_opaque(capture, capture.values[id(loss)][1])
    graph = t.graph(loss_value if "loss" in leaves else loss_value.named("loss"))
    nodes = {n.name for n in graph.nodes}
    adjoints = {value.name: _host(tensor.grad) for tensor, value in kept
                if value.name in nodes and tensor.grad is not None}
    grads = {n: _host(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
             for n, leaf in leaves.items()}
    if screen:
        note["function_values"] = values.screen(run, leaves, values.reducer(out, outs, weights), grads, capture,
                                                seed)
    inputs = {i.name for i in graph.inputs}
    # a checked tensor the output does not depend on is no parameter of the graph: its gradient must be zero
    unreached = sorted(n for n, g in grads.items() if n not in inputs and np.any(g != 0))
    if unreached:
        note["unreached"] = unreached
    grads = {n: g for n, g in grads.items() if n in inputs}
    grads.update({n: g for n, g in opaque_grads.items() if n in inputs})
    return with_claims(graph, claims_message(grads, adjoints)), note, capture.where, entries


def _outputs(out, capture, name: str) -> list:
    """fn's outputs (a tensor, or a tuple or list of them, as torch.autograd.gradcheck takes, or nested as
    nn.LSTM's (output, (h, c))) that depend on a checked input."""
    outs = values.output_tensors(out)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise TracerError(f"{name} returned {type(out).__name__}: return a tensor (or a tuple of tensors)")
    outs = [o for o in outs if id(o) in capture.values]
    if not outs:
        raise TracerError(f"{name}'s output does not depend on any checked input")
    # beside a differentiable output, one autograd does not track (ctx.mark_non_differentiable) is not
    # differentiated, as torch's gradcheck (_differentiable_outputs) does not
    return [o for o in outs if o.requires_grad] or outs


def _cut_opaque(capture, loss_value):
    """The opaque nodes cut out of the graph (opaque.py): the loss with each one's upstream term, the claimed
    gradients of the parameters standing for their outputs (torch's adjoints), and each one's own check."""
    t, grads, entries = capture.tracer, {}, []
    for node in capture.opaque:
        if any(capture.values[id(o)][1] is not v for o, v in node.outputs):  # torch's .grad is its last version's
            raise TracerError(f"an output of opaque {node.kind} {node.name} ({node.source}) is written in place "
                              "afterwards: its adjoint is not torch's gradient there (write it out of place)")
        if not all(bool(torch.isfinite(x).all()) for x in node.inputs):  # the term below would be nan (nan - nan)
            raise TracerError(f"opaque {node.kind} {node.name} ({node.source}) reads a traced tensor holding nan or "
                              "inf: its gradient cannot be handed back through it (an op outside the capture's table)")
        adjoints = [o.grad.detach() if o.grad is not None else torch.zeros_like(o) for o, _ in node.outputs]
        grads.update({v.name: _host(a) for (_, v), a in zip(node.outputs, adjoints)})
        try:
            vjps = opaque.vjp(node, adjoints)
            entries.append(surrogate.entry(node) if node.surrogate else opaque.local_check(node, adjoints, vjps))
        except RuntimeError as exc:
            raise TracerError(f"opaque {node.kind} {node.name} ({node.source}) raised when re-run on its own: "
                              f"{(str(exc).strip().splitlines() or [''])[0][:300]}") from None
        for value, v in zip(node.input_values, vjps):  # zero in value, gradient v: torch's VJP handed back
            loss_value = loss_value + t.apply("sum", (value - t.constant(value)) * _host(v))
    return loss_value, grads, entries


def _host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values on the host (the references run there, in float64)."""
    return t.detach().cpu().numpy()


def _adjoint_tensors(capture) -> list:
    """(tensor, value) whose torch gradient is that value's adjoint: the tensor that made the value (not a
    clone or alias bound to it later, whose gradient is only part of it), while it still holds that value
    (torch's gradient of a tensor written in place is its last version's), and that autograd tracks."""
    maker: dict = {}
    for tensor, value in capture.produced:
        maker.setdefault(value.name, tensor)
    return [(t, v) for t, v in capture.produced if maker[v.name] is t and capture.values[id(t)][1] is v
            and t.requires_grad and t.grad_fn is not None]


@contextlib.contextmanager
def _module_paths(capture, paths: dict):
    """While the forward runs, capture.modules holds the path of the module running (`1 (CubeLayer)`)."""
    if not paths:
        yield
        return
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    def enter(module, args):
        if module in paths and paths[module]:
            capture.modules.append(f"module {paths[module]} ({type(module).__name__})")

    def leave(module, args, out):
        if module in paths and paths[module]:
            capture.modules.pop()
    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


_TORCH_LIBRARY = "torch._library"  # where torch.library makes the autograd.Function of a custom op


@contextlib.contextmanager
def _recording_functions(calls: list, capture):
    """Record each custom autograd.Function call of this thread (its class, arguments and the module running
    it) while the forward runs, and tell the capture where each begins and ends (an opaque one is the
    capture's: capture.function_call). It replaces Function.apply for the duration: one check at a time per
    process (check holds _RUNNING)."""
    original = torch.autograd.Function.__dict__["apply"]
    thread = threading.get_ident()

    def apply(cls, *args, **kwargs):
        if threading.get_ident() != thread or cls.__module__.startswith(_TORCH_LIBRARY):
            return original.__func__(cls, *args, **kwargs)  # (a custom op's autograd: the capture sees the op)
        module = capture.modules[-1] if capture.modules else ""
        capture.frames.append({"inside": "", "surrogate": bool(surrogate.declared(cls))})
        try:
            out = original.__func__(cls, *args, **kwargs)
        except BaseException:
            capture.frames.pop()
            raise
        if not capture.function_call(cls, args, out, module):
            calls.append((cls, args, module))
        return out
    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = original


def _function_check(cls, args, server, options) -> dict:
    """One custom Function on its own: its forward captured, its backward's gradients claimed, verified."""
    where = opaque.backward_line(cls)
    if surrogate.declared(cls):  # (a surrogate nested in another Function: the outer call is the opaque node)
        return {"function": cls.__name__, "source": where, "verdict": "surrogate",
                "detail": f"declared surrogate ({surrogate.declared(cls)}), not checked against the derivative"}
    # the inputs are the arguments that required grad at the call; another float tensor (a mask, a table) is a
    # constant of the check, and a backward returning None for it is right
    wants = [isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad for a in args]
    inputs = [a.detach().to(torch.float64).clone() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    names = _input_names(cls, len(inputs))
    leaves = {n: a.requires_grad_(True) for n, a, w in zip(names, inputs, wants) if w}
    try:
        graph, note, _, entries = _captured(lambda: cls.apply(*inputs), leaves, options.get("seed", 0), [],
                                            cls.__name__)
        report = _with_opaque(_verify(graph, server, options), entries)  # (opaque on its own: nested in another)
        _unreached(report, note)
    except TracerError as exc:
        return {"function": cls.__name__, "source": where, "verdict": "undecided", "detail": f"not checked: {exc}"}
    return _function_entry(cls, report, note, entries)


def _same_as_whole(fn, calls: list, leaves: dict, opaque_nodes: list) -> bool:
    """Whether the check of fn is the one custom Function call's own check: fn is `MyFn.apply` (torch's idiom)
    and the Function ran once, on the checked tensors themselves -- the same forward, leaves, cotangent and
    backward, so its own capture and verification would repeat the whole check's (half of a tiny check's time)."""
    cls = getattr(fn, "function_class", None)
    if cls is None or opaque_nodes or len(calls) != 1 or calls[0][0] is not cls:
        return False
    args = calls[0][1]
    wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return len(wanted) == len(leaves) and all(any(a is leaf for leaf in leaves.values()) for a in wanted)


def _function_entry(cls, report: Report, note: dict, entries: list) -> dict:
    """A custom Function's entry of report.data["custom_functions"], from the verification of its own graph."""
    where = opaque.backward_line(cls)
    problems = [f"torch's gradient of {', '.join(note['unreached'])} is nonzero, but the output does not depend "
                "on it" for _ in [1] if note.get("unreached")] + \
        [f"{f.node}: {f.detail}" for f in report.findings if f.severity == "error"] + \
        [f"{e['op']}: {e['detail']}" for e in entries if e["verdict"] not in ("pass", "surrogate")]
    detail = "its backward agrees with the derivative of its forward" if report.passed else \
        ("its backward disagrees with the derivative of its forward: " if report.verdict == "fail" else
         "not decided: ") + "; ".join(problems)
    return {"function": cls.__name__, "source": where, "verdict": report.verdict, "detail": detail}


def _verify(graph, server, options: dict) -> Report:
    """The captured graph verified where every check() verifies (checking.verifier: in process unless `server`)."""
    from ..checking import verifier

    if nonfinite_constants(graph):  # a -inf mask buffer is the model's own constant (capture.nonfinite_constants)
        options = {**options, "allow_nonfinite": True}
    return verifier(server)(graph, options)
