"""How to install an optional extra, said one way wherever one is missing.

The service is not published on any package index (installing the extra of a package by its name,
gradcheck-svc, would fetch whatever someone registered under it): extras install from a checkout."""
from __future__ import annotations


def install_hint(extra: str) -> str:
    """The command that adds `extra`, run in a gradcheck checkout."""
    return f"pip install '.[{extra}]' in a gradcheck checkout (gradcheck-svc is not on a package index)"
