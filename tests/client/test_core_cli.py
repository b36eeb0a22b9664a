"""The `gradcheck-svc verify` command end to end: the seed example, fault
injection, the JSON contract and exit codes. Runs the real console script."""
import json

import pytest

from conftest import EXAMPLES
import forked_cli

SEED = str(EXAMPLES / "seed.json")


def run_cli(*args):
    p = forked_cli.run("gradcheck_svc.cli", *args, timeout=120)
    return p.returncode, p.stdout, p.stderr


def by_name(report):
    return {p["name"]: p for p in report["parameters"]}


def test_seed_example_exact():
    rc, out, err = run_cli("verify", SEED, "--format", "json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["verdict"] == "pass"
    assert report["loss"] == 9.0
    params = by_name(report)
    assert params["w"]["gradient"] == [6.0]
    assert params["x"]["gradient"] == [9.0]
    assert params["w"]["reference"] == pytest.approx([6.0], abs=1e-8)
    assert params["x"]["reference"] == pytest.approx([9.0], abs=1e-8)
    for key in ("name", "shape", "gradient", "reference", "max_abs_error", "max_rel_error", "worst_index",
                "tolerance", "passed"):
        assert key in params["w"]
    for key in ("verdict", "loss", "parameters", "memory", "timings"):
        assert key in report


def test_seed_fault_overwrite_999_gives_999_and_fails():
    rc, out, err = run_cli("verify", SEED, "--format", "json", "--fault", "z:overwrite:999")
    assert rc == 1, err
    report = json.loads(out)
    assert report["verdict"] == "fail"
    params = by_name(report)
    # the classic: dL/dw = 2 * z * x / 4 with the cached z replaced by 999
    assert params["w"]["gradient"] == [999.0]
    assert params["x"]["gradient"] == [1498.5]
    assert not params["w"]["passed"] and not params["x"]["passed"]
    assert report["faults"][0]["read_by"] == ["a"]
    assert (report["faults"][0]["before"], report["faults"][0]["after"]) == (6.0, 999.0)


@pytest.mark.parametrize("fault, dldw", [
    ("z:scale:2", 12.0),      # z = 12 in the backward
    ("z:zero", 0.0),
    ("z:bitflip", 3.0),       # lowest exponent bit of 6.0 -> 3.0
])
def test_fault_kinds(fault, dldw):
    rc, out, _ = run_cli("verify", SEED, "--format", "json", "--fault", fault)
    assert rc == 1
    assert by_name(json.loads(out))["w"]["gradient"] == [dldw]


def test_fault_nan_reports_nan_and_fails():
    rc, out, _ = run_cli("verify", SEED, "--format", "json", "--fault", "z:nan")
    assert rc == 1
    assert by_name(json.loads(out))["w"]["gradient"] == ["NaN"]


def test_text_report_names_parameters_and_verdict():
    rc, out, _ = run_cli("verify", SEED, "--fault", "z:overwrite:999")
    assert rc == 1
    assert "FAIL" in out and "z:overwrite:999" in out and "999 vs 6" in out


@pytest.mark.parametrize("args, needle", [
    (["--fault", "z:explode"], "unknown fault kind 'explode'"),
    (["--fault", "nosuch:zero"], "unknown value 'nosuch'"),
    (["--fault", "z:overwrite"], "needs a value"),
    (["--fault", "z:bitflip:nan"], "integer bit index"),
    (["--fault", "z:bitflip:1.7"], "integer bit index"),
    (["--fault", "z:bitflip:99"], "bit 99 is out of range"),
    (["--dtype", "float16"], "invalid choice"),
    (["--atol", "-1"], "atol: -1.0 is not a finite number >= 0"),
    (["--rtol", "nan"], "rtol: nan is not a finite number >= 0"),
    (["--directions", "0"], "directions: 0: needs at least 1 direction"),
    (["--memory-plot", "/nonexistent/dir/plot.svg"], "memory-plot: '/nonexistent/dir/plot.svg': cannot write"),
])
def test_bad_options_exit_2_one_line(args, needle):
    rc, out, err = run_cli("verify", SEED, *args)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_file_exit_2():
    rc, _, err = run_cli("verify", "/nonexistent/graph.json")
    assert rc == 2 and "cannot read graph file" in err and "Traceback" not in err


def test_float32_run_passes_with_float32_tolerance():
    rc, out, _ = run_cli("verify", str(EXAMPLES / "mlp_cross_entropy.json"), "--dtype", "float32",
                         "--format", "json")
    assert rc == 0
    report = json.loads(out)
    assert report["dtype"] == "float32"
    row = report["parameters"][0]
    # float32 keeps the absolute floor: atol * max(1, max |reference|), never less than atol
    magnitude = max(abs(v) for v in row["reference"])
    assert row["tolerance"] == {"atol": 1e-4, "rtol": 1e-3, "absolute": pytest.approx(1e-4 * max(1.0, magnitude))}


def test_ops_listing_comes_from_registry():
    from gradcheck_svc.ops import all_ops

    rc, out, _ = run_cli("ops", "--format", "json")
    assert rc == 0
    assert [r["name"] for r in json.loads(out)] == [op.name for op in all_ops()]


@pytest.mark.parametrize("args, needle", [
    (["--port", "99999"], "--port: 99999 is not a port number (0-65535)"),
    (["--metrics-port", "-1"], "--metrics-port: -1 is not a port number (0-65535)"),
    (["--max-nodes", "0"], "--max-nodes: must be positive"),
    (["--max-queue", "-1"], "--max-queue: must be 0 or more"),
    # over what a bounded wait can wait (select.poll's int milliseconds): refused, not an internal error
    (["--max-request-seconds", "inf"], "--max-request-seconds: must be at most 1000000"),
    (["--grace", "-5"], "--grace: -5.0 is not a number of seconds from 0 to 1000000"),  # was served
])
def test_bad_serve_options_exit_2_one_line(args, needle):
    rc, _, err = run_cli("serve", *args)
    assert rc == 2 and needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
