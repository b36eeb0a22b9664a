"""PyTorch's own gradients, verified: `check(fn_or_module, *inputs)` and a `gradcheck(fn, inputs)` drop-in with
torch.autograd.gradcheck's signature (check.py; the capture of the forward: capture.py; an op it cannot
replay, checked on its own: opaque.py). Needs torch."""
from .check import GradcheckError, check, gradcheck

__all__ = ["GradcheckError", "check", "gradcheck"]
