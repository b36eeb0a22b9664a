"""Did-you-mean hints for a name that is not one of the valid ones (difflib's nearest matches).

One helper for the client and the server (gradcheck_svc imports it), so a mistyped node, value or
JSON field reads the same wherever it is caught."""
from __future__ import annotations

SHOWN = 5  # names listed when none is close


def nearest(word: str, candidates, n: int = 3) -> list[str]:
    """Up to n of `candidates` closest to `word`, best first (difflib's ratio >= 0.6)."""
    import difflib  # (here: only a mistyped name needs it; every command imports this module)

    return difflib.get_close_matches(str(word), [str(c) for c in candidates], n=n)


def hint(word: str, candidates, n: int = 3, what: str = "names") -> str:
    """" (did you mean 'a'?)", " (did you mean 'a', 'b'?)", or, with nothing close, the first few
    `what` (" (names: 'x', 'y', ... 12 in all)"); "" when there are no candidates."""
    close = nearest(word, candidates, n)
    if close:
        return " (did you mean " + ", ".join(f"'{c}'" for c in close) + "?)"
    names = sorted(str(c) for c in candidates)
    if not names:
        return ""
    more = f", ... {len(names)} in all" if len(names) > SHOWN else ""
    return f" ({what}: " + ", ".join(f"'{c}'" for c in names[:SHOWN]) + more + ")"
