"""Is the user's hand-written derivative of an `expr` node right?

For every expr node carrying a `grad`, each user derivative is compared with
SymPy's derivative of the node's formula:
- numerically, in 40-digit mpmath, at the node's input values in this graph
  (every element up to MAX_POINTS) and at RANDOM_POINTS random points in
  [-3, 3] (points where SymPy's derivative is not a finite real are skipped).
  Any disagreement beyond 1e-10 relative is a counterexample: matches = false.
- symbolically, by sympy.simplify of the difference, under a time budget
  (simplify has no time limit of its own and can run for minutes). On the main
  thread (a server worker, the CLI) it runs right here, stopped by an interval
  timer: no process to start (~0.5 s saved per expr verification, see
  BENCHMARKS.md) and none that could outlive the request. Elsewhere (a library
  caller's thread) it runs in a child process that is killed after
  `timeout_s`, is limited in memory and dies with its parent (PR_SET_PDEATHSIG);
  the child receives the SymPy tree pickled, never request text.
user_grad_matches is true when the difference simplifies to 0 and no
counterexample was found, false on a counterexample, null when the numbers
agree but simplification did not reach 0 within its time (inconclusive).
"""
from __future__ import annotations

import ctypes
import pickle
import signal
import sys
from dataclasses import dataclass, field

import numpy as np

from ..alarm import alarm, timer_free
from ..graph.ir import Graph
from ..ops.expr import ExprProgram

MAX_POINTS = 2000
RANDOM_POINTS = 32
REL_TOL = 1e-10
MEMORY_LIMIT = 2 * 2**30

_SIMPLIFY = r"""
import pickle, resource, sys
try:
    resource.setrlimit(resource.RLIMIT_AS, (%d, %d))
except (ValueError, OSError):
    pass
import sympy
diffs = pickle.loads(sys.stdin.buffer.read())
sys.stdout.write(" ".join("zero" if sympy.simplify(d) == 0 else "nonzero" for d in diffs))
""" % (MEMORY_LIMIT, MEMORY_LIMIT)


@dataclass
class CustomOpCheck:
    node: str
    inputs: list
    args: list
    formula: str
    user_grad: dict | None
    user_grad_matches: bool | None
    detail: str
    per_input: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"node": self.node, "inputs": self.inputs, "args": self.args, "formula": self.formula,
                "user_grad": self.user_grad, "user_grad_matches": self.user_grad_matches, "detail": self.detail,
                "per_input": self.per_input}


class _OutOfTime(BaseException):  # no `except Exception` inside SymPy may swallow it
    pass


def _simplify_here(diffs: list, timeout_s: float) -> list[str]:
    import sympy

    out = []
    try:
        with alarm(timeout_s, _OutOfTime):
            for d in diffs:
                out.append("zero" if sympy.simplify(d) == 0 else "nonzero")
    except _OutOfTime:
        out += ["timeout"] * (len(diffs) - len(out))
    except (RecursionError, MemoryError, ValueError, TypeError, ArithmeticError):
        out += ["error"] * (len(diffs) - len(out))
    return out


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def simplifies_to_zero(diffs: list, timeout_s: float) -> list[str]:
    """'zero' | 'nonzero' | 'timeout' | 'error' per expression."""
    if all(d == 0 for d in diffs):
        return ["zero"] * len(diffs)
    if timer_free():
        return _simplify_here(diffs, timeout_s)
    import subprocess  # (here: a graph without a custom op's derivative does not import it, ~3 ms a command)

    try:
        done = subprocess.run([sys.executable, "-I", "-c", _SIMPLIFY], input=pickle.dumps(diffs),
                              capture_output=True, timeout=timeout_s, check=False,
                              preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except subprocess.TimeoutExpired:
        return ["timeout"] * len(diffs)
    words = done.stdout.decode(errors="replace").split()
    return words if done.returncode == 0 and len(words) == len(diffs) else ["error"] * len(diffs)


def _node_points(program: ExprProgram, node, values, ctx):
    """Envs (symbol -> mpf) at the node's input values in this graph, or [] if unknown."""
    if values is None or any(n not in values for n in node.inputs):
        return []
    arrays = [np.asarray(values[n], dtype=object) for n in node.inputs]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    flat = [np.broadcast_to(a, shape).reshape(-1) for a in arrays]
    n = flat[0].size if flat else 0
    picks = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).astype(int)) if n else []
    return [{s: ctx.mpf(f[i]) if not isinstance(f[i], ctx.mpf) else f[i] for s, f in zip(program.symbols, flat)}
            for i in picks]


def _counterexample(ev, user, ref, envs, names, where):
    ctx = ev.ctx
    for env in envs:
        r = ev.value(ref, env, {})
        if not ctx.isfinite(r):
            continue
        u = ev.value(user, env, {})
        if not ctx.isfinite(u) or abs(u - r) > REL_TOL * (1 + abs(r)):
            at = ", ".join(f"{n}={float(v):.6g}" for n, v in zip(names, env.values()))
            return f"user {float(u):.10g} vs SymPy {float(r):.10g} at {at} ({where})"
    return None


def check_custom_ops(graph: Graph, values: dict | None, timeout_s: float = 10.0) -> list[CustomOpCheck]:
    """values: the graph's forward values by name (mpf or float64 arrays), or None."""
    out = []
    if not any(isinstance(n.attrs.get("program"), ExprProgram) for n in graph.nodes):
        return out  # no expr node: no mpmath context to build
    from ..oracles.mp_eval import MpEvaluator, make_context  # SymPy and mpmath: only when there is an expr node

    ctx = make_context(40)
    ev = MpEvaluator(ctx)
    rng = np.random.default_rng(0)
    for node in graph.nodes:
        program = node.attrs.get("program")
        if not isinstance(program, ExprProgram):
            continue
        entry = CustomOpCheck(node.name, list(node.inputs), list(program.names), program.formula,
                              dict(program.user_grad_text) or None, None, "")
        out.append(entry)
        if not program.user_grads:
            entry.detail = "no user derivative: the engine uses SymPy's"
            continue
        graph_envs = _node_points(program, node, values, ctx)
        random_envs = [{s: ctx.mpf(float(v)) for s, v in zip(program.symbols, rng.uniform(-3, 3, len(program.names)))}
                       for _ in range(RANDOM_POINTS)]
        ks = [program.names.index(n) for n in program.user_grads]
        bad, unproven = [], []
        for k in ks:  # numbers first: a counterexample settles it without simplification
            name = program.names[k]
            user, ref = program.user_grads[name], program.sympy_grad(k)
            cx = (_counterexample(ev, user, ref, graph_envs, program.names, "this graph's values")
                  or _counterexample(ev, user, ref, random_envs, program.names, "a random point"))
            entry.per_input[name] = {"sympy_grad": str(ref), "counterexample": cx, "symbolic": None}
            if cx:
                bad.append(f"d/d{name}: {cx}")
            else:
                unproven.append(k)
        verdicts = simplifies_to_zero([program.user_grads[program.names[k]] - program.sympy_grad(k)
                                       for k in unproven], timeout_s) if unproven else []
        inconclusive = []
        for k, verdict in zip(unproven, verdicts):
            name = program.names[k]
            entry.per_input[name]["symbolic"] = {"zero": "equal", "nonzero": "not shown equal",
                                                 "timeout": "timed out", "error": "simplification failed"}[verdict]
            if verdict != "zero":
                inconclusive.append(name)
        points = f"{len(graph_envs)} graph point(s) and {RANDOM_POINTS} random points"
        if bad:
            entry.user_grad_matches = False
            entry.detail = "user derivative is wrong: " + "; ".join(bad)
        elif inconclusive:
            entry.detail = (f"numerically equal at {points}; simplification did not show "
                            f"d/d{', d/d'.join(inconclusive)} equal to SymPy's within {timeout_s:g} s")
        else:
            entry.user_grad_matches = True
            entry.detail = f"equal to SymPy's derivative (simplified difference is 0; agrees at {points})"
    return out
