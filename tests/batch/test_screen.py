"""Per-node screening: four "nodes" (processes with different node names, as the downward API sets
NODE_NAME) run the same suite; two are bad -- one with a planted cache fault that fails its verification, one
a host whose tanh is silently one ulp off (NumPy's, patched in that process as a faulty libm would be: its
engine and its own references agree, so its verification passes; its bits differ) -- and the merge, holding
every node to its own reference verification of the suite, must name exactly those two and no healthy one: a
vote among four with two bad would have no majority."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import forked_cli
from grpc_helpers import EXAMPLES, ROOT, _env
from gradcheck_svc.batch import screen
from gradcheck_svc.cli import main

NODES = ("node-a", "node-b", "node-c", "node-d")
LOUD, SILENT = "node-c", "node-d"
FAULTS = {LOUD: "a:bitflip", SILENT: None}  # a cached value's exponent bit (caught); a host's tanh (silent)
GENERATED = [f"generated/gen-{i:05d}.json" for i in range(6)]  # x @ W + b -> tanh -> a -> ...
# a host whose tanh rounds one ulp up: numpy.tanh replaced before the CLI runs (the engine and the references
# alike call it, as they would a faulty libm)
ONE_ULP_OFF_TANH = ("import sys, numpy as np; _tanh = np.tanh; "
                    "np.tanh = lambda x, *a, **k: np.nextafter(_tanh(x, *a, **k), np.inf); "
                    "from gradcheck_svc.cli import main; sys.exit(main(sys.argv[1:]))")


def _run_screen(out, examples, node: str, fault: str | None):
    """One node's screen: the silent node's a real process (its NumPy patched before the CLI starts), the
    others the command forked from this process (tests/forked_cli.py), as is the merge."""
    args = ["screen", "--out", str(out), "--examples", str(examples), "--generated", "6", "--size", "4",
            *(["--fault", fault] if fault else [])]
    env = _env({"NODE_NAME": node})
    if node != SILENT:
        return forked_cli.Forked("gradcheck_svc.cli", args, env=env, cwd=ROOT, timeout=300)
    return subprocess.Popen([sys.executable, "-c", ONE_ULP_OFF_TANH, *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _merge(out, *extra):
    # the planted faults are options only the bad nodes ran with: merging across options must be asked for
    return forked_cli.run("gradcheck_svc.cli", "batch-merge", out, "--allow-mixed", *extra, env=_env(), cwd=ROOT,
                          timeout=300)


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("screen")
    examples = tmp / "examples"
    examples.mkdir()
    for name in ("seed.json", "broadcasting.json", "swish_custom_wrong.json"):  # the last fails everywhere
        shutil.copy(EXAMPLES / name, examples / name)
    out = tmp / "results"
    # planted on every graph that has a node `a`: the generated ones, seed and broadcasting
    procs = [_run_screen(out, examples, node, FAULTS.get(node)) for node in NODES]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    merge = _merge(out)
    return out, merge, json.loads((out / "runs" / "default" / "merged.json").read_text())


def test_the_merge_names_exactly_the_bad_nodes(screened):
    out, merge, merged = screened
    assert merge.returncode == 1, merge.stderr
    assert f"nodes that disagree: {LOUD}, {SILENT}\n" in merge.stderr
    assert "merged anyway (--allow-mixed): node-node-a, node-node-b, node-node-d: options " in merge.stderr
    assert "(they differ in: faults)" in merge.stderr
    s = merged["screen"]
    assert s["disagreeing_nodes"] == [LOUD, SILENT] and s["undecided"] == []
    assert sorted(s["nodes"]) == sorted(NODES) and all(n["graphs"] == 9 for n in s["nodes"].values())
    assert s["nodes"]["node-a"]["disagreements"] == s["nodes"]["node-b"]["disagreements"] == 0
    planted = set(GENERATED) | {"examples/seed.json", "examples/broadcasting.json"}
    loud = [d for d in s["disagreements"] if d["node"] == LOUD]
    assert {d["graph"] for d in loud} == planted and s["nodes"][LOUD]["disagreements"] == 8
    assert all(d["reason"].startswith("fail where the reference got pass: node ") and "cache_corruption" in d["reason"]
               for d in loud)
    # the silent one passes every verification, and is named from its bits alone
    silent = [d for d in s["disagreements"] if d["node"] == SILENT]
    assert {d["graph"] for d in silent} == set(GENERATED) and s["nodes"][SILENT]["counts"] == {"pass": 8, "fail": 1}
    assert all(d["status"] == "pass" and " differs bit for bit from the reference (full comparison)" in d["reason"]
               for d in silent)
    # a graph every node fails, as the reference does, is the graph's fault, not a node's
    assert s["consistent_failures"] == [{"graph": "examples/swish_custom_wrong.json", "device": "cpu",
                                         "dtype": "float64", "status": "fail", "nodes": sorted(NODES)}]
    assert s["reference"]["graphs"] == 9 and s["reference"]["unavailable"] == {}
    assert merged["missing"] == [] and merged["duplicates"] == [] and len(merged["records"]) == 4 * 9
    for r in merged["records"]:  # each result records its node, device and dtype
        assert r["unit"] == f"node-{r['node']}" and r["device"] == "cpu" and r["dtype"] == "float64"
    md = (out / "runs" / "default" / "summary.md").read_text()
    assert f"**Disagreeing nodes:** `{LOUD}`, `{SILENT}`" in md and f"| `{LOUD}` | `cpu` | 9 | 9 fail | 8 |" in md
    # counts are per node, never summed across nodes ("9 graphs: 36 results" says nothing about any node)
    assert s["nodes"]["node-a"]["counts"] == {"pass": 8, "fail": 1} and s["nodes"][LOUD]["counts"] == {"fail": 9}
    assert "| `node-a` | `cpu` | 9 | 8 pass, 1 fail | 0 |" in md
    # the last line (and the termination message, the same words) names the bad nodes first, then the counts
    assert md.splitlines()[2].startswith(f"`2 node(s) disagree: {LOUD}, {SILENT}; 9 graphs on each of 4 node(s): "
                                         "node-a: 8 pass, 1 fail; node-b: ")
    assert merge.stderr.endswith(f"gradcheck-svc batch-merge: 2 node(s) disagree: {LOUD}, {SILENT}; 9 graphs on each "
                                 "of 4 node(s): node-a: 8 pass, 1 fail; node-b: 8 pass, 1 fail; node-c: 9 fail; "
                                 "node-d: 8 pass, 1 fail (exit 1)\n")


def test_healthy_nodes_agree_bit_for_bit_with_the_reference(screened):
    """The premise of the bit-level comparison, checked: healthy hosts of one kind (here the same machine) and
    the merge's own verification agree to the bit."""
    _, _, merged = screened
    by_graph = {}
    for r in merged["records"]:
        if r["node"] not in FAULTS and r["status"] == "pass":
            by_graph.setdefault(r["graph"], set()).add(json.dumps(r["digests"], sort_keys=True))
    assert len(by_graph) == 8 and all(len(d) == 1 for d in by_graph.values())
    assert not [d for d in merged["screen"]["disagreements"] if d["node"] not in FAULTS]


def _records(merged, nodes):
    return [dict(r) for r in merged["records"] if r["node"] in nodes]


def _reference_of(out):
    plans = [json.loads(p.read_text()) for p in sorted((out / "runs" / "default").glob("node-*/unit.json"))]
    ref = screen.reference(plans, {"float64"})
    return ref, {p["node"]: p["numerics"] for p in plans}


def test_any_number_of_bad_nodes_and_no_healthy_one(screened):
    """Held to the reference, not to each other: three bad of four, two bad of two, one healthy alone, or two
    nodes bad in the same way (they agree with each other bit for bit: a vote would call them right)."""
    out, _, merged = screened
    ref, numerics = _reference_of(out)
    for nodes, bad in (((LOUD, SILENT, "node-a"), [LOUD, SILENT]), ((LOUD, SILENT), [LOUD, SILENT]),
                       (("node-b",), []), (("node-a", LOUD), [LOUD])):
        assert screen.compare(_records(merged, nodes), ref, numerics)["disagreeing_nodes"] == bad
    twin = [dict(r, node="node-e", unit="node-node-e") for r in _records(merged, (SILENT,))]
    result = screen.compare(_records(merged, ("node-a", SILENT)) + twin, ref,
                            dict(numerics, **{"node-e": numerics[SILENT]}))
    assert result["disagreeing_nodes"] == [SILENT, "node-e"]


def test_bit_level_difference_without_a_verdict_change_is_named(screened):
    """Corruption outside the cache (a bad ALU in the backward) would pass the oracles' tolerance and still
    change low bits: compare() must name the node from the digests alone. Real records, one digest
    changed the way such a node would change it."""
    out, _, merged = screened
    ref, numerics = _reference_of(out)
    healthy = _records(merged, ("node-a", "node-b"))
    target = next(r for r in healthy if r["node"] == "node-b" and r["graph"] == "examples/seed.json")
    target["digests"] = dict(target["digests"], w="0" * 64)
    result = screen.compare(healthy, ref, numerics)
    assert result["disagreeing_nodes"] == ["node-b"]
    (d,) = result["disagreements"]
    assert d["reason"] == "gradient of w differs bit for bit from the reference (full comparison)"


def test_nodes_of_another_kind_are_undecided_not_blamed(screened):
    """A node whose numerics are not the merge's (another SIMD level or BLAS kernel, a GPU) cannot be held to
    the reference's bits: its verdict still is; different bits among such nodes are undecided (exit 4), no node
    named as bad for them."""
    out, _, merged = screened
    ref, numerics = _reference_of(out)
    other = {n: dict(v, simd=["SSE2"]) for n, v in numerics.items()}
    result = screen.compare(_records(merged, ("node-a", SILENT, LOUD)), ref, other)
    assert result["disagreeing_nodes"] == [LOUD]  # its verdict is wrong whatever its kind
    assert result["undecided_nodes"] == ["node-a", SILENT]
    assert all("different answers among 2 node(s) of one kind, and no reference of its kind" in d["reason"]
               for d in result["undecided"])
    # without any reference (a suite the merge could not rebuild) nothing is blamed on bits or votes
    none = screen.compare(_records(merged, ("node-a", SILENT)), None, numerics)
    assert none["disagreeing_nodes"] == [] and none["undecided_nodes"] == ["node-a", SILENT]


def test_an_undecided_screen_is_incomplete(screened, tmp_path):
    """A node of another kind whose bits differ from another's: the merge says undecided and exits 4."""
    out, _, _ = screened
    copy = tmp_path / "results"
    shutil.copytree(out, copy)
    unit = copy / "runs" / "default" / f"node-{SILENT}" / "unit.json"
    plan = json.loads(unit.read_text())
    plan["numerics"] = dict(plan["numerics"], simd=["SSE2"])
    unit.write_text(json.dumps(plan))
    other = copy / "runs" / "default" / "node-node-a" / "unit.json"
    plan = json.loads(other.read_text())
    plan["numerics"] = dict(plan["numerics"], simd=["SSE2"])
    other.write_text(json.dumps(plan))
    merge = _merge(copy)
    assert merge.returncode == 4, merge.stderr
    assert ("node result(s) undecided (a difference with nothing to tell which side is right): node-a on "
            in merge.stderr)
    assert f"nodes that disagree: {LOUD}\n" in merge.stderr


def test_screen_usage_errors(capsys, tmp_path):
    assert main(["screen", "--out", str(tmp_path), "--examples", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("gradcheck-svc: error: --examples: not a directory:")
    assert main(["screen", "--out", str(tmp_path), "--size", "0"]) == 2
    assert "--size: must be at least 1" in capsys.readouterr().err


# --- screens that know their nodes --------------------------------------------------------------------

def _screen(monkeypatch, out, node: str, index: int | None, *extra: str) -> int:
    """One screen pod as the Indexed Job runs it: NODE_NAME from the downward API, JOB_COMPLETION_INDEX set
    by the Job controller, the expected nodes from the ConfigMap written at launch."""
    monkeypatch.setenv("NODE_NAME", node)
    if index is None:
        monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    else:
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
    return main(["screen", "--out", str(out), "--examples", "none", "--generated", "2", "--size", "2", *extra])


def test_a_screen_names_every_node_it_did_not_screen(monkeypatch, capsys, tmp_path):
    """Three nodes listed at launch (`kubectl get nodes -l ... -o name`, as written to nodes.txt); index 1's
    first pod lands on the node index 0 screened and is refused there (exit 75: retried), its retry lands on
    the second node; the third node is never reached. The merge names the unscreened node, the landing, and
    gives each node's own counts."""
    out, nodes = tmp_path / "results", tmp_path / "nodes.txt"
    nodes.write_text("node/gpu-a\nnode/gpu-b\nnode/gpu-c\n")
    monkeypatch.setenv("GRADCHECK_EXPECT_NODES", nodes.read_text())  # the ConfigMap's key, through env
    monkeypatch.setenv("GRADCHECK_RUN_ID", "gradcheck-screen")
    assert _screen(monkeypatch, out, "gpu-a", 0) == 0
    capsys.readouterr()
    assert _screen(monkeypatch, out, "gpu-a", 1) == 75  # a retried index on a node already screened
    err = capsys.readouterr().err
    assert "node gpu-a was screened by index 0 in run gradcheck-screen; index 1 landed on it again" in err
    assert _screen(monkeypatch, out, "gpu-z", 1) == 75  # a node labelled after the list was written
    assert "node gpu-z is not among the 3 expected node(s) (--expect-nodes)" in capsys.readouterr().err
    assert _screen(monkeypatch, out, "gpu-b", 1) == 0
    assert not (out / "runs" / "gradcheck-screen" / "node-gpu-z").exists()
    capsys.readouterr()

    assert main(["batch-merge", str(out)]) == 4
    err = capsys.readouterr().err
    assert "gradcheck-svc batch-merge: 1 of 3 expected node(s) not screened (no unit.json in this run): gpu-c\n" in err
    assert ("1 retried pod(s) landed on a node already screened, were refused there and retried elsewhere: "
            "gpu-a (index 1; screened by index 0)") in err
    assert ("gradcheck-svc batch-merge: 2 graphs on each of 2 of 3 expected node(s): gpu-a: 2 pass; gpu-b: 2 pass; "
            "gpu-c: not screened (exit 4)") in err
    merged = json.loads((out / "runs" / "gradcheck-screen" / "merged.json").read_text())
    assert merged["nodes"]["expected"] == ["gpu-a", "gpu-b", "gpu-c"] and merged["nodes"]["unscreened"] == ["gpu-c"]
    assert merged["nodes"]["landings"] == [{"node": "gpu-a", "index": 1, "screened_by": 0}]
    assert merged["verdict"] == "incomplete" and merged["screen"]["disagreeing_nodes"] == []
    assert {n: v["counts"] for n, v in merged["screen"]["nodes"].items()} == {"gpu-a": {"pass": 2},
                                                                              "gpu-b": {"pass": 2}}
    junit = (out / "runs" / "gradcheck-screen" / "junit.xml").read_text()
    assert "not screened: node gpu-c was expected and left no result" in junit
    assert "| `gpu-c` | | 0 | not screened | |" in (out / "runs" / "gradcheck-screen" / "summary.md").read_text()

    # the index that reaches the last node completes the screen; the same index re-run resumes, not refused
    assert _screen(monkeypatch, out, "gpu-c", 2) == 0 and _screen(monkeypatch, out, "gpu-c", 2) == 0
    capsys.readouterr()
    assert main(["batch-merge", str(out), "--exit-zero", "--verdict-file", str(tmp_path / "verdict")]) == 0
    assert (tmp_path / "verdict").read_text() == ("pass: run gradcheck-screen: 2 graphs on each of 3 of 3 expected "
                                                  "node(s): gpu-a: 2 pass; gpu-b: 2 pass; gpu-c: 2 pass\n")
    # every listed node screened: a merge waiting as the deployed one does (up to an hour) has nothing to wait for
    assert main(["batch-merge", str(out), "--wait", "3600"]) == 0
    assert "waiting up to 3600 s" in capsys.readouterr().err
    # the merge can be told the nodes too: one more is named, and a node outside its list as well
    assert main(["batch-merge", str(out), "--expect-nodes", "gpu-d"]) == 4
    assert "1 of 4 expected node(s) not screened (no unit.json in this run): gpu-d" in capsys.readouterr().err


def test_screened_nodes_outside_the_merge_list_are_named(monkeypatch, capsys, tmp_path):
    out = tmp_path / "results"
    assert _screen(monkeypatch, out, "n1", None) == 0 and _screen(monkeypatch, out, "n2", None) == 0
    capsys.readouterr()
    assert main(["batch-merge", str(out), "--expect-nodes", "n1"]) == 4
    assert "1 node(s) screened but not in the expected list: n2" in capsys.readouterr().err
    assert main(["batch-merge", str(out), "--expect-nodes", "n1,n2"]) == 0
    assert main(["batch-merge", str(out), "--shard-count", "2"]) == 2
    assert "--shard-count: applies to a batch; this run is a screen" in capsys.readouterr().err


@pytest.mark.parametrize("value, error", [
    ("", "--expect-nodes: lists no node (write it at launch: kubectl get nodes -l SELECTOR -o name)"),
    ("# nothing yet\n", "--expect-nodes: lists no node"),
    ("a,b;c", "--expect-nodes: 'b;c' is not a node name"),
    ("node/-x", "--expect-nodes: 'node/-x' is not a node name"),
    ("@/no/such/file", "--expect-nodes: cannot read /no/such/file: No such file or directory"),
])
def test_bad_node_lists_are_refused_before_anything_runs(capsys, tmp_path, value, error):
    assert main(["screen", "--out", str(tmp_path), "--expect-nodes", value]) == 2
    assert capsys.readouterr().err.startswith(f"gradcheck-svc: error: {error}")
    assert not (tmp_path / "runs").exists()


def test_a_node_list_of_another_length_than_the_pods_is_refused(monkeypatch, capsys, tmp_path):
    """The Job's completions (settings.yaml `nodes`, as GRADCHECK_NODE_COUNT) and the list written at launch
    must agree: each index refuses at once (exit 2: FailIndex) instead of pods waiting for nodes that do not
    exist, or listed nodes left without a pod."""
    monkeypatch.setenv("GRADCHECK_NODE_COUNT", "4")
    assert _screen(monkeypatch, tmp_path, "a", 0, "--expect-nodes", "a,b,c") == 2
    assert capsys.readouterr().err == ("gradcheck-svc: error: --node-count: 4 screen pod(s) for the 3 node(s) of "
                                       "--expect-nodes: launch one pod per listed node (settings.yaml `nodes`)\n")
    assert not (tmp_path / "runs").exists()
    assert _screen(monkeypatch, tmp_path, "a", 0, "--expect-nodes", "a,b,c", "--node-count", "0") == 2
    assert "--node-count: must be at least 1" in capsys.readouterr().err
    monkeypatch.setenv("GRADCHECK_NODE_COUNT", "3")
    assert _screen(monkeypatch, tmp_path, "a", 0, "--expect-nodes", "a,b,c") == 0


def test_node_lists_as_kubectl_writes_them(tmp_path):
    f = tmp_path / "nodes.txt"
    f.write_text("# kubectl get nodes -l gradcheck.dev/screen=true -o name\nnode/b\nnode/a\n\nnode/a\n")
    assert screen.parse_nodes("@" + str(f)) == ["a", "b"]
    assert screen.parse_nodes(" c, a  b\n") == ["a", "b", "c"]


def test_numerics_name_numpys_blas_whatever_else_is_loaded():
    """A node's numerics are what decides the engine's bits: NumPy's BLAS, not another library's loaded
    beside it (scipy.special brings SciPy's own OpenBLAS). Otherwise a record made before SciPy was
    imported and a reference made after it differ, and a bit-level difference goes unblamed."""
    import subprocess
    import sys

    code = ("from gradcheck_svc.batch.screen import numerics; before = numerics(); import scipy.special; "
            "after = numerics(); assert before == after, (before, after); print(after['blas'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() and out.strip() != "none"
