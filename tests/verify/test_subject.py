"""Whose gradient is under test (verify/subject.py): the engine's, or the user's claims. The two subjects differ
only in the thing under test -- the references, the tolerance and the judgement are the same."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import EXAMPLES

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.ir import Claims
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.engine_run import run_engine
from gradcheck_svc.verify.subject import Claimed, EngineGradient, subject_of

OPTIONS = VerifyOptions(memory_profile=False)


@pytest.fixture(scope="module")
def seed():
    graph = load_graph(EXAMPLES / "seed.json")
    return graph, run_engine(graph, OPTIONS, graph.declared_float_dtype, profile=False).gradients


def _rows(report) -> list:
    return [(r.name, r.status, r.fd.comparison.max_abs_error, r.gradient.tolist()) for r in report.parameters]


def test_claims_equal_to_the_engines_gradient_verify_as_the_engine_does(seed):
    graph, engine = seed
    claimed = dataclasses.replace(graph, claims=Claims(gradients=dict(engine), adjoints={}))
    assert isinstance(subject_of(graph), EngineGradient) and isinstance(subject_of(claimed), Claimed)
    mine, theirs = verify(graph, OPTIONS), verify(claimed, OPTIONS)
    assert (mine.subject, theirs.subject) == ("engine", "claimed")
    assert mine.verdict == theirs.verdict == "pass"
    assert _rows(mine) == _rows(theirs)
    assert all(r.claim == "provided" and r.vs_engine.passed for r in theirs.parameters)


def test_a_parameter_without_a_claim_keeps_a_row_that_is_never_ok(seed):
    graph, engine = seed
    first, *rest = graph.parameters
    claimed = dataclasses.replace(graph, claims=Claims(gradients={p: engine[p] for p in rest}, adjoints={}))
    subject = subject_of(claimed)
    assert subject.gradients(engine)[first] is engine[first]  # drawn with the engine's, judged not provided
    report = verify(claimed, OPTIONS)
    row = next(r for r in report.parameters if r.name == first)
    assert (row.status, report.verdict) == ("not provided", "fail")
    assert f"no claimed gradient for parameter '{first}'" in " ".join(report.warnings)


def test_float32_claims_are_held_to_float32s_tolerance():
    claims = Claims(gradients={}, adjoints={}, dtype="float32")
    assert Claimed(claims).tolerance_dtype("float64") == "float32"
    assert Claimed(Claims(gradients={}, adjoints={})).tolerance_dtype("float64") == "float64"
    assert EngineGradient().tolerance_dtype("float32") == "float32"
    assert EngineGradient().witness(None, "w") is None
