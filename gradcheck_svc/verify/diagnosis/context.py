"""One verification's state (Run): what verify/run.py passes through its stages and every analysis of
the diagnosis reads -- the graph, the options, the engine's dtype and run, the references (the
finite-difference and symbolic oracles), the tolerance and the per-parameter results; and small
helpers that describe values at an index. `Context` is the diagnosis's name for the same object.

The "expected" value of a saved tensor comes from a clean, out-of-place forward in the
engine's dtype, computed only when something was found.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...backend import get_backend
from ...engine import forward, prepare_feeds
from ...engine.program import Program, Step
from ...graph.ir import Graph
from ...oracles.fd_modes import FDMode
from ...oracles.finite_diff import FiniteDifferences
from ..compare import Tolerance, bounds
from ..engine_run import EngineRun, run_engine
from ..findings import parameters_through
from ..options import VerifyOptions
from ..parameter_result import ParameterResult


EVIDENCE = 8  # failing elements localization checks one by one


@dataclass
class Run:
    """Filled stage by stage (verify/run.py): the engine's run, then the references, the tolerance and the
    rows; the diagnosis reads it whole."""
    graph: Graph
    options: VerifyOptions
    dtype: str
    engine: EngineRun | None = None
    results: list[ParameterResult] | None = None
    fd: FiniteDifferences | None = None  # the finite-difference oracle
    tol: Tolerance | None = None  # what the gradient under test is held to
    subject: object = None  # whose gradient is under test and the findings speak of (verify/subject.py)
    symbolic: object = None  # the symbolic oracle's gradients (oracles/symbolic.py)
    custom: list | None = None  # the checks of the graph's user derivatives (custom_ops.py)
    # the kink notes (kinks.py) another process of a split made as this one would where every row passes and
    # nothing else named a kink (fd_shards.py); None: made here
    kink_notes: list | None = None
    _clean: dict | None = None
    _traced: EngineRun | None = None
    _params_of: dict = field(default_factory=dict)
    _evidence: dict = field(default_factory=dict)  # (name, most) -> evidence(): the sweep asks once per node

    @property
    def whose(self) -> str:
        """"the engine's" / "the claimed", before "gradient" in a finding's words."""
        return self.subject.whose

    @property
    def program(self) -> Program:
        return self.engine.program

    def clean(self) -> dict:
        """Every value from an out-of-place forward in the engine's dtype, host arrays."""
        if self._clean is None:
            backend = get_backend(self.options.device)
            tape = forward(self.program, backend, prepare_feeds(self.program, backend), grad=False,
                           keep_values=True)
            self._clean = {k: np.asarray(backend.to_host(v)) for k, v in tape.values.items()}
        return self._clean

    def traced(self) -> EngineRun:
        """The engine run again (same faults and options) keeping every adjoint and vjp contribution."""
        if self._traced is None:
            self._traced = run_engine(self.graph, self.options, self.dtype, keep_adjoints=True, profile=False)
        return self._traced

    def params_through(self, node: str) -> list[str]:
        """Parameters whose gradient flows through `node` (cached per node)."""
        if node not in self._params_of:
            self._params_of[node] = parameters_through(self.program, node)
        return self._params_of[node]

    def evidence(self, name: str, most: int = EVIDENCE) -> np.ndarray | None:
        """Flat indices of the elements of parameter `name` its own element-wise check found beyond their
        bound, worst first (at most `most`); None when there are none (passed, or not checked element by
        element). Localization checks these elements themselves: a few random projections of a large
        tensor, where one element moves a value by e / sqrt(n), would lose them."""
        if (name, most) not in self._evidence:
            self._evidence[name, most] = self._evidence_of(name, most)
        return self._evidence[name, most]

    def _evidence_of(self, name: str, most: int) -> np.ndarray | None:
        r = next((r for r in self.results if r.name == name), None)
        if r is None or r.fd.mode is not FDMode.FULL or r.passed:
            return None
        g, ref = r.gradient.reshape(-1), np.asarray(r.fd.reference, dtype=np.float64).reshape(-1)
        with np.errstate(all="ignore"):
            ratio = np.nan_to_num(np.abs(g - ref) / bounds(ref, self.tol, r.fd.error.reshape(-1)), nan=np.inf)
        ratio[np.asarray(r.fd.undecidable, dtype=np.intp)] = 0.0
        over = np.flatnonzero(ratio > 1)
        return over[np.argsort(-ratio[over], kind="stable")][:most] if over.size else None

    def op_of(self, name: str) -> str:
        step = self.program.by_name.get(name)
        return step.op.name if step is not None else "input"


Context = Run  # the diagnosis's name for it: the analyses take a `ctx`


def inputs_at(step: Step, values: dict, idx: tuple) -> str:
    """'x[1] = 0, y = 2': each input's value at an output index (inputs broadcast to the output)."""
    shape = np.shape(values[step.name])
    parts = []
    for n in dict.fromkeys(step.inputs):
        v = np.asarray(values[n])
        try:
            e = np.broadcast_to(v, shape)[idx] if v.ndim <= len(shape) else None
        except ValueError:
            e = None
        if e is None or v.dtype.kind not in "fiub":
            parts.append(f"'{n}'")
        else:
            parts.append(f"{n}{list(idx) if v.size > 1 else ''} = {float(e):g}")
    return ", ".join(parts)
