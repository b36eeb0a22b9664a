"""In-process limits under threads (gradcheck_svc/bounded.py): each bounded_call owns its child and reaps
it on every path, so N threads x M calls give N x M right answers and leave no child, zombie or live; and
the server's worker pool, under many concurrent cancels, keeps its workers and answers right after."""
from __future__ import annotations

import threading
import time

import grpc
import psutil
import pytest

from gradcheck.v1 import service_pb2, service_pb2_grpc
from grpc_helpers import module_server, seed_graph, slow_graph, wait_for

THREADS, CALLS = 4, 10


def _verify(w: float, x: float, max_elements: int):
    """A short graph L = (w x)^2, verified in the child: (loss, dL/dw, verdict). Small integers: exact."""
    from gradcheck_core.request_message import make_request
    from gradcheck_core.tracer import Tracer
    from gradcheck_svc.limits import ServerLimits
    from gradcheck_svc.outcome import report_of
    from gradcheck_svc.request import run_request

    t = Tracer(f"g_{w:g}_{x:g}")
    z = t.param("w", w) * t.param("x", x)
    report = report_of(run_request(make_request(t.graph((z * z).named("L"))), ServerLimits(max_elements=max_elements)))
    d = report.to_dict()
    grad = {p["name"]: p["gradient"] for p in d["parameters"]}
    return d["loss"], grad["w"], d["verdict"]


def _sleep_forever():
    time.sleep(600)


def _thread(i: int, out: dict) -> None:
    from gradcheck_svc.bounded import bounded_call
    from gradcheck_svc.errors import LimitError, TimeLimitError

    for j in range(CALLS):
        w, x = float(i + 1), float(j + 1)
        try:
            if j == 3:  # the time limit hit: this call's child killed, the other threads' untouched
                out[i, j] = bounded_call(0.5, "timeout", _sleep_forever)
            elif j == 6:  # a request limit hit inside the child: its LimitError comes back whole
                out[i, j] = bounded_call(60, "timeout", _verify, w, x, 2)
            else:
                out[i, j] = bounded_call(60, "timeout", _verify, w, x, 1000)
        except (TimeLimitError, LimitError) as exc:
            out[i, j] = (type(exc).__name__, exc.message)
        except BaseException as exc:  # anything else is a wrong answer, recorded as such
            out[i, j] = ("unexpected", f"{type(exc).__name__}: {exc}")


def test_threads_each_own_their_child_and_every_answer_is_right():
    from gradcheck_svc import bounded
    from gradcheck_svc.request import preload

    preload(True, 2)  # the children start warm
    out: dict = {}
    threads = [threading.Thread(target=_thread, args=(i, out)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert len(out) == THREADS * CALLS
    for (i, j), answer in sorted(out.items()):
        w, x = i + 1, j + 1
        if j == 3:
            assert answer == ("TimeLimitError", "verification exceeded the per-request limit of 0.5 s "
                                                "(raise it with --timeout)"), (i, j, answer)
        elif j == 6:
            assert answer == ("LimitError", "node 'mul_1': graph holds 4 elements (inputs and node outputs), the "
                                            "limit is 2"), (i, j, answer)
        else:
            assert answer == ((w * x) ** 2, [2 * w * x * x], "pass"), (i, j, answer)
    assert not bounded._live
    children = psutil.Process().children(recursive=True)
    assert [c.pid for c in children if c.status() == psutil.STATUS_ZOMBIE] == []
    assert children == []  # every child reaped, none left running


# ---- the server's worker pool under concurrent cancels ---------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "2", "--max-queue", "16")


def _zombies_under(pid: int) -> list[int]:
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_concurrent_cancels_leave_the_pool_whole_and_right(server):
    channel = grpc.insecure_channel(server.target)
    stub = service_pb2_grpc.GradCheckServiceStub(channel)
    try:
        slow = service_pb2.VerifyRequest(graph=slow_graph(), options=service_pb2.VerifyOptions(fd_mode="full"))
        for _ in range(3):  # three rounds: two running, the rest queued, all cancelled at once
            calls = [stub.Verify.future(slow, timeout=300) for _ in range(8)]
            server.wait_in_flight(8)
            cancellers = [threading.Thread(target=c.cancel) for c in calls]
            for t in cancellers:
                t.start()
            for t in cancellers:
                t.join()
            for c in calls:
                assert c.cancelled() or c.exception().code() == grpc.StatusCode.CANCELLED
            wait_for(lambda: server.metric("gradcheck_in_flight") == 0, 60, "the cancelled calls to end")
        wait_for(lambda: len(server.worker_pids()) == 2, 60, "two workers again")
        answers = [stub.Verify.future(service_pb2.VerifyRequest(graph=seed_graph()), timeout=120) for _ in range(6)]
        assert [(a.result().WhichOneof("outcome"), a.result().report.verdict) for a in answers] == \
            [("report", "pass")] * 6
        wait_for(lambda: not _zombies_under(server.pid), 30, "no zombie under the server")
        assert len(server.worker_pids()) == 2
    finally:
        channel.close()
