"""Issue 21 item 7: every limit that bounds a request is enforced the same way by the server and by
`gradcheck-svc verify` in-process. One server with every limit small; for each limit a request just
over it goes to the server (real gRPC on loopback) and, as a file with the same `--max-...` flags,
to the in-process command: the server refuses with its code and the in-process command exits 2
with the same reason (plus the flag that raises the limit). The cases come from the LIMITS table:
a new limit without a case here fails."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from gradcheck_client import Client, VerifyError, save_graph
from gradcheck_core.options import BY_NAME
from gradcheck_core.tracer import Tracer
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.limits import LIMITS
from grpc_helpers import ROOT, _env, module_server, seed_graph, slow_graph, wait_for
import forked_cli

SMALL = {"max_message_bytes": 400_000, "max_nodes": 20, "max_elements": 500_000, "max_name_length": 40,
         "max_attribute_values": 50, "max_formula_chars": 100, "max_formula_depth": 8,
         "max_symbolic_budget": 50, "max_symbolic_partials": 5, "max_directions": 16, "max_faults": 2,
         "max_request_seconds": 2}
# only the time limit's own case runs under its 2 s: every other case (the symbolic-partials one runs the
# whole slow path) gets time to spare on a loaded machine
ROOMY_SECONDS = 600


def _limit_flags(limits: dict) -> list[str]:
    return [a for name, value in limits.items() for a in ("--" + name.replace("_", "-"), str(value))]


TIMED_FLAGS = _limit_flags(SMALL)
FLAGS = _limit_flags(SMALL | {"max_request_seconds": ROOMY_SECONDS})


def _chain(n):
    t = Tracer("long")
    x = t.param("x", 1.0)
    for _ in range(n):
        x = x * 1.0
    return t.graph(x)


def _bytes():
    t = Tracer("heavy")
    return t.graph(t.param("x", np.ones(52_000)).sum())  # 416 kB


def _elements():
    t = Tracer("wide")  # an outer product: a million elements from 2,000 numbers
    return t.graph((t.param("x", np.ones((1000, 1))) * t.input("y", np.ones((1, 1000)))).sum())


def _name():
    t = Tracer("named")
    return t.graph(t.param("x" * 41, 1.0) * 2.0)


def _expr(formula):
    b = GraphBuilder("expr")
    b.input("x", np.array([0.3, 0.5]), requires_grad=True)
    b.output(b.node("sum", b.node("expr", "x", name="f", formula=formula), name="L"))
    return b.build()


def _attributes():
    b = GraphBuilder("attrs")
    b.input("x", np.ones(3), requires_grad=True)
    b.output(b.node("sum", "x", name="L", axes=list(range(51))))
    return b.build()


def _partials():
    t = Tracer("partials")  # 3 elements each, so within the symbolic budget; more than 5 partials
    return t.graph((t.param("x", np.ones(3)) * t.param("y", np.ones(3))).sum())


# limit -> (graph, options): a request over that limit and no other
CASES = {
    "max_message_bytes": (_bytes, {}),
    "max_nodes": (lambda: _chain(21), {}),
    "max_elements": (_elements, {}),
    "max_name_length": (_name, {}),
    "max_attribute_values": (_attributes, {}),
    "max_formula_chars": (lambda: _expr("x" + "+x" * 50), {}),
    "max_formula_depth": (lambda: _expr("(" * 9 + "x" + ")" * 9), {}),
    "max_symbolic_budget": (seed_graph, {"symbolic_budget": 51}),
    "max_symbolic_partials": (_partials, {}),
    "max_directions": (seed_graph, {"fd_mode": "projection", "directions": 17}),
    "max_faults": (seed_graph, {"faults": ["z:nan", "z:nan", "z:nan"]}),
    "max_request_seconds": (slow_graph, {"fd_mode": "full"}),  # tens of seconds; 369 kB, ~160,000 elements
}


def test_every_request_limit_has_a_case():
    assert set(CASES) == {s.name for s in LIMITS if not s.server_only} == set(SMALL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", *FLAGS)


@pytest.fixture(scope="module")
def timed_server(tmp_path_factory):
    """The 2 s request limit: for the one case that is over it."""
    yield from module_server(tmp_path_factory, "--workers", "1", *TIMED_FLAGS)


def _flags(options: dict) -> list[str]:
    out = []
    for name, value in options.items():
        for v in value if isinstance(value, list) else [value]:
            out += [BY_NAME[name].cli_flag, str(v)]
    return out


def _in_process(path, options, flags=FLAGS):
    return forked_cli.run("gradcheck_svc.cli", "verify", path, "--format", "json", *flags, *_flags(options),
                          env=_env(), cwd=ROOT, timeout=120)


def _reason(err: VerifyError) -> str:
    """The server's message without its 'field: ' prefix (the CLI names the flag instead)."""
    prefix = f"node '{err.field}': " if err.message.startswith("node '") else f"{err.field}: "
    return err.message[len(prefix):] if err.field and err.message.startswith(prefix) else err.message


@pytest.mark.parametrize("limit", [name for name in CASES if name != "max_symbolic_partials"])
def test_the_server_and_in_process_refuse_alike(request, tmp_path, limit):
    make, options = CASES[limit]
    timed = limit == "max_request_seconds"
    server = request.getfixturevalue("timed_server" if timed else "server")
    graph = make()
    old = wait_for(server.worker_pids, 120, "the server's worker")[0] if timed else None
    with Client(server.target, timeout=60, retries=0) as c:
        with pytest.raises(VerifyError) as info:
            c.verify(graph, **options)
    err = info.value
    if limit == "max_request_seconds":
        assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED and err.kind == "timeout"
        assert err.message.startswith("verification exceeded the per-request limit of 2 s")
        # the worker that ran over is replaced (a request after it would itself race the 2 s limit)
        wait_for(lambda: old not in server.worker_pids() and len(server.worker_pids()) == 1, 120,
                 "the worker that ran over to be replaced")
    else:
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.kind == "limit"
    path = tmp_path / "g.pb"
    save_graph(graph, path)
    r = _in_process(path, options, TIMED_FLAGS if timed else FLAGS)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.splitlines()
    flag = "--" + limit.replace("_", "-")
    assert line.startswith("gradcheck-svc: error: ")
    assert _reason(err) in line, (err.message, line)
    # the in-process line names the flag that raises the limit (the depth cap and the graph limits say
    # what they are; the options and sizes also say which flag)
    if limit in ("max_message_bytes", "max_symbolic_budget", "max_directions", "max_faults", "max_request_seconds"):
        assert f"raise it with {flag}" in line


def test_symbolic_partials_are_capped_alike(server, tmp_path):
    """max_symbolic_partials caps the symbolic oracle (it is skipped, the verdict uses finite differences):
    the same warning from the server and in-process."""
    graph = _partials()
    with Client(server.target, timeout=60, retries=0) as c:
        remote = c.verify(graph)
    path = tmp_path / "g.pb"
    save_graph(graph, path)
    r = _in_process(path, {})
    assert r.returncode == 0, r.stderr
    local = json.loads(r.stdout)
    [skipped] = [w for w in remote.warnings if "symbolic oracle skipped" in w]
    assert "more than 5 non-zero local partial derivatives" in skipped
    assert [w for w in local["warnings"] if "symbolic oracle skipped" in w] == [skipped]


def test_in_process_time_limit_stops_python_code_and_leaves_the_interval_timer_free():
    """The in-process limit interrupts the main thread without the one interval timer, which the expr
    check keeps for its own simplify budget (else it would fall back to a SymPy subprocess)."""
    import time

    from gradcheck_svc.alarm import timer_free
    from gradcheck_svc.errors import TimeLimitError
    from gradcheck_svc.limits import request_time_limit

    start = time.monotonic()
    with pytest.raises(TimeLimitError) as info:
        with request_time_limit(0.3):
            assert timer_free()
            while time.monotonic() - start < 60:
                sum(range(1000))
    assert time.monotonic() - start < 30
    assert info.value.message == ("verification exceeded the per-request limit of 0.3 s "
                                  "(raise it with --max-request-seconds)")
    with request_time_limit(5):  # within the limit: nothing happens, during or after
        pass
    time.sleep(0.1)


def test_off_the_main_thread_a_block_over_the_limit_is_refused_when_it_ends():
    import threading
    import time

    from gradcheck_svc.errors import TimeLimitError
    from gradcheck_svc.limits import request_time_limit

    box = {}

    def run():
        try:
            with request_time_limit(0.1, hint="timeout"):
                time.sleep(0.3)
        except TimeLimitError as exc:
            box["error"] = exc.message

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert box["error"] == "verification exceeded the per-request limit of 0.1 s (raise it with --timeout)"
