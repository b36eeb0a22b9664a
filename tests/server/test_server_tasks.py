"""The stream's bounded task group (server/tasks.py): at most `limit` tasks at once, and every spawned
item's on_done runs exactly once -- finished, cancelled while running, cancelled before it started, or
dropped while spawn() waited for a place. The servicer closes each request's account there, so this is
what makes one log line and one metric per stream item hold on every path."""
from __future__ import annotations

import asyncio

from gradcheck_svc.server.tasks import BoundedTasks


def test_at_most_limit_run_and_each_on_done_runs_once_on_every_path():
    async def scenario():
        group = BoundedTasks(2)
        done: list[str] = []
        running, peak = 0, 0
        release = asyncio.Event()

        async def work(name: str):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                if name != "quick":
                    await release.wait()  # held until the end: then cancelled while running
            finally:
                running -= 1

        await group.spawn(work("quick"), lambda: done.append("quick"))
        await asyncio.sleep(0)  # quick finishes and frees its place
        await group.spawn(work("a"), lambda: done.append("a"))
        await group.spawn(work("b"), lambda: done.append("b"))
        waiting = asyncio.create_task(group.spawn(work("c"), lambda: done.append("c")))  # no place: waits
        await asyncio.sleep(0.01)
        assert not waiting.done() and running == 2
        waiting.cancel()  # dropped while it waited for a place
        await asyncio.gather(waiting, return_exceptions=True)
        group.cancel()  # a and b cancelled while running
        await asyncio.sleep(0.01)
        return sorted(done), peak, group.live()

    done, peak, live = asyncio.run(scenario())
    assert done == ["a", "b", "c", "quick"]  # each once
    assert peak == 2 and not live


def test_a_task_cancelled_before_it_started_still_reports_done():
    async def scenario():
        group = BoundedTasks(1)
        done = []
        started = []

        async def work():
            started.append(True)

        await group.spawn(work(), lambda: done.append(1))
        group.cancel()  # before the event loop ran it
        await asyncio.sleep(0.01)
        return done, started

    done, started = asyncio.run(scenario())
    assert done == [1] and started == []
