"""gRPC's fork support is off in any process that imports our packages first (gradcheck_core/__init__.py):
our in-process checks fork, and gRPC's pre-fork handler was seen to hang os.fork() in a process that had used
a channel. A value the user set is theirs."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PATHS = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])


def _fork_support_after(statement, env_value=None):
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = PATHS
    if env_value is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = env_value
    code = f"import os, sys; {statement}; assert 'grpc' in sys.modules; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


# each way in to gRPC through our code: the client's Client, the service's server, the core's client module
@pytest.mark.parametrize("statement", ["from gradcheck_client import Client", "import gradcheck_svc.server.main",
                                       "import gradcheck_core.client"])
def test_importing_ours_turns_grpc_fork_support_off(statement):
    assert _fork_support_after(statement) == "false"


def test_the_users_own_setting_is_kept():
    assert _fork_support_after("from gradcheck_client import Client", "true") == "true"
