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


torch = pytest.importorskip("torch")  # the torch door's cases below (torch is the client's optional extra)
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck_client.torch import GradcheckError, gradcheck  # noqa: E402
from gradcheck_client.torch import check as torch_check  # noqa: E402


class SoftPlus(torch.autograd.Function):
    """softplus with a backward that overflows in float32 only: exp(100) is inf there (inf / inf = nan), 2.7e43
    in float64."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * torch.exp(x) / (1 + torch.exp(x))


SOFTPLUS_X = torch.tensor([0.5, -1.0, 100.0])


def test_a_float32_only_overflow_in_a_backward_fails_as_in_torch():
    with pytest.raises(TorchGradcheckError):  # torch's gradcheck at the user's float32
        torch.autograd.gradcheck(SoftPlus.apply, (SOFTPLUS_X.clone().requires_grad_(),))
    report = torch_check(lambda x: SoftPlus.apply(x).sum(), SOFTPLUS_X)
    assert report.verdict == "fail", report.text
    first = report.text.splitlines()[0]
    assert first.startswith("dtypes: the check below ran in float64 (upcast: x); torch's gradient and the function's "
                            "values were also run in float32") and "verdict FAIL" in first
    gradient, values = report.data["dtypes"]["checks"]
    assert gradient["verdict"] == "fail" and "worst element 2: nan" in gradient["detail"]
    assert values["verdict"] == "pass"
    # in float64 the same Function is right: both tools pass it
    x64 = SOFTPLUS_X.double()
    assert torch.autograd.gradcheck(SoftPlus.apply, (x64.clone().requires_grad_(),))
    right = torch_check(lambda x: SoftPlus.apply(x).sum(), x64)
    assert right.verdict == "pass" and "dtypes" not in right.data


def test_torch_float32_function_flat_in_float32_does_not_pass_even_where_torchs_loose_tolerance_passes_it():
    """sum((x + 1e8) - 1e8) is 0 in float32 for every x: undecided by check(); torch's gradcheck passes it at atol=2,
    a tolerance not below its gradient 1 (a constant passes it too), so the drop-in says nothing more: undecided,
    a GradcheckError -- stricter than torch, never a pass."""
    flat = (lambda x: ((x + 1e8) - 1e8).sum())
    report = torch_check(flat, torch.from_numpy(X32))
    assert report.verdict == "undecided", report.text
    assert [e["verdict"] for e in report.data["dtypes"]["checks"]] == ["pass", "undecided"]
    x = torch.from_numpy(X32).requires_grad_()
    assert torch.autograd.gradcheck(flat, (x,), atol=2) is True
    with pytest.raises(GradcheckError, match=r"verdict UNDECIDED[^\n]*\n.*\n  in float32: UNDECIDED: its values do not "
                                             r"resolve its derivative"):
        gradcheck(flat, (x,), atol=2)


def test_the_drop_in_at_a_tolerance_below_every_gradient_lets_torchs_check_decide_the_values_in_float16():
    """2 t in float16: its rounding alone leaves its values undecided; torch's Jacobian check of those values passing
    at atol + rtol |J| below every nonzero |J| (dtypes._separated) decides them: True, as torch's. A gradient the
    tolerance does not separate, beside one it does (the flat float32 term at atol=2), leaves it undecided."""
    x16 = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float16, requires_grad=True)
    loose = {"eps": 1e-2, "atol": 0.1, "rtol": 0.1}
    assert torch.autograd.gradcheck(lambda t: t * 2, (x16,), **loose) is True
    assert gradcheck(lambda t: t * 2, (x16,), **loose) is True
    assert torch_check(lambda t: t * 2, x16.detach()).verdict == "undecided"  # without torch's check
    x = torch.from_numpy(X32).requires_grad_()
    partly_flat = (lambda x: 100 * x[0] + ((x[1] + 1e8) - 1e8) + 50 * x[2])
    assert torch.autograd.gradcheck(partly_flat, (x,), atol=2, eps=1e-3) is True
    with pytest.raises(GradcheckError, match=r"\n  in float32: UNDECIDED: its values do not resolve"):
        gradcheck(partly_flat, (x,), atol=2, eps=1e-3)


def test_a_float32_module_passes_in_both_dtypes_and_is_left_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = torch_check(model, torch.randn(5, 3))
    assert report.verdict == "pass", report.text
    assert [e["verdict"] for e in report.data["dtypes"]["checks"]] == ["pass", "pass"]
    assert all(p.dtype == torch.float32 and p.grad is None and torch.equal(p, before[n])
               for n, p in model.named_parameters())
