"""ONNX at the edges, probed as an attacker would (issue 21, items 1 and 2).

No request names a file: a TensorProto that points at external data -- in any position: the
request's inputs and cotangent, an initializer, a node attribute, a sparse initializer, a sparse
tensor inside an If branch, a Loop body's initializer, a function's node -- is refused with
INVALID_ARGUMENT before anything is opened. The planted targets are a file holding a secret and a
FIFO: opening a FIFO for reading blocks until a writer comes, so a server that opened it would
not answer at all, and one blocked in it would leave a reader this test could see.
On the command line, external data is read only from beside the model (or tensor) file named,
never through an absolute path, `..`, a symlink, or from a FIFO.

Folding is budgeted: Range(0, 2e8), Range(0, 1e11), ConstantOfShape, Expand and Tile of 10^10
elements and a Loop of 10^12 iterations are refused, over gRPC and on the command line, while the
worker's peak RSS (VmHWM, Linux) grows by far less than 200 MB; a node ONNX's evaluator fails on
is one line naming it; a MemoryError is RESOURCE_EXHAUSTED / exit 2, never INTERNAL.
"""
from __future__ import annotations

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from onnx_helpers import onnx

from gradcheck.v1 import service_pb2, service_pb2_grpc
from gradcheck_svc.cli import main
from grpc_helpers import ROOT, ServerProcess, _env, module_server

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")

SECRET = b"GRADCHECK-SECRET"  # 16 bytes: four float32 values, what the planted tensors hold
MB = 2**20


# --- planted targets --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A secret file and a FIFO, outside any model's directory."""
    d = tmp_path_factory.mktemp("planted")
    (d / "secret.bin").write_bytes(SECRET)
    os.mkfifo(d / "pipe")
    return {"secret": d / "secret.bin", "fifo": d / "pipe"}


def fifo_has_no_reader(path: Path) -> bool:
    """Nobody holds the FIFO open for reading (opening it for writing, non-blocking, says ENXIO)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return exc.errno == errno.ENXIO
    os.close(fd)
    return False


def external(t, location: str, *, data_location=TensorProto.EXTERNAL):
    """Point a float tensor of 4 values at `location` (its own data dropped)."""
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = data_location
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(SECRET)))):
        t.external_data.add(key=k, value=v)
    return t


def f32(name: str, values=(1.0, 2.0, 3.0, 4.0)):
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def model(nodes, inits=(), *, sparse=(), functions=(), out="y", out_shape=(4,), opset=17):
    """y = f(x); x: float [4]."""
    graph = helper.make_graph(nodes, "planted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))],
                              initializer=list(inits), sparse_initializer=list(sparse))
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(graph, opset_imports=ops, functions=list(functions))


def sparse(name: str, location: str):
    values = external(f32(name), location)
    return helper.make_sparse_tensor(values, numpy_helper.from_array(np.arange(4, dtype=np.int64), name + "_i"),
                                     [4])


def planted_models(location: str) -> dict:
    """Each position a TensorProto can take in a model, pointing at `location`; the tensor in
    position P is named 'planted_P'."""
    add = lambda name: helper.make_node("Add", ["x", name], ["y"], name="add")  # noqa: E731
    out = {}
    out["initializer"] = model([add("planted_initializer")], [external(f32("planted_initializer"), location)])
    out["constant_attribute"] = model([
        helper.make_node("Constant", [], ["c"], name="const", value=external(f32("planted_constant_attribute"),
                                                                              location)), add("c")])
    out["sparse_initializer"] = model([add("planted_sparse_initializer")],
                                      sparse=[sparse("planted_sparse_initializer", location)])
    branch = lambda name, node: helper.make_graph(  # noqa: E731
        [node], name, [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])])
    then_ = branch("then", helper.make_node("Constant", [], ["b"],
                                            sparse_value=sparse("planted_if_branch_sparse", location)))
    else_ = branch("else", helper.make_node("Constant", [], ["b"], value=f32("e")))
    out["if_branch_sparse"] = model([helper.make_node("If", ["cond"], ["c"], name="if", then_branch=then_,
                                                      else_branch=else_), add("c")],
                                    [numpy_helper.from_array(np.array(True), "cond")])
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "planted_loop_body_initializer"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])],
        initializer=[external(f32("planted_loop_body_initializer"), location)])
    out["loop_body_initializer"] = model(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)],
        [numpy_helper.from_array(np.int64(2), "n")])
    fn = helper.make_function("local", "AddPlanted", ["a"], ["z"], [
        helper.make_node("Constant", [], ["k"], value=external(f32("planted_function"), location)),
        helper.make_node("Add", ["a", "k"], ["z"])], [helper.make_opsetid("", 17)])
    out["function"] = model([helper.make_node("AddPlanted", ["x"], ["y"], domain="local")], functions=[fn])
    # external_data entries alone (data_location left DEFAULT) are refused too
    out["location_without_flag"] = model(
        [add("planted_location_without_flag")],
        [external(f32("planted_location_without_flag"), location, data_location=TensorProto.DEFAULT)])
    return out


def locations(planted) -> dict:
    """The ways a request could name the planted files: absolute, and relative climbing out of
    whatever directory the server runs in."""
    up = "../" * 40
    return {"secret_absolute": str(planted["secret"]), "secret_dotdot": up + str(planted["secret"]).lstrip("/"),
            "fifo_absolute": str(planted["fifo"]), "fifo_dotdot": up + str(planted["fifo"]).lstrip("/"),
            "relative": "secret.bin"}


def test_the_planted_tensors_are_real_attacks(planted, monkeypatch):
    """ONNX's own helper, given such a tensor, reads the file relative to the working directory:
    what the server did before (from '/', 'etc/passwd'), and must never do."""
    monkeypatch.chdir(planted["secret"].parent)
    assert numpy_helper.to_array(external(f32("probe"), "secret.bin")).tobytes() == SECRET


# --- over gRPC --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.target)
    yield service_pb2_grpc.GradCheckServiceStub(channel)
    channel.close()


def refused(stub, request, code=grpc.StatusCode.INVALID_ARGUMENT, timeout: float = 60) -> str:
    """The call's status must be `code` (well within `timeout`); returns everything the server said."""
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(request, timeout=timeout)
    err = info.value
    said = f"{err.details()} {err.trailing_metadata()} {err.debug_error_string()}"
    assert err.code() == code, said
    assert "\n" not in err.details()
    return said


def onnx_request(m, params: str = "none", **import_options):
    return service_pb2.VerifyRequest(onnx_model=m.SerializeToString(),
                                     onnx=service_pb2.OnnxImport(params=params, **import_options))


def test_no_tensor_in_a_model_can_name_a_file(stub, planted):
    cases = 0
    for where, location in locations(planted).items():
        for position, m in planted_models(location).items():
            said = refused(stub, onnx_request(m))
            assert f"'planted_{position}'" in said and "external data" in said, (where, position, said)
            assert SECRET.decode() not in said, (where, position)
            cases += 1
    assert cases == 5 * 7  # every location in every position
    assert fifo_has_no_reader(planted["fifo"])


def test_no_tensor_in_the_import_options_can_name_a_file(stub, planted):
    ok = model([helper.make_node("Add", ["x", "w"], ["y"])], [f32("w")])
    for location in locations(planted).values():
        for options in ({"inputs": {"x": external(f32("planted_input"), location).SerializeToString()}},
                        {"loss": "cotangent",
                         "cotangent": external(f32("planted_cotangent"), location).SerializeToString()}):
            said = refused(stub, onnx_request(ok, **options))
            name = "planted_input" if "inputs" in options else "planted_cotangent"
            field = "onnx.inputs[x]" if "inputs" in options else "onnx.cotangent"
            assert f"'{name}'" in said and field in said and SECRET.decode() not in said, said
    assert fifo_has_no_reader(planted["fifo"])
    # the same model and options, with the data embedded, verify: only the file reference was refused
    request = onnx_request(ok, inputs={"x": f32("x").SerializeToString()}, loss="cotangent",
                           cotangent=f32("c").SerializeToString())
    request.onnx.params = "w"
    assert stub.Verify(request, timeout=60).report.verdict == "pass"


def test_the_server_runs_in_an_empty_directory_of_its_own(server):
    home = Path(os.readlink(f"/proc/{server.pid}/cwd"))
    assert home != Path.cwd() and home != ROOT and os.listdir(home) == []
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for pid in server.worker_pids():
        assert Path(os.readlink(f"/proc/{pid}/cwd")) == home


# --- folding bombs ----------------------------------------------------------------------------

def _c(name, v):
    return numpy_helper.from_array(np.asarray(v), name)


def _consume(name):
    """y = (x + sum(float(name))) * w: the folded value reaches the loss, and w is a parameter (a graph with
    none is refused before it runs: nothing to check)."""
    return [helper.make_node("Cast", [name], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["as_float"], ["total"], keepdims=0),
            helper.make_node("Add", ["x", "total"], ["shifted"]),
            helper.make_node("Mul", ["shifted", "w"], ["y"])]


def _bomb(node, *inits):
    return model([node] + _consume(node.output[0]), (*inits, f32("w")))


def bombs() -> dict:
    """node name (its error must name it) -> (a model of a few hundred bytes, the gRPC code)."""
    big = np.array([10**5, 10**5], np.int64)
    loop_body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.INT64, [])], initializer=[_c("one", np.int64(1))])
    limit, invalid = grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT
    return {
        "range_2e8": (_bomb(helper.make_node("Range", ["a", "b", "d"], ["r"], name="range_2e8"),
                            _c("a", np.int64(0)), _c("b", np.int64(2 * 10**8)), _c("d", np.int64(1))), limit),
        "range_1e11": (_bomb(helper.make_node("Range", ["a", "b", "d"], ["r"], name="range_1e11"),
                             _c("a", np.int64(0)), _c("b", np.int64(10**11)), _c("d", np.int64(1))), limit),
        "range_float": (_bomb(helper.make_node("Range", ["a", "b", "d"], ["r"], name="range_float"),
                              _c("a", np.float32(0)), _c("b", np.float32(2e8)), _c("d", np.float32(1))), limit),
        "constant_of_shape": (_bomb(helper.make_node("ConstantOfShape", ["s"], ["r"], name="constant_of_shape",
                                                     value=_c("v", np.array([7], np.int64))), _c("s", big)), limit),
        "expand": (_bomb(helper.make_node("Expand", ["one", "s"], ["r"], name="expand"),
                         _c("one", np.ones((1, 1), np.int64)), _c("s", big)), limit),
        "tile": (_bomb(helper.make_node("Tile", ["one", "s"], ["r"], name="tile"),
                       _c("one", np.ones((1, 1), np.int64)), _c("s", big)), limit),
        "loop_1e12": (_bomb(helper.make_node("Loop", ["n", "go", "v0"], ["r"], name="loop_1e12", body=loop_body),
                            _c("n", np.int64(10**12)), _c("go", np.bool_(True)), _c("v0", np.int64(0))), invalid),
    }


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_folding_bombs_over_grpc_are_refused_within_the_limits(server, stub):
    [worker] = server.worker_pids()
    before = peak_rss(worker)
    for name, (m, code) in bombs().items():
        said = refused(stub, onnx_request(m, params="w"), code)
        assert f"'{name}'" in said, said  # the node is named
        assert server.worker_pids() == [worker], name  # answered, not killed for time
    growth = peak_rss(worker) - before
    assert growth < 200 * MB, f"the worker's peak RSS grew by {growth / MB:.0f} MB"


def test_a_node_the_evaluator_fails_on_is_one_line_naming_it(stub):
    bad = {"bad_reshape": _bomb(helper.make_node("Reshape", ["v", "s"], ["r"], name="bad_reshape"),
                                _c("v", np.arange(10)), _c("s", np.array([5, 3]))),
           "zero_step": _bomb(helper.make_node("Range", ["a", "b", "d"], ["r"], name="zero_step"),
                              _c("a", np.int64(0)), _c("b", np.int64(5)), _c("d", np.int64(0)))}
    for name, m in bad.items():
        said = refused(stub, onnx_request(m, params="w"))
        op = m.graph.node[0].op_type
        assert f"{op} node '{name}'" in said and "import time" in said, said


# --- the command line -------------------------------------------------------------------------

_RUNNER = """
import contextlib, io, json, resource, sys
from gradcheck_svc.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    # each command's work runs in a child of this process (bounded.py): the peak is its own or a child's
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024
    print(json.dumps([code, err.getvalue().strip(), peak]), flush=True)
"""


def cli(*commands, timeout: float = 120, limit_as: int | None = None) -> list:
    """Each `gradcheck-svc ARGV` of `commands`, in turn, in one child process (its address space
    capped at limit_as) -> [(exit code, stderr, peak RSS in bytes so far)]. Uncapped, the child is a fork
    of this process running the same main(argv) (tests/forked_cli.py: a second of interpreter start-up
    spared, and a fork's rusage starts afresh, its peak its own from here on); capped, it is a fresh
    interpreter, whose address space is the command's alone (this process's may be over the cap already)."""
    argv = json.dumps([[str(a) for a in c] for c in commands])
    if limit_as is None:
        out = _forked_runner(argv, timeout)
    else:
        cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))  # noqa: E731
        proc = subprocess.run([sys.executable, "-c", _RUNNER, argv], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=cap, cwd=ROOT,
                              env=_env({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}))
        out = proc.stdout + proc.stderr
    results = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert len(results) == len(commands), out[-2000:]
    return results


def _forked_runner(argv: str, timeout: float) -> str:
    """_RUNNER in a fork of this process (cwd the repository, as the subprocess's): what it wrote on stdout
    and stderr; killed past `timeout` (a FIFO opened for reading would block it)."""
    import gc
    import io
    import selectors
    import time

    read, write = os.pipe()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            gc.freeze()  # the test process's objects are never collected here (forked_cli.py)
            os.close(read)
            os.dup2(write, 1), os.dup2(write, 2)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)
            os.chdir(ROOT)
            os.environ.pop("GRADCHECK_TOKEN", None)
            sys.argv = ["-c", argv]
            exec(_RUNNER, {"__name__": "__main__"})
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(write)
    chunks, deadline, late = [], time.monotonic() + timeout, False
    with selectors.DefaultSelector() as sel:
        sel.register(read, selectors.EVENT_READ)
        while not (late := (left := deadline - time.monotonic()) <= 0 or not sel.select(left)):
            if not (data := os.read(read, 65536)):
                break
            chunks.append(data)
    os.close(read)
    if late:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert not late, f"the commands ran past {timeout} s: {b''.join(chunks)[-2000:]!r}"
    return b"".join(chunks).decode("utf-8", "replace")


def test_folding_bombs_on_the_command_line(tmp_path):
    """Each bomb after a tiny model, in one process: its peak RSS stays within 200 MB of the tiny one's."""
    tiny = tmp_path / "tiny.onnx"
    onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])], [f32("w")]), tiny)
    commands = [["verify", tiny, "--params", "w"]]
    for name, (m, _) in bombs().items():
        onnx.save(m, tmp_path / f"{name}.onnx")
        commands.append(["verify", tmp_path / f"{name}.onnx", "--params", "w"])
    (code, err, baseline), *results = cli(*commands)
    assert code == 0, err
    for name, (code, err, peak) in zip(bombs(), results):
        assert code == 2 and len(err.splitlines()) == 1 and f"'{name}'" in err, err
        assert peak - baseline < 200 * MB, f"{name}: peak RSS {peak / MB:.0f} MB, a tiny model's {baseline / MB:.0f}"


def test_folding_has_a_time_budget(tmp_path, capsys):
    """Fifty folded nodes cannot fit in 0.5 ms of folding: a one-line error naming the budget. From the
    command line the whole request's limit (of which folding gets half) may fire first: one line either way."""
    from gradcheck_svc.errors import GradcheckError
    from gradcheck_svc.onnx_import import import_onnx
    from gradcheck_svc.onnx_import.folding import FoldBudget
    from gradcheck_svc.onnx_import.importer import ImportOptions

    nodes = [helper.make_node("Add", [f"k{i}", "one"], [f"k{i + 1}"], name=f"fold_{i}") for i in range(50)]
    m = model(nodes + _consume("k50"), [_c("k0", np.int64(0)), _c("one", np.int64(1)), f32("w")])
    path = tmp_path / "many_folds.onnx"
    onnx.save(m, path)
    with pytest.raises(GradcheckError, match="constant folding at import time took more than 0.0005 s"):
        import_onnx(path, ImportOptions(params="w"), budget=FoldBudget(seconds=0.0005))
    assert main(["verify", str(path), "--params", "w", "--max-request-seconds", "0.001"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("constant folding at import time took more than 0.0005 s" in err
                                           or "exceeded the per-request limit of 0.001 s" in err), err
    assert main(["verify", str(path), "--params", "w", "--fd", "full"]) == 0  # within the default budget


def input_values(graph_json: Path, name: str) -> list:
    return next(i for i in json.loads(graph_json.read_text())["inputs"] if i["name"] == name)["value"]["data"]


def test_external_data_on_the_command_line_only_beside_the_model(tmp_path, planted, capsys):
    weights = np.arange(4, dtype=np.float32) + 0.5
    # beside the model: read, and the values are the file's
    good = tmp_path / "good"
    good.mkdir()
    (good / "w.bin").write_bytes(weights.tobytes())
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [external(f32("w"), "w.bin")])
    onnx.save(m, good / "m.onnx")
    assert main(["import-onnx", str(good / "m.onnx"), "-o", str(good / "g.json"), "--params", "w"]) == 0
    capsys.readouterr()
    assert input_values(good / "g.json", "w") == weights.tolist()
    # anywhere else: refused, one line, the tensor named, nothing read
    bad = tmp_path / "bad"
    bad.mkdir()
    os.symlink(planted["secret"], bad / "link.bin")
    os.mkfifo(bad / "pipe.bin")
    cases = {str(planted["secret"]): "relative", "../" + planted["secret"].name: "relative",
             "link.bin": "symbolic link", "pipe.bin": "not a regular file", "missing.bin": "missing"}
    commands = []
    for i, location in enumerate(cases):
        m = model([helper.make_node("Add", ["x", "planted_w"], ["y"])], [external(f32("planted_w"), location)])
        onnx.save(m, bad / f"m{i}.onnx")
        commands.append(["verify", bad / f"m{i}.onnx"])
    for (location, needle), (code, err, _) in zip(cases.items(), cli(*commands)):
        assert code == 2 and len(err.splitlines()) == 1, (location, err)
        assert "'planted_w'" in err and needle in err and SECRET.decode() not in err, (location, err)
    assert fifo_has_no_reader(bad / "pipe.bin")


def test_tensor_files_on_the_command_line_only_beside_them(tmp_path, planted, capsys):
    m = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])], [f32("w")]), m)
    (tmp_path / "x.bin").write_bytes(np.full(4, 2.5, np.float32).tobytes())
    (tmp_path / "x.pb").write_bytes(external(f32("x"), "x.bin").SerializeToString())
    assert main(["import-onnx", str(m), "-o", str(tmp_path / "g.json"), "--input", f"x={tmp_path / 'x.pb'}"]) == 0
    capsys.readouterr()
    assert input_values(tmp_path / "g.json", "x") == [2.5] * 4
    (tmp_path / "evil.pb").write_bytes(external(f32("planted_x"), str(planted["secret"])).SerializeToString())
    (tmp_path / "evil_c.pb").write_bytes(external(f32("planted_c"), str(planted["fifo"])).SerializeToString())
    cases = ((["--input", f"x={tmp_path / 'evil.pb'}"], "planted_x"),
             (["--loss", "cotangent", "--cotangent", str(tmp_path / "evil_c.pb")], "planted_c"))
    for (_, name), (code, err, _) in zip(cases, cli(*[["verify", m, *flags] for flags, _ in cases])):
        assert code == 2 and len(err.splitlines()) == 1 and f"'{name}'" in err and "relative" in err, err
        assert SECRET.decode() not in err
    assert fifo_has_no_reader(planted["fifo"])


# --- MemoryError ------------------------------------------------------------------------------

def memory_bombs() -> dict:
    """Within a raised --max-elements, each needs 8 GB or more at once (no allocation that size succeeds
    under the address-space caps below): one while folding, one in the engine."""
    n = 2 * 10**9
    fold = _bomb(helper.make_node("Range", ["a", "b", "d"], ["r"], name="oom_range"),
                 _c("a", np.int64(0)), _c("b", np.int64(n)), _c("d", np.int64(1)))
    engine = _bomb(helper.make_node("ConstantOfShape", ["s"], ["r"], name="oom_fill",  # a float fill: a node
                                    value=_c("v", np.array([1.0], np.float32))), _c("s", np.array([n], np.int64)))
    return {"oom_range": fold, "oom_fill": engine}


def vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def test_out_of_memory_is_a_limit_over_grpc(tmp_path):
    """A worker whose address space is capped (prlimit) meets requests bigger than it: the answer is
    RESOURCE_EXHAUSTED, and the worker lives on."""
    with ServerProcess("--workers", "1", "--max-elements", "10000000000",
                       log_path=tmp_path / "server.log") as srv:
        [worker] = srv.worker_pids()
        cap = vm_size(worker) + 1024 * MB
        resource.prlimit(worker, resource.RLIMIT_AS, (cap, cap))
        with grpc.insecure_channel(srv.target) as channel:
            stub = service_pb2_grpc.GradCheckServiceStub(channel)
            for name, m in memory_bombs().items():
                said = refused(stub, onnx_request(m, params="w"), grpc.StatusCode.RESOURCE_EXHAUSTED)
                assert "memory" in said, said
                assert srv.worker_pids() == [worker], name
            ok = model([helper.make_node("Add", ["x", "w"], ["y"])], [f32("w")])
            assert stub.Verify(onnx_request(ok, params="w"), timeout=60).report.verdict == "pass"
        home = Path(os.readlink(f"/proc/{srv.pid}/cwd"))
        assert home.is_dir() and home != Path.cwd()
    assert not home.exists()  # the server's private directory goes with it


def test_out_of_memory_on_the_command_line_is_exit_2(tmp_path):
    commands = []
    for name, m in memory_bombs().items():
        onnx.save(m, tmp_path / f"{name}.onnx")
        commands.append(["verify", tmp_path / f"{name}.onnx", "--params", "w", "--max-elements", "10000000000"])
    for code, err, _ in cli(*commands, limit_as=3 * 1024 * MB):
        assert code == 2 and len(err.splitlines()) == 1 and "memory" in err, err
