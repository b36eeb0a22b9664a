"""A command's end without the interpreter's teardown: what an exit must do, and nothing more.

After a `verify` of chain_256 the interpreter spends ~0.05 s (0.1-0.15 s under load) tearing itself
down: every module's namespace cleared, the report's arrays and the op registry freed one object at a
time, a last garbage collection -- memory the kernel takes back at once when the process ends. Here the
process ends as an exit would, less that: the atexit handlers run (children killed, files closed), stdout
and stderr are flushed, then os._exit. Where that could differ from a normal exit it is not taken:
another thread still running (an exit joins it first), or a flush that fails (the interpreter says so
and exits 120).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: int | None) -> None:
    """End the process with `code` (as sys.exit(code) would: None is 0) without the interpreter's teardown."""
    if threading.active_count() > 1:  # an exit waits for the others: the usual way
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 -- the handlers an exit runs, in its order
    atexit._clear()  # noqa: SLF001 -- run once, also if the exit below is the usual one after all
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # (a closed pipe): the interpreter's own exit reports it
        sys.exit(code)
    os._exit(0 if code is None else code)
