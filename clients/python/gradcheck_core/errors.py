"""The one error family, with a distinct name for each of the two opposite meanings.

- InvalidInput: the request cannot be verified as given -- a bad graph, option, file or formula, or a
  request over a limit. One line naming the node, field or file; exit 2, gRPC INVALID_ARGUMENT (or the
  limit's status). The service's user errors (gradcheck_svc.errors.GradcheckError and its subclasses),
  the client's file and flag errors (GraphFileError, ClaimsFileError, OnnxFileError, OnnxFlagError)
  and the tracer's refusals (TracerError) are all InvalidInput.
- GradientsNotVerified: the verification ran and a gradient is wrong (or undecided where a verdict was
  demanded); exit 1. Report.raise_for_mismatch's GradientMismatch and the torch front end's
  gradcheck_client.torch.GradcheckError (torch.autograd.gradcheck's GradcheckError) are this one.

The two public names both called GradcheckError keep their meanings for the users who catch them:
gradcheck_svc.errors.GradcheckError is InvalidInput, gradcheck_client.torch.GradcheckError is
GradientsNotVerified. Catch InvalidInput / GradientsNotVerified to say which is meant.
"""
from __future__ import annotations

__all__ = ["GradcheckProblem", "GradientsNotVerified", "InvalidInput"]


class GradcheckProblem(Exception):
    """Either of the two below; catch one of them, not this, to know which outcome it is."""


class InvalidInput(GradcheckProblem):
    """The input cannot be verified as given (exit 2, INVALID_ARGUMENT): never a verdict on gradients."""


class GradientsNotVerified(GradcheckProblem):
    """The gradients were checked and did not verify (exit 1): the input itself was fine."""
