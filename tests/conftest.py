import os
import socket
import subprocess
import sys
import time
from pathlib import Path

# Before anything imports gRPC: a test process both talks gRPC (servers, clients) and forks (bounded calls,
# forked commands), which no command of ours does in one process. gRPC's core, built with fork support on by
# default, then runs a pre-fork handler on every fork that waits for its own threads to pause -- a full run
# hung in os.fork() there, in a worker whose earlier tests had used gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Also before NumPy and torch load: `make test` runs one xdist worker per core, so a BLAS or torch pool of a
# thread per core in each worker (and in each server and command it starts) oversubscribes the cores, and
# spinning pools slow each other down -- the server's worker pool sets 1 for the same reason
# (gradcheck_svc/server/pool.py). No test depends on the thread count; a value already set is kept.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "graphs"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- shared fixtures (test modules import none from each other) --------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free loopback port, and the environment a pod would give s3fs to reach it."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the in-process CLI calls read them as the subprocesses do
    try:
        deadline = time.monotonic() + 60
        while True:  # up once it accepts connections (it takes a second or two to import)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
        yield fs, env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LazyModule:
    """A module imported at its first attribute access -- inside the test that uses it, so collecting the
    suite does not pay for importing torch (seconds); without the module, that test skips
    (pytest.importorskip). `torch = LazyModule("torch")` reads as `import torch` after that."""

    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # introspection (pytest, pickling) must not import the module
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl's path (installed when missing: deploy_helpers.install_kubectl), or the test skips saying why."""
    import shutil

    from deploy_helpers import install_kubectl

    path = shutil.which("kubectl") or install_kubectl()
    if not os.path.isfile(path):
        pytest.skip(f"kubectl is not installed and could not be installed here ({path})")
    return path


# -- the tiers: `make test-fast` runs what is not `slow` --------------------------------------------------
# slow = process-level (a server, an S3 or Kubernetes stand-in, a command run forked or as a subprocess, a
# compiler), a model (ONNX exports and imports, the torch front end: each imports a framework and exports or
# captures a model) or one test over ~5 s (marked where it is). Marked here by folder, file, fixture and by
# what a test module imports (forked_cli or subprocess: it runs commands), so that a new test in those places
# is tiered without a decorator.
SLOW_FOLDERS = {"server", "batch", "onnx", "torch"}
SLOW_FILES = {"test_doc_snippets", "test_deploy", "test_ci_templates", "test_gpu_bundle", "test_ci_command",
              "test_node_client", "test_client_cli", "test_client_ends", "test_client_retries", "test_memory_leak",
              "test_cli_help", "test_install_hints", "test_core_cli", "test_html_screenshot", "test_cuda_kernels",
              "test_grpc_fork_default"}
PROCESS_FIXTURES = {"server", "s3", "kubectl"}
PROCESS_MODULES = {"forked_cli", "subprocess"}


def _is_slow(item) -> bool:
    module = getattr(item, "module", None)
    return (item.path.parent.name in SLOW_FOLDERS or item.path.stem in SLOW_FILES
            or bool(PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())))
            or (module is not None and bool(PROCESS_MODULES & set(vars(module)))))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
