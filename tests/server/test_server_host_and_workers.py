"""IPv6 loopback for gRPC and metrics, and --workers sized to the CPUs the process may use."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from gradcheck_client import Client
from gradcheck_svc.config import _cgroup_cpu_quota, default_workers
from grpc_helpers import ServerProcess, _env, seed_graph


def _ipv6_loopback() -> bool:
    import socket

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_ipv6_loopback_serves_grpc_and_metrics(host):
    proc = subprocess.Popen([sys.executable, "-m", "gradcheck_svc.cli", "serve", "--host", host, "--port", "0",
                             "--workers", "1", "--metrics-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_env())
    try:
        info = json.loads(proc.stdout.readline())
        with Client(f"[::1]:{info['port']}", timeout=30, retries=0) as c:
            assert c.verify(seed_graph()).passed
        body = urllib.request.urlopen(f"http://[::1]:{info['metrics_port']}/metrics", timeout=10).read().decode()
        assert 'gradcheck_requests_total{code="OK",method="Verify"} 1.0' in body
    finally:
        proc.terminate()
        proc.stdout.close()  # else its pipe is still open when the interpreter exits (a ResourceWarning)
        assert proc.wait(60) == 0


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_cpu_quota(tmp_path) is None


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cgroup_cpu_quota(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert _cgroup_cpu_quota(tmp_path) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_default_workers_follow_the_affinity_mask():
    """A process pinned to one CPU (as a container's cpuset would) defaults to one worker."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from gradcheck_svc.config import default_workers; print(default_workers())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.stdout.strip() == "1", out.stderr
    assert default_workers() <= len(os.sched_getaffinity(0))


def test_server_reports_its_default_workers(tmp_path):
    server = ServerProcess(log_path=tmp_path / "log")
    try:
        assert server.info["workers"] == default_workers()
        assert len(server.worker_pids()) == default_workers()
    finally:
        assert server.stop() == 0
