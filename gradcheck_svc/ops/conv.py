"""conv: N-d convolution (1-D and 2-D in practice) with ONNX's attributes.

X (N, C, *S), W (M, C/group, *K), optional bias B (M). Grouped and
depthwise (group == C) convolution, strides, explicit pads or auto_pad,
dilations. The forward is im2col feeding one batched GEMM: the windows are a
strided view (ops/windows.py), copied once, channel-major as Caffe lays them
out, into a (N, G, C/G * prod(K), P) matrix that the weight (G, M/G,
C/G * prod(K)) multiplies from the left: the product is the output as it
lies. No Python loop over pixels; the same code runs on CuPy.

Batch-aware (the finite-difference oracle adds one leading axis to X, W or B,
or several of them): leading axes of X and W are aligned before the GEMM, so
a stack of perturbed weights convolves one input in a single matmul, and the
images of a batch or of a stack of perturbed inputs go through one GEMM with
their one weight (ResNet's small late-stage images would otherwise re-pack a
large weight per image).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from .base import FLOAT, REALS, Attr, Case, OpDef, Spec
from .registry import register
from .slices import Sliced, take_slices
from .windows import WINDOW_ATTRS, channel_view, crop_spatial, geometry, pad_spatial, windows, windows_adjoint


def _x_and_w(node, specs, attrs, name: str, layout: str):
    """X's and W's shapes, after the checks both convolutions make: 2 or 3 inputs, X and W of one
    rank, kernel_shape (when given) that of W."""
    if len(specs) not in (2, 3):
        raise GraphError(f"{name} takes X, W and an optional bias B, got {len(specs)} inputs", node=node)
    x, w = specs[0].shape, specs[1].shape
    if len(x) < 3 or len(w) != len(x):
        raise GraphError(f"{name} expects X (N, C, *spatial) and W ({layout}, *kernel) of the same rank, "
                         f"got {list(x)} and {list(w)}", node=node)
    if attrs["kernel_shape"] is not None and tuple(attrs["kernel_shape"]) != w[2:]:
        raise GraphError(f"kernel_shape {attrs['kernel_shape']} differs from the weight's {list(w[2:])}", node=node)
    return x, w


def _infer(node, specs, attrs):
    x, w = _x_and_w(node, specs, attrs, "conv", "M, C/group")
    group = attrs["group"]
    m, c = w[0], x[1]
    if group < 1 or c % group or m % group or w[1] * group != c:
        raise GraphError(f"conv: X has {c} channels, W {list(w)}, group {group}: need C = group * W.shape[1] "
                         "and M divisible by group", node=node)
    if len(specs) == 3 and specs[2].shape != (m,):
        raise GraphError(f"conv bias must have shape [{m}], got {list(specs[2].shape)}", node=node)
    geo = geometry(node, x[2:], w[2:], attrs)
    return Spec((x[0], m) + geo.out, FLOAT), {"geo": geo, "group": group, "bias": len(specs) == 3}


def _im2col(xp, x, geo, group, batch_inner: bool = False):
    """(..., N, C, *S) -> (..., N, G, C/G * prod(K), P): every window as a column, per group, in
    channel-major order (Caffe's). The one copy reads each window row's run of output positions
    (a whole output row per kernel offset), where a window-major layout copies kernel-width runs;
    and W (G, Mg, CgK) @ cols is the output (N, M, *out) as it lies, no transpose after the GEMM.
    batch_inner: (G, CgK, B * P) instead, the B = prod(..., N) images inside the GEMM's inner
    dimension (one GEMM per group for all of them)."""
    k = geo.k
    win = windows(xp, pad_spatial(xp, x, geo), geo)  # (..., N, C, *out, *K), a view
    t = win.ndim - 2 * k  # the axes before out: (..., N, C)
    kernel, out = tuple(range(t + k, t + 2 * k)), tuple(range(t, t + k))
    order = (t - 1,) + kernel + tuple(range(t - 1)) + out if batch_inner else tuple(range(t)) + kernel + out
    cols = xp.transpose(win, order)
    c, p = x.shape[-(k + 1)], math.prod(geo.out)
    cgk = (c // group) * math.prod(geo.kernel)
    if batch_inner:
        return cols.reshape((group, cgk, math.prod(x.shape[:-(k + 1)]) * p))
    return cols.reshape(x.shape[:-(k + 1)] + (group, cgk, p))


def _weight_matrix(w, group, k):
    """(..., M, Cg, *K) -> (..., G, M/G, Cg * prod(K)), a view where w is contiguous."""
    lead = w.shape[:-(k + 2)]
    return w.reshape(lead + (group, w.shape[-(k + 2)] // group, -1))


def _align(wm, other, lw, lo):
    """Leading (perturbed-copy) axes of the weight matrix against those of the other GEMM operand
    (..., N, G, rows, P): W gets an N axis, the other the same number of leading axes."""
    if lw:
        wm = wm.reshape(wm.shape[:lw] + (1,) + wm.shape[lw:])
        other = other.reshape((1,) * max(0, lw - lo) + other.shape)
    return wm, other


def _merged(w, lw, group, batch):
    """Whether every image (the batch's and the perturbed copies', batch of them) goes through one
    GEMM with the one weight: a GEMM per image re-packs the weight each time, which costs as much
    as the product where the images are small (ResNet's last stage: 512 x 4608 weights, 7 x 7)."""
    return lw == 0 and group == 1 and batch > 1


def _conv(xp, x, w, b=None, *, geo, group, bias):
    k = geo.k
    lx, lw = x.ndim - (k + 2), w.ndim - (k + 2)
    batch, m = math.prod(x.shape[:-(k + 1)]), w.shape[-(k + 2)]
    if _merged(w, lw, group, batch):
        y = xp.matmul(_weight_matrix(w, 1, k)[0], _im2col(xp, x, geo, 1, batch_inner=True)[0])  # (M, B * P)
        y = xp.swapaxes(y.reshape(m, batch, -1), 0, 1)  # (B, M, P): the one copy of the output
        y = y.reshape(x.shape[:-(k + 1)] + (m,) + geo.out)
    else:
        wm, cols = _align(_weight_matrix(w, group, k), _im2col(xp, x, geo, group), lw, lx)
        y = xp.matmul(wm, cols)  # (*L, N, G, Mg, P): the output as it lies
        del cols  # the windows (9x the input for a 3x3 kernel) are not held while the bias is added
        y = y.reshape(y.shape[:-3] + (m,) + geo.out)
    if b is not None:  # y is a fresh array of our own: the bias in place where it fits
        bias = channel_view(b, k)
        if y.dtype == bias.dtype and np.broadcast_shapes(y.shape, bias.shape) == y.shape:
            y += bias
        else:
            y = y + bias
    return y


def _input_adjoint(xp, g, w, geo, group):
    """The conv's gradient in X from g (..., N, M, *out) and w (..., M, C/group, *K): the weights'
    transpose times g per group (the columns' gradient, channel-major as _im2col lays them out),
    added back into the input one kernel offset at a time (col2im). conv's vjp, and
    conv_transpose's forward; batch-aware like the forward (leading axes on g or w)."""
    k = geo.k
    lg, lw = g.ndim - (k + 2), w.ndim - (k + 2)
    m, c = g.shape[lg + 1], w.shape[-(k + 1)] * group
    lead = g.shape[:lg + 1]  # (..., N)
    if _merged(w, lw, group, math.prod(lead)):  # (C * K, M) @ g as (M, B * P), g's one copy
        gm = xp.swapaxes(g.reshape(-1, m, math.prod(geo.out)), 0, 1).reshape(m, -1)
        dcols = xp.matmul(xp.swapaxes(_weight_matrix(w, 1, k)[0], 0, 1), gm)
        dcols = xp.moveaxis(dcols.reshape((c,) + geo.kernel + lead + geo.out), tuple(range(k + 1)),
                            tuple(range(lg + 1, lg + k + 2)))  # (..., N, C, *K, *out), a view
    else:
        gm = g.reshape(lead + (group, m // group, -1))  # (..., N, G, Mg, P)
        wm, gm = _align(_weight_matrix(w, group, k), gm, lw, lg)
        dcols = xp.matmul(xp.swapaxes(wm, -1, -2), gm)  # (..., N, G, CgK, P)
        dcols = dcols.reshape(dcols.shape[:-3] + (c,) + geo.kernel + geo.out)
    t = dcols.ndim - 2 * k  # (..., N, C, *K, *out), viewed as windows' (..., N, C, *out, *K)
    dwin = xp.transpose(dcols, tuple(range(t)) + tuple(range(t + k, t + 2 * k)) + tuple(range(t, t + k)))
    return crop_spatial(windows_adjoint(xp, dwin, geo), geo)


def _weight_grad(xp, g, x, geo, group, shape):
    """The conv's gradient in W (shape) from g (N, M, *out) and its input x: per group, one GEMM with
    N * P as the inner dimension."""
    n, m = g.shape[0], g.shape[1]
    cols = _im2col(xp, x, geo, group, batch_inner=True)  # (G, CgK, N * P)
    gm = g.reshape(n, group, m // group, -1)  # (N, G, Mg, P)
    gm = (gm[0] if n == 1 else xp.transpose(gm, (1, 2, 0, 3))).reshape(group, m // group, -1)
    return xp.matmul(gm, xp.swapaxes(cols, -1, -2)).reshape(shape)


def _channel_sum(xp, g, k):
    return xp.sum(g, axis=(0,) + tuple(range(2, 2 + k)))


def _conv_vjp(xp, g, saved, geo, group, bias):
    x, w = saved
    dx, dw = _input_adjoint(xp, g, w, geo, group), _weight_grad(xp, g, x, geo, group, w.shape)
    return (dx, dw, _channel_sum(xp, g, geo.k)) if bias else (dx, dw)


def _sliced(xp, op, xs, base_out, attrs):
    """One changed slice through conv (ops/slices.py). A changed filter (W along M) or bias entry
    changes its own output channel only: that channel alone, one GEMM of X's windows with the
    changed filters. A change in one input channel reaches every output channel of a group-1 conv,
    as the unperturbed output plus the conv of that channel's change alone (1/C of the work), and
    only its own output channel of a depthwise conv with one filter per channel. None (densify)
    for anything else."""
    x, w, b = (list(xs) + [None])[:3]
    if sum(isinstance(v, Sliced) for v in (x, w, b)) != 1:
        return None
    geo, group = attrs["geo"], attrs["group"]
    ch = -(geo.k + 1)  # the channel axis of X and of the output
    if isinstance(w, Sliced):
        if w.axis != -(geo.k + 2):
            return None
        cols = _im2col(xp, x, geo, group)  # (N, G, CgK, P)
        filters = w.values.reshape(len(w), -1)  # (B, CgK)
        group_of = np.asarray(w.index) // (w.base.shape[0] // group)
        # (B, N, P), in the filters' dtype where that is wider (complex-step copies)
        y = xp.empty((len(w), cols.shape[0], cols.shape[3]), dtype=xp.result_type(cols.dtype, filters.dtype))
        for g in np.unique(group_of):  # one GEMM per group the changed filters belong to
            rows = np.flatnonzero(group_of == g)
            y[rows] = xp.swapaxes(xp.matmul(filters[rows], cols[:, g]), 0, 1)
        if b is not None:
            y += xp.take(b, w.index)[:, None, None]
        return Sliced(base_out, ch, w.index, y.reshape((len(w), cols.shape[0]) + geo.out))
    if isinstance(b, Sliced):
        delta = b.values - b.old(xp)
        old = take_slices(xp, base_out, ch, b.index)  # (B, N, *out)
        return Sliced(base_out, ch, b.index, old + delta.reshape((len(b),) + (1,) * (old.ndim - 1)))
    if x.axis != ch:
        return None
    c, m = x.base.shape[ch], w.shape[0]
    if group == 1:  # base + conv(the change in channel c, W[:, c])
        cols = _im2col(xp, (x.values - x.old(xp))[:, :, None], geo, 1)[:, :, 0]  # (B, N, K, P)
        wc = xp.moveaxis(xp.take(w, x.index, axis=1), 1, 0).reshape(len(x), 1, m, -1)  # (B, 1, M, K)
        y = xp.matmul(wc, cols)  # (B, N, M, P)
        return base_out + y.reshape((len(x),) + base_out.shape)
    if group == c == m:  # depthwise, one filter per channel: channel c alone, by filter c
        cols = _im2col(xp, x.values[:, :, None], geo, 1)[:, :, 0]  # (B, N, K, P)
        f = xp.take(w, x.index, axis=0).reshape(len(x), 1, 1, -1)  # (B, 1, 1, K)
        y = xp.matmul(f, cols)[..., 0, :]  # (B, N, P)
        if b is not None:
            y = y + xp.take(b, x.index)[:, None, None]
        return Sliced(base_out, ch, x.index, y.reshape((len(x), x.base.shape[0]) + geo.out))
    return None


def _im2col_elements(channels: int, n: int, geo) -> int:
    """Elements of one im2col matrix (or of its adjoint, col2im's input): a row per window."""
    return n * math.prod(geo.out) * channels * math.prod(geo.kernel)


def _scratch(in_shapes, out_shape, *, geo, **_):
    # forward and weight gradient copy X's windows; the input gradient builds their adjoint, as large
    return _im2col_elements(in_shapes[0][1], in_shapes[0][0], geo)


def _scratch_transpose(in_shapes, out_shape, *, geo, **_):
    # the forward is conv's input gradient (the output's windows), the backward conv itself on g
    return _im2col_elements(out_shape[1], out_shape[0], geo)


def _save(xs, y, **_):
    return xs[0], xs[1]  # the bias gradient needs only g


def _cases(rng):
    s = REALS.sample
    return [
        Case([s(rng, (2, 2, 7)), s(rng, (3, 2, 3)), s(rng, (3,))], {}),  # 1-D
        Case([s(rng, (1, 2, 8)), s(rng, (2, 2, 2))], {"strides": [2], "pads": [1, 2], "dilations": [2]}),
        Case([s(rng, (1, 4, 5, 5)), s(rng, (4, 2, 3, 2)), s(rng, (4,))], {"group": 2, "pads": [1, 0, 1, 1]}),
        Case([s(rng, (2, 3, 5, 4)), s(rng, (6, 1, 3, 3))], {"group": 3, "strides": [2, 1],
                                                            "auto_pad": "SAME_UPPER"}),  # depthwise, x2
        Case([s(rng, (1, 2, 6, 6)), s(rng, (2, 2, 2, 2)), s(rng, (2,))], {"dilations": [2, 2],
                                                                          "auto_pad": "SAME_LOWER"}),
        Case([s(rng, (2, 3, 4, 4)), s(rng, (3, 1, 3, 3)), s(rng, (3,))], {"group": 3, "pads": [1, 1, 1, 1]}),  # depthwise
    ]


register(OpDef(
    name="conv", forward=_conv, vjp=_conv_vjp, infer=_infer, arity=None, input_kinds=(FLOAT,),
    attrs={**WINDOW_ATTRS, "group": Attr("int", 1, doc="channel groups; group == C is depthwise")},
    save=_save, cases=_cases, sliced=_sliced, sliced_axes=(1, 0, 0),  # X's channels, W's filters, B
    multilinear=(0, 1),  # in X and W; the bias adds
    scratch=_scratch,
    doc="ONNX Conv: X (N, C, *S) * W (M, C/group, *K) + B (M); im2col + one batched GEMM"))


# --- conv_transpose -------------------------------------------------------------------
# The adjoint of conv in its input: X (N, C, *S) and W (C, M/group, *K), W laid out as the conv
# whose input gradient it is (that conv maps the output back onto X's size). Output size
# (S - 1) * stride - pad_begin - pad_end + dilation * (K - 1) + output_padding + 1 per axis.


def _infer_transpose(node, specs, attrs):
    x, w = _x_and_w(node, specs, attrs, "conv_transpose", "C, M/group")
    group, k = attrs["group"], len(x) - 2
    if group < 1 or x[1] % group or w[0] != x[1]:
        raise GraphError(f"conv_transpose: X has {x[1]} channels, W {list(w)}, group {group}: need W.shape[0] = C "
                         "and C divisible by group", node=node)
    kernel = w[2:]
    strides = tuple(attrs["strides"] or (1,) * k)
    dilations = tuple(attrs["dilations"] or (1,) * k)
    pads = tuple(attrs["pads"] or (0,) * (2 * k))
    extra = tuple(attrs["output_padding"] or (0,) * k)
    if len(strides) != k or len(dilations) != k or len(pads) != 2 * k or len(extra) != k:
        raise GraphError(f"strides, dilations and output_padding need {k} values, pads {2 * k}", node=node)
    if any(not 0 <= e < max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise GraphError(f"output_padding {list(extra)} must be >= 0 and below the stride or dilation", node=node)
    out = tuple((n - 1) * s - pads[i] - pads[k + i] + d * (kk - 1) + e + 1
                for i, (n, s, d, kk, e) in enumerate(zip(x[2:], strides, dilations, kernel, extra)))
    if min(out) < 1:
        raise GraphError(f"conv_transpose output would be {list(out)}: the pads are larger than the output", node=node)
    geo = geometry(node, out, kernel, {"strides": strides, "dilations": dilations, "pads": pads})
    if geo.out != x[2:]:  # (guaranteed by the size rule above; a broken rule must not go unnoticed)
        raise GraphError(f"conv_transpose geometry maps {list(out)} to {list(geo.out)}, not {list(x[2:])}", node=node)
    if len(specs) == 3 and specs[2].shape != (w[1] * group,):
        raise GraphError(f"conv_transpose bias must have shape [{w[1] * group}], got {list(specs[2].shape)}", node=node)
    return Spec((x[0], w[1] * group) + out, FLOAT), {"geo": geo, "group": group, "bias": len(specs) == 3}


def _conv_transpose(xp, x, w, b=None, *, geo, group, bias):
    y = _input_adjoint(xp, x, w, geo, group)
    return y + channel_view(b, geo.k) if b is not None else y


def _conv_transpose_vjp(xp, g, saved, geo, group, bias):
    x, w = saved
    # y is conv's input gradient, linear in x and w: its x-gradient is conv itself, its w-gradient
    # conv's weight gradient with the roles of g and the input exchanged
    dx = _conv(xp, g, w, geo=geo, group=group, bias=False)
    dw = _weight_grad(xp, x, g, geo, group, w.shape)
    return (dx, dw, _channel_sum(xp, g, geo.k)) if bias else (dx, dw)


def _transpose_cases(rng):
    s = REALS.sample
    return [
        Case([s(rng, (2, 2, 5)), s(rng, (2, 3, 3)), s(rng, (3,))], {}),  # 1-D
        Case([s(rng, (1, 2, 4, 3)), s(rng, (2, 2, 3, 2))], {"strides": [2, 1], "pads": [1, 0, 0, 1],
                                                             "output_padding": [1, 0]}),
        Case([s(rng, (1, 4, 3, 3)), s(rng, (4, 1, 2, 2)), s(rng, (2,))], {"group": 2, "dilations": [2, 1],
                                                                          "strides": [2, 2]}),
    ]


register(OpDef(
    name="conv_transpose", forward=_conv_transpose, vjp=_conv_transpose_vjp, infer=_infer_transpose, arity=None,
    input_kinds=(FLOAT,),
    attrs={"kernel_shape": WINDOW_ATTRS["kernel_shape"], "strides": WINDOW_ATTRS["strides"],
           "pads": WINDOW_ATTRS["pads"], "dilations": WINDOW_ATTRS["dilations"],
           "group": Attr("int", 1, doc="channel groups"),
           "output_padding": Attr("ints", None, doc="extra size at the end of each spatial axis (< stride)")},
    save=_save, cases=_transpose_cases, scratch=_scratch_transpose,
    multilinear=(0, 1),  # in X and W; the bias adds
    doc="ONNX ConvTranspose: the adjoint of conv in its input, X (N, C, *S) * W (C, M/group, *K) + B (M)"))
