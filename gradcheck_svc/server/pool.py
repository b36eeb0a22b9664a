"""A pool of worker processes for the CPU-heavy work (engine, FD, SymPy).

One request per worker at a time, so a slow request never stalls the event
loop, other clients or the health check. Requests beyond `size + max_queue`
in flight are refused at once (PoolBusy -> RESOURCE_EXHAUSTED): a request takes
its place with admitted() before its bytes are read or parsed.

A worker is a forkserver child (cheap to replace: the forkserver has already
imported NumPy and the engine). The pool watches each worker's pipe from the
event loop: end-of-file means the process died; if it had a request, that
request fails with WorkerDied and the worker is replaced. A request that is
cancelled (client cancel, deadline, server time limit) kills its worker --
the only way to stop NumPy mid-computation -- and a fresh one takes its place.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager

from ..bounded import WorkerDied, describe_exit
from ..config import ServerLimits
from .worker import worker_main


class PoolBusy(Exception):
    """Every worker is busy and the queue is full."""


class _Worker:
    def __init__(self, ctx, limits: ServerLimits, on_idle_death):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, limits), daemon=True, name="gradcheck-worker")
        self.proc.start()
        child.close()  # only the worker holds its end: its death closes the pipe
        self.dead = False
        self._future: asyncio.Future | None = None
        self._on_idle_death = on_idle_death
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.conn.fileno(), self._readable)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _readable(self) -> None:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self._died()
            return
        if self._future is not None and not self._future.done():
            self._future.set_result(msg)

    def _died(self) -> None:
        self._close()
        self.proc.join(0.5)  # it has closed its pipe; reap it to read the exit status
        err = WorkerDied(f"worker process {self.pid} {describe_exit(self.proc.exitcode)} during the request; "
                         "the request was not completed")
        if self._future is not None and not self._future.done():
            self._future.set_exception(err)
        else:
            self._on_idle_death(self)

    def _close(self) -> None:
        if not self.dead:
            self.dead = True
            self._loop.remove_reader(self.conn.fileno())
            self.conn.close()

    async def call(self, payload: bytes) -> tuple:
        self._future = self._loop.create_future()
        try:
            self.conn.send_bytes(payload)  # the idle worker is blocked in recv: this drains at once
        except OSError:
            self._died()
        try:
            return await self._future
        finally:
            self._future = None

    def kill(self) -> None:
        self._close()
        if self.proc.exitcode is not None:  # reaped (_died): its pid may be another process's by now
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
        threading.Thread(target=self.proc.join, daemon=True).start()  # reap without blocking the loop


class WorkerPool:
    def __init__(self, size: int, max_queue: int, limits: ServerLimits, context: str = "forkserver",
                 on_restart=lambda: None):
        if size < 1:
            raise ValueError("a pool needs at least one worker")
        self.size = size
        self.max_queue = max_queue
        self.limits = limits
        self._on_restart = on_restart
        self.pending = 0  # requests in flight: running or waiting for a worker
        # parallelism comes from the processes: one BLAS thread each avoids oversubscribing the cores
        # (read when the forkserver imports NumPy; a value the operator set is kept)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        self._ctx = multiprocessing.get_context(context)
        if context == "forkserver":
            self._ctx.set_forkserver_preload(["gradcheck_svc.server.worker"])
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._closed = False

    async def start(self) -> None:
        for _ in range(self.size):
            self._idle.put_nowait(self._spawn())

    def _spawn(self) -> _Worker:
        w = _Worker(self._ctx, self.limits, self._idle_death)
        self._workers.add(w)
        return w

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.discard(worker)
        if not self._closed:
            self._on_restart()
            self._idle.put_nowait(self._spawn())

    def _idle_death(self, worker: _Worker) -> None:
        self._replace(worker)  # the dead one stays queued but is skipped (worker.dead)

    @property
    def pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers if not w.dead)

    @contextmanager
    def admitted(self):
        """One place, running or queued, held for the block; PoolBusy at once when there is none.
        Taken when a call arrives, before its request is received and parsed, so that a busy server
        refuses a large request without reading it."""
        if self.pending >= self.size + self.max_queue:
            raise PoolBusy(f"server busy: {self.size} workers busy and {self.max_queue} requests queued; "
                           "retry later")
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    async def run(self, payload: bytes) -> tuple:
        """Run one request on a worker, inside admitted(); raises WorkerDied or CancelledError."""
        worker = await self._idle.get()
        while worker.dead:
            worker = await self._idle.get()
        healthy = False
        try:
            result = await worker.call(payload)
            healthy = True
            return result
        finally:
            if healthy:
                self._idle.put_nowait(worker)
            else:  # died, cancelled or timed out mid-request: a fresh worker takes its place
                self._replace(worker)

    async def close(self) -> None:
        self._closed = True
        for w in list(self._workers):
            w.kill()
        self._workers.clear()
