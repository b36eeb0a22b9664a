"""A Graph compiled for execution: the steps that reach the loss, which of
them need gradients, and when each value can be released."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..graph.ir import Graph
from ..ops.base import FLOAT, OpDef, save_inputs, save_nothing


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    op: OpDef
    inputs: tuple[str, ...]
    attrs: dict
    needs_grad: bool  # some parameter reaches this node through differentiable inputs
    grad_inputs: tuple[bool, ...]  # per input: differentiable and needs a gradient
    in_ranks: tuple[int, ...]
    out_rank: int
    release: tuple[str, ...]  # values read for the last time by this step (forward)
    inplace: bool = False  # writes its result into its first input's buffer
    grad_targets: tuple[tuple[int, str, tuple], ...] = ()  # (k, name, shape) of each grad input: backward's loop
    vjp_attrs: dict | None = None  # what backward passes the vjp: attrs, plus needs_input_grad if it takes it
    save_attrs: dict | None = None  # what forward passes the save rule: attrs, plus needs_input_grad if it takes it
    # derived from the fields above, for the executor's hot loops:
    save: Callable | None = field(init=False)  # the op's save rule (default: its inputs); None: saves nothing
    value_names: tuple[str, ...] = field(init=False)  # (name, *inputs): what a saved tensor can be (its source)

    def __post_init__(self):
        if self.vjp_attrs is None:  # a Step built without it: the vjp gets the attributes alone
            object.__setattr__(self, "vjp_attrs", self.attrs)
        if self.save_attrs is None:
            object.__setattr__(self, "save_attrs", self.attrs)
        save = self.op.save or save_inputs
        object.__setattr__(self, "save", None if save is save_nothing else save)
        object.__setattr__(self, "value_names", (self.name, *self.inputs))


class Program:
    def __init__(self, graph: Graph, float_dtype):
        self.graph = graph
        self.float_dtype = float_dtype
        self.output = graph.output
        self.shapes = {name: spec.shape for name, spec in graph.specs.items()}
        self.params = graph.parameters
        self.param_set = frozenset(self.params)  # (membership in the backward's hot loop)

        # in-place writers -> the value whose buffer they write (graph/inplace.py resolved the reads)
        self.inplace_root: dict[str, str] = {}
        for node in graph.nodes:
            if node.inplace:
                self.inplace_root[node.name] = self.inplace_root.get(node.inputs[0], node.inputs[0])
        kept = self._prune(graph)
        # values sharing a buffer with an in-place write: they get a private, writable buffer
        self.aliased = set(self.inplace_root) | set(self.inplace_root.values())

        grad = set(self.params)
        last_reader: dict[str, int] = {}
        for i, node in enumerate(kept):
            for name in node.inputs:
                last_reader[name] = i
        steps = []
        for i, node in enumerate(kept):
            gi = tuple(node.op.is_differentiable(k) and name in grad for k, name in enumerate(node.inputs))
            if any(gi) and graph.specs[node.name].dtype == FLOAT:
                grad.add(node.name)
            attrs = dict(node.attrs)
            if node.op.wants_dtype:
                attrs["dtype"] = float_dtype
            release = tuple(
                name for name in dict.fromkeys(node.inputs)
                if last_reader[name] == i and name != graph.output and name not in graph.inputs
            )
            targets = tuple((k, name, self.shapes[name]) for k, name in enumerate(node.inputs) if gi[k])
            vjp_attrs = {**attrs, "needs_input_grad": gi} if node.op.takes_needs_input_grad else attrs
            # a save may drop what no needed gradient reads only if its vjp is told so too
            masked = node.op.save_takes_needs_input_grad and node.op.takes_needs_input_grad
            save_attrs = {**attrs, "needs_input_grad": gi} if masked else attrs
            steps.append(Step(i, node.name, node.op, node.inputs, attrs, node.name in grad, gi,
                              tuple(graph.specs[n].rank for n in node.inputs), node.spec.rank, release,
                              node.inplace, targets, vjp_attrs, save_attrs))
        self.steps: list[Step] = steps
        self.requires_grad = grad
        self.by_name = {s.name: s for s in steps}
        # value -> the index of the first step that reads it: no step before it depends on the value (a walk
        # over what is downstream of some values starts at the first of theirs)
        self.first_reader: dict[str, int] = {}
        for s in steps:
            for name in s.inputs:
                self.first_reader.setdefault(name, s.index)
        # elements a value costs while it is made: its own, plus its op's temporary (OpDef.scratch)
        self.footprint = {name: math.prod(shape) for name, shape in self.shapes.items()}
        for s in steps:
            if s.op.scratch is not None:
                self.footprint[s.name] += s.op.scratch([self.shapes[n] for n in s.inputs], self.shapes[s.name],
                                                       **s.attrs)

    def _prune(self, graph: Graph) -> list:
        """The ancestors of the loss, plus in-place writers into a kept buffer (their write can
        still overwrite a value some kept node saved) and their ancestors; to a fixpoint."""
        needed = {graph.output}
        count = -1
        while True:
            kept = []
            for node in reversed(graph.nodes):
                if node.name in needed or self.inplace_root.get(node.name) in needed:
                    kept.append(node)
                    needed.add(node.name)
                    needed.update(node.inputs)
            if len(kept) == count or not self.inplace_root:
                return kept[::-1]
            count = len(kept)

    def start_of(self, names) -> int:
        """The index of the first step that reads any of `names` (len(steps): none does)."""
        return min((self.first_reader.get(n, len(self.steps)) for n in names), default=len(self.steps))

    def downstream(self, names) -> set[str]:
        """Values that depend on any of `names` (including them)."""
        out = set(names)
        for s in self.steps[self.start_of(out):]:
            if any(n in out for n in s.inputs):
                out.add(s.name)
        return out


def program_of(graph: Graph, float_dtype) -> Program:
    """The graph's Program at a dtype, compiled once: a verification's engine, finite differences
    and symbolic oracle all run the same graph (at float64, one Program for the three), and
    compiling costs about as much as running a small graph. Kept on the graph, which nothing
    changes after validation; a Program is read-only once built."""
    cache = graph.__dict__.setdefault("_programs", {})
    key = np.dtype(float_dtype).name
    program = cache.get(key)
    if program is None:
        program = cache[key] = Program(graph, float_dtype)
    return program
