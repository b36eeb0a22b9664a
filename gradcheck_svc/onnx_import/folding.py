"""Import-time constant folding within the request's limits.

A node whose inputs are all known at import time is computed then, by ONNX's reference
evaluator. A 300-byte model can ask for Range(0, 1e11), a ConstantOfShape of 10^12 elements or a
Loop of 10^12 iterations, so nothing is computed before its size is known:

- the size of every output comes from ONNX's shape inference on the one node, with its small
  constant inputs given as initializers (so Range, ConstantOfShape, Expand, Tile, Reshape, Pad,
  Resize... get exact shapes) and is counted, with every earlier folded value, against
  `max_elements`; a dimension that depends on the data (NonZero, Unique) is bounded by the
  inputs' size; an output whose rank is unknown is refused;
- folding has a time budget (half the request's `max_request_seconds`), enforced between nodes
  and, on the main thread, inside the evaluator by an alarm;
- control flow (Loop, If, Scan: any node with a graph attribute) is not folded: it is an
  unsupported op, named with its node;
- a node the evaluator fails on is a one-line GraphError; a MemoryError a LimitError;
- ops the evaluator computes wrongly are computed here instead (OWN_FOLDS): GatherElements (its
  np.choose takes at most 63 choices, and its fallback reshapes wrongly: every BERT's token types
  gathered from a 512-long buffer).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError, LimitError
from ..limits import LIMIT_SPECS
from .context import Filled, Unsupported

# inputs up to this size go to shape inference as data (shapes, repeats, bounds, pads, axes);
# larger ones only as shapes: no shape-determining input is that large
_DATA_FOR_INFERENCE = 4096


@dataclass(frozen=True)
class FoldBudget:
    """What import-time folding may compute: elements over all folded values together, and seconds."""

    max_elements: int = LIMIT_SPECS["max_elements"].default
    seconds: float = LIMIT_SPECS["max_request_seconds"].default / 2

    @classmethod
    def from_limits(cls, limits) -> "FoldBudget":
        """Within a request's ServerLimits: its max_elements, half its max_request_seconds."""
        return cls(max_elements=limits.max_elements, seconds=limits.max_request_seconds / 2)


def _gather_elements(node, data, indices):
    """ONNX GatherElements: np.take_along_axis after ONNX's checks (same rank, indices in range)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    data, indices = np.asarray(data), np.asarray(indices).astype(np.int64)
    if data.ndim != indices.ndim or not -data.ndim <= axis < data.ndim:
        raise GraphError(f"indices of rank {indices.ndim} and axis {axis} for data of rank "
                         f"{data.ndim}")
    n = data.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise GraphError(f"an index is out of range [-{n}, {n - 1}]")
    if any(i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis % data.ndim):
        raise GraphError(f"indices {list(indices.shape)} exceed data {list(data.shape)} off the axis")
    # off the axis, indices may be shorter than data (ONNX): take the leading part of data there
    window = tuple(slice(None) if k == axis % data.ndim else slice(0, i) for k, i in enumerate(indices.shape))
    return [np.take_along_axis(data[window], np.where(indices < 0, indices + n, indices), axis=axis)]


OWN_FOLDS = {"GatherElements": _gather_elements}  # op type -> (node, *inputs) -> outputs


class _OutOfTime(BaseException):
    """The alarm went off inside the evaluator (a BaseException: no `except Exception` in it swallows it)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def is_control_flow(node) -> bool:
    from onnx import AttributeProto

    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


class Folder:
    """The folding budget of one import: elements used so far and seconds spent."""

    def __init__(self, budget: FoldBudget, model):
        self.budget = budget
        self.opset_import = list(model.opset_import)
        self.ir_version = model.ir_version
        self.used = 0
        self.spent = 0.0

    def charge(self, n: int, what: str) -> None:
        """Count n more elements computed at import time; LimitError past max_elements."""
        if self.used + n > self.budget.max_elements:
            total = f"{n}" if not self.used else f"{n} more (after {self.used} already)"
            raise LimitError(f"{what} would hold {total} elements at import time, over the limit of "
                             f"{self.budget.max_elements} (max_elements)", field="model", limit="max_elements")
        self.used += n

    def materialize(self, value):
        """A constant as an array, charging a lazily filled one for the memory it is about to take."""
        if isinstance(value, Filled):
            self.charge(_elements(value.shape), "a constant filled by ConstantOfShape")
            return value.materialize(np.float64)
        return value

    # --- sizes before computing ---------------------------------------------------------

    def predicted_elements(self, node, feeds: dict) -> int:
        """Elements of all the node's outputs, from ONNX's shape inference, before computing them."""
        from onnx import helper, numpy_helper, shape_inference

        try:
            inputs, inits = [], []
            for name, v in feeds.items():
                a = np.asarray(v)
                inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                            a.shape))
                if a.size <= _DATA_FOR_INFERENCE:
                    inits.append(numpy_helper.from_array(a, name))
            graph = helper.make_graph([node], "fold", inputs, [], initializer=inits)
            one = helper.make_model(graph, opset_imports=self.opset_import, ir_version=self.ir_version)
            inferred = shape_inference.infer_shapes(one, strict_mode=True, data_prop=True)
        except Exception as exc:  # the node contradicts its inputs, or holds what ONNX cannot type: one line
            raise GraphError(f"cannot be computed at import time ({_one_line(exc)})") from None
        types = {vi.name: vi.type for vi in inferred.graph.value_info}
        bound = max(1, sum(np.asarray(v).size for v in feeds.values()))
        total = 0
        for out in node.output:
            if not out:
                continue
            t = types.get(out)
            if t is None or not t.HasField("tensor_type"):
                raise Unsupported(node.op_type)  # sequences, maps, optionals: not values the engine has
            if not t.tensor_type.HasField("shape"):
                raise GraphError("the size of its output cannot be known before computing it at import time "
                                 "(ONNX shape inference gives no shape)")
            n = 1
            for d in t.tensor_type.shape.dim:
                # a data-dependent dimension (NonZero, Unique, Compress) is at most the inputs' size
                n *= d.dim_value if d.HasField("dim_value") else bound
            total += n
        return total

    # --- computing --------------------------------------------------------------------

    def run(self, node, feeds: dict, label: str) -> list:
        """The node's outputs by ONNX's reference evaluator, within the budget."""
        if is_control_flow(node):
            raise Unsupported(node.op_type)
        left = self.budget.seconds - self.spent
        if left <= 0:
            raise self._out_of_time(node, label)
        start = time.monotonic()
        what = f"the output of {node.op_type} node {label}"
        try:
            predicted = self.predicted_elements(node, feeds)
            self.charge(predicted, what)
            outs = self._evaluate(node, feeds, label, left)
            actual = sum(np.size(o) for o in outs)
            if actual > predicted:  # shape inference under-counted (a data-dependent size): count the rest
                self.charge(actual - predicted, what)
            return outs
        finally:
            self.spent += time.monotonic() - start

    def _evaluate(self, node, feeds: dict, label: str, left: float) -> list:
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        from ..alarm import alarm, timer_free

        own = OWN_FOLDS.get(node.op_type)
        if own is not None:
            try:
                return own(node, *(feeds[n] if n else None for n in node.input))
            except MemoryError:
                raise LimitError(f"{node.op_type} node {label}: computing it at import time ran out of memory",
                                 field="model") from None
        try:
            graph = helper.make_graph(
                [node], "fold",
                [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                               np.shape(v)) for n, v in feeds.items()],
                [helper.make_empty_tensor_value_info(o) for o in node.output if o])
            one = helper.make_model(graph, opset_imports=self.opset_import, ir_version=self.ir_version)
            # the model's own arithmetic, warnings and all (T5's buckets take log(0) = -inf, then mask it)
            with np.errstate(all="ignore"):
                if timer_free():
                    with alarm(left, _OutOfTime):
                        return ReferenceEvaluator(one).run(None, feeds)
                return ReferenceEvaluator(one).run(None, feeds)
        except _OutOfTime:
            raise self._out_of_time(node, label) from None
        except MemoryError:
            raise LimitError(f"{node.op_type} node {label}: computing it at import time ran out of memory",
                             field="model") from None
        except Exception as exc:  # the reference evaluator's own failure on this node: say so in one line
            raise GraphError(f"cannot be computed at import time ({_one_line(exc)})") from None

    def _out_of_time(self, node, label: str) -> LimitError:
        return LimitError(f"{node.op_type} node {label}: constant folding at import time took more than "
                          f"{self.budget.seconds:g} s (half of max_request_seconds)", field="model")
