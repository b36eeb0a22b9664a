"""Check a NumPy function's gradients in one call, through a server:

    import numpy as np
    from gradcheck_client import check
    report = check(lambda x, w: np.tanh(x @ w), np.ones((2, 3)), np.eye(3), server="localhost:50051")
    print(report.verdict, report.parameters["w"].gradient)   # an array of w's shape

The function is traced on the given arrays (tracer.py): every float argument is a parameter (its
gradient is checked) unless `wrt` names which are (positions or argument names); other arguments
are passed to the function as they are. A non-scalar output is reduced to the scalar
sum(output * c) with a cotangent c ~ N(0, 1) drawn from the `seed` option (0 unless given): the
report says so (data["check"], and a line of its text). gradcheck_svc.check runs the same trace and
the same verification in process and returns the same Report.

The traced graph must compute f: f also runs on plain NumPy copies of the arguments and its output (and
each argument after the call, for in-place code) is compared with the trace's, and its loss with the
engine's; a difference beyond rounding refuses the check (faithful.py).

grad=: the user's own backward is what is verified (claims.py; the report's subject is "claimed").
`grad(*args)` returns the gradients of the checked arguments -- a tuple in their order (a bare array
when there is one), or a dict by argument name; for a non-scalar output it is a VJP,
`grad(*args, cotangent)`, given the very cotangent the reduction uses. A wrong one fails naming the
argument, the element and the size of the error.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from . import dtypes, faithful
from .claims import NUMBER_KINDS, claims_message, with_claims
from .options import BY_NAME
from .report import Report
from .trace_errors import TracerError
from .tracer import Tracer, Value


@dataclass
class Traced:
    """A function traced for checking: its graph message, its parameters, and what was done to its output."""
    graph: object  # gradcheck.v1.Graph
    parameters: list
    note: dict  # what the report states: function, parameters, output shape, cotangent
    loss: float = 0.0  # f's own loss on NumPy arrays, reduced the same way (faithful.confirm_loss)
    terms: float = 0.0  # sum |output * c|: what the loss's rounding is relative to
    known: bool = True  # the trace-time values confirmed the output (faithful.confirm_trace)
    cotangent: np.ndarray | None = None  # the reduction's c, for a non-scalar output


def _argument_names(f, n: int) -> list[str]:
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        p = params[i] if i < len(params) else None
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            names.append(f"arg{i}")
        else:
            names.append(p.name)
    return names


def _is_float(a) -> bool:
    return isinstance(a, (float, np.floating)) or isinstance(a, np.ndarray) and a.dtype.kind == "f"


def _which(wrt, names: list[str], args) -> list[int]:
    if wrt is None:
        return [i for i, a in enumerate(args) if _is_float(a)]
    picks = wrt if isinstance(wrt, (list, tuple)) else [wrt]
    out = []
    for w in picks:
        if isinstance(w, str):
            if w not in names:
                raise TracerError(f"wrt names '{w}', which is not an argument (arguments: {', '.join(names)})")
            i = names.index(w)
        elif isinstance(w, (int, np.integer)) and -len(args) <= w < len(args):
            i = int(w) % len(args)
        else:
            raise TracerError(f"wrt {w!r}: expected an argument's position (0 to {len(args) - 1}) or name")
        if not (_is_float(args[i]) or np.asarray(args[i]).dtype.kind in "iu"):
            raise TracerError(f"wrt names '{names[i]}', which is not numeric data")
        out.append(i)
    return sorted(set(out))


def trace_function(f, args: tuple, wrt=None, seed: int = 0) -> Traced:
    """Trace f(*args) with the chosen arguments as parameters; reduce a non-scalar output with a seeded cotangent."""
    name = getattr(f, "__name__", "f")
    name = "f" if name == "<lambda>" else name
    names = _argument_names(f, len(args))
    which = _which(wrt, names, args)
    if not which:
        raise TracerError("no parameters: nothing to check (no float argument; pass float arrays, or name the "
                          "arguments to check with wrt=)")
    t = Tracer(name)
    state = np.random.get_state()  # the plain run starts from the same draws (faithful.py)
    traced = [t.param(names[i], np.asarray(a, dtype=np.float64)) if i in which else a
              for i, a in enumerate(faithful.numpy_copies(args, ()))]
    out = _call(f, traced)
    if isinstance(out, (tuple, list)):
        raise TracerError(f"{name} returned a {type(out).__name__}: check one output (return a single array)")
    if not isinstance(out, Value):
        checked = ", ".join(names[i] for i in which)
        raise TracerError(f"{name}'s output does not depend on any checked argument ({checked})")
    expected = faithful.run_plain(f, faithful.numpy_copies(args, which), names, state)
    known = faithful.confirm_trace(name, out, dict(zip(names, traced)), expected)
    note = {"function": name, "parameters": [names[i] for i in which], "output_shape": list(out.shape)}
    c = None
    if out.size != 1:
        c = np.random.default_rng(seed).standard_normal(out.shape)
        out = t.apply("sum", out * c)
        note["cotangent"] = {"distribution": "normal(0, 1)", "seed": int(seed)}
    elif out.shape:
        out = out.reshape(())
    if "loss" not in names:
        out = out.named("loss")
    terms = float(np.sum(np.abs(expected.output * (c if c is not None else 1.0))))
    user_dtype = dtypes.numpy_entry(f, list(args), which, names, c, seed)  # never a silent upcast (dtypes.py)
    if user_dtype is not None:
        note["user_dtype"] = user_dtype
    return Traced(t.graph(out), [names[i] for i in which], note, loss=faithful.expected_loss(expected.output, c),
                  terms=terms, known=known, cotangent=c)


def claimed(grad, args: tuple, traced: Traced) -> Traced:
    """The traced graph carrying grad's gradients of the checked arguments as its claims (module docstring)."""
    name = getattr(grad, "__name__", "grad")
    got = grad(*args) if traced.cotangent is None else grad(*args, traced.cotangent.copy())
    params = traced.parameters
    if isinstance(got, dict):
        unknown = [k for k in got if k not in params]
        if unknown:
            raise TracerError(f"{name} returned a gradient for '{unknown[0]}', which is not a checked argument "
                              f"(checked: {', '.join(params)})")
        by_name = dict(got)
    else:
        got = (got,) if len(params) == 1 and not isinstance(got, (tuple, list)) else got
        if not isinstance(got, (tuple, list)) or len(got) != len(params):
            n = len(got) if isinstance(got, (tuple, list)) else 1
            raise TracerError(f"{name} returned {n} gradient(s) for {len(params)} checked argument(s) "
                              f"({', '.join(params)}): return one per argument, in that order, or a dict by name")
        by_name = dict(zip(params, got))
    shapes = {i.name: list(i.value.shape) for i in traced.graph.inputs}
    arrays = {}
    for p, g in by_name.items():
        a = np.asarray(g)
        if a.dtype.kind not in NUMBER_KINDS:
            what = "None" if g is None else f"{a.dtype} values"
            raise TracerError(f"{name} returned {what} for '{p}', not real numbers (return a float array of its "
                              f"shape {shapes[p]})")
        a = a if a.dtype == np.float32 else a.astype(np.float64)  # a float32 backward keeps its dtype (tolerance)
        if list(a.shape) != shapes[p]:
            raise TracerError(f"{name} returned a gradient of shape {list(a.shape)} for '{p}', whose shape is "
                              f"{shapes[p]}")
        arrays[p] = a
    traced.graph = with_claims(traced.graph, claims_message(arrays))
    traced.note["grad"] = name
    return traced


def _call(f, traced):
    """f(*traced); a TracerError that NumPy wrapped in its own error (storing a traced value into an array
    element: "setting an array element with a sequence", with ours as the cause) is raised as itself."""
    try:
        return f(*traced)
    except TracerError:
        raise
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        while cause is not None and not isinstance(cause, TracerError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise cause.with_traceback(None) from None


def check_options(options: dict) -> dict:
    """The verification options by their one table's names (options.py); anything else is a TypeError."""
    unknown = sorted(set(options) - set(BY_NAME))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; the options are: {', '.join(BY_NAME)}")
    return {k: v for k, v in options.items() if v is not None}


def stated(report: Report, traced: Traced) -> Report:
    """The report with what check() did to the function stated: data["check"] and a line of its text; a
    loss the engine computed otherwise than f on NumPy arrays refuses it (faithful.confirm_loss)."""
    faithful.confirm_loss(traced.note["function"], report.loss, traced.loss, traced.terms,
                          report.data.get("dtype", "float64"), traced.known)
    report.data["check"] = traced.note
    line = f"checked {traced.note['function']} with respect to {', '.join(traced.parameters)}"
    if "grad" in traced.note:
        line = f"checked {traced.note['grad']}, the gradient of " + line[len("checked "):]
    if "cotangent" in traced.note:
        line += (f"; its output of shape {traced.note['output_shape']} was reduced to sum(output * c), c ~ N(0, 1) "
                 f"seeded with {traced.note['cotangent']['seed']}")
    report.text = f"{line}\n{report.text}" if report.text else line
    if "user_dtype" in traced.note:  # first: what ran in which dtype
        dtypes.with_dtypes(report, traced.note["user_dtype"]["checks"], traced.note["user_dtype"]["ran"])
    return report


def traced_for_check(f, args: tuple, wrt, grad, options: dict) -> Traced:
    """check()'s trace, in process or not: f traced, and grad's gradients claimed when grad is given."""
    traced = trace_function(f, args, wrt, seed=options.get("seed", 0))
    return traced if grad is None else claimed(grad, args, traced)


def on_server(graph, server, options: dict) -> Report:
    """The graph verified on the server at `server` (an address, or a Client kept open by its caller): the one
    remote step of every check() (this one, gradcheck_svc.check, gradcheck_client.check, the torch front end)."""
    from .client import Client

    if isinstance(server, Client):
        return server.verify(graph, **options)
    with Client(server) as client:
        return client.verify(graph, **options)


def check_with(verify, f, args: tuple, wrt, grad, options: dict) -> Report:
    """The one check(): options checked, f traced (grad's gradients claimed when given), the graph verified by
    verify(graph, options) -> Report (in process or on a server: the entry point's choice), what was done
    stated in the report."""
    options = check_options(options)
    traced = traced_for_check(f, args, wrt, grad, options)
    return stated(verify(traced.graph, options), traced)


def check(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """Trace f on args and verify its gradients (grad's, when given) on the server at `server` (an address or
    a Client). This package has no verifier of its own: without `server`, gradcheck_client.check and
    gradcheck_svc.check (the same signature) verify in process."""
    if server is None:
        raise TypeError("gradcheck_core.check_call.check verifies on a server: give server=HOST:PORT, or call "
                        "gradcheck_client.check (in process when gradcheck-svc is installed)")
    return check_with(lambda graph, opts: on_server(graph, server, opts), f, args, wrt, grad, options)


def assert_gradients(f, *args, wrt=None, grad=None, server=None, **options) -> Report:
    """check(), raising AssertionError with the text report unless every gradient verified (for pytest)."""
    return passed_or_raise(check(f, *args, wrt=wrt, grad=grad, server=server, **options))


def passed_or_raise(report: Report) -> Report:
    """assert_gradients' one rule, for every front end: the report, or AssertionError with its text."""
    if not report.passed:
        raise AssertionError(str(report))
    return report
