"""deploy/: every overlay renders with `kubectl kustomize`, validates against the Kubernetes 1.30-1.35 schemas
(strict: unknown fields are errors), and has the properties the service relies on; the Dockerfiles are
multi-stage, non-root, and run the server."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT
from deploy_helpers import DEPLOY, FAILURE_COUNT, JOB_UID, deploy_copy, render

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra: pip install -e '.[test]'")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

OVERLAYS = ("namespace", "cpu", "gpu", "batch", "batch/merge", "batch-jobset", "batch-kueue", "batch-gpu", "batch-s3",
            "batch-s3/merge", "batch-volume", "batch-volume/merge", "screen", "screen/merge", "screen-gpu",
            "screen-daemonset")
CLUSTER_SCOPED = ("Namespace", "PriorityClass")
# The JobSet API (jobset.x-k8s.io/v1alpha2, sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go): its schema is
# a CRD's, not in kubernetes-validate; the fields it has, to check the rendered objects strictly by hand
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
               "coordinator", "managedBy", "ttlSecondsAfterFinished"}
JOBSET_REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}
K8S_VERSION = "1.33.0"
# the stated minimum (deploy/README.md): the Jobs' podFailurePolicy rules without onPodConditions, and
# backoffLimitPerIndex with FailIndex (beta, on by default), first validate in 1.29; every release from it to the
# newest schema kubernetes-validate ships is checked, and the one below it shown to refuse the Jobs
K8S_MIN = (1, 29)
K8S_VERSIONS = tuple(f"1.{m}.0" for m in range(K8S_MIN[1], 38))
JOBSET_MIN = "v0.8.0"  # the JobSet API the field tables below are of (deploy/README.md states it)


@pytest.fixture(scope="module", autouse=True)
def _schemas_parsed_once():
    """kubernetes-validate reads and parses a version's schema files (its _definitions.json: 1.4 MB of JSON) on
    every call, and this module makes ~600 calls over the same few dozen files: each file is parsed once here,
    the same schema is checked the same way (the validator is still built per call; nothing changes a schema)."""
    import functools

    from kubernetes_validate import utils

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "schema_contents", functools.lru_cache(maxsize=None)(utils.schema_contents))
        yield


@pytest.fixture(scope="session")
def rendered(kubectl) -> dict[str, list[dict]]:
    return {overlay: render(kubectl, DEPLOY / "overlays" / overlay) for overlay in OVERLAYS}


def tag(image: str) -> str:
    """An image reference's tag (name:tag@sha256:digest -> tag)."""
    return image.split("@", 1)[0].rsplit(":", 1)[-1]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def as_job(jobset: dict, replicated: dict) -> dict:
    """A JobSet's Job template as the Job the JobSet controller creates from it (named as it names them)."""
    t = replicated["template"]
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": t["spec"],
            "metadata": {**t.get("metadata", {}), "name": f"{jobset['metadata']['name']}-{replicated['name']}-0",
                         "namespace": jobset["metadata"]["namespace"]}}


def validate_jobset(obj: dict, version: str = K8S_VERSION) -> None:
    """What can be checked without the CRD's schema: every field is one the API has, the references inside
    resolve, and each Job template validates strictly as the Job it becomes."""
    assert obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert set(spec) <= JOBSET_SPEC, set(spec) - JOBSET_SPEC
    names = [r["name"] for r in spec["replicatedJobs"]]
    assert len(set(names)) == len(names)
    for i, r in enumerate(spec["replicatedJobs"]):
        assert set(r) <= JOBSET_REPLICATED_JOB and set(r["template"]) <= {"metadata", "spec"}
        assert isinstance(r.get("replicas", 1), int) and r.get("replicas", 1) >= 1
        for d in r.get("dependsOn", []):  # only on a job listed before it, and only these two statuses
            assert set(d) == {"name", "status"} and d["name"] in names[:i] and d["status"] in ("Ready", "Complete")
        kubernetes_validate.validate(as_job(obj, r), version, strict=True)
    success = spec.get("successPolicy", {})
    assert set(success) <= {"operator", "targetReplicatedJobs"} and success.get("operator", "All") in ("All", "Any")
    assert set(success.get("targetReplicatedJobs", [])) <= set(names)
    assert set(spec.get("failurePolicy", {})) <= {"maxRestarts", "restartStrategy", "rules"}
    assert set(spec.get("network", {})) <= {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(rendered, overlay, version):
    assert rendered[overlay]
    for obj in rendered[overlay]:
        if obj["kind"] == "JobSet":
            validate_jobset(obj, version)
        else:
            kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"].get("namespace", "gradcheck") == "gradcheck"
        # a local-config object (the settings) is kustomize's input, never the cluster's
        assert "config.kubernetes.io/local-config" not in obj["metadata"].get("annotations", {})


def test_the_jobset_check_is_strict(rendered):
    """A misspelt JobSet field, a dependency on an unknown job, or an invalid Job template must fail."""
    import copy

    good = one(rendered["batch-jobset"], "JobSet")
    validate_jobset(good)
    for spoil in (lambda o: o["spec"].update(replicatedJob=[]),
                  lambda o: o["spec"]["replicatedJobs"][1].update(dependsOn=[{"name": "shardz",
                                                                                  "status": "Complete"}]),
                  lambda o: o["spec"]["replicatedJobs"][1].update(dependsOn=[{"name": "shards",
                                                                                  "status": "Succeeded"}]),
                  lambda o: o["spec"]["successPolicy"].update(targetReplicatedJobs=["merged"]),
                  lambda o: o["spec"]["network"].update(enableDNSHostname=False),
                  lambda o: o["spec"]["replicatedJobs"][0]["template"]["spec"].update(completion=3)):
        bad = copy.deepcopy(good)
        spoil(bad)
        with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
            validate_jobset(bad)


def test_the_validator_is_strict():
    """A misspelt field must fail, or the test above proves nothing."""
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}, "dtaa": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _workdir(name: str = "Dockerfile") -> str:
    """The final stage's WORKDIR (where the server and every command run)."""
    return [rest for op, rest in _stages(DEPLOY / "docker" / name)[-1] if op == "WORKDIR"][-1]


def test_the_namespace_is_its_own_overlay(rendered):
    """The Namespace, enforcing "restricted", is applied by deploy/overlays/namespace alone: `kubectl delete -k` of
    a batch, screen or server overlay never deletes it (and the server with it)."""
    (ns,) = rendered["namespace"]
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == "gradcheck"
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
        # the minimum supported release (K8S_MIN), not "latest": a cluster upgrade never tightens the standard
        # under running batches; raised together with the stated minimum
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == f"v{K8S_MIN[0]}.{K8S_MIN[1]}"
    for overlay in OVERLAYS:
        if overlay != "namespace":
            assert not [o for o in rendered[overlay] if o["kind"] == "Namespace"], overlay
            assert all(o["metadata"]["namespace"] == "gradcheck" for o in rendered[overlay]
                       if o["kind"] not in CLUSTER_SCOPED)


def _assert_restricted(spec: dict) -> None:
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for c in spec["containers"] + spec.get("initContainers", []):
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
        # our image's WORKDIR is an empty writable directory of the pod's own (the root filesystem is read-only);
        # another image (batch-volume's graphs loader, yours) has a WORKDIR of its own
        if c["image"].split(":")[0].rsplit("/", 1)[-1] != "gradcheck":
            continue
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
        assert tag(c["image"]).endswith("-gpu")
        # no CPU autoscaling: a GPU replica's CPU says little about its load, and each replica claims a GPU
        assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    else:
        assert one(objs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "gradcheck"
        assert gpu is None and "tolerations" not in spec and tag(c["image"]).endswith("-cpu")
        assert "runtimeClassName" not in spec


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _job_policy(job: dict, container: str) -> None:
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimitPerIndex"] >= 1
    assert spec["activeDeadlineSeconds"] > 0  # no Job runs (or waits Pending) for ever
    assert pod_spec(job)["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    by_action = {r["action"]: r for r in rules}
    # exit 2 (bad configuration) fails the index at once; 75/3/137 (infrastructure) are retried
    assert by_action["FailIndex"]["onExitCodes"] == {"containerName": container, "operator": "In", "values": [2]}
    assert set(by_action["Count"]["onExitCodes"]["values"]) == {3, 75, 137}
    assert by_action["Ignore"]["onPodConditions"][0]["type"] == "DisruptionTarget"
    (c,) = pod_spec(job)["containers"]
    env = env_of(c)
    assert env["NODE_NAME"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # every run writes under its run ID, the name of the Job: a re-run is a new name, so a Job is never re-applied
    assert env["GRADCHECK_RUN_ID"] == job["metadata"]["name"]
    if container == "batch":  # a shard knows when a failure is its index's last: the waiting merge stops then
        assert env["GRADCHECK_INDEX_FAILURES"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"
        assert env["GRADCHECK_INDEX_RETRIES"] == str(spec["backoffLimitPerIndex"])
        # the Job's uid (a new one per apply): a launch reusing an earlier launch's attempt is refused
        assert env["GRADCHECK_JOB_UID"]["fieldRef"]["fieldPath"] == JOB_UID
        # every index runs to its own end (no maxFailedIndexes), so the merge reports every shard that could finish
        assert "maxFailedIndexes" not in spec
    _assert_restricted(pod_spec(job))


def _merge_job(merge: dict, job: dict, claim: str | None, shards: int | None = None, out: str = "/results",
               manifest: str = "/graphs") -> None:
    """The merge reads the run its Job wrote (the Job's name), started with it: it waits (--wait) as long as
    the Job may run, for every index to end, and reads the graph set where the shards read it (a batch's
    --manifest). It succeeds once its report is written: the verdict goes to the log, merged.json and the
    termination message, not to the Job's status; it is retried when evicted (not counted) or when it fails
    (exit 3, 75), never for bad usage (exit 2). Its results are the claim's (mounted at `out`), or with no claim
    at all the object store URL `out`."""
    spec = pod_spec(merge)
    _assert_restricted(spec)
    (c,) = spec["containers"]
    wait = job["spec"]["activeDeadlineSeconds"] if "spec" in job else None
    batch = [] if shards is None else [f"--shard-count={shards}", f"--manifest={manifest}"]
    assert c["args"][:len(batch) + 3] == ["batch-merge", out, "--run-id=$(GRADCHECK_RUN_ID)", *batch]
    assert c["args"][len(batch) + 3:] == [f"--wait={wait if wait is not None else _arg(c, '--wait')}", "--exit-zero",
                                          "--verdict-file=/dev/termination-log"]
    assert env_of(c)["GRADCHECK_RUN_ID"] == job["metadata"]["name"]
    assert merge["metadata"]["name"] == job["metadata"]["name"] + "-merge"
    assert merge["spec"]["activeDeadlineSeconds"] > int(_arg(c, "--wait")) and merge["spec"]["backoffLimit"] >= 1
    rules = merge["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert {"action": "FailJob", "onExitCodes": {"containerName": "merge", "operator": "In", "values": [2]}} in rules
    # its pod deleted (SIGTERM): the report written, exit 143 -- intended, retried without counting
    assert {"action": "Ignore", "onExitCodes": {"containerName": "merge", "operator": "In", "values": [143]}} in rules
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] >= 60
    assert c.get("terminationMessagePath", "/dev/termination-log") == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "File"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
    if claim is None:
        assert not claims
    else:
        assert next(v for v in spec["volumes"] if v["name"] == "results")["persistentVolumeClaim"]["claimName"] == claim


_ABSENT = object()
_POD = "spec.template.spec."
# what each storage variant changes in deploy/batch's Jobs (the shards', the merge's), and nothing else
STORAGE_CHANGES = {
    "batch-s3": {_POD + f for f in ("serviceAccountName", "containers.0.envFrom", "containers.0.args.1",
                                    "containers.0.args.3", "containers.0.volumeMounts", "volumes")},
    "batch-s3/merge": {_POD + f for f in ("serviceAccountName", "containers.0.envFrom", "containers.0.args.1",
                                          "containers.0.args.4", "containers.0.volumeMounts", "volumes")},
    "batch-volume": {_POD + f for f in ("securityContext.fsGroupChangePolicy", "initContainers",
                                        "containers.0.resources.limits.ephemeral-storage",
                                        "volumes.0.persistentVolumeClaim", "volumes.0.emptyDir")},
    "batch-volume/merge": {_POD + f for f in ("initContainers", "containers.0.resources.limits.ephemeral-storage",
                                              "volumes.0.persistentVolumeClaim", "volumes.0.emptyDir")},
}


def _diff(a, b, path: str = "") -> set[str]:
    """The dotted paths where two rendered objects differ (a list of another length differs as a whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return set().union(*(_diff(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{path}.{k}".lstrip("."))
                             for k in set(a) | set(b)))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(*(_diff(x, y, f"{path}.{i}") for i, (x, y) in enumerate(zip(a, b))))
    return set() if a == b else {path}


def _arg(c: dict, flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith(flag + "=")]
    return value


def test_batch_is_an_indexed_job_with_a_failure_policy(rendered):
    job = one(rendered["batch"], "Job", "gradcheck-batch")
    _job_policy(job, "batch")
    (c,) = pod_spec(job)["containers"]
    assert c["args"][0] == "batch"
    shards = job["spec"]["completions"]
    assert shards == job["spec"]["parallelism"] == int(_arg(c, "--shard-count")) == 8
    assert "--shard-index" not in " ".join(c["args"])  # JOB_COMPLETION_INDEX, set by Kubernetes
    assert _arg(c, "--device") == "$(GRADCHECK_DEVICE)" and env_of(c)["GRADCHECK_DEVICE"] == "cpu"
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec(job)["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims["results"] == one(rendered["batch"], "PersistentVolumeClaim")["metadata"]["name"]
    # the merge comes with the shards; batch/merge is the same Job alone, to merge again
    merge = one(rendered["batch"], "Job", "gradcheck-batch-merge")
    assert merge == one(rendered["batch/merge"], "Job")
    _merge_job(merge, job, claims["results"], shards)


def test_the_run_id_and_shard_count_are_set_once(kubectl, tmp_path):
    """One settings file; every overlay follows: the names of the Jobs (and the JobSet), completions,
    parallelism, --shard-count of the shards and of the merge, the run ID each pod writes or reads."""
    root = deploy_copy(tmp_path, "batch-run", run="nightly-42", shards="3", attempt="2026-12-07.3")
    plain, merge = render(kubectl, root / "overlays/batch"), render(kubectl, root / "overlays/batch/merge")
    job = one(plain, "Job", "nightly-42")
    _job_policy(job, "batch")
    # the attempt: the shards' and the merge's the same, from the one settings file
    assert env_of(pod_spec(job)["containers"][0])["GRADCHECK_ATTEMPT"] == "2026-12-07.3"
    assert env_of(pod_spec(one(merge, "Job", "nightly-42-merge"))["containers"][0])["GRADCHECK_ATTEMPT"] == \
        "2026-12-07.3"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert _arg(pod_spec(job)["containers"][0], "--shard-count") == "3"
    _merge_job(one(merge, "Job", "nightly-42-merge"), job, "gradcheck-results", 3)
    for overlay in ("batch-jobset", "batch-kueue"):
        jobset = one(render(kubectl, root / "overlays" / overlay), "JobSet", "nightly-42")
        shards, merge_t = (r["template"] for r in jobset["spec"]["replicatedJobs"])
        assert shards["spec"]["completions"] == shards["spec"]["parallelism"] == 3
        for t in (shards, merge_t):
            (c,) = t["spec"]["template"]["spec"]["containers"]
            assert _arg(c, "--shard-count") == "3" and env_of(c)["GRADCHECK_RUN_ID"] == "nightly-42"
            assert env_of(c)["GRADCHECK_ATTEMPT"] == "2026-12-07.3"
    gpu = one(render(kubectl, root / "overlays/batch-gpu"), "Job", "nightly-42")
    assert gpu["spec"]["completions"] == 3
    # the storage variants: the same settings, the same way (deploy/batch and the batch-run component), and
    # their own changes still made under another run ID
    for overlay, out, graphs in (("batch-s3", "$(GRADCHECK_OUT)", "$(GRADCHECK_MANIFEST)"),
                                 ("batch-volume", "/results", "/graphs")):
        objs = render(kubectl, root / "overlays" / overlay)
        job = one(objs, "Job", "nightly-42")
        assert _diff(job, one(plain, "Job", "nightly-42")) == STORAGE_CHANGES[overlay]
        merge_v = one(render(kubectl, root / "overlays" / overlay / "merge"), "Job", "nightly-42-merge")
        assert merge_v == one(objs, "Job", "nightly-42-merge")  # the merge applied with the shards, and alone
        assert _diff(merge_v, one(merge, "Job", "nightly-42-merge")) == STORAGE_CHANGES[overlay + "/merge"]
        _merge_job(merge_v, job, None if overlay == "batch-s3" else "gradcheck-results", 3, out, graphs)
    # no other place in deploy/ holds a shard count or a batch run ID of its own
    texts = {p: p.read_text() for d in ("batch", "overlays/batch-s3", "overlays/batch-volume")
             for p in (root / d).rglob("*.yaml")}
    assert not [p for p, t in texts.items() if re.search(r"shard-count=(?!1\b)|completions: (?!1\b)", t)]


def test_the_jobset_is_one_object_for_the_whole_batch(rendered):
    """Shards fan out, the merge fans in when they complete, one status: the JobSet's templates are exactly
    the plain Jobs' specs (copied, never a second copy to drift), and nothing else runs."""
    objs = rendered["batch-jobset"]
    assert not [o for o in objs if o["kind"] == "Job"]
    jobset = one(objs, "JobSet", "gradcheck-batch")
    shards, merge = jobset["spec"]["replicatedJobs"]
    assert (shards["name"], merge["name"]) == ("shards", "merge")
    assert shards.get("replicas", 1) == merge.get("replicas", 1) == 1
    assert shards["template"]["spec"] == one(rendered["batch"], "Job", "gradcheck-batch")["spec"]
    assert merge["template"]["spec"] == one(rendered["batch/merge"], "Job")["spec"]
    # no dependsOn: the merge starts beside the shards and waits for every index to end, failed ones included
    assert "dependsOn" not in merge
    # Completed when the merge has written its report; Failed (once) when a shard index is out of retries
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["merge"]}
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert jobset["spec"]["ttlSecondsAfterFinished"] > 0
    assert jobset["spec"]["network"] == {"enableDNSHostnames": False}  # no Service: shards never talk
    as_shards, as_merge = (as_job(jobset, r) for r in (shards, merge))
    _job_policy({**as_shards, "metadata": {"name": "gradcheck-batch"}}, "batch")
    claim = one(objs, "PersistentVolumeClaim")["metadata"]["name"]
    _merge_job({**as_merge, "metadata": {"name": "gradcheck-batch-merge"}},
               {"metadata": {"name": "gradcheck-batch"}, "spec": shards["template"]["spec"]},
               claim, shards["template"]["spec"]["completions"])


def test_the_kueue_variant_is_queued_suspended_and_prioritised(rendered):
    objs = rendered["batch-kueue"]
    jobset = one(objs, "JobSet", "gradcheck-batch")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gradcheck"
    assert jobset["spec"]["suspend"] is True  # Kueue admits it (unsuspends it) when its queue has quota
    pc = one(objs, "PriorityClass")
    assert pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False and pc["value"] < 0
    for r in jobset["spec"]["replicatedJobs"]:
        assert r["template"]["spec"]["template"]["spec"]["priorityClassName"] == pc["metadata"]["name"]
    # otherwise the JobSet variant itself
    plain = one(rendered["batch-jobset"], "JobSet")
    for a, b in zip(jobset["spec"]["replicatedJobs"], plain["spec"]["replicatedJobs"]):
        assert {k: v for k, v in a["template"]["spec"]["template"]["spec"].items() if k != "priorityClassName"} == \
            b["template"]["spec"]["template"]["spec"]


def _gpu(job: dict, cpu_job: dict, container: str) -> None:
    spec, cpu = pod_spec(job), pod_spec(cpu_job)
    (c,), (cc,) = spec["containers"], cpu["containers"]
    assert spec["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"] == {**cpu.get("nodeSelector", {}), "nvidia.com/gpu.present": "true"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert tag(c["image"]).endswith("-gpu") and tag(cc["image"]).endswith("-cpu")
    # --device=cuda: an unusable GPU fails the pod (exit 75, retried) instead of verifying on the CPU
    assert env_of(c)["GRADCHECK_DEVICE"] == "cuda" and _arg(c, "--device") == "$(GRADCHECK_DEVICE)"
    assert c["args"] == cc["args"] and c["name"] == container
    assert {k: v for k, v in env_of(c).items() if k != "GRADCHECK_DEVICE"} == \
        {k: v for k, v in env_of(cc).items() if k != "GRADCHECK_DEVICE"}
    _job_policy(job, container)


def test_gpu_batch_and_gpu_screen(rendered):
    _gpu(one(rendered["batch-gpu"], "Job", "gradcheck-batch"), one(rendered["batch"], "Job", "gradcheck-batch"),
         "batch")
    _gpu(one(rendered["screen-gpu"], "Job", "gradcheck-screen"), one(rendered["screen"], "Job", "gradcheck-screen"),
         "screen")
    # the merges stay on the CPU (they need no GPU; the screen's reference is a CPU verification)
    for overlay in ("batch-gpu", "screen-gpu"):
        merge = next(o for o in rendered[overlay] if o["kind"] == "Job" and o["metadata"]["name"].endswith("-merge"))
        assert "runtimeClassName" not in pod_spec(merge) and "nvidia.com/gpu" not in str(pod_spec(merge))
    assert pod_spec(one(rendered["screen-gpu"], "Job", "gradcheck-screen"))["nodeSelector"] == {
        "gradcheck.dev/screen": "true", "nvidia.com/gpu.present": "true"}


def test_screen_runs_one_pod_per_node(rendered):
    job = one(rendered["screen"], "Job", "gradcheck-screen")
    _job_policy(job, "screen")
    spec = pod_spec(job)
    assert job["spec"]["parallelism"] == job["spec"]["completions"]  # all at once, so anti-affinity spreads
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert spec["nodeSelector"] == {"gradcheck.dev/screen": "true"}
    (c,) = spec["containers"]
    assert c["args"][0] == "screen" and env_of(c)["GRADCHECK_DEVICE"] == "auto"
    claim = one(rendered["screen"], "PersistentVolumeClaim")["metadata"]["name"]
    _merge_job(one(rendered["screen/merge"], "Job"), job, claim)


def test_the_daemonset_screen_runs_the_job_s_screen_once_per_node(rendered):
    """One pod per matching node by construction (no retried index can land on a screened node): the screen
    Job's own container as the init container, a do-nothing container holding the pod once it is done."""
    ds = one(rendered["screen-daemonset"], "DaemonSet", "gradcheck-screen")
    job = one(rendered["screen"], "Job", "gradcheck-screen")
    spec, jspec = pod_spec(ds), pod_spec(job)
    _assert_restricted(spec)
    (init,), (hold,) = spec["initContainers"], spec["containers"]
    (screen,) = jspec["containers"]
    # the same container, less the pod count a DaemonSet does not have
    assert {k: v for k, v in init.items() if k != "env"} == {k: v for k, v in screen.items() if k != "env"}
    ref = env_of(init)["GRADCHECK_EXPECT_NODES"]["configMapKeyRef"]  # its own list, written at launch
    assert one(rendered["screen-daemonset"], "ConfigMap", ref["name"])["data"][ref["key"]]
    job_ref = env_of(screen)["GRADCHECK_EXPECT_NODES"]["configMapKeyRef"]
    assert ref["name"].rsplit("-", 1)[0] == job_ref["name"].rsplit("-", 1)[0] == "gradcheck-screen-nodes"
    same = [e for e in screen["env"] if e["name"] not in ("GRADCHECK_NODE_COUNT", "GRADCHECK_EXPECT_NODES")]
    assert [e for e in init["env"] if e["name"] != "GRADCHECK_EXPECT_NODES"] == same
    assert hold["command"] == ["sleep", "infinity"] and "args" not in hold and hold["image"] == screen["image"]
    assert spec.get("restartPolicy", "Always") == "Always"
    for key in ("nodeSelector", "securityContext", "volumes"):
        assert spec[key] == jspec[key], key
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    # its pods are not the Job's: the screen Job's anti-affinity and a merge's label selectors never see them
    assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] != "screen"
    # the only Job is the screen's merge, applied with the DaemonSet
    jobs = [o["metadata"]["name"] for o in rendered["screen-daemonset"] if o["kind"] == "Job"]
    assert jobs == ["gradcheck-screen-merge"]


def test_the_screen_knows_its_nodes(kubectl, rendered, tmp_path):
    """The node list written at launch reaches every pod as --expect-nodes (GRADCHECK_EXPECT_NODES from a
    ConfigMap of the same overlay); as shipped it lists none, so an unprepared screen is refused, not run."""
    from gradcheck_svc.batch.screen import parse_nodes
    from gradcheck_svc.errors import OptionError

    def nodes_of(objs):
        (c,) = pod_spec(next(o for o in objs if o["kind"] == "Job" and "-merge" not in o["metadata"]["name"]))[
            "containers"]
        ref = env_of(c)["GRADCHECK_EXPECT_NODES"]["configMapKeyRef"]
        return one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]

    with pytest.raises(OptionError, match="lists no node"):
        parse_nodes(nodes_of(rendered["screen"]))
    root = deploy_copy(tmp_path, "screen-run", run="screen-0601", nodes="3")
    (root / "overlays/screen/nodes.txt").write_text("node/gpu-a\nnode/gpu-b\nnode/gpu-c\n")  # kubectl -o name
    for overlay in ("screen", "screen-gpu"):
        objs = render(kubectl, root / "overlays" / overlay)
        assert parse_nodes(nodes_of(objs)) == ["gpu-a", "gpu-b", "gpu-c"]
        job = one(objs, "Job", "screen-0601")
        assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
        # the count each pod checks its list against is the Job's own completions
        assert env_of(pod_spec(job)["containers"][0])["GRADCHECK_NODE_COUNT"] == "3"
        _job_policy(job, "screen")
    _merge_job(one(render(kubectl, root / "overlays/screen/merge"), "Job"), job, "gradcheck-screen-results")
    ds = one(render(kubectl, root / "overlays/screen-daemonset"), "DaemonSet", "screen-0601")
    assert env_of(pod_spec(ds)["initContainers"][0])["GRADCHECK_RUN_ID"] == "screen-0601"


def test_batch_s3_is_deploy_batch_on_a_bucket_named_once(rendered):
    """The object storage variant: deploy/batch's Jobs (run ID and shard count from the batch-run settings),
    changed only where a bucket replaces the claims: --manifest, --out and the merge's DIR from one ConfigMap,
    credentials from an optional Secret or the ServiceAccount's workload identity, no claim anywhere."""
    plain, plain_merge = one(rendered["batch"], "Job", "gradcheck-batch"), one(rendered["batch/merge"], "Job")
    job = one(rendered["batch-s3"], "Job", plain["metadata"]["name"])
    merge = one(rendered["batch-s3/merge"], "Job", plain_merge["metadata"]["name"])
    _job_policy(job, "batch")
    assert _diff(job, plain) == STORAGE_CHANGES["batch-s3"]
    assert _diff(merge, plain_merge) == STORAGE_CHANGES["batch-s3/merge"]
    _merge_job(merge, job, None, job["spec"]["completions"], "$(GRADCHECK_OUT)", "$(GRADCHECK_MANIFEST)")
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
        # no mount left without its volume, nor a volume without a mount
        emptydirs = {"work"} if obj is merge else {"tmp", "work"}
        assert {m["name"] for m in c["volumeMounts"]} == {v["name"] for v in spec["volumes"]} == emptydirs
    (c,) = pod_spec(job)["containers"]
    assert _arg(c, "--manifest") == "$(GRADCHECK_MANIFEST)" and _arg(c, "--out") == "$(GRADCHECK_OUT)"
    assert _arg(c, "--shard-count") == str(job["spec"]["completions"])


def test_batch_volume_is_deploy_batch_with_a_storage_class_and_loaded_graphs(rendered):
    """The volume variant: deploy/batch's Job and results claim (run ID and shard count from the batch-run
    settings), the claim of the class set in storage/parameters.yaml (which is not rendered), and an init
    container that copies the graphs image's /graphs into the emptyDir the shard reads; its merge is the
    plain batch's."""
    objs = rendered["batch-volume"]
    params = yaml.safe_load((DEPLOY / "overlays/batch-volume/storage/parameters.yaml").read_text())["data"]
    assert not [o for o in objs if o["kind"] == "ConfigMap"]  # local-config: kustomize's input only
    pvc = one(objs, "PersistentVolumeClaim", "gradcheck-results")
    assert _diff(pvc, one(rendered["batch"], "PersistentVolumeClaim")) == {"spec.storageClassName"}
    assert pvc["spec"]["storageClassName"] == params["storageClassName"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == params["resultsSize"]
    plain = one(rendered["batch"], "Job", "gradcheck-batch")
    job = one(objs, "Job", plain["metadata"]["name"])
    _job_policy(job, "batch")
    assert _diff(job, plain) == STORAGE_CHANGES["batch-volume"]
    spec = pod_spec(job)
    (init,) = spec["initContainers"]
    assert init["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                       "readOnlyRootFilesystem": True, "privileged": False,
                                       "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert init["resources"]["limits"]["ephemeral-storage"] and init["resources"]["requests"]["cpu"]
    assert init["command"] == ["cp", "-R", "/graphs/.", "/load/"] and "gradcheck-graphs" in init["image"]
    (c,) = spec["containers"]
    graphs = next(v for v in spec["volumes"] if v["name"] == "graphs")
    assert graphs == {"name": "graphs", "emptyDir": {"sizeLimit": params["graphsSize"]}}
    assert {"name": "graphs", "mountPath": "/load"} in init["volumeMounts"]
    assert {"name": "graphs", "mountPath": "/graphs", "readOnly": True} in c["volumeMounts"]
    assert _arg(c, "--manifest") == "/graphs" and _arg(c, "--shard-count") == str(job["spec"]["completions"])
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"results": "gradcheck-results"}
    # the merge reads the graphs the shards read: loaded by the same init container from the same image
    merge = one(rendered["batch-volume/merge"], "Job")
    assert merge == one(objs, "Job", merge["metadata"]["name"])
    assert pod_spec(merge)["initContainers"] == spec["initContainers"]
    assert next(v for v in pod_spec(merge)["volumes"] if v["name"] == "graphs") == graphs
    _merge_job(merge, job, "gradcheck-results", job["spec"]["completions"])


def test_documented_waits_end_on_failure_too():
    """`kubectl wait --for=condition=complete` alone waits out its whole timeout when the Job fails: every
    documented wait for a Job ends on Complete or Failed (a JobSet's conditions: Completed or Failed)."""
    texts = [DEPLOY / "README.md", ROOT / "README.md", *DEPLOY.glob("overlays/**/kustomization.yaml")]
    lines = [ln for t in texts for ln in t.read_text().splitlines()]
    assert not [ln for ln in lines if "condition=complete" in ln.lower() and "failed" not in ln.lower()]
    waits = [ln for ln in lines if ln.startswith("until kubectl")]
    assert len(waits) >= 4
    for line in waits:
        kind = "Completed" if " jobset/" in line else "Complete"
        assert (f"""-o jsonpath='{{.status.conditions[?(@.status=="True")].type}}' | grep -qwE '{kind}|Failed'"""
                in line), line
    assert [ln for ln in waits if " jobset/" in ln]


# --- the rendered Jobs, run here as Kubernetes runs them ------------------------------------------------

def _run_container(monkeypatch, c: dict, volumes: dict, index: int | None = None, node: str = "node-1",
                   config: dict | None = None, failures: int = 0, uid: str = "uid-1") -> int:
    """One container of a rendered pod, in-process: its env (literals, the downward API's node name and the
    Job controller's failure count of the index, a ConfigMap's key), JOB_COMPLETION_INDEX as the Job controller
    sets it, its Job's uid (`uid`: a new one per apply), $(VAR) in its args expanded as the kubelet expands
    them, and its mount paths mapped onto local folders."""
    from gradcheck_svc.cli import main

    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = node
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == FAILURE_COUNT:
            env[e["name"]] = str(failures)
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == JOB_UID:
            env[e["name"]] = uid
        else:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = config[ref["name"]][ref["key"]]
    for k in ("JOB_COMPLETION_INDEX", "GRADCHECK_EXPECT_NODES", "GRADCHECK_NODE_COUNT", "GRADCHECK_RUN_ID",
              "NODE_NAME", "GRADCHECK_INDEX_FAILURES", "GRADCHECK_INDEX_RETRIES", "GRADCHECK_ATTEMPT",
              "GRADCHECK_JOB_UID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if index is not None:
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    for mount, local in volumes.items():
        args = [a.replace(mount, str(local)) for a in args]
    return main(args)


def test_the_rendered_jobset_runs_as_a_batch(kubectl, monkeypatch, capsys, tmp_path):
    """The JobSet of a changed settings file (3 shards, run nightly-7): every shard index run as its
    template says, one of them failing for good (its graphs volume unreadable, every retry the Job controller
    grants), then the merge with its own arguments, waiting as it does: a partial report naming what passed,
    failed and is missing, the merge itself succeeding; resumed, the complete verdict."""
    import json

    from gradcheck_svc.batch.generate import graph_dict
    from gradcheck_svc.batch.manifest import shard_of

    root = deploy_copy(tmp_path, "batch-run", run="nightly-7", shards="3")
    jobset = one(render(kubectl, root / "overlays/batch-jobset"), "JobSet", "nightly-7")
    shards, merge = ((r["template"]["spec"], r["template"]["spec"]["template"]["spec"]["containers"][0])
                     for r in jobset["spec"]["replicatedJobs"])
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    for i in range(6):
        (graphs / f"g{i}.json").write_text(json.dumps(graph_dict(i, size=2, kind="mismatch" if i == 4 else "ok")))
    volumes = {"/graphs": graphs, "/results": tmp_path / "results", "/dev/termination-log": tmp_path / "message"}
    count = shards[0]["completions"]
    last = shard_of("g4.json", count)
    shard = shards[0]["template"]["spec"]["containers"][0]
    for index in range(count):
        if index != last:
            assert _run_container(monkeypatch, shard, volumes, index) == 0
    # the last index's volume is gone: exit 75 on every attempt, until the controller's count is used up
    broken = {**volumes, "/graphs": tmp_path / "unmounted"}
    for failures in range(shards[0]["backoffLimitPerIndex"] + 1):
        assert _run_container(monkeypatch, shard, broken, last, failures=failures) in (2, 75)
    capsys.readouterr()
    assert _run_container(monkeypatch, merge[1], volumes) == 0  # the merge Job succeeds; the verdict says
    assert (tmp_path / "message").read_text().startswith("incomplete: run nightly-7: 6 graphs: ")
    err = capsys.readouterr().err
    held = [f"g{i}.json" for i in range(6) if shard_of(f"g{i}.json", count) == last]
    assert f"{len(held)} graph result(s) missing: " in err and all(f"{g} (shard {last})" in err for g in held)
    assert f"partial report: {6 - len(held)} passed (" in err
    # re-applied with the same attempt: a new Job (uid) reusing an earlier launch's attempt is refused, nothing
    # written -- a stale ending of that attempt could otherwise settle the merge
    assert _run_container(monkeypatch, shard, volumes, last, uid="uid-2") == 2
    assert "was launched before by Job uid uid-1: give each launch a fresh attempt ID" in capsys.readouterr().err
    # and the merge applied with it (the same attempt) refuses too, writing nothing: the files under that
    # attempt are the earlier launch's, and this launch's shards wrote none
    report = (tmp_path / "results/runs/nightly-7/merged.json").read_bytes()
    assert _run_container(monkeypatch, merge[1], volumes) == 2
    assert "give each launch a fresh attempt ID" in capsys.readouterr().err
    assert (tmp_path / "results/runs/nightly-7/merged.json").read_bytes() == report
    # resumed under the same run ID as documented (a fresh attempt, the JobSet re-applied): every index runs
    # again (the finished ones have nothing to verify), the failed one verifies its shard, the merge completes
    root = deploy_copy(tmp_path / "resume", "batch-run", run="nightly-7", shards="3", attempt="2")
    jobset = one(render(kubectl, root / "overlays/batch-jobset"), "JobSet", "nightly-7")
    shards, merge = ((r["template"]["spec"], r["template"]["spec"]["template"]["spec"]["containers"][0])
                     for r in jobset["spec"]["replicatedJobs"])
    shard = shards[0]["template"]["spec"]["containers"][0]
    for index in range(count):
        assert _run_container(monkeypatch, shard, volumes, index, uid="uid-3") == 0
    assert _run_container(monkeypatch, merge[1], volumes) == 0
    assert (tmp_path / "message").read_text() == "fail: run nightly-7: 6 graphs: 5 pass, 1 fail\n"
    merged = json.loads((tmp_path / "results/runs/nightly-7/merged.json").read_text())
    assert merged["shard_count"] == 3 and merged["failed"] == ["g4.json"] and merged["exit_code"] == 1


def test_the_rendered_screen_names_the_node_it_did_not_reach(kubectl, monkeypatch, capsys, tmp_path):
    """The screen overlay as launched on three nodes (nodes.txt from `kubectl get nodes -o name`), its Job run
    on two of them (the suite made small: --generated/--size), then its merge Job: the third node is named."""
    import json

    root = deploy_copy(tmp_path, "screen-run", run="screen-7", nodes="3")
    (root / "overlays/screen/nodes.txt").write_text("node/a\nnode/b\nnode/c\n")
    objs = render(kubectl, root / "overlays/screen")
    config = {o["metadata"]["name"]: o["data"] for o in objs if o["kind"] == "ConfigMap"}
    (c,) = pod_spec(one(objs, "Job", "screen-7"))["containers"]
    c = {**c, "args": [a for a in c["args"] if not a.startswith(("--generated", "--size"))]
         + ["--generated=2", "--size=2", "--examples=none"]}
    (m,) = pod_spec(one(objs, "Job", "screen-7-merge"))["containers"]
    # the merge waits as long as the Job may run, then names what it did not reach; here that time has passed
    assert _arg(m, "--wait") == str(one(objs, "Job", "screen-7")["spec"]["activeDeadlineSeconds"])
    m = {**m, "args": [a if not a.startswith("--wait=") else "--wait=0" for a in m["args"]]}
    volumes = {"/results": tmp_path / "results", "/dev/termination-log": tmp_path / "message"}
    assert _run_container(monkeypatch, c, volumes, 0, node="a", config=config) == 0
    assert _run_container(monkeypatch, c, volumes, 1, node="a", config=config) == 75  # retried elsewhere
    assert _run_container(monkeypatch, c, volumes, 1, node="b", config=config) == 0
    capsys.readouterr()
    assert _run_container(monkeypatch, m, volumes) == 0
    assert (tmp_path / "message").read_text() == (
        "incomplete: run screen-7: 2 graphs on each of 2 of 3 expected node(s): a: 2 pass; b: 2 pass; "
        "c: not screened\n")
    err = capsys.readouterr().err
    assert "1 of 3 expected node(s) not screened (no unit.json in this run): c" in err
    assert "a (index 1; screened by index 0)" in err
    merged = json.loads((tmp_path / "results/runs/screen-7/merged.json").read_text())
    assert merged["nodes"]["unscreened"] == ["c"] and merged["exit_code"] == 4


def test_the_rendered_daemonset_screen_names_the_node_it_did_not_reach(kubectl, monkeypatch, capsys, tmp_path):
    """The DaemonSet variant's init container on two of three listed nodes (the third NotReady, say), then
    the merge Job: the third node is named."""
    root = deploy_copy(tmp_path, "screen-run", run="screen-ds")
    (root / "overlays/screen-daemonset/nodes.txt").write_text("node/a\nnode/b\nnode/c\n")
    objs = render(kubectl, root / "overlays/screen-daemonset")
    config = {o["metadata"]["name"]: o["data"] for o in objs if o["kind"] == "ConfigMap"}
    (c,) = pod_spec(one(objs, "DaemonSet", "screen-ds"))["initContainers"]
    c = {**c, "args": [a for a in c["args"] if not a.startswith(("--generated", "--size"))]
         + ["--generated=2", "--size=2", "--examples=none"]}
    (m,) = pod_spec(one(objs, "Job", "screen-ds-merge"))["containers"]
    m = {**m, "args": [a if not a.startswith("--wait=") else "--wait=0" for a in m["args"]]}  # its time is up
    volumes = {"/results": tmp_path / "results", "/dev/termination-log": tmp_path / "message"}
    for node in ("a", "b", "a"):  # a's pod recreated: it resumes (nothing to do), it is not refused
        assert _run_container(monkeypatch, c, volumes, None, node=node, config=config) == 0
    assert _run_container(monkeypatch, m, volumes) == 0
    assert (tmp_path / "message").read_text() == (
        "incomplete: run screen-ds: 2 graphs on each of 2 of 3 expected node(s): a: 2 pass; b: 2 pass; "
        "c: not screened\n")


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


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_images_install_the_locked_dependency_set(name):
    """The build stage copies constraints.txt and installs under it: the image holds what `make test` tested."""
    build = _stages(DEPLOY / "docker" / name)[0]
    assert any(op == "COPY" and "constraints.txt" in rest.split()[:-1] for op, rest in build)
    installs = [rest for op, rest in build if op == "RUN" and "pip install" in rest]
    assert installs and all("-c constraints.txt" in rest for rest in installs)


def test_make_image_builds_each_variant_from_its_dockerfile():
    """`make image` with DOCKER=echo: the command it would run (docker itself cannot run here; `make test`
    runs under make, so make is there)."""
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)

    def make(*args):
        return subprocess.run(["make", "-s", "--no-print-directory", "image", "DOCKER=echo", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    cpu = make()
    assert cpu.returncode == 0, cpu.stderr
    words = cpu.stdout.split()
    assert words[:3] == ["build", "-f", "deploy/docker/Dockerfile"] and words[-1] == "."
    assert words[words.index("-t") + 1] == f"ghcr.io/gradcheck/gradcheck:{version}-cpu"
    assert f"org.opencontainers.image.version={version}" in words and "--build-arg" not in words
    pinned = "nvidia/cuda:12.6.3-runtime-ubuntu24.04@sha256:" + "a" * 64
    gpu = make("VARIANT=gpu", f"BASE_IMAGE={pinned}", "IMAGE=registry.example/team/gc")
    words = gpu.stdout.split()
    assert words[:3] == ["build", "-f", "deploy/docker/Dockerfile.gpu"], gpu.stderr
    assert words[words.index("--build-arg") + 1] == f"CUDA_IMAGE={pinned}"
    assert words[words.index("-t") + 1] == f"registry.example/team/gc:{version}-gpu"
    # the build argument each Dockerfile really declares
    for variant, dockerfile, arg in (("cpu", "Dockerfile", "PYTHON_IMAGE"), ("gpu", "Dockerfile.gpu", "CUDA_IMAGE")):
        assert re.search(rf"^ARG {arg}=", (DEPLOY / "docker" / dockerfile).read_text(), re.M)
        out = make(f"VARIANT={variant}", "BASE_IMAGE=x@sha256:" + "b" * 64).stdout.split()
        assert out[out.index("--build-arg") + 1].startswith(f"{arg}=x@sha256:")
    bad = make("VARIANT=tpu")
    assert bad.returncode != 0 and "VARIANT must be cpu or gpu, not 'tpu'" in bad.stderr and "build" not in bad.stdout


# --- what a platform team meets in week two: versions, names, networks, replicas, images ------------------

def test_the_stated_minimum_versions_are_the_real_ones(rendered):
    """deploy/README.md states Kubernetes 1.29 and JobSet v0.8 as the minimum: every overlay validates strictly on
    each release from 1.29 (test_every_object_validates_strictly), and the release below refuses the Jobs."""
    text = (DEPLOY / "README.md").read_text()
    assert f"Kubernetes {K8S_MIN[0]}.{K8S_MIN[1]} or later" in text and f"JobSet {JOBSET_MIN[:-2]} or later" in text
    below = f"{K8S_MIN[0]}.{K8S_MIN[1] - 1}.0"
    job = one(rendered["batch"], "Job", "gradcheck-batch")
    kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="onPodConditions"):
        kubernetes_validate.validate(job, below, strict=True)
    # the JobSet controller the docs install is the stated one; nothing says an older one will do
    texts = [DEPLOY / "README.md", ROOT / "README.md", *DEPLOY.rglob("*.yaml")]
    assert not [t for t in texts if re.search(r"JobSet[^\n]{0,40}v0\.[0-7]\b", t.read_text())]
    assert f"jobset/releases/download/{JOBSET_MIN}/manifests.yaml" in text


def test_run_ids_fit_every_name_made_from_them(kubectl, tmp_path):
    """The longest run ID the CLI accepts, as settings.yaml's `run`: every name Kubernetes makes from it -- the
    Jobs, the JobSet's child Jobs, an Indexed pod's hostname <job>-<index> -- is a DNS label of at most 63."""
    from gradcheck_svc.store.records import RUN_ID, RUN_ID_MAX

    for component in ("batch-run", "screen-run"):
        run = yaml.safe_load((DEPLOY / "components" / component / "settings.yaml").read_text())["data"]["run"]
        assert RUN_ID.fullmatch(run), run
    longest = "r" * RUN_ID_MAX
    assert RUN_ID.fullmatch(longest) and not RUN_ID.fullmatch(longest + "r")
    root = deploy_copy(tmp_path, "batch-run", run=longest, shards="99999")
    label = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
    names = [o["metadata"]["name"] for o in render(kubectl, root / "overlays/batch")]
    jobset = one(render(kubectl, root / "overlays/batch-jobset"), "JobSet")
    children = [f"{jobset['metadata']['name']}-{r['name']}-0" for r in jobset["spec"]["replicatedJobs"]]
    hostnames = [f"{job}-99998" for job in children + [longest]]
    for name in names + children + hostnames:
        assert len(name) <= 63 and label.fullmatch(name), name


def _pods(objs: list[dict]) -> list[tuple[str, dict]]:
    """Every pod template of an overlay, with its labels (a JobSet's templates as the Jobs it makes)."""
    out = []
    for o in objs:
        if o["kind"] in ("Job", "DaemonSet", "Deployment"):
            out.append((o["metadata"]["name"], o["spec"]["template"]["metadata"]["labels"]))
        elif o["kind"] == "JobSet":
            out += [(r["name"], r["template"]["spec"]["template"]["metadata"]["labels"])
                    for r in o["spec"]["replicatedJobs"]]
    return out


def _selects(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        ok = ok and labels.get(e["key"]) in e["values"]
    return ok


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "namespace"])
def test_every_pod_is_under_a_network_policy(rendered, overlay):
    """Every pod of every overlay is selected by a NetworkPolicy of that overlay, Ingress and Egress both: the
    server's takes gRPC and metrics, a batch's and a screen's take nothing and call the DNS (a batch: the server;
    batch-s3: HTTPS too)."""
    policies = [o for o in rendered[overlay] if o["kind"] == "NetworkPolicy"]
    pods = _pods(rendered[overlay])
    assert pods
    for name, labels in pods:
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        assert mine, f"{overlay}: pod {name} is under no NetworkPolicy"
        assert all(p["spec"]["policyTypes"] == ["Ingress", "Egress"] for p in mine)
        if labels["app.kubernetes.io/component"] != "server":
            assert all(p["spec"]["ingress"] == [] for p in mine)
            ports = {(port["port"], port["protocol"]) for p in mine for rule in p["spec"]["egress"]
                     for port in rule["ports"]}
            assert {(53, "UDP"), (53, "TCP")} <= ports
            assert ((443, "TCP") in ports) == (overlay.startswith("batch-s3") and "screen" not in name)


def test_the_server_replicas_are_the_hpa_s_and_spread(rendered):
    """With an HPA (cpu) the Deployment sets no replicas (a re-apply would reset the HPA's count); without one
    (gpu) it does. Replicas spread over nodes (required) and zones (preferred), per ReplicaSet."""
    cpu, gpu = (one(rendered[o], "Deployment", "gradcheck") for o in ("cpu", "gpu"))
    assert "replicas" not in cpu["spec"] and one(rendered["cpu"], "HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2
    assert gpu["spec"]["replicas"] >= 2
    for dep in (cpu, gpu):
        spread = {c["topologyKey"]: c for c in pod_spec(dep)["topologySpreadConstraints"]}
        assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
        assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
        for c in spread.values():
            assert c["maxSkew"] == 1 and c["matchLabelKeys"] == ["pod-template-hash"]
            assert c["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_apt_packages_are_pinned_and_the_gpu_extra_is_locked():
    """hadolint DL3008: every apt package named with a version -- the Python the build stage made the venv with,
    the same in the runtime stage (the venv links to it); the GPU extra's CuPy is in the lock, for the CUDA 12
    runtime the GPU image is built on."""
    for name in ("Dockerfile", "Dockerfile.gpu"):
        for stage in _stages(DEPLOY / "docker" / name):
            for op, rest in stage:
                if op == "RUN" and "apt-get install" in rest:
                    cmd = rest.split("apt-get install", 1)[1].split("&&", 1)[0].split()
                    packages = [w for w in cmd if not w.startswith("-")]
                    assert packages and all("=" in p for p in packages), f"{name}: unpinned: {packages}"
    text = (DEPLOY / "docker" / "Dockerfile.gpu").read_text()
    (version,) = set(re.findall(r"^ARG PYTHON3_VERSION=(\S+)$", text, re.M))
    assert text.count("python3=${PYTHON3_VERSION}") == 2  # build and runtime stages alike
    lock = (ROOT / "constraints.txt").read_text().splitlines()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'gpu = ["cupy-cuda12x>=13"]' in pyproject and "ARG CUDA_IMAGE=nvidia/cuda:12." in text
    assert [ln for ln in lock if ln.startswith("cupy-cuda12x==")] and version


@pytest.mark.parametrize("overlay", ["batch", "batch-gpu", "batch-s3", "batch-volume", "batch-jobset", "batch-kueue",
                                     "screen", "screen-gpu", "screen-daemonset"])
def test_every_variant_runs_its_merge(rendered, overlay):
    """No variant leaves the merge to a person: each applies, with its pods, a merge that waits as long as they
    may run (--wait: the shards' or screen's activeDeadlineSeconds; the DaemonSet's, the screen Job's) and then
    always writes a report."""
    objs = rendered[overlay]
    jobsets = [o for o in objs if o["kind"] == "JobSet"]
    if jobsets:
        (js,) = jobsets
        shards, merge = js["spec"]["replicatedJobs"]
        merges, deadline = [merge["template"]["spec"]], shards["template"]["spec"]["activeDeadlineSeconds"]
    else:
        merges = [o["spec"] for o in objs if o["kind"] == "Job" and o["metadata"]["name"].endswith("-merge")]
        work = [o for o in objs if o["kind"] == "Job" and not o["metadata"]["name"].endswith("-merge")]
        source = work[0] if work else one(rendered["screen"], "Job", "gradcheck-screen")  # the DaemonSet's bound
        deadline = source["spec"]["activeDeadlineSeconds"]
    (spec,) = merges
    (c,) = spec["template"]["spec"]["containers"]
    assert c["args"][0] == "batch-merge" and _arg(c, "--wait") == str(deadline) and "--exit-zero" in c["args"]


# --- pinned images ------------------------------------------------------------------------------------------

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _images(objs: list[dict]) -> list[str]:
    specs = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Job", "DaemonSet", "Deployment")]
    specs += [r["template"]["spec"]["template"]["spec"] for o in objs if o["kind"] == "JobSet"
              for r in o["spec"]["replicatedJobs"]]
    return [c["image"] for spec in specs for c in spec.get("initContainers", []) + spec["containers"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_pinned_by_digest(rendered, overlay):
    """A tag moves (a rebuild under the same tag, a registry's retag): every container of every overlay names
    its image by digest, the tag kept beside it for the reader (deploy/README.md, "Pinned images")."""
    for image in _images(rendered[overlay]):
        name, at, digest = image.partition("@")
        assert at and DIGEST.fullmatch(digest) and ":" in name, (overlay, image)


def test_pinning_rewrites_every_overlay_s_digests(kubectl, tmp_path):
    """The documented update: scripts/pin_images.py VARIANT=DIGEST sets each variant's digest in every overlay
    (and nothing else); a malformed digest is refused, one line, exit 2, nothing changed."""
    root = deploy_copy(tmp_path, "batch-run")
    digests = {v: "sha256:" + (c * 64) for v, c in (("cpu", "a"), ("gpu", "b"), ("graphs", "c"))}
    script = [sys.executable, str(ROOT / "scripts" / "pin_images.py"), "--deploy", str(root)]
    bad = subprocess.run([*script, "cpu=sha256:abc"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "cpu=sha256:abc" in bad.stderr
    before = {p: p.read_text() for p in root.rglob("kustomization.yaml")}
    subprocess.run([*script, *(f"{v}={d}" for v, d in digests.items())], check=True)
    for overlay in OVERLAYS:
        for image in _images(render(kubectl, root / "overlays" / overlay)):
            want = digests["graphs"] if "gradcheck-graphs" in image else digests[tag(image).rsplit("-", 1)[-1]]
            assert image.endswith("@" + want), (overlay, image)
    for p, text in before.items():  # only digest lines changed
        old, new = text.splitlines(), p.read_text().splitlines()
        assert [ln for ln in old if "digest:" not in ln] == [ln for ln in new if "digest:" not in ln], p
