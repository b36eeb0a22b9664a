"""A bounded task group: at most `limit` tasks at once; spawn() waits for a place (a stream's backpressure).

Every spawned coroutine's `on_done` runs exactly once: when its task ends, or when it never starts
(spawn cancelled while it waited, or the group cancelled before the task ran)."""
from __future__ import annotations

import asyncio


class BoundedTasks:
    def __init__(self, limit: int):
        self._slots = asyncio.Semaphore(limit)
        self.tasks: set[asyncio.Task] = set()

    async def spawn(self, coro, on_done) -> None:
        try:
            await self._slots.acquire()
        except asyncio.CancelledError:
            coro.close()
            on_done()
            raise
        task = asyncio.create_task(coro)
        self.tasks.add(task)

        def ended(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            self._slots.release()
            on_done()

        task.add_done_callback(ended)

    def live(self) -> set[asyncio.Task]:
        return {t for t in self.tasks if not t.done()}

    def cancel(self) -> None:
        for t in self.tasks:
            t.cancel()
