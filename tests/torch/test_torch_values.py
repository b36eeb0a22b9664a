"""gradcheck_client.torch: the reference is the function's values (issue 42, item 2). A path torch's autograd
does not see -- .detach(), .item(), .data, torch.no_grad, a .numpy() round trip -- fails the check, as it fails
torch.autograd.gradcheck, naming the line where torch's graph was cut; each twin without the cut passes both.
A hook on a module's parameter runs as registered (the module is not copied), so its effect is seen."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)

from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError  # noqa: E402

from gradcheck_client.torch import check, gradcheck  # noqa: E402

X = torch.tensor([0.7, -1.3, 0.4, -0.2, 1.1], dtype=torch.float64)


def _line(fn, marker: str) -> str:
    """FILE:LINE of the line of fn holding marker."""
    lines, first = inspect.getsourcelines(fn)
    [k] = [i for i, line in enumerate(lines) if marker in line]
    return f"{inspect.getsourcefile(fn)}:{first + k}"


def cut_detach(x):
    return (x * torch.sin(x).detach()).sum()  # CUT


def cut_item(x):
    return (x * x.sum().item()).sum()  # CUT


def cut_data(x):
    return (x * x.data).sum()  # CUT


def cut_no_grad(x):
    with torch.no_grad():
        s = torch.cos(x)  # CUT
    return (x * s).sum()


def cut_numpy(x):
    return (x * torch.from_numpy(np.cos(x.detach().numpy()))).sum()  # CUT


TWINS = {  # the cut, and its twin whose values are the same function with the path seen
    "detach": (cut_detach, lambda x: (x * torch.sin(x)).sum(), "a .detach()/.data alias read"),
    "item": (cut_item, lambda x: (x * x.sum()).sum(), ".item()"),
    "data": (cut_data, lambda x: (x * x).sum(), "a .detach()/.data alias read"),
    "no_grad": (cut_no_grad, lambda x: (x * torch.cos(x)).sum(), "under torch.no_grad"),
    "numpy": (cut_numpy, lambda x: (x * torch.cos(x)).sum(), ".numpy()"),
}


@pytest.mark.parametrize("name", list(TWINS))
def test_a_path_autograd_does_not_see_fails_as_in_torch_naming_the_line(name):
    cut, twin, what = TWINS[name]
    with pytest.raises(TorchGradcheckError):  # torch's numerical Jacobian sees the path
        torch.autograd.gradcheck(cut, (X.clone().requires_grad_(),))
    report = check(cut, X)
    assert report.verdict == "fail", report.text
    entry = report.data["check"]["function_values"]
    assert entry["verdict"] == "fail"
    assert any(what in c for c in entry["cuts"] if _line(cut, "# CUT") in c), entry["cuts"]
    assert "torch's graph was cut at" in report.text and _line(cut, "# CUT") in report.text
    assert torch.autograd.gradcheck(twin, (X.clone().requires_grad_(),))
    right = check(twin, X)
    assert right.verdict == "pass" and right.data["check"]["function_values"]["verdict"] == "pass", right.text


@pytest.mark.parametrize("name", ["detach", "numpy"])
def test_the_drop_in_names_the_cut_after_torchs_jacobian_check_fails(name):
    # the drop-in skips its own screen of the values where torch's Jacobian check compared them and passed; where
    # that check fails, the screen runs and the message names the line where torch's graph was cut
    cut, twin, what = TWINS[name]
    with pytest.raises(TorchGradcheckError) as caught:
        gradcheck(cut, (X.clone().requires_grad_(),))
    message = str(caught.value)
    assert "torch's graph was cut at" in message and _line(cut, "# CUT") in message, message
    assert "Jacobian mismatch" in message  # torch's own failure follows ours
    assert gradcheck(twin, (X.clone().requires_grad_(),)) is True


def test_a_hook_on_a_parameter_runs_as_registered_and_the_module_is_left_as_it_was():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    assert check(model, x).verdict == "pass"
    handle = model[0].weight.register_hook(lambda g: g * 1.5)  # weight.grad 1.5 times the truth
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = check(model, x)
    assert report.verdict == "fail", report.text
    assert {p.name: p.status for p in report.parameters}["0.weight"].startswith("FAIL")
    assert {p.name: p.status for p in report.parameters}["2.weight"] == "ok"
    # the user's module is untouched: its float32 data, no .grad left behind, the hook still registered
    assert all(p.dtype == torch.float32 and p.grad is None and torch.equal(p, before[n])
               for n, p in model.named_parameters())
    w = model[0].weight.detach().double().requires_grad_()
    w.register_hook(lambda g: g * 1.5)  # torch's gradcheck sees such a hook too
    with pytest.raises(TorchGradcheckError):
        torch.autograd.gradcheck(lambda w: torch.nn.functional.linear(x.double(), w).tanh(), (w,))
    handle.remove()
    assert check(model, x).verdict == "pass"


def test_an_output_whose_shape_depends_on_the_values_is_undecided_never_passed():
    # the captured graph fixes the mask (a comparison is a constant) and agrees with torch's gradient; the
    # values re-run beside the input change the output's shape, so no difference exists: undecided
    x = torch.tensor([0.2, -0.5, 1e-9], dtype=torch.float64, requires_grad=True)
    report = check(lambda x: x[x > 0].sin(), x)
    assert report.verdict == "undecided"
    assert "the output's shape depends on the input's values" in report.text
