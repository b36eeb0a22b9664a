"""PyTorch's own gradients, verified: `check(fn_or_module, *inputs)` (check.py; the capture of the forward:
capture.py; an op it cannot replay, checked on its own: opaque.py), and `gradcheck` / `gradgradcheck` with
torch.autograd's signatures and semantics (drop_in.py); `surrogate` declares a Function's backward a
deliberate surrogate (surrogate.py). Needs torch."""
from .check import check
from .drop_in import GradcheckError, gradcheck, gradgradcheck
from .surrogate import surrogate

__all__ = ["GradcheckError", "check", "gradcheck", "gradgradcheck", "surrogate"]
