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
"""
from __future__ import annotations

import contextlib
import copy
import inspect

import numpy as np
import torch

from ..check_call import _argument_names, check_options, stated
from ..claims import claims_message, with_claims
from ..report import Report
from ..trace_errors import TracerError
from ..tracer import Tracer
from .capture import Capture


def check(fn, *inputs, wrt=None, server=None, seed: int = 0, **options) -> Report:
    """Verify torch's gradients of fn(*inputs) (fn a function of tensors or an nn.Module) with respect to the
    float inputs (or those `wrt` names) and a module's parameters; in process, or on `server`."""
    options = check_options({**options, "seed": seed})
    run, named, paths = _prepared(fn, inputs, wrt)
    calls: list = []
    traced, note, where = _captured(run, named, seed, calls, getattr(fn, "__name__", type(fn).__name__), paths)
    report = stated(_verify(traced, server, options), _Stated(note))
    report.data["sources"] = {f.node: where[f.node] for f in report.findings if f.node in where}
    for node, at in report.data["sources"].items():  # the culprit in the user's terms
        report.text = f"node '{node}' was made at {at}\n{report.text}"
    report.data["custom_functions"] = [{**_function_check(cls, args, server, options), "module": module}
                                       for cls, args, module in calls]
    for c in report.data["custom_functions"]:
        if c["verdict"] != "pass":
            inside = f" in {c['module']}" if c["module"] else ""
            report.text = (f"custom autograd.Function {c['function']}{inside} ({c['source']}): {c['detail']}\n"
                           f"{report.text}")
        if c["verdict"] == "fail":  # a wrong backward fails the check even where this call's gradients hide it
            report.verdict = report.data["verdict"] = "fail"
    return report


def gradcheck(fn, inputs, *, eps=None, atol=None, rtol=None, raise_exception: bool = True, server=None,
              **ignored) -> bool:
    """torch.autograd.gradcheck's signature: True when torch's gradients verify, else raises (or returns False
    with raise_exception=False) with the report. eps is not used (the step is chosen per element), nor are
    torch's other options (fast_mode, check_batched_grad, ...): they are accepted so that a call switches
    with one import."""
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    wrt = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad] or None
    report = check(fn, *inputs, wrt=wrt, server=server, atol=atol, rtol=rtol)
    if not report.passed and raise_exception:
        raise GradcheckError(str(report))
    return report.passed


class GradcheckError(RuntimeError):
    """torch's gradients did not verify; the message is the report (torch.autograd.gradcheck raises
    torch.autograd.gradcheck.GradcheckError, a RuntimeError, too)."""


class _Stated:
    """What check_call.stated reads of a trace: the note, the parameters, and the loss the captured graph
    must reproduce -- torch's own (a capture that mis-replays an op is refused, as a mis-trace is)."""

    def __init__(self, note: dict):
        self.note, self.parameters = note, note["parameters"]
        self.loss, self.terms = note.pop("torch_loss"), note.pop("torch_terms")
        self.known = False  # no trace-time values confirmed the output: the loss is the whole check


def _prepared(fn, inputs, wrt):
    """(the function over float64 tensors, {name: float64 leaf tensor checked} -- the inputs first, then a
    module's parameters by their module path (`layer.1.weight`) --, {submodule run: its path})."""
    names = _argument_names(fn.forward if isinstance(fn, torch.nn.Module) else fn, len(inputs))
    picks = range(len(inputs)) if wrt is None else [names.index(w) if isinstance(w, str) else w for w in
                                                     (wrt if isinstance(wrt, (list, tuple)) else [wrt])]
    leaves, args = {}, []
    for i, a in enumerate(inputs):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach().to(torch.float64).clone()  # on its own device: torch runs there
            if i in picks:
                a.requires_grad_(True)
                leaves[names[i]] = a
        args.append(a)
    paths = {}
    if isinstance(fn, torch.nn.Module):
        fn = copy.deepcopy(fn).to(torch.float64)
        paths = {m: path for path, m in fn.named_modules()}
        for name, p in fn.named_parameters():
            if p.requires_grad:
                leaves[name] = p
    if not leaves:
        raise TracerError("no parameters: nothing to check (no float tensor input, and no module parameter)")
    return (lambda: fn(*args)), leaves, paths


def _captured(run, leaves: dict, seed: int, calls: list, name: str, paths: dict | None = None):
    """fn's forward captured as a graph carrying torch's gradients and adjoints as claims, the note, and where
    each node was made (module path, source line)."""
    t = Tracer(name)
    capture = Capture(t)
    for n, leaf in leaves.items():
        capture.bind(leaf, t.param(n, _host(leaf)))
    with _recording_functions(calls, capture), _module_paths(capture, paths or {}), capture:
        out = run()
        if not isinstance(out, torch.Tensor) or id(out) not in capture.values:
            raise TracerError(f"{name}'s output does not depend on any checked input")
        note = {"function": name, "parameters": list(leaves), "output_shape": list(out.shape)}
        if out.numel() == 1:
            loss = out.reshape(())
        else:
            c = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(out.shape))).to(out.device)
            loss = (out * c).sum()
            note["cotangent"] = {"distribution": "normal(0, 1)", "seed": int(seed)}
    # torch's own loss, read outside the capture: the graph must compute it (check_call.stated ->
    # faithful.confirm_loss), so a capture that mis-replays an op is refused as a mis-trace is
    with torch.no_grad():
        note["torch_loss"] = float(loss)
        note["torch_terms"] = float((out.abs() * (c.abs() if out.numel() != 1 else 1.0)).sum())
    kept = _adjoint_tensors(capture)
    for tensor, _ in kept:
        tensor.retain_grad()
    loss.backward()
    loss_value = capture.values[id(loss)][1]
    graph = t.graph(loss_value if "loss" in leaves else loss_value.named("loss"))
    nodes = {n.name for n in graph.nodes}
    adjoints = {value.name: _host(tensor.grad) for tensor, value in kept
                if value.name in nodes and tensor.grad is not None}
    grads = {n: _host(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
             for n, leaf in leaves.items()}
    return with_claims(graph, claims_message(grads, adjoints)), note, capture.where


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


@contextlib.contextmanager
def _recording_functions(calls: list, capture):
    """Record each custom autograd.Function call (its class, arguments and the module running it) while the
    forward runs. (It replaces Function.apply for the duration: one check at a time per process.)"""
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        calls.append((cls, args, capture.modules[-1] if capture.modules else ""))
        return original.__func__(cls, *args, **kwargs)
    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = original


def _function_check(cls, args, server, options) -> dict:
    """One custom Function on its own: its forward captured, its backward's gradients claimed, verified."""
    where = _source(cls)
    inputs = [a.detach().to(torch.float64).clone() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    names = [f"input{k}" for k in range(len(inputs))]
    leaves = {n: a.requires_grad_(True) for n, a in zip(names, inputs) if isinstance(a, torch.Tensor) and
              a.is_floating_point()}
    try:
        graph, _, _ = _captured(lambda: cls.apply(*inputs), leaves, options.get("seed", 0), [], cls.__name__)
        report = _verify(graph, server, options)
    except TracerError as exc:
        return {"function": cls.__name__, "source": where, "verdict": "undecided", "detail": f"not checked: {exc}"}
    errors = [f for f in report.findings if f.severity == "error"]
    detail = "its backward agrees with the derivative of its forward" if report.passed else \
        "its backward disagrees with the derivative of its forward: " + "; ".join(
            f"{f.node}: {f.detail}" for f in errors)
    return {"function": cls.__name__, "source": where, "verdict": report.verdict, "detail": detail}


def _source(cls) -> str:
    try:
        return f"{inspect.getsourcefile(cls.backward)}:{inspect.getsourcelines(cls.backward)[1]}"
    except (OSError, TypeError):
        return "source unknown"


def _verify(graph, server, options: dict) -> Report:
    if server is None:
        from gradcheck.v1 import service_pb2
        from gradcheck_svc.server.execute import verify_request

        faults = {"faults": list(options["faults"])} if "faults" in options else {}
        request = service_pb2.VerifyRequest(graph=graph, options=service_pb2.VerifyOptions(**{**options, **faults}))
        return Report.from_proto(verify_request(request).report)
    from ..client import Client

    if isinstance(server, Client):
        return server.verify(graph, **options)
    with Client(server) as client:
        return client.verify(graph, **options)
