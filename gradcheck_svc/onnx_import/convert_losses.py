"""ONNX's classification losses, as PyTorch's exporters write F.cross_entropy and F.nll_loss (opset 12+):
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, composed of registry ops.

The targets must be known at import time (a buffer, or an integer graph input: data of the one evaluation).
Each element's weight is weight[target] (1 without class weights), 0 where the target is ignore_index; the loss
is -(picked log-probability x that weight), summed, or for `mean` divided by the weights' sum (ONNX's
definition, torch's too). Constant class weights make each element's weight a constant; class weights that are
values (a weight buffer is a parameter under the default --params weights, a float graph input a value) are
taken at the targets (`take`), so their gradient is computed too."""
from __future__ import annotations

import numpy as np

from .context import Unsupported
from .converters import converter


@converter("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
def _nll(ctx, node, a, opset):
    x = ctx.value(node.input[0])
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise Unsupported(f"{node.op_type} of an input of rank {len(shape)}")
    if not ctx.is_const(node.input[1]):
        raise Unsupported(f"{node.op_type} with computed targets")
    target = np.asarray(ctx.const(node.input[1], "target")).astype(np.int64)
    kept, safe = _targets(node, a, target, shape[1])
    reduction = a.get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"{node.op_type} with reduction '{reduction}'")
    logp = x if node.op_type == "NegativeLogLikelihoodLoss" else ctx.emit(
        "log_softmax", [x], {"axis": 1}, name=node.output[1] if len(node.output) > 1 and node.output[1] else None)
    idx = ctx.add_input(ctx.fresh(f"{node.output[0]}/target"), safe[:, None], False, "int64")
    picked = ctx.emit("reshape", [ctx.emit("take_along_axis", [logp, idx], {"axis": 1})], {"shape": list(target.shape)})
    weights = _weights(ctx, node, kept, safe)
    loss = ctx.emit("mul", [ctx.emit("neg", [picked]), weights], name=node.output[0] if reduction == "none" else None)
    if reduction != "none":
        loss = ctx.emit("sum", [loss], {"axis": None, "keepdims": False},
                        name=node.output[0] if reduction == "sum" else None)
    if reduction == "mean":  # over the weights' sum (0 / 0 where every target is ignored: NaN, as ONNX's)
        loss = ctx.emit("div", [loss, ctx.emit("sum", [weights], {"axis": None, "keepdims": False})],
                        name=node.output[0])
    return [loss, logp] if node.op_type == "SoftmaxCrossEntropyLoss" else loss


def _targets(node, a, target: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(1.0 where the target counts, 0.0 where it is ignore_index; the targets with an ignored one's index made a
    valid class, its weight 0). A target out of [0, classes) otherwise is refused."""
    ignore = a.get("ignore_index")
    ignored = target == ignore if ignore is not None else np.zeros(target.shape, bool)
    if np.any(~ignored & ((target < 0) | (target >= classes))):
        raise Unsupported(f"{node.op_type} with a target out of range [0, {classes - 1}]")
    return np.where(ignored, 0.0, 1.0), np.where(ignored, 0, target)


def _weights(ctx, node, kept: np.ndarray, safe: np.ndarray) -> str:
    """Each element's weight: a constant, or the class weights (a value) taken at the targets, times `kept`."""
    where = ctx.fresh(f"{node.output[0]}/weights")
    if len(node.input) <= 2 or not node.input[2]:
        return ctx.add_input(where, kept, False, ctx.float_dtype)
    if ctx.is_const(node.input[2]):
        weight = np.asarray(ctx.const(node.input[2], "weight"), dtype=np.float64)
        return ctx.add_input(where, kept * weight[safe], False, ctx.float_dtype)
    at = ctx.add_input(ctx.fresh(f"{node.output[0]}/classes"), safe, False, "int64")
    taken = ctx.emit("take", [ctx.value(node.input[2]), at], {"axis": 0})
    return ctx.emit("mul", [taken, ctx.add_input(where, kept, False, ctx.float_dtype)])
