"""In-process work under a hard time limit: a child process, killed at the limit, as the server's workers are.

A signal handler cannot stop one long C call (an 8-operand einsum, a large folded MatMul): Python runs
it only when the call returns. Killing a process stops anything, so the in-process commands
(`gradcheck-svc verify`, `plan-memory`, `gradcheck verify` without a server) run each graph's work in a
child and kill it at `max_request_seconds` (`--timeout`), like server/pool.py does with a worker.

Each call forks its own child, so the child starts with every module imported here and with this
process's state as it is at the call (a fork, not a fresh interpreter: milliseconds). A child kept for
later calls would not: an op registered, a module patched or an option set after its fork would be
invisible to it -- a verification of another program than the caller's. What a verification imports
lazily is imported here first (request.preload), so each child starts warm. A call that runs past its
limit kills its child (SIGKILL) and raises the limit's TimeLimitError. The parent only waits on a pipe: the limit holds whatever the child is doing, and nothing
the child raises can race with it. Where there is no fork (Windows), the work runs here under the
signal-based limits.request_time_limit instead.
"""
from __future__ import annotations

import atexit
import gc
import os
import pickle
import select
import signal
import sys
import threading
import time


class WorkerDied(Exception):
    """The process running a request exited before answering (server/pool.py's and ours)."""


def describe_exit(code: int | None) -> str:
    """'killed by SIGKILL', 'exited with status 3': a child's end, from its exit code (negative: a signal)."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class _End:
    """One end of the parent's and child's duplex channel, over two OS pipes: pickled objects, each framed by
    its length -- what multiprocessing's Pipe gives, without importing multiprocessing (~10 ms of the
    command's start, socket and tempfile with it). recv raises EOFError once the other end has gone; send,
    BrokenPipeError."""

    def __init__(self, read_fd: int, write_fd: int):
        self.fds = (read_fd, write_fd)

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        for chunk in (len(data).to_bytes(8, "little"), data):
            view = memoryview(chunk)
            while view:
                view = view[os.write(self.fds[1], view):]

    def recv(self):
        return pickle.loads(self._read(int.from_bytes(self._read(8), "little")))

    def _read(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self.fds[0], min(n, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def poll(self, timeout: float) -> bool:
        """Whether something (an object, or the other end's close) can be read within `timeout` seconds."""
        poller = select.poll()
        poller.register(self.fds[0], select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000) + 1)))

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:  # closed already
                pass
        self.fds = (-1, -1)


def _channel() -> tuple[_End, _End]:
    """(the parent's end, the child's end); the descriptors are not inherited by an exec."""
    down, up = os.pipe(), os.pipe()
    return _End(up[0], down[1]), _End(down[0], up[1])


def _portable(exc: BaseException) -> Exception:
    """`exc` as it can cross the pipe: itself when it pickles (the user errors, MemoryError), else an
    internal fault's type and text -- also a BaseException of the child's own (an alarm's private
    exception that escaped), which must not end the command as a traceback."""
    try:
        if isinstance(exc, Exception):
            pickle.loads(pickle.dumps(exc))
            return exc
    except Exception:
        pass
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def _die_with(parent: int) -> None:
    """Linux: be killed when the parent dies (a SIGTERM'd or killed command leaves no orphan computing for
    hours); elsewhere the closed pipe ends the child after its current call."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)


def _serve(conn, parent: int) -> None:
    """The child: run (fn, args, kwargs, events) calls until the pipe closes; never returns."""
    # the parent's objects are the parent's: never collected here, so no finalizer of the parent's garbage
    # runs in this fork (a gRPC object's, collected in a child of a process that had used gRPC, spun forever)
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it kills us
    _die_with(parent)
    code = 0
    try:
        while True:
            try:
                fn, args, kwargs, events = conn.recv()
            except (EOFError, OSError):
                break
            if events:  # progress goes back to the parent, which draws it
                kwargs = dict(kwargs, on_phase=lambda phase: conn.send(("phase", phase)))
            try:
                out = ("ok", fn(*args, **kwargs))
            except BaseException as exc:  # everything goes back: the parent decides what it means
                out = ("raise", _portable(exc))
            try:
                conn.send(out)
            except Exception as exc:  # a result that does not pickle: an internal fault, said as one
                conn.send(("raise", RuntimeError(f"cannot return the result: {type(exc).__name__}: {exc}")))
    except BaseException:
        code = 3
    finally:
        os._exit(code)  # not the parent's atexit handlers, nor its stdio buffers a second time


class _Child:
    """One call's child process and the parent's end of its pipe: owned by that call alone (threads each
    fork their own), reaped by it on every path."""

    def __init__(self):
        sys.stdout.flush()  # what the parent has buffered is printed once, by the parent
        sys.stderr.flush()
        parent = os.getpid()
        self.reaped = False
        # the pipe made and the fork done under one lock: a thread forking meanwhile would otherwise give its
        # child a copy of this child's end, and this call would never see the end of a child that died
        with _lock:
            self.conn, child = _channel()
            self.pid = os.fork()
            if self.pid == 0:
                self.conn.close()
                _forget_the_parents_calls()
                _serve(child, parent)
            child.close()
            _live.add(self)

    def call(self, deadline: float, fn, args, kwargs, on_phase):
        try:
            self.conn.send((fn, args, kwargs, on_phase is not None))
        except BrokenPipeError:  # it died while idle (the OOM killer)
            raise self._died() from None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                return None
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if kind != "phase":
                return kind, value
            on_phase(value)

    def _died(self) -> WorkerDied:
        self.conn.close()
        _, status = os.waitpid(self.pid, 0)
        self.reaped = True  # its pid may be another process's from now on: never signalled again
        return WorkerDied(f"the verification process {describe_exit(os.waitstatus_to_exitcode(status))} "
                          "before answering")

    def kill(self) -> None:
        """Close, kill and reap (also a child that already exited: no zombie is left)."""
        with _lock:
            _live.discard(self)
        self.conn.close()
        if self.reaped:
            return
        self.reaped = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


_lock = threading.Lock()
_live: set = set()  # the children of the calls in progress, each owned by its call; here for the exit only


def _forget_the_parents_calls() -> None:
    """In a new child: the other calls' pipes are theirs, not this child's (closed here), and the lock, held
    by the forking thread, starts afresh (the child may make bounded calls of its own)."""
    global _lock
    for other in _live:
        other.conn.close()
    _live.clear()
    _lock = threading.Lock()


def _close_all() -> None:
    for child in list(_live):
        child.kill()


atexit.register(_close_all)  # a child killed at exit too, not left to notice the closed pipe


def bounded_call(seconds: float, hint: str | None, fn, *args, on_phase=None, **kwargs):
    """fn(*args, **kwargs) (a module-level function; its arguments and result are pickled), ended at
    `seconds` with the limit's TimeLimitError (limits.over_time_message; `hint` names the flag that
    raises it). What fn raises is raised here; a child that dies raises WorkerDied. on_phase(name),
    when given, is passed to fn and called here as fn calls it."""
    from .limits import over_time_error, request_time_limit

    if not hasattr(os, "fork"):
        with request_time_limit(seconds, hint):
            return fn(*args, **kwargs, **({"on_phase": on_phase} if on_phase else {}))
    deadline = time.monotonic() + seconds
    child = _Child()  # this call's own: forked now, it sees this process as it is now
    try:
        answer = child.call(deadline, fn, args, kwargs, on_phase)
    finally:  # answered, died, over time, or Ctrl-C while waiting: the child goes, reaped
        child.kill()
    if answer is None:
        raise over_time_error(seconds, hint)
    kind, value = answer
    if kind == "raise":
        raise value
    return value
