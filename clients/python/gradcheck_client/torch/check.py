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
backward): report.data["custom_functions"] names each one's class and source line and its verdict.
An op the capture cannot replay (or a Function whose forward calls one) is an opaque node, checked on
its own in process and cut out of the graph without leaving anything unverified (opaque.py):
report.data["opaque"] says what was checked how.

Float64: torch runs the function in float64 -- float32 (and half) inputs and parameters are upcast
first, and the report's data["check"]["upcast"] names them: what is checked is the float64 function,
not a float32 run's rounding. One check at a time per process (it replaces Function.apply while
the forward runs): a second one started meanwhile -- another thread, or a check called inside the
function checked -- is refused with a TracerError saying so.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import operator
import threading

import numpy as np
import torch

from gradcheck_core.check_call import _argument_names, check_options, stated
from gradcheck_core.claims import claims_message, with_claims
from gradcheck_core.errors import GradientsNotVerified
from gradcheck_core.report import Report
from gradcheck_core.trace_errors import TracerError
from gradcheck_core.tracer import Tracer
from . import opaque
from .capture import Capture, raised_at

_RUNNING = threading.Lock()  # one check at a time per process (the module docstring)

# torch.autograd.gradcheck's keyword arguments beside eps, atol, rtol and raise_exception: accepted so that a
# test suite switches with one import; they ask for checks torch's gradcheck makes of itself (batched
# gradients, forward mode, dtypes), which this one does not make
TORCH_OPTIONS = ("nondet_tol", "check_undefined_grad", "check_grad_dtypes", "check_batched_grad",
                 "check_batched_forward_grad", "check_forward_ad", "check_backward_ad", "fast_mode", "masked")


def check(fn, *inputs, wrt=None, server=None, seed: int = 0, **options) -> Report:
    """Verify torch's gradients of fn(*inputs) (fn a function of tensors or an nn.Module) with respect to the
    float inputs (or those `wrt` names) and a module's parameters; in process, or on `server`."""
    options = check_options({**options, "seed": seed})
    if not _RUNNING.acquire(blocking=False):
        raise TracerError("gradcheck_client.torch.check is already running in this process (another thread, or a "
                          "check called inside the function being checked): it replaces torch.autograd.Function."
                          "apply while it runs, so checks run one at a time")
    try:
        return _checked(fn, inputs, wrt, server, options)
    finally:
        _RUNNING.release()


def _checked(fn, inputs, wrt, server, options: dict) -> Report:
    run, named, paths, upcast = _prepared(fn, inputs, wrt)
    calls: list = []
    traced, note, where, opaque_nodes = _captured(run, named, options["seed"], calls,
                                                  getattr(fn, "__name__", type(fn).__name__), paths)
    if upcast:
        note["upcast"] = upcast
    report = stated(_verify(traced, server, options), _Stated(note))
    graph_verdict = report.verdict
    report.data["sources"] = {f.node: where[f.node] for f in report.findings if f.node in where}
    for node, at in report.data["sources"].items():  # the culprit in the user's terms
        report.text = f"node '{node}' was made at {at}\n{report.text}"
    report.data["custom_functions"] = [{**_function_check(cls, args, server, options), "module": module,
                                        "checked": _where(server)} for cls, args, module in calls]
    for c in report.data["custom_functions"]:
        if c["verdict"] != "pass":
            inside = f" in {c['module']}" if c["module"] else ""
            report.text = (f"custom autograd.Function {c['function']}{inside} ({c['source']}): {c['detail']}\n"
                           f"{report.text}")
        if c["verdict"] == "fail":  # a wrong backward fails the check even where this call's gradients hide it
            report.verdict = report.data["verdict"] = "fail"
    report = _with_opaque(report, opaque_nodes)
    _say_where(report, server, opaque_nodes)
    if report.verdict != graph_verdict:  # the server's text below states the captured graph's verdict only
        report.text = (f"verdict {report.verdict.upper()} (the captured graph's own verdict below is "
                       f"{graph_verdict.upper()})\n{report.text}")
    return report


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
        inside = f" in {e['module']}" if e["module"] and e["module"] not in e["source"] else ""
        report.text = (f"opaque {e['kind']} {e['op']}{inside} ({e['source']}): {e['verdict'].upper()}: "
                       f"{e['detail']}; checked in process by float64 central differences, its outputs "
                       f"{', '.join(e['parameters'])} checked as parameters\n{report.text}")
    verdicts = {e["verdict"] for e in entries}
    if "fail" in verdicts:
        report.verdict = report.data["verdict"] = "fail"
    elif "undecided" in verdicts and report.verdict == "pass":
        report.verdict = report.data["verdict"] = "undecided"
    return report


def gradcheck(fn, inputs, *, eps=None, atol=None, rtol=None, raise_exception: bool = True, server=None,
              **torch_options) -> bool:
    """torch.autograd.gradcheck's signature: True when torch's gradients verify, else raises GradcheckError (a
    RuntimeError, as torch's) with the report -- or returns False with raise_exception=False. A function
    that cannot be checked raises it too ("not checked: ..."): never a pass. eps is not used (the step is
    chosen per element), nor are torch's other options (TORCH_OPTIONS); any other keyword is a TypeError."""
    unknown = sorted(set(torch_options) - set(TORCH_OPTIONS))
    if unknown:
        raise TypeError(f"gradcheck() got unexpected keyword argument(s) {', '.join(unknown)}")
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    wrt = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad] or None
    try:
        report = check(fn, *inputs, wrt=wrt, server=server, atol=atol, rtol=rtol)
    except TracerError as exc:
        if raise_exception:
            raise GradcheckError(f"not checked: {exc}") from None
        return False
    if not report.passed and raise_exception:
        raise GradcheckError(str(report))
    return report.passed


class GradcheckError(GradientsNotVerified, RuntimeError):
    """torch's gradients did not verify (gradcheck_core.errors.GradientsNotVerified, exit 1 -- not
    gradcheck_svc.errors.GradcheckError, which is invalid input); the message is the report
    (torch.autograd.gradcheck raises torch.autograd.gradcheck.GradcheckError, a RuntimeError, too)."""


class _Stated:
    """What check_call.stated reads of a trace: the note, the parameters, and the loss the captured graph
    must reproduce -- torch's own (a capture that mis-replays an op is refused, as a mis-trace is)."""

    def __init__(self, note: dict):
        self.note, self.parameters = note, note["parameters"]
        self.loss, self.terms = note.pop("torch_loss"), note.pop("torch_terms")
        self.known = False  # no trace-time values confirmed the output: the loss is the whole check


def _prepared(fn, inputs, wrt):
    """(the function over float64 tensors, {name: float64 leaf tensor checked} -- the inputs first, then a
    module's parameters by their module path (`layer.1.weight`) --, {submodule run: its path}, the names of
    the tensors upcast to float64 from a narrower float)."""
    names = _argument_names(fn.forward if isinstance(fn, torch.nn.Module) else fn, len(inputs))
    picks = range(len(inputs)) if wrt is None else [names.index(w) if isinstance(w, str) else w for w in
                                                     (wrt if isinstance(wrt, (list, tuple)) else [wrt])]
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
        upcast += [n for n, t in [*fn.named_parameters(), *fn.named_buffers()]
                   if t.is_floating_point() and t.dtype != torch.float64]
        try:
            fn = copy.deepcopy(fn).to(torch.float64)  # the user's module and its gradients stay untouched
        except (TypeError, RuntimeError) as exc:
            raise TracerError(f"module {type(fn).__name__} cannot be copied to run it in float64 (copy.deepcopy: "
                              f"{str(exc)[:200]}): keep what it holds copyable (an op by name, not the op object)") \
                from None
        paths = {m: path for path, m in fn.named_modules()}
        for name, p in fn.named_parameters():
            if p.requires_grad:
                leaves[name] = p
    if not leaves:
        raise TracerError("no parameters: nothing to check (no float tensor input, and no module parameter)")
    return (lambda: fn(*args)), leaves, paths, upcast


def _captured(run, leaves: dict, seed: int, calls: list, name: str, paths: dict | None = None):
    """fn's forward captured as a graph carrying torch's gradients and adjoints as claims, the note, where
    each node was made (module path, source line), and the opaque nodes' own checks (opaque.py)."""
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
    inputs = {i.name for i in graph.inputs}
    grads.update({n: g for n, g in opaque_grads.items() if n in inputs})
    return with_claims(graph, claims_message(grads, adjoints)), note, capture.where, entries


def _outputs(out, capture, name: str) -> list:
    """fn's outputs (a tensor, or a tuple or list of them, as torch.autograd.gradcheck takes) that depend on a
    checked input."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise TracerError(f"{name} returned {type(out).__name__}: return a tensor (or a tuple of tensors)")
    outs = [o for o in outs if id(o) in capture.values]
    if not outs:
        raise TracerError(f"{name}'s output does not depend on any checked input")
    return outs


def _cut_opaque(capture, loss_value):
    """The opaque nodes cut out of the graph (opaque.py): the loss with each one's upstream term, the claimed
    gradients of the parameters standing for their outputs (torch's adjoints), and each one's own check."""
    t, grads, entries = capture.tracer, {}, []
    for node in capture.opaque:
        if any(capture.values[id(o)][1] is not v for o, v in node.outputs):  # torch's .grad is its last version's
            raise TracerError(f"an output of opaque {node.kind} {node.name} ({node.source}) is written in place "
                              "afterwards: its adjoint is not torch's gradient there (write it out of place)")
        adjoints = [o.grad.detach() if o.grad is not None else torch.zeros_like(o) for o, _ in node.outputs]
        grads.update({v.name: _host(a) for (_, v), a in zip(node.outputs, adjoints)})
        try:
            vjps = opaque.vjp(node, adjoints)
            entries.append(opaque.local_check(node, adjoints, vjps))
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
        capture.frames.append({"inside": ""})
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
    inputs = [a.detach().to(torch.float64).clone() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    names = [f"input{k}" for k in range(len(inputs))]
    leaves = {n: a.requires_grad_(True) for n, a in zip(names, inputs) if isinstance(a, torch.Tensor) and
              a.is_floating_point()}
    try:
        graph, _, _, entries = _captured(lambda: cls.apply(*inputs), leaves, options.get("seed", 0), [],
                                         cls.__name__)
        report = _with_opaque(_verify(graph, server, options), entries)  # (opaque on its own: nested in another)
    except TracerError as exc:
        return {"function": cls.__name__, "source": where, "verdict": "undecided", "detail": f"not checked: {exc}"}
    problems = [f"{f.node}: {f.detail}" for f in report.findings if f.severity == "error"] + \
        [f"{e['op']}: {e['detail']}" for e in entries if e["verdict"] != "pass"]
    detail = "its backward agrees with the derivative of its forward" if report.passed else \
        ("its backward disagrees with the derivative of its forward: " if report.verdict == "fail" else
         "not decided: ") + "; ".join(problems)
    return {"function": cls.__name__, "source": where, "verdict": report.verdict, "detail": detail}


def _verify(graph, server, options: dict) -> Report:
    if server is None:
        from gradcheck.v1 import service_pb2
        from gradcheck_svc.outcome import report_of
        from gradcheck_svc.report_proto import client_report
        from gradcheck_svc.request import run_request

        faults = {"faults": list(options["faults"])} if "faults" in options else {}
        request = service_pb2.VerifyRequest(graph=graph, options=service_pb2.VerifyOptions(**{**options, **faults}))
        return client_report(report_of(run_request(request)))
    from gradcheck_core.client import Client

    if isinstance(server, Client):
        return server.verify(graph, **options)
    with Client(server) as client:
        return client.verify(graph, **options)
