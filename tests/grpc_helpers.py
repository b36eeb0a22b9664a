"""Helpers for the gRPC tests: a real `gradcheck-svc serve` process on loopback, and test graphs."""
from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import numpy as np

from gradcheck_svc.server.launcher import LocalServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "graphs"


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python"), env.get("PYTHONPATH", "")])
    env.pop("GRADCHECK_TOKEN", None)
    env.update(extra or {})
    return env


def module_server(tmp_path_factory, *args: str, env: dict | None = None):
    """A module fixture's body: a ServerProcess with its log in a fresh temp directory, yielded, then
    stopped -- and it must stop cleanly (exit 0)."""
    s = ServerProcess(*args, env=env, log_path=tmp_path_factory.mktemp("srv") / "server.log")
    yield s
    assert s.stop() == 0


def module_client(tmp_path_factory, *args: str, timeout: float = 120):
    """A module fixture's body: a Client of a module_server started with `args`, yielded, then closed
    with the server."""
    from gradcheck_client import Client

    gen = module_server(tmp_path_factory, *args)
    server = next(gen)
    try:
        with Client(server.target, timeout=timeout) as c:
            yield c
    finally:
        # resumed, not closed: gen.close() raises GeneratorExit at module_server's yield, so its stop (and
        # the clean-exit assertion) never ran and every such server outlived pytest
        next(gen, None)


class ServerProcess(LocalServer):
    """A real server for a test module, with its metrics port, log file and worker processes at hand."""

    def __init__(self, *args: str, env: dict | None = None, log_path: Path | None = None, cwd: Path | None = None):
        super().__init__("--metrics-port", "0", *args, env=_env(env), log_path=log_path, cwd=cwd)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.info['metrics_port']}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()

    def samples(self, name: str) -> list:
        """Every sample named `name` (e.g. gradcheck_requests_total), parsed by prometheus_client."""
        from prometheus_client.parser import text_string_to_metric_families

        return [s for family in text_string_to_metric_families(self.metrics()) for s in family.samples
                if s.name == name]

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when absent)."""
        return sum(s.value for s in self.samples(name) if labels.items() <= s.labels.items())

    def wait_in_flight(self, n: int, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while self.metric("gradcheck_in_flight") < n:
            if time.monotonic() > end:
                raise AssertionError(f"never saw {n} request(s) in flight")
            time.sleep(0.02)

    def worker_pids(self) -> list[int]:
        """Live worker processes: the server's grandchildren (children of its forkserver)."""
        parent = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
                    if state != "Z":
                        parent[int(d.name)] = int(ppid)
                except (OSError, IndexError):
                    pass
        children = {p for p, pp in parent.items() if pp == self.pid}
        return sorted(p for p, pp in parent.items() if pp in children)

    def log_lines(self) -> list[dict]:
        lines = []
        for line in Path(self.log_path).read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return lines


def slow_graph(width: int = 96, layers: int = 4):
    """tanh(h @ W_i^T) chain: full finite differences cost ~width**5 (seconds at width 64, tens at 96).
    The transpose keeps it so: it has no slice rule (ops/slices.py), so every perturbed copy of W_i
    is pushed through the graph dense, where x @ W alone would change one column per copy."""
    from gradcheck_core.tracer import Tracer, ops

    rng = np.random.default_rng(0)
    t = Tracer(f"slow_{width}x{layers}")
    h = t.input("h", rng.standard_normal((width, width)))
    for i in range(layers):
        h = ops.tanh(h @ t.param(f"W{i}", rng.standard_normal((width, width)) / width).T)
    return t.graph(h.sum())


def seed_graph():
    from gradcheck_client import load_graph

    return load_graph(EXAMPLES / "seed.json")


def unsaved_z_graph():
    """Has a node 'z' that no backward step reads: a fault on z has no effect, the graph passes."""
    from gradcheck_core.tracer import Tracer

    t = Tracer("unsaved_z")
    z = (t.param("w", 3.0) * t.param("x", 2.0)).named("z")
    return t.graph((z + 4.0).named("L"))


FAULT_ON_Z = "z:overwrite:99"  # breaks the seed graph's gradient (square saves z), not unsaved_z's


def example_paths() -> list[Path]:
    """The bundled examples, without the bug zoo (examples/graphs/faults/, whose cases need the
    options in its manifest; scripts/run_examples.py verifies those over gRPC)."""
    return sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".json", ".pb") and "faults" not in p.parts)


def expected_verdict(path: Path) -> str:
    return "fail" if path.stem.endswith("_wrong") else "pass"


def descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def stray_processes(since: float, *owners: int, settle: float = 15.0) -> list[str]:
    """Python processes started after `since` (time.time()), re-parented to init and not an
    owner's descendants: what a request left behind (other people's processes have live parents).
    A process already on its way out (a forkserver reads its parent's closed pipe a moment after the
    server exits) is given up to `settle` seconds to go; the answer comes as soon as none is left."""
    end = time.monotonic() + settle
    while True:
        left = _strays(since, owners)
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.2)


def _strays(since: float, owners: tuple) -> list[str]:
    import sys

    import psutil

    mine = {os.getpid(), *descendants(os.getpid())}
    for pid in owners:
        mine |= {pid, *descendants(pid)}
    out = []
    for p in psutil.process_iter(["pid", "ppid", "create_time", "cmdline", "status"]):
        info = p.info
        if (info["pid"] in mine or info["ppid"] != 1 or (info["create_time"] or 0) < since - 0.5
                or info["status"] == "zombie"):
            continue
        cmd = info["cmdline"] or []
        if cmd and (cmd[0] == sys.executable or "gradcheck" in " ".join(cmd)):
            out.append(f"{info['pid']}: {' '.join(cmd)[:120]}")
    return out


def wait_for(predicate, timeout: float = 15, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def hard_simplify_graph():
    """An expr node whose user derivative is right but written so that sympy.simplify needs seconds
    to prove it (tanh in exp form): the verification spends its time in the simplify check."""
    from gradcheck_svc.graph.build import GraphBuilder

    b = GraphBuilder("hard_simplify")
    b.input("x", np.array([0.3, -0.7]), requires_grad=True)
    e = "(exp(x) - exp(-x))"
    s = "(exp(x) + exp(-x))"
    grad = f"(6 - 6*{e}**2/{s}**2)*{e}**5/{s}**5"
    y = b.node("expr", "x", name="act", formula="tanh(x)**6", grad={"x": grad})
    b.output(b.node("sum", y, name="L"))
    return b.build()
