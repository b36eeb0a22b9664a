"""Per-node screening: four "nodes" (processes with different node names, as the downward API sets
NODE_NAME) run the same suite; one has a planted cache fault; the merge must name exactly that node."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from grpc_helpers import EXAMPLES, ROOT, _env
from gradcheck_svc.batch import screen
from gradcheck_svc.cli import main

NODES = ("node-a", "node-b", "node-c", "node-d")
FAULTY = "node-c"


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("screen")
    examples = tmp / "examples"
    examples.mkdir()
    for name in ("seed.json", "broadcasting.json", "swish_custom_wrong.json"):  # the last fails everywhere
        shutil.copy(EXAMPLES / name, examples / name)
    out = tmp / "results"
    procs = []
    for node in NODES:
        # planted on every graph that has a node `a`: the generated ones, seed and broadcasting
        fault = ["--fault", "a:bitflip"] if node == FAULTY else []
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gradcheck_svc.cli", "screen", "--out", str(out), "--examples", str(examples),
             "--generated", "6", "--size", "4", *fault], env=_env({"NODE_NAME": node}), cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    # the planted fault is an option only node-c ran with: merging across options must be asked for
    merge = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "batch-merge", str(out), "--allow-mixed"],
                           env=_env(),
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    return out, merge, json.loads((out / "runs" / "default" / "merged.json").read_text())


def test_the_merge_names_exactly_the_faulty_node(screened):
    out, merge, merged = screened
    assert merge.returncode == 1, merge.stderr
    assert "nodes that disagree: node-c\n" in merge.stderr
    assert "merged anyway (--allow-mixed): node-node-a, node-node-b, node-node-d: options " in merge.stderr
    assert "(they differ in: faults)" in merge.stderr
    s = merged["screen"]
    assert s["disagreeing_nodes"] == [FAULTY]
    assert sorted(s["nodes"]) == sorted(NODES) and all(n["graphs"] == 9 for n in s["nodes"].values())
    assert s["nodes"][FAULTY]["disagreements"] == 8 and s["nodes"]["node-a"]["disagreements"] == 0
    bad = s["disagreements"]
    assert {d["graph"] for d in bad} == {f"generated/gen-{i:05d}.json" for i in range(6)} | {
        "examples/seed.json", "examples/broadcasting.json"}
    assert all(d["node"] == FAULTY and d["reason"].startswith("fail where 3 other node(s) got pass: node ")
               and "cache_corruption" in d["reason"] for d in bad)
    # a graph every node fails is the graph's fault, not a node's
    assert s["consistent_failures"] == [{"graph": "examples/swish_custom_wrong.json", "device": "cpu",
                                         "dtype": "float64", "status": "fail", "nodes": sorted(NODES)}]
    assert merged["missing"] == [] and merged["duplicates"] == [] and len(merged["records"]) == 4 * 9
    for r in merged["records"]:  # each result records its node, device and dtype
        assert r["unit"] == f"node-{r['node']}" and r["device"] == "cpu" and r["dtype"] == "float64"
    md = (out / "runs" / "default" / "summary.md").read_text()
    assert "**Disagreeing nodes:** `node-c`" in md and "| `node-c` | `cpu` | 9 | 9 fail | 8 |" in md
    # counts are per node, never summed across nodes ("9 graphs: 36 results" says nothing about any node)
    assert s["nodes"]["node-a"]["counts"] == {"pass": 8, "fail": 1} and s["nodes"][FAULTY]["counts"] == {"fail": 9}
    assert "| `node-a` | `cpu` | 9 | 8 pass, 1 fail | 0 |" in md
    assert md.splitlines()[2].startswith("`9 graphs on each of 4 node(s): node-a: 8 pass, 1 fail; node-b: ")
    assert ("gradcheck-svc batch-merge: 9 graphs on each of 4 node(s): node-a: 8 pass, 1 fail; node-b: 8 pass, "
            "1 fail; node-c: 9 fail; node-d: 8 pass, 1 fail (exit 1)\n") in merge.stderr


def test_healthy_nodes_agree_bit_for_bit(screened):
    _, _, merged = screened
    by_graph = {}
    for r in merged["records"]:
        if r["node"] != FAULTY and r["status"] == "pass":
            by_graph.setdefault(r["graph"], set()).add(json.dumps(r["digests"], sort_keys=True))
    assert len(by_graph) == 8 and all(len(d) == 1 for d in by_graph.values())


def test_bit_level_difference_without_a_verdict_change_is_named(screened):
    """Corruption outside the cache (a bad ALU in the backward) would pass the oracles' tolerance and still
    change low bits: compare() must name the node from the digests alone. Real records, one digest
    changed the way such a node would change it."""
    _, _, merged = screened
    healthy = [dict(r) for r in merged["records"] if r["node"] != FAULTY]
    target = next(r for r in healthy if r["node"] == "node-b" and r["graph"] == "examples/seed.json")
    target["digests"] = dict(target["digests"], w="0" * 64)
    result = screen.compare(healthy)
    assert result["disagreeing_nodes"] == ["node-b"]
    (d,) = result["disagreements"]
    assert d["reason"] == "gradient of w differs bit for bit from 2 other node(s) (full comparison)"


def test_two_nodes_that_disagree_are_both_named(screened):
    _, _, merged = screened
    pair = [r for r in merged["records"] if r["node"] in ("node-a", FAULTY)]
    assert screen.compare(pair)["disagreeing_nodes"] == ["node-a", FAULTY]


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
