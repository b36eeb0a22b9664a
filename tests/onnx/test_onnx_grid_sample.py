"""Issue 45 item 2: ONNX GridSample (F.grid_sample) and AffineGrid, exported by torch's legacy exporter,
imported (ops/grid_sample.py: int64 corners, then a smooth sampler) and checked against torch's float64
gradients through each parameter's source_names: every mode x padding x align_corners, a spatial transformer
(affine_grid + grid_sample) passing, a grid point exactly on a pixel boundary reported as a kink, not a
failure, and what is refused said in one line."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from param_models import grid_sample as spatial_transformer  # noqa: E402
from torch_export import export_onnx  # noqa: E402

from gradcheck.v1 import service_pb2  # noqa: E402
from gradcheck_svc.cli import main  # noqa: E402
from gradcheck_svc.request import prepare, run_request  # noqa: E402
from gradcheck_svc.verify import VerifyOptions, verify  # noqa: E402
from gradcheck_svc.verify.engine_run import run_engine  # noqa: E402

F = torch.nn.functional
COMBOS = list(itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection"), (False, True)))


class Sampler(torch.nn.Module):
    """A 1x1x4x4 image and a 1x3x3x2 grid, both parameters: their gradients are the op's two."""

    def __init__(self, grid, mode, padding_mode, align_corners):
        super().__init__()
        self.image = torch.nn.Parameter(torch.randn(1, 1, 4, 4, dtype=torch.float64, generator=_gen(0)))
        self.grid = torch.nn.Parameter(torch.as_tensor(grid, dtype=torch.float64))
        self.kw = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}

    def forward(self, x):
        return F.grid_sample(self.image * x, self.grid, **self.kw)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _pixels(g, align_corners):
    return (g + 1) / 2 * 3 if align_corners else ((g + 1) * 4 - 1) / 2


def _away_from_kinks(rng):
    """A grid a little beyond [-1, 1] (padding is read) whose pixel coordinates, either way of aligning, are
    0.1 or more from every integer and half-integer (floor's, rounding's, clipping's and reflection's kinks)."""
    g = rng.uniform(-1.4, 1.4, (1, 3, 3, 2))
    while True:
        d = np.min([np.abs(2 * _pixels(g, a) - np.round(2 * _pixels(g, a))) / 2 for a in (False, True)], axis=0)
        if d.min() >= 0.1:
            return g
        g[d < 0.1] = rng.uniform(-1.4, 1.4, np.count_nonzero(d < 0.1))


def _tensor(a) -> bytes:
    return onnx.numpy_helper.from_array(np.asarray(a)).SerializeToString()


def _request(model, x, opset=None):
    blob = export_onnx(model, (x,), "legacy") if opset is None else _export_at(model, x, opset)
    name = onnx.load_from_string(blob).graph.input[0].name
    c = np.random.default_rng(1).standard_normal(tuple(model(x).shape))
    req = service_pb2.VerifyRequest(onnx_model=blob, onnx=service_pb2.OnnxImport(
        inputs={name: _tensor(x.numpy())}, loss="cotangent", cotangent=_tensor(c)))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad((model(x) * torch.from_numpy(c)).sum(), list(params.values()))
    return req, {n: g.numpy() for n, g in zip(params, grads)}


def _export_at(model, x, opset: int) -> bytes:
    import io
    import warnings

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=False, opset_version=opset)
    return f.getvalue()


def _engine_equals_torch(req, want) -> tuple:
    """The engine's gradient of each parameter equal to torch's (under the torch name its source_names give);
    returns the graph and the torch names compared."""
    graph, _ = prepare(req)
    engine = run_engine(graph, VerifyOptions(dtype="float64"), "float64")
    compared = set()
    for p in graph.parameters:
        names = [s.name for s in graph.inputs[p].source_names] or [p]
        [torch_name] = names
        expected = want[torch_name].reshape(graph.inputs[p].value.shape)
        np.testing.assert_allclose(engine.gradients[p], expected, rtol=1e-12, atol=1e-12, err_msg=torch_name)
        compared.add(torch_name)
    return graph, compared


@pytest.mark.parametrize(("mode", "padding", "align"), COMBOS, ids=["-".join(map(str, c)) for c in COMBOS])
def test_every_mode_padding_and_alignment_equals_torch(mode, padding, align):
    model = Sampler(_away_from_kinks(np.random.default_rng(7)), mode, padding, align)
    x = torch.full((1, 1, 4, 4), 1.5, dtype=torch.float64)
    req, want = _request(model, x)
    graph, compared = _engine_equals_torch(req, want)
    assert compared == {"image", "grid"}
    # the grid's gradient is torch's, non-zero for bilinear; nearest is piecewise constant in the grid
    assert (np.abs(want["grid"]).max() > 0.1) == (mode == "bilinear")
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_opset_16s_mode_names_import_the_same(mode):
    """GridSample's first opset (16) names modes bilinear / bicubic; opset 20 linear / cubic."""
    model = Sampler(_away_from_kinks(np.random.default_rng(7)), mode, "reflection", False)
    req, want = _request(model, torch.full((1, 1, 4, 4), 1.5, dtype=torch.float64), opset=16)
    [node] = [n for n in onnx.load_from_string(req.onnx_model).graph.node if n.op_type == "GridSample"]
    assert {a.name: a.s for a in node.attribute}["mode"] == mode.encode()  # (opset 20 would say "linear")
    graph, compared = _engine_equals_torch(req, want)
    assert compared == {"image", "grid"}
    assert verify(graph, VerifyOptions()).verdict == "pass"


def test_a_spatial_transformer_passes_equal_to_torch():
    model, x = spatial_transformer()  # affine_grid of a learned theta, grid_sample of a conv's output
    req, want = _request(model, x)
    graph, compared = _engine_equals_torch(req, want)
    assert compared == {"theta", "conv.weight", "conv.bias"}
    report = run_request(req)
    assert report.verdict == "pass"
    req.graph.claimed.CopyFrom(_claims(want))  # torch's whole named_parameters() archive, as --claimed
    assert run_request(req).verdict == "pass"
    # theta reaches the loss only through AffineGrid and GridSample's grid: a wrong gradient there fails
    claimed = dict(want, theta=want["theta"] + 1e-3 * np.abs(want["theta"]).max())
    req.graph.claimed.CopyFrom(_claims(claimed))
    assert run_request(req).verdict == "fail"


def _claims(grads):
    from gradcheck_core.claims import claims_message

    return claims_message(grads)


def test_a_grid_point_on_a_pixel_boundary_is_a_kink_not_a_failure():
    grid = _away_from_kinks(np.random.default_rng(7))
    grid[0, 1, 1] = [-0.25, 0.25]  # pixel coordinates (1.0, 2.0) exactly, without align_corners
    model = Sampler(grid, "bilinear", "zeros", False)
    req, want = _request(model, torch.full((1, 1, 4, 4), 1.5, dtype=torch.float64))
    graph, _ = _engine_equals_torch(req, want)  # torch's convention there: the corner is floor(c)
    report = verify(graph, VerifyOptions())
    assert report.verdict == "pass", report.to_text()
    assert "nondifferentiable_point" in report.to_text() and "floor(c)" in report.to_text(), report.to_text()


def test_bicubic_is_refused_in_one_line_exit_2(tmp_path, capsys):
    model = Sampler(_away_from_kinks(np.random.default_rng(7)), "bicubic", "zeros", False)
    path = tmp_path / "bicubic.onnx"
    path.write_bytes(export_onnx(model, (torch.ones(1, 1, 4, 4, dtype=torch.float64),), "legacy"))
    assert main(["import-onnx", str(path), "-o", str(tmp_path / "g.pb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "GridSample with mode cubic" in err, err
    assert "node '/GridSample'" in err, err
