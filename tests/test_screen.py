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
    assert "**Disagreeing nodes:** `node-c`" in md and "| `node-c` | `cpu` | 9 | 8 |" in md


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
