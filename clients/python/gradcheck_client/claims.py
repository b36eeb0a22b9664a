"""gradcheck_client.claims is gradcheck_core.claims (the path the docs show): one module object, not a copy."""
import sys

from gradcheck_core import claims as _claims

sys.modules[__name__] = _claims
