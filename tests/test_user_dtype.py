"""The user's dtype (issue 42, item 3): a check of a function run in float32 says what ran in which dtype in its
first line and never passes on a float64 upcast alone -- the NumPy door (gradcheck_svc.check) and the torch
door (gradcheck_client.torch.check), each against the float64 references."""
from __future__ import annotations

import numpy as np
import pytest

import gradcheck_svc

X32 = np.array([0.5, -0.3, 0.2], dtype=np.float32)


def test_numpy_float32_function_flat_in_float32_does_not_pass():
    """sum((x + 1e8) - 1e8) is 0 in float32 for every small x: its float64 gradient [1, 1, 1] does not speak for
    it. The float64 check still runs (and passes: the math is right), the float32 values leave it undecided."""
    report = gradcheck_svc.check(lambda x: np.sum((x + 1e8) - 1e8), X32)
    assert report.verdict == "undecided" and not report.passed, report.text
    first = report.text.splitlines()[0]
    assert first.startswith("dtypes: the gradient check below ran in float64 on float64 copies of x (float32)")
    [entry] = report.data["dtypes"]["checks"]
    assert entry["dtype"] == "float32" and entry["verdict"] == "undecided"
    assert "(the loss 0 in float32" in entry["detail"]


def test_numpy_float32_function_that_float32_resolves_passes_saying_so():
    report = gradcheck_svc.check(lambda x: np.sum(np.tanh(x) * x), X32)
    assert report.verdict == "pass", report.text
    assert report.text.splitlines()[1].startswith("  in float32: PASS: its values follow the float64 derivative")


def test_numpy_float64_arguments_run_no_dtype_check():
    report = gradcheck_svc.check(lambda x: np.sum(np.tanh(x) * x), X32.astype(np.float64))
    assert report.verdict == "pass" and "dtypes" not in report.data
