"""Every registered op: the engine's VJP against finite differences, on the
op's own test points (random shapes with broadcasting and size-1 axes, drawn
from its smooth domain), in float64 and float32. Parametrized over the
registry, so a new op is covered without editing this file.

The symbolic oracle is off here: with it on, the verdict would be engine vs SymPy (verify/run.py), which
test_audit_ops.py::test_audit_passes_over_the_whole_registry already checks for every op, at the same
OpDef.cases, in both dtypes (and next to kinks); SymPy's derivations were ~3/4 of this file's time.
Off, each verdict is what this file is about: the engine's VJP against finite differences."""
import numpy as np
import pytest

from gradcheck_svc.ops import all_ops
from gradcheck_svc.oracles.symbolic import SymbolicOptions
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.audit import op_graph

OPS = all_ops()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_vjp_matches_finite_differences(op, dtype, rng):
    assert op.cases is not None, f"op '{op.name}' declares no test cases"
    cases = op.cases(rng)
    assert cases, f"op '{op.name}' declares no test cases"
    for case in cases:
        shape = op_graph(op, case).specs["y"].shape
        graph = op_graph(op, case, rng.uniform(0.5, 1.5, size=shape))
        report = verify(graph, VerifyOptions(dtype=dtype, symbolic=SymbolicOptions(enabled=False)))
        assert all(p.verdict_reference == "finite_differences" for p in report.parameters)
        bad = [p.name for p in report.parameters if not p.passed]
        assert report.verdict == "pass", f"{op.name} {case.attrs} {[np.shape(x) for x in case.inputs]}: {bad}\n" \
                                         + report.to_text()
        if op.vjp is not None and graph.parameters:
            # the check is not vacuous: some gradient is non-zero
            assert any(np.any(p.gradient != 0) for p in report.parameters)
