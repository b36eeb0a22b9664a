"""`gradcheck-svc audit-ops`: every registered op's VJP against SymPy's
derivative -- passes over the whole registry, fails on a broken VJP or on an
op without a symbolic form."""
import dataclasses

import numpy as np

from gradcheck_svc.cli import main
from gradcheck_svc.ops import REGISTRY, all_ops
from gradcheck_svc.ops.base import FLOAT, REALS, Case, OpDef, Spec, save_nothing
from gradcheck_svc.verify.audit import audit_ops, near_kink_cases


def test_audit_passes_over_the_whole_registry():
    rows = audit_ops()
    assert {r.op for r in rows} == set(REGISTRY)
    failed = [f"{r.op} {r.points} {r.dtype}: {r.detail}" for r in rows if not r.passed]
    assert not failed, failed
    assert {r.dtype for r in rows} == {"float64", "float32"}
    # every op with declared kinks was also audited next to them
    kinked = {op.name for op in all_ops() if op.kinks}
    assert kinked and kinked == {r.op for r in rows if r.points == "near kink"}


def test_near_kink_points_are_near_but_not_at(rng):
    op = REGISTRY["clip"]
    for case in near_kink_cases(op, op.cases(rng), rng):
        x = case.inputs[0]
        d = np.min([np.abs(x - p) for p in (-0.5, 0.7)], axis=0)
        assert np.all(d > 0) and np.all(d <= 1e-3)


def _broken_mul(xp, g, s, **_):
    return g * s[1], g * s[0] * 1.001  # a 0.1% error in d/db


def test_audit_fails_on_a_broken_vjp(monkeypatch, capsys):
    monkeypatch.setitem(REGISTRY, "mul", dataclasses.replace(REGISTRY["mul"], vjp=_broken_mul))
    rows = audit_ops(["mul"])
    assert rows and not any(r.passed for r in rows if r.dtype == "float64")
    assert "d/din1" in rows[0].detail
    assert main(["audit-ops", "--op", "mul"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_audit_fails_on_an_op_without_symbolic_form(monkeypatch):
    op = OpDef(name="tmp_cumsum", forward=lambda xp, x: xp.cumsum(x, axis=-1),
               vjp=lambda xp, g, s: (xp.cumsum(g[..., ::-1], axis=-1)[..., ::-1],),
               infer=lambda node, specs, attrs: (Spec(specs[0].shape, FLOAT), attrs), arity=1,
               input_kinds=(FLOAT,), save=save_nothing, cases=lambda rng: [Case([REALS.sample(rng, (4,))])])
    monkeypatch.setitem(REGISTRY, "tmp_cumsum", op)
    rows = audit_ops(["tmp_cumsum"])
    assert rows and not any(r.passed for r in rows)
    assert "no symbolic reference" in rows[0].detail and "cumsum" in rows[0].detail


def test_cli_audit_one_op(capsys):
    assert main(["audit-ops", "--op", "relu"]) == 0
    out = capsys.readouterr().out
    assert "near kink" in out and "4 rows, 0 failed" in out
    assert main(["audit-ops", "--op", "nope"]) == 2
