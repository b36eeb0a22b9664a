"""`gradcheck verify G G G | head`: a reader that stops reading ends the printing quietly, not the command.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises BrokenPipeError: from the middle
of printing the outcomes it would end the command in a traceback with exit 1 ("gradients did not verify").
Here stdout becomes a stream that, from its first broken write on, sends what follows to the null device:
the command goes on (its report files are still written) and exits with its verdict's code. Dying by
SIGPIPE's default instead (as `gradcheck-svc ops | head` does) would lose both.
"""
from __future__ import annotations

import os
import sys


class _QuietStdout:
    """sys.stdout as it was, until a write or flush meets a closed pipe; then nothing more is written."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def _closed_pipe(self) -> None:
        self.broken = True
        try:  # the interpreter flushes stdout at exit: onto the null device, not the closed pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed_pipe()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed_pipe()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def quiet_stdout() -> None:
    """Install the quiet stdout (once)."""
    if not isinstance(sys.stdout, _QuietStdout) and sys.stdout is not None:
        sys.stdout = _QuietStdout(sys.stdout)
