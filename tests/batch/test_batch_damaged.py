"""batch-merge on damaged result trees: every unit.json and record is schema-checked; a damaged file is named
by its path in a one-line error, its graph counts as missing, and the merge exits 4 (the batch is incomplete:
re-running the named shard repairs it) after writing its report. Exit 2 is left for a directory that holds no
run to merge at all. Each case damages one file of a real 2-shard run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradcheck_svc.batch.generate import write_graphs
from gradcheck_svc.cli import main

RUN = Path("runs", "default")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("damaged")
    write_graphs(tmp / "g", 8, size=2, kinds=lambda i: "mismatch" if i == 5 else "ok")
    for i in range(2):
        assert main(["batch", "--manifest", str(tmp / "g"), "--shard-index", str(i), "--shard-count", "2",
                     "--out", str(tmp / "out")]) == 0
    assert main(["batch-merge", str(tmp / "out"), "--json", str(tmp / "m.json"), "--junit", str(tmp / "j.xml"),
                 "--summary-md", str(tmp / "s.md")]) == 1
    return tmp / "out"


def _pass_record(out: Path) -> Path:
    """Shard 0's first passing record (sorted by file name: the same one every time)."""
    return next(p for p in sorted((out / RUN / "shard-0000" / "results").glob("*.json"))
                if json.loads(p.read_text())["status"] == "pass")


def _edit(**changes):
    def damage(path: Path):
        obj = json.loads(path.read_text())
        for k, v in changes.items():
            if v is KeyError:
                del obj[k]
            else:
                obj[k] = v
        path.write_text(json.dumps(obj))
    return damage


def _edit_report(**changes):
    def damage(path: Path):
        obj = json.loads(path.read_text())
        obj["report"].update(changes)
        path.write_text(json.dumps(obj))
    return damage


def _write(text):
    return lambda path: path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _truncate(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _rename(path: Path):
    path.rename(path.with_name("0" * 64 + ".json"))


def _nan_seconds(path: Path):
    path.write_text(path.read_text().replace('"seconds":', '"seconds":NaN,"was":'))


REC, UNIT = "record", "unit.json"

# (case, which file, how it is damaged, the reason the error line gives)
CASES = [
    ("empty-object", REC, _write("{}"), "missing 'graph'"),
    ("array", REC, _write("[]"), "not a JSON object but an array"),
    ("null", REC, _write("null"), "not a JSON object but null"),
    ("number", REC, _write("42"), "not a JSON object but a number"),
    ("no-status", REC, _edit(status=KeyError), "missing 'status'"),
    ("binary-garbage", REC, _write(b"\x00\xff\xfe garbage"), "not JSON: not UTF-8 text"),
    ("text-garbage", REC, _write("hello, world"), "not JSON (malformed): Expecting value (line 1, column 1)"),
    ("truncated", REC, _truncate, "not JSON (truncated): "),
    ("empty-file", REC, _write(""), "not JSON (empty): Expecting value (line 1, column 1)"),
    ("deeply-nested", REC, _write("[" * 100_000), "not JSON: nested too deeply"),
    ("unknown-status", REC, _edit(status="passed"),
     "'status' must be one of pass, fail, invalid, timeout, error, not a string \"passed\""),
    ("status-not-a-string", REC, _edit(status=1), "'status' must be one of pass, fail, invalid, timeout, error, "
                                                  "not a number 1"),
    ("index-as-string", REC, _edit(shard_index="0"), "'shard_index' must be an integer >= 0, not a string \"0\""),
    ("index-as-bool", REC, _edit(shard_index=True), "'shard_index' must be an integer >= 0, not a boolean"),
    ("index-past-count", REC, _edit(shard_index=5), "shard_index 5 is not below shard_count 2"),
    ("nan-seconds", REC, _nan_seconds, "not JSON: NaN is not a JSON value"),
    ("negative-seconds", REC, _edit(seconds=-1), "'seconds' must be a finite number >= 0, not a number -1"),
    ("digests-a-list", REC, _edit(digests=["x"]), "'digests' must be an object of parameter -> sha256, not an array"),
    ("content-hash-not-hex", REC, _edit(graph_sha256="abc"), "'graph_sha256' must be a sha256 (64 hex digits)"),
    ("graph-null", REC, _edit(graph=None), "'graph' must be a non-empty string, not null"),
    ("timeout-without-error", REC, _edit(status="timeout"), "status 'timeout' without an 'error'"),
    ("verdict-disagrees", REC, _edit_report(verdict="fail"), "'status' is pass but the report's verdict is"),
    ("report-missing", REC, _edit(report=None), "status 'pass' without a 'report' object"),
    ("parameters-not-a-list", REC, _edit_report(parameters={"w": 1}), "report 'parameters' must be a list of objects"),
    ("pass-with-a-failing-row", REC, _edit_report(parameters=[{"name": "w", "status": "FAIL"}]),
     "'status' is pass but the report holds a FAIL row or an error finding"),
    ("pass-with-an-error-finding", REC, _edit_report(findings=[{"node": "a", "severity": "error"}]),
     "'status' is pass but the report holds a FAIL row or an error finding"),
    ("renamed", REC, _rename, "its name is not its record's key"),
    ("unit-empty-object", UNIT, _write("{}"), "missing 'mode'"),
    ("unit-null", UNIT, _write("null"), "not a JSON object but null"),
    ("unit-truncated", UNIT, _truncate, "not JSON (truncated)"),
    ("unit-no-graphs", UNIT, _edit(graphs=[]),
     "'graphs' must be a non-empty list of distinct graph names, not an array"),
    ("unit-unknown-mode", UNIT, _edit(mode="sweep"), "'mode' must be one of batch, screen, not a string \"sweep\""),
    ("unit-misplaced", UNIT, _edit(unit="shard-0007"), "names unit 'shard-0007' but lies in 'shard-0001'"),
    ("unit-contents-outside", UNIT, _edit(contents={"nope.json": "0" * 64}),
     "'contents' names a graph that 'graphs' does not list"),
    ("unit-deleted", UNIT, lambda p: p.unlink(), "missing"),
]


@pytest.mark.parametrize("case, which, damage, reason", CASES, ids=[c[0] for c in CASES])
def test_a_damaged_file_is_named_and_the_batch_is_incomplete(capsys, tmp_path, pristine, case, which, damage,
                                                             reason):
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    target = _pass_record(out) if which == REC else out / RUN / "shard-0001" / "unit.json"
    graph = json.loads(target.read_text())["graph"] if which == REC else None
    damage(target)
    named = target if case != "renamed" else target.with_name("0" * 64 + ".json")
    code = main(["batch-merge", str(out)])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "Traceback" not in err and "internal error" not in err
    (line,) = [ln for ln in err.splitlines() if "damaged result file" in ln]
    assert line.startswith(f"gradcheck-svc batch-merge: damaged result file {named}: {reason}"), line
    merged = json.loads((out / RUN / "merged.json").read_text())  # the report is written all the same
    assert merged["exit_code"] == 4 and [d["file"] for d in merged["damaged"]] == [str(named)]
    missing = {m["graph"] for m in merged["missing"]}
    if which == REC:  # the damaged record's graph is missing: no other file answers it
        assert graph in missing and missing == {graph}
    else:  # a unit without a plan: none of its records is used, each of its graphs is missing, with its shard
        assert missing and all(m["shard"] == 1 for m in merged["missing"])
    assert merged["counts"]["missing"] == len(missing)


def test_every_unit_damaged_is_no_graphs_not_a_pass(capsys, tmp_path, pristine):
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    for unit in ("shard-0000", "shard-0001"):
        (out / RUN / unit / "unit.json").write_text('{"graphs": []}')
    code = main(["batch-merge", str(out)])
    err = capsys.readouterr().err
    assert code == 4 and len([ln for ln in err.splitlines() if "damaged result file" in ln]) == 2
    assert "no graphs: no readable unit.json lists any, so nothing was verified" in err
    assert err.splitlines()[-1] == "gradcheck-svc batch-merge: 0 graphs: no results (exit 4)"


@pytest.mark.parametrize("case", ["empty-dir", "run-without-units", "not-a-dir", "batch-and-screen"])
def test_trees_with_nothing_to_merge_exit_2_one_line(capsys, tmp_path, pristine, case):
    out = tmp_path / "out"
    if case == "empty-dir":
        out.mkdir()
        needle = f"DIR: no batch results in {out} (no runs/*/*/unit.json)"
    elif case == "run-without-units":
        (out / "runs" / "r1" / "shard-0000").mkdir(parents=True)
        needle = f"DIR: no batch results in {out} (no runs/*/*/unit.json)"
    elif case == "not-a-dir":
        out.write_text("{}")
        needle = f"DIR: not a directory: {out}"
    else:
        shutil.copytree(pristine, out)
        plan = out / RUN / "shard-0001" / "unit.json"
        plan.write_text(json.dumps(dict(json.loads(plan.read_text()), mode="screen")))
        needle = "DIR: mixes batch and screen results (batch, screen); merge them apart"
    code = main(["batch-merge", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err == f"gradcheck-svc: error: {needle}\n"


def test_a_damaged_record_is_verified_again_by_its_shard(capsys, tmp_path, pristine):
    """A restarted shard does not take a damaged record for a finished graph: it verifies it again."""
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    _truncate(_pass_record(out))
    manifest = json.loads((out / RUN / "shard-0000" / "unit.json").read_text())["manifest_root"]
    assert main(["batch", "--manifest", manifest, "--shard-index", "0", "--shard-count", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 to verify" in err and "[1/1] pass" in err
    assert main(["batch-merge", str(out)]) == 1  # complete again; the planted mismatch fails


def test_a_run_whose_plans_are_all_lost_is_incomplete_not_absent(capsys, tmp_path, pristine):
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    for unit in ("shard-0000", "shard-0001"):
        (out / RUN / unit / "unit.json").unlink()
    code = main(["batch-merge", str(out)])
    err = capsys.readouterr().err
    assert code == 4
    for unit in ("shard-0000", "shard-0001"):
        assert f"damaged result file {out / RUN / unit / 'unit.json'}: missing\n" in err
    assert "no graphs: no readable unit.json lists any" in err


def test_a_hostile_file_name_stays_on_one_line(capsys, tmp_path, pristine):
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    shutil.copy(_pass_record(out), out / RUN / "shard-0000" / "results" / "x\nTraceback: fake.json")
    code = main(["batch-merge", str(out)])
    err = capsys.readouterr().err
    assert code == 4
    assert all(ln.startswith("gradcheck-svc batch-merge: ") for ln in err.splitlines())
    assert "x\\nTraceback: fake.json: its name is not its record's key" in err
