"""Each small internal error of issue 35 (item 6, "low") is a named one-line refusal, or exact:

- damaged finite-difference shard files (truncated, overwritten, a member cut, foreign metadata): exit 2
  naming the file, never BadZipFile / EOFError;
- `--checkpoint budget:²` (str.isdigit takes it), a 5,000-digit budget (int() refuses it), `every:³`;
- an ONNX initializer or graph input with data type 9999: named; Trilu with k = ±2**63 - the kept
  triangle is exact (all of the matrix, or none of it), not an overflow;
- an S3 key holding `//` is a graph of its own, read back under its exact key (it used to stop its shard
  for good: exit 75 on every retry).
"""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from gradcheck_svc.batch.generate import graph_dict
from gradcheck_svc.cli import main
from grpc_helpers import EXAMPLES
from fd_graphs import mlp


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code: int, err: str, *parts: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gradcheck-svc: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    for part in parts:
        assert part in lines[0], err


def test_damaged_fd_shard_files_are_named(capsys, tmp_path):
    graph = tmp_path / "mlp.json"
    graph.write_text(mlp())
    out = tmp_path / "fd"
    for i in range(2):
        code, _, err = run(capsys, "verify", graph, "--fd-shard-count", 2, "--fd-shard-index", i, "--fd-out", out)
        assert code == 0, err
    victim = out / "fd-shard-0001-of-0002.npz"
    good = victim.read_bytes()

    def foreign_meta() -> bytes:  # a well-formed .npz whose metadata is JSON of another shape
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(b"[1, 2]", np.uint8))
        return buf.getvalue()

    def member_cut() -> bytes:  # the zip's directory intact, one member's bytes overwritten
        data = bytearray(good)
        with zipfile.ZipFile(io.BytesIO(good)) as z:
            info = z.infolist()[0]
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        data[start:start + 64] = b"\xff" * 64
        return bytes(data)
    damaged = {"truncated": good[:len(good) // 2], "garbage": b"\x00" * 512, "empty": b"",
               "foreign metadata": foreign_meta(), "member overwritten": member_cut()}
    for what, data in damaged.items():
        victim.write_bytes(data)
        code, _, err = run(capsys, "verify", graph, "--fd-from", out)
        _refused(code, err, "fd-shard-0001-of-0002.npz: damaged or not a finite-difference shard", "--fd-from")
    victim.write_bytes(good)
    code, _, err = run(capsys, "verify", graph, "--fd-from", out)
    assert code == 0, err


@pytest.mark.parametrize("spec, reason", [
    ("budget:²", "'budget:²': budget:BYTES needs a positive integer number of bytes"),
    ("budget:" + "9" * 5000, "'budget:' and 5000 characters: budget:BYTES needs a positive integer number of "
                             "bytes of at most 20 digits"),
    ("every:³", "'every:³': every:K needs a positive integer K"),
])
def test_checkpoint_counts_are_ascii_and_bounded(capsys, spec, reason):
    code, _, err = run(capsys, "verify", EXAMPLES / "seed.json", "--checkpoint", spec)
    _refused(code, err, "checkpoint: " + reason)


def _model(path, nodes, inputs, inits, outputs):
    from onnx import helper

    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_unknown_onnx_data_types_are_named(capsys, tmp_path):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    w = TensorProto(name="W", dims=[3], data_type=9999, raw_data=b"\0" * 12)
    model = _model(tmp_path / "init.onnx", [helper.make_node("Mul", ["x", "W"], ["y"])], [x], [w], [y])
    for command in (["verify", model], ["import-onnx", model, "-o", tmp_path / "g.json"]):
        code, _, err = run(capsys, *command)
        _refused(code, err, "tensor 'W' has an unknown data type 9999")
    bad = helper.make_tensor_value_info("x", 9999, [3])
    w = helper.make_tensor("W", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    model = _model(tmp_path / "input.onnx", [helper.make_node("Mul", ["x", "W"], ["y"])], [bad], [w], [y])
    code, _, err = run(capsys, "verify", model)
    _refused(code, err, "input 'x' has an unknown element type 9999")


@pytest.mark.parametrize("upper, k, kept", [(1, -2**63, True), (1, 2**63 - 1, False), (0, 2**63 - 1, True),
                                            (0, -2**63, False)])
def test_trilu_with_a_diagonal_beyond_the_matrix_is_exact(tmp_path, upper, k, kept):
    from onnx import TensorProto, helper, numpy_helper

    from gradcheck_svc.onnx_import import import_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    inits = [numpy_helper.from_array(np.full((3, 4), 0.5, np.float32), "W"),
             numpy_helper.from_array(np.array(k, np.int64), "k")]
    nodes = [helper.make_node("Mul", ["x", "W"], ["h"]), helper.make_node("Trilu", ["h", "k"], ["y"], upper=upper)]
    message = import_onnx(str(_model(tmp_path / "trilu.onnx", nodes, [x], inits, [y])))
    [mask] = [i for i in message.inputs if i.name.endswith("/mask")]
    from gradcheck_svc.graph.validate import decode_tensor

    values, _ = decode_tensor(mask.value, mask.name)
    assert values.shape == (3, 4) and values.dtype == bool and bool(values.all() if kept else not values.any())


def test_an_s3_key_with_a_double_slash_round_trips(capsys, s3):  # noqa: F811 -- the fixture
    fs, _ = s3
    fs.mkdir("slashes")
    for k, key in enumerate(("a//x.json", "a/x.json", "b///y.json")):  # two distinct graphs: a//x and a/x
        fs.pipe_file(f"slashes/graphs/{key}", json.dumps(graph_dict(k, size=2, kind="ok")).encode())
    code, _, err = run(capsys, "batch", "--manifest", "s3://slashes/graphs", "--shard-index", 0,
                       "--out", "s3://slashes/out")
    assert code == 0 and "finished: 3 pass" in err, err
    code, _, err = run(capsys, "batch-merge", "s3://slashes/out", "--json", "s3://slashes/merged.json")
    assert code == 0, err
    merged = json.loads(fs.cat_file("slashes/merged.json"))
    assert sorted(r["graph"] for r in merged["records"]) == ["a//x.json", "a/x.json", "b///y.json"]
    fs.pipe_file("slashes/graphs/list.txt", b"a//x.json\nb///y.json\n")  # a list file names them exactly too
    code, _, err = run(capsys, "batch", "--manifest", "s3://slashes/graphs/list.txt", "--shard-index", 0,
                       "--out", "s3://slashes/out2")
    assert code == 0 and "2 graphs" in err and "finished: 2 pass" in err, err
