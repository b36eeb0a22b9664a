"""A command run as its process would run it -- argv, environment, working directory, stdin/stdout/stderr
pipes, exit status -- in a forked child of the test process instead of a fresh interpreter.

`python -m gradcheck_svc.cli verify g.json` spends ~1 s starting Python and importing NumPy, SymPy and the
service before it verifies a small graph in milliseconds; the suite ran hundreds of such commands and spent
most of its time there. A fork of a test process that has imported them (`warm()`) starts in milliseconds
and runs the same `main(argv)` with the same environment, files and pipes, so a test of what a command
prints, writes and exits with proves the same thing. What only a real process proves -- the entry point
script, import-time behaviour, signals from outside, a command talking gRPC (gRPC is not supported in a
fork of a process that has used it: `run` starts a real process for `--server`) -- keeps `subprocess` (tests/client/test_cli_help.py,
tests/server/test_server_lifecycle.py, ...).

The child is made to look like a fresh process where a test process differs: Python's default warning
filters, no logging handlers (pytest installs its own), SIGINT/SIGTERM/SIGPIPE handled as Python starts, new
sys.stdin/stdout/stderr on the pipes, and sys.argv as `python -m MODULE` sets it.
"""
from __future__ import annotations

import faulthandler
import gc
import importlib
import io
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
import warnings

# Python 3.11's default filters in a release build (what a fresh `python -m` starts with)
_DEFAULT_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                    ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                    ("ignore", ResourceWarning, None))
_warmed = False


def warm() -> None:
    """Import what a verification imports lazily (SymPy, the oracles), once per test process, by verifying the
    smallest example: every forked command after it starts with them loaded."""
    global _warmed
    if not _warmed:
        from gradcheck_client import load_graph
        from gradcheck_core.request_message import make_request
        from gradcheck_svc.request import run_request

        from grpc_helpers import EXAMPLES

        run_request(make_request(load_graph(EXAMPLES / "seed.json"), ""))
        _warmed = True


class Forked:
    """subprocess.Popen's shape for `python -m module *args` run in a fork: communicate(input, timeout),
    returncode, pid, poll(), send_signal(sig), kill()."""

    def __init__(self, module: str, args, env: dict | None = None, cwd=None, timeout: float | None = None):
        warm()
        self.args = [sys.executable, "-m", module, *map(str, args)]
        self.returncode = None
        ins, outs, errs = os.pipe(), os.pipe(), os.pipe()
        sys.stdout.flush(), sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            _child(module, [str(a) for a in args], env, cwd, timeout, (ins[0], outs[1], errs[1]),
                   (ins[1], outs[0], errs[0]))
        for fd in (ins[0], outs[1], errs[1]):
            os.close(fd)
        self._stdin, self._stdout, self._stderr = ins[1], outs[0], errs[0]

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once the child has ended; subprocess.TimeoutExpired (the child killed) past timeout."""
        if input:
            os.write(self._stdin, input.encode())  # small inputs only (a pipe's buffer)
        os.close(self._stdin)
        chunks = {self._stdout: [], self._stderr: []}
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.kill()
                    self.wait()
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
        self.wait()
        return tuple(b"".join(chunks[fd]).decode("utf-8", "replace") for fd in (self._stdout, self._stderr))

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def poll(self) -> int | None:
        """The exit status once the child has ended, else None (without waiting)."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def run(module: str, *args, env: dict | None = None, cwd=None, input: str | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """subprocess.run([python, -m, module, *args], capture_output=True, text=True, ...)'s result, forked -- or
    run as a real process when the command talks gRPC (`--server`): gRPC in a fork of a process that has used
    it is not supported (tests/conftest.py turns gRPC's fork support off)."""
    if any(str(a) == "--server" or str(a).startswith("--server=") for a in args):
        return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                              env=env, cwd=cwd, input=input, timeout=timeout)
    proc = Forked(module, args, env=env, cwd=cwd, timeout=timeout)
    stdout, stderr = proc.communicate(input, timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _child(module, args, env, cwd, timeout, ends, parent_ends) -> None:
    code = 1
    stdin_fd, stdout_fd, stderr_fd = ends
    gc.freeze()  # the test process's objects are never collected here (no finalizer of its gRPC garbage runs)
    try:
        for fd in parent_ends:
            os.close(fd)
        os.dup2(stdin_fd, 0), os.dup2(stdout_fd, 1), os.dup2(stderr_fd, 2)
        for fd in (stdin_fd, stdout_fd, stderr_fd):
            os.close(fd)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        _fresh_process_state()
        if timeout is not None:  # a child stuck past its time: every thread's stack on its stderr, then it ends
            faulthandler.dump_traceback_later(max(1.0, timeout - 3), exit=True)
        sys.argv = [module, *args]
        code = importlib.import_module(module).main(args)
    except SystemExit as exc:  # as the interpreter ends on it: an int, None (0), or a message and 1
        code = exc.code
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # what an uncaught exception does to a process: its traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush(), sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code or 0)


def _fresh_process_state() -> None:
    warnings.resetwarnings()
    for action, category, module in reversed(_DEFAULT_FILTERS):
        warnings.filterwarnings(action, category=category, module=module or "")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    signal.signal(signal.SIGINT, signal.default_int_handler)
