"""The CNN ops (conv, conv_transpose, max_pool, avg_pool, batch_norm, lrn, pad, prelu) against torch autograd, op by op,
on every test case the op declares (OpDef.cases: 1-D to 2-D, groups and depthwise, strides, dilations,
explicit and auto pads, ceil_mode, count_include_pad, every pad mode), in float64.

torch gets the op's ONNX semantics from its own functions: asymmetric pads become an F.pad before an
unpadded torch op (the pads the op resolved for auto_pad and ceil_mode, read from its Geometry), and
LRN's ONNX window (floor((size-1)/2) channels before, ceil after) a channel sum by F.avg_pool over a
padded square. Random DAGs in test_torch_reference use small generic shapes; these ops need N, C, spatial
axes, so they are checked here (and in the PyTorch round trip of tests/onnx/test_onnx_torch_roundtrip.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gradcheck_svc.ops import get_op
from gradcheck_svc.verify.audit import op_graph
from gradcheck_svc.verify.run import VerifyOptions, run_engine

from conftest import LazyModule  # noqa: E402

torch = LazyModule("torch")  # imported by the first test that uses it
F = LazyModule("torch.nn.functional")


def _torch_pad(geo):
    k = geo.k
    out = []
    for i in reversed(range(k)):  # torch lists the last axis first
        out += [geo.pads[i], geo.pads[k + i]]
    return out


def _conv(x, w, b=None, *, geo, group, bias):
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[geo.k]
    return fn(F.pad(x, _torch_pad(geo)), w, b, stride=geo.strides, dilation=geo.dilations, groups=group)


def _conv_transpose(x, w, b=None, *, geo, group, bias):
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[geo.k]
    y = fn(x, w, None, stride=geo.strides, dilation=geo.dilations, groups=group)  # unpadded: the full output
    crop = []  # then the ONNX pads cropped from each end, and output_padding's zeros added at the end
    for i in reversed(range(geo.k)):
        crop += [-geo.pads[i], geo.spatial[i] - (y.shape[2 + i] - geo.pads[i])]
    y = F.pad(y, crop)
    return y + b.reshape((-1,) + (1,) * geo.k) if b is not None else y


def _max_pool(x, *, geo):
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[geo.k]
    return fn(F.pad(x, _torch_pad(geo), value=-math.inf), geo.kernel, geo.strides, dilation=geo.dilations)


def _avg_pool(x, *, geo, count):
    # window sums as a depthwise convolution with a kernel of ones (torch's avg_pool has no dilation)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[geo.k]
    c = x.shape[1]
    ones = torch.ones((c, 1) + geo.kernel, dtype=x.dtype)
    total = fn(F.pad(x, _torch_pad(geo)), ones, stride=geo.strides, dilation=geo.dilations, groups=c)
    return total / torch.as_tensor(count)


def _lrn(x, *, alpha, beta, bias, size, axis, before, after):
    sq = F.pad((x * x).unsqueeze(1), [0, 0] * (x.ndim - 2) + [before, after])  # pad the channel axis
    window = F.avg_pool3d(sq.reshape(sq.shape[:3] + (-1, 1)), (size, 1, 1), stride=1).reshape(x.shape) * size
    return x / (bias + alpha / size * window) ** beta


def _pad(x, *, widths, mode, value, in_shape):
    if mode == "constant":
        return F.pad(x, [p for pair in reversed(widths) for p in pair], value=value)
    # torch pads the trailing axes of an (N, C, ...) tensor in these modes: the unpadded leading axes
    # become C (with N = 1), the axes from the first padded one on are padded
    first = next(i for i, w in enumerate(widths) if any(w))
    flat = [p for pair in reversed(widths[first:]) for p in pair]
    lead = tuple(x.shape[:first])
    y = F.pad(x.reshape((1, math.prod(lead)) + tuple(x.shape[first:])), flat,
              mode={"reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode])
    return y.reshape(lead + tuple(y.shape[2:]))


def _batch_norm(x, scale, b, mean, var, *, epsilon, k):
    c = (-1,) + (1,) * k
    return (x - mean.reshape(c)) / torch.sqrt(var.reshape(c) + epsilon) * scale.reshape(c) + b.reshape(c)


TORCH = {
    "conv": _conv, "conv_transpose": _conv_transpose, "max_pool": _max_pool, "avg_pool": _avg_pool, "lrn": _lrn, "pad": _pad,
    "batch_norm": _batch_norm,
    "prelu": lambda x, slope: torch.where(x > 0, x, x * slope),
}


@pytest.mark.parametrize("name", sorted(TORCH))
def test_cnn_op_gradients_match_torch(name, rng):
    op = get_op(name)
    for case in op.cases(rng):
        graph = op_graph(op, case)
        attrs = graph.node("y").attrs
        xs = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in case.inputs]
        y = TORCH[name](*xs, **attrs)
        weights = rng.uniform(0.5, 1.5, size=tuple(y.shape))
        (y * torch.from_numpy(weights)).sum().backward()
        engine = run_engine(op_graph(op, case, weights), VerifyOptions(dtype="float64"), "float64")
        assert engine.loss == pytest.approx(float((y * torch.from_numpy(weights)).sum().detach()), rel=1e-12, abs=1e-12)
        for i, x in enumerate(xs):
            np.testing.assert_allclose(engine.gradients[f"in{i}"], x.grad.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name} {case.attrs} input {i}")
