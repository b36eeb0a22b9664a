"""SIGTERM during a `verify` of several graphs, ended as Ctrl-C ends it: a CI runner's cancel sends SIGTERM, and
its default (the process killed at once) lost the reports of the graphs already verified.

Inside `sigterm_interrupts()` a SIGTERM to this process raises Terminated, a KeyboardInterrupt: every path that
cleans up after Ctrl-C (a remote call cancelled on the server, a bounded child killed and reaped) does the same
for it, and the command prints what finished (outputs/outcome.print_interrupted) and exits 143. Only the plain
verify of several graphs uses it: a finite-difference shard or merge and the batch units keep their own endings.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports it


class Terminated(KeyboardInterrupt):
    """SIGTERM while several graphs were being verified."""


@contextmanager
def sigterm_interrupts():
    """SIGTERM raises Terminated in this process while the block runs (the previous handler restored after)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return
    owner = os.getpid()

    def terminated(signum, frame):
        if os.getpid() != owner:  # a child forked meanwhile (bounded.py) ends by the signal, as it always has
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
