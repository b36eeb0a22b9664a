"""ModelProto -> gradcheck.v1.Graph: parameters, inputs, nodes in order, the loss.

Parameters (requires_grad) are chosen by a spec, a comma-separated list of:
  weights       every float initializer of rank >= 1 (the default: a model's weights; scalar
                initializers -- exponents, epsilons, the 0.5 of a GELU, as the dynamo exporter
                stores them, 0-d or an exporter-made shape [1] -- stay constants: d/d(exponent)
                of x**p is NaN at negative x; so do masks, initializers holding an entry of magnitude
                >= 1e30 such as an additive causal mask's finfo.min, Resize's scales, rotary tables --
                initializers read only through Cos/Sin -- and what a dynamo export's optimizer made and
                traced to no torch parameter: its cos/sin, a folded position embedding; tables.py)
  initializers  every float initializer, scalars too
  inputs        every float graph input that is not an initializer
  constants     every float value known at import time that a node makes
                (Constant, ConstantOfShape -- the light models' weights -- and
                values folded from them)
  all           initializers, inputs and constants
  none          nothing but what is named
  NAME          one value of the model, by its ONNX name
Graph inputs take the given values (TensorProto files) or are drawn from a
seed, uniform in [0, 1) like ONNX's backend test runner. The loss is the
chosen output (default: the first) reduced to a scalar: "sum" (default),
"mean", or "cotangent": sum(output * c) with c given, or drawn from a seed
(standard normal) -- the form a softmax output needs, whose plain sum is 1
whatever the weights.

Every unsupported node is collected, not just the first: the error lists
each unsupported op type with its count and its first node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError, LimitError
from ..graph.ir import FOLDED_CONSTANTS
from ..graph.validate import MAX_NOTE_LENGTH
from .context import Context, Filled, Unsupported
from . import convert_composed, convert_losses, convert_masks, convert_nn, convert_rnn, loops  # noqa: F401  (their converters join CONVERTERS on import)
from .converters import CONVERTERS, constant_of_shape, constant_value, static_initializers
from .folding import FoldBudget, Folder
from .model import default_opset
from .provenance import _SIGNATURE, MADE, exported_parameters, source_names  # noqa: F401 (_SIGNATURE: tests)
from .tables import buffer_names, exporter_made, is_mask, may_hold, rotary_tables, unexplained_constants
from .archive import legacy_unheld, unnamed_tensors
from .ties import block_start, copy_candidates, find_ties, torch_aliases

LOSSES = ("sum", "mean", "cotangent")
PARAM_GROUPS = ("weights", "initializers", "inputs", "constants", "all", "none")
DEFAULT_PARAMS = "weights"
LOSS_NAME = "loss"


@dataclass
class ImportOptions:
    params: str = DEFAULT_PARAMS
    inputs: dict = field(default_factory=dict)  # ONNX input name -> np.ndarray
    input_seed: int = 0
    output: str | None = None
    loss: str = "sum"
    cotangent: np.ndarray | None = None
    cotangent_seed: int = 0


def _attrs(node) -> dict:
    from onnx import helper

    out = {}
    for at in node.attribute:
        v = helper.get_attribute_value(at)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [e.decode("utf-8", "replace") for e in v]
        out[at.name] = v
    return out


def _label(node) -> str:
    return f"'{node.name}'" if node.name else f"producing '{node.output[0]}'"


def _declared(vi) -> list:
    """An input's declared dimensions: a size (0 included: a static 0 is a size, not "dynamic"), or its
    dim_param / "?" where dynamic."""
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in vi.type.tensor_type.shape.dim]


def _static_shape(vi) -> tuple:
    """An input's declared shape, its dynamic dimensions 1 (docs/onnx.md) and a static 0 kept (verified at its
    declared size, as a graph file's empty input is); a negative one is refused: it is neither a size nor
    dynamic (the ONNX checker lets it through)."""
    declared = _declared(vi)
    if any(isinstance(d, int) and d < 0 for d in declared):
        raise GraphError(f"input '{vi.name}' declares shape {declared} with a negative dimension", field="inputs")
    return tuple(d if isinstance(d, int) else 1 for d in declared)


def _is_weight(name: str, value) -> bool:
    """A model's weight, not a scalar: rank >= 1, and not one number in an exporter-made initializer
    (the dynamo exporter stores attention's 1/sqrt(d) as val_N of shape [1], as 0-d ones elsewhere);
    a torch parameter of one element keeps its name (`prelu.weight`) and stays a weight."""
    return value.ndim >= 1 and not (value.size == 1 and value.ndim == 1 and MADE.match(name))


def _np_dtype(vi):
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


class Importer:
    def __init__(self, model, options: ImportOptions, name: str, budget: FoldBudget | None = None):
        from onnx import numpy_helper

        self.model, self.options = model, options
        self.folder = Folder(budget or FoldBudget(), model)
        self.opset = default_opset(model)
        g = model.graph
        self.inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        floats = [a.dtype for a in self.inits.values() if a.dtype.kind == "f"]
        floats += [_np_dtype(vi) for vi in g.input if vi.name not in self.inits and _np_dtype(vi).kind == "f"]
        float_dtype = "float64" if any(d == np.float64 for d in floats) else "float32"
        names = {n for node in g.node for n in list(node.input) + list(node.output)}
        names |= {vi.name for vi in g.input} | set(self.inits)
        self.ctx = Context(name or g.name or "onnx", float_dtype, names, charge=self.folder.charge)
        tokens = [t.strip() for t in options.params.split(",") if t.strip()]
        self.groups = {t for t in tokens if t in PARAM_GROUPS}
        if "all" in self.groups:
            self.groups |= {"initializers", "inputs", "constants"}
        self.named = [t for t in tokens if t not in PARAM_GROUPS]
        self.made_params: set[str] = set()
        self.made_constants: set[str] = set()  # tables.exporter_made
        self.ties: dict[str, tuple[str, str]] = {}  # an exporter's copy of a parameter -> (it, relation): ties.py
        self.unsupported: dict[str, list] = {}  # reason -> [count, first node]

    # --- parameters and inputs --------------------------------------------------------

    def _wants(self, onnx_name: str, group: str) -> bool:
        return group in self.groups or onnx_name in self.named

    def _param(self, onnx_name: str, value: np.ndarray) -> None:
        self.ctx.add_input(onnx_name, value, requires_grad=True, dtype=self.ctx.float_dtype)
        self.ctx.emitted[onnx_name] = onnx_name
        self.made_params.add(onnx_name)

    def _store(self, onnx_name: str, value) -> None:
        """A value known at import time: a parameter if chosen (floats only), else a constant."""
        is_float = isinstance(value, Filled) or np.asarray(value).dtype.kind == "f"
        if is_float and self._wants(onnx_name, "constants"):
            self._param(onnx_name, self.folder.materialize(value))
        else:
            self.ctx.consts[onnx_name] = value

    def _graph_inputs(self) -> None:
        elements = 0  # of every input, counted before one is made: a 171-byte model can declare 10^8
        for i, vi in enumerate(self.model.graph.input):
            if vi.name in self.inits:
                continue
            dtype = _np_dtype(vi)
            shape = _static_shape(vi)
            elements += (np.asarray(self.options.inputs[vi.name]).size if vi.name in self.options.inputs
                         else math.prod(shape))
            if elements > self.folder.budget.max_elements:
                raise LimitError(f"input '{vi.name}' of shape {list(shape)} brings the model's inputs to {elements} "
                                 f"elements, over the limit of {self.folder.budget.max_elements} (max_elements)",
                                 field="inputs", limit="max_elements")
            if vi.name in self.options.inputs:
                value = np.asarray(self.options.inputs[vi.name])
                if value.dtype.kind in "OSU":
                    raise GraphError(f"input '{vi.name}' holds strings; only numeric tensors are supported",
                                     field="inputs")
                declared = _declared(vi)
                if len(declared) != value.ndim or any(isinstance(d, int) and d != s
                                                      for d, s in zip(declared, value.shape)):
                    raise GraphError(f"input '{vi.name}' has shape {list(value.shape)}, the model declares "
                                     f"{declared}", field="inputs")
            elif dtype.kind == "f":
                value = np.random.default_rng([self.options.input_seed, i]).random(shape).astype(dtype)
            else:
                value = np.zeros(shape, dtype=dtype)
            if value.dtype.kind not in "fiub":
                raise GraphError(f"input '{vi.name}' holds {value.dtype} values; only numeric tensors are "
                                 "supported", field="inputs")
            if value.dtype.kind != "f":
                # integer and bool inputs are data of this one evaluation (indices, shapes): constants,
                # so shape arithmetic on them folds; emitted as int64 inputs where an op reads them
                self.ctx.consts[vi.name] = value.astype(np.int64) if value.dtype.kind in "iu" else value
                continue
            requires_grad = self._wants(vi.name, "inputs")
            self.ctx.add_input(vi.name, value, requires_grad, self.ctx.float_dtype)
            self.ctx.emitted[vi.name] = vi.name
            if requires_grad:
                self.made_params.add(vi.name)
        unknown = set(self.options.inputs) - {vi.name for vi in self.model.graph.input}
        if unknown:
            raise GraphError(f"the model has no input '{sorted(unknown)[0]}'", field="inputs")

    def _initializers(self) -> None:
        static = static_initializers(self.model.graph, self.inits)  # Resize's scales: never a weight
        tables = rotary_tables(self.model.graph, self.inits) | self._made()
        wanted = set()
        for name, value in self.inits.items():
            weight = _is_weight(name, value) and name not in static and not is_mask(value) and name not in tables
            if value.dtype.kind == "f" and (self._wants(name, "initializers") or (weight and "weights" in self.groups)):
                wanted.add(name)
        # an exporter's copy of a parameter (a tied head's transpose) is emitted from it (ties.py), unless named
        copies = copy_candidates(self.inits, exported_parameters(self.model)) - set(self.named)
        self.ties = {c: t for c, t in find_ties(self.inits, copies, wanted - copies).items() if c not in self.ctx.emitted}
        for name, value in self.inits.items():
            if name in self.ctx.emitted or name in self.ties:
                continue
            if name in wanted:
                self._param(name, value)
            else:
                self.ctx.consts[name] = value
        for copy, (base, relation) in sorted(self.ties.items()):
            self.ctx.onnx_name = copy
            if relation == "same":
                self.ctx.set_output(copy, base)
            else:
                op, attrs = self._tie_op(copy, base, relation)
                self.ctx.set_output(copy, self.ctx.emit(op, [base], attrs, name=self.ctx.fresh(f"{copy}/tied")))

    def _tie_op(self, copy: str, base: str, relation: str) -> tuple[str, dict]:
        """The registry op (and its attributes) that makes a tied copy from its parameter (ties.py)."""
        shape = list(self.inits[copy].shape)
        if relation == "sliced":
            start = block_start(self.inits[copy], self.inits[base])
            return "slice", {"starts": list(start), "ends": [s + n for s, n in zip(start, shape)],
                             "axes": list(range(len(shape)))}
        return {"transposed": ("transpose", {}), "broadcast": ("broadcast_to", {"shape": shape})}.get(
            relation, ("reshape", {"shape": shape}))

    def _readers(self, names: set[str]) -> dict[str, object]:
        """Each of `names` -> the first node that reads it (None if none does)."""
        out: dict[str, object] = dict.fromkeys(names)
        for node in self.model.graph.node:
            for n in node.input:
                if n in names and out[n] is None:
                    out[n] = node
        return out

    def _made(self) -> set[str]:
        """A dynamo export's initializers that are no torch parameter nor traced to one (tables.py); kept
        for the note (folded_note) that names them."""
        floats = [n for n, v in self.inits.items() if v.dtype.kind == "f"]
        found = source_names(self.model, set(floats), {n: self.inits[n].shape for n in floats})
        traced = {p for p, entries in found.items() if any(e["name"] for e in entries)}
        self.made_constants = exporter_made(exported_parameters(self.model), self.inits, traced)
        return self.made_constants

    # --- nodes ---------------------------------------------------------------------------

    def _unsupported(self, reason: str, node) -> None:
        entry = self.unsupported.setdefault(reason, [0, _label(node)])
        entry[0] += 1
        self.ctx.poisoned.update(o for o in node.output if o)

    def _fold(self, node, a):
        """Outputs of a node whose inputs are all constants: a Constant's value, or computed by
        ONNX's reference evaluator within the folding budget (folding.py), sizes known first."""
        from onnx import helper

        ctx = self.ctx
        if node.op_type == "Constant":
            return [constant_value(node, a)]
        feeds = {n: self.folder.materialize(ctx.consts[n]) for n in node.input if n}
        if node.op_type == "ConstantOfShape":
            dims = [int(d) for d in np.asarray(feeds[node.input[0]]).reshape(-1)] if node.input else []
            if any(d < 0 for d in dims):
                raise GraphError(f"shape {dims} has a negative dimension")
            what, n = f"the output of ConstantOfShape node {_label(node)}", int(np.prod(dims, dtype=object))
            fill = a.get("value")
            # a float fill stays lazy (a Filled: a constant_of_shape node, which validation counts, or
            # charged if it is ever materialized); an int fill is data made here
            if fill is not None and helper.tensor_dtype_to_np_dtype(fill.data_type).kind != "f":
                self.folder.charge(n, what)
            return [constant_of_shape(ctx, node, a)]
        return self.folder.run(node, feeds, _label(node))

    def _shape_of(self, node, a):
        """Shape and Size of a computed value: known statically."""
        shape = self.ctx.shape(self.ctx.value(node.input[0]))
        if node.op_type == "Size":
            return np.asarray(int(np.prod(shape)), dtype=np.int64)
        start, end = a.get("start", 0), a.get("end", len(shape))
        return np.asarray(shape[start:end], dtype=np.int64)

    def _foldable(self, node) -> bool:
        """All inputs are constants, and either no registry op does this, or it computes on
        non-float values (shape arithmetic), or its value must be known at import time (it ends in
        integers or in a node only folding computes: _needed_constants). Other float work on
        constants is emitted as nodes, so it runs through the registry's ops like everything else."""
        ins = [n for n in node.input if n]
        if not all(self.ctx.is_const(n) for n in ins):
            return False
        if node.op_type in ("Constant", "ConstantOfShape") or node.op_type not in CONVERTERS:
            return True
        if any(o in self.needed for o in node.output):
            return True
        return any(np.asarray(self.ctx.consts[n]).dtype.kind != "f" for n in ins
                   if not isinstance(self.ctx.consts[n], Filled))

    def _needed_constants(self) -> set[str]:
        """Values that must be import-time constants: the inputs of a Cast to integers or bool (T5's
        relative-position buckets: float logs of int positions, then cast) and of nodes no converter
        takes (ScatterND: Swin's shifted-window mask), and, in turn, every input of a node making one."""
        from onnx import helper

        needed: set[str] = set()
        for node in reversed(self.model.graph.node):
            casts_to_int = node.op_type == "Cast" and np.dtype(helper.tensor_dtype_to_np_dtype(
                next((a.i for a in node.attribute if a.name == "to"), 1))).kind != "f"
            only_folded = node.op_type not in CONVERTERS and node.op_type not in ("Shape", "Size", "Loop", "If")
            if casts_to_int or only_folded or any(o in needed for o in node.output):
                needed.update(n for n in node.input if n)
        return needed

    def _node(self, node) -> None:
        ctx = self.ctx
        ctx.onnx_name = node.name or node.output[0]
        if node.domain not in ("", "ai.onnx"):
            self._unsupported(f"{node.domain}::{node.op_type}", node)
            return
        if any(n in ctx.poisoned for n in node.input if n):
            ctx.poisoned.update(o for o in node.output if o)
            if node.op_type not in CONVERTERS and node.op_type not in ("Shape", "Size", "Loop", "If"):
                self._unsupported(node.op_type, node)
            return
        a = _attrs(node)
        try:
            if node.op_type in ("Shape", "Size") and not ctx.is_const(node.input[0]):
                self._store(node.output[0], self._shape_of(node, a))
                return
            if node.op_type in ("Loop", "If"):  # unrolled / the branch taken, converted node by node (loops.py)
                (loops.unroll if node.op_type == "Loop" else loops.inline_if)(self, node)
                return
            if self._foldable(node):
                for out, value in zip(node.output, self._fold(node, a)):
                    if out:
                        self._store(out, value if isinstance(value, Filled) else np.asarray(value))
                return
            conv = CONVERTERS.get(node.op_type)
            if conv is None:
                raise Unsupported(node.op_type)
            outs = conv(ctx, node, a, self.opset)
            for out, gc in zip(node.output, [outs] if isinstance(outs, str) else outs):
                if out and gc is not None:  # None: the converter stored a constant (ctx.consts) itself
                    ctx.set_output(out, gc)
        except Unsupported as exc:
            self._unsupported(exc.reason, node)
        except GraphError as exc:  # a registry op refused the node: say which ONNX node
            raise GraphError(f"{node.op_type} node {_label(node)}: {exc.reason}", field="model") from None

    # --- the loss ------------------------------------------------------------------------

    def _loss(self) -> None:
        ctx, opts = self.ctx, self.options
        outputs = [vi.name for vi in self.model.graph.output]
        if not opts.output and not outputs:
            raise GraphError("the model declares no output: name the value the loss reduces (--loss-output / "
                             "loss_output)", field="output")
        out = opts.output or outputs[0]
        if out not in outputs and out not in ctx.emitted and out not in ctx.consts:
            raise GraphError(f"the model has no output or value '{out}' (outputs: {', '.join(outputs)})",
                             field="output")
        if out in ctx.poisoned:
            raise GraphError(f"output '{out}' is not computed", field="output")
        if out in ctx.consts and not isinstance(ctx.consts[out], Filled) and ctx.consts[out].dtype.kind != "f":
            raise GraphError(f"output '{out}' holds {ctx.consts[out].dtype} values computed from integer inputs "
                             "alone; the loss needs a float output", field="output")
        y = ctx.value(out)
        if opts.loss not in LOSSES:
            raise GraphError(f"unknown loss '{opts.loss}' (expected one of {', '.join(LOSSES)})", field="loss")
        name = ctx.fresh(LOSS_NAME)
        ctx.onnx_name = name
        if opts.loss == "cotangent":
            shape = ctx.shape(y)
            if opts.cotangent is not None:
                c = np.asarray(opts.cotangent, dtype=np.float64)
                if c.shape != shape:
                    raise GraphError(f"the cotangent has shape {list(c.shape)}, output '{out}' has {list(shape)}",
                                     field="cotangent")
            else:
                c = np.random.default_rng(opts.cotangent_seed).standard_normal(shape)
            seed = ctx.add_input(ctx.fresh(f"{name}/cotangent"), c, False, ctx.float_dtype)
            y = ctx.emit("mul", [y, seed])
        ctx.emit("sum" if opts.loss != "mean" else "mean", [y], name=name)
        ctx.builder.output(name)

    def run(self):
        self.needed = self._needed_constants()
        self._graph_inputs()
        self._initializers()
        for node in self.model.graph.node:
            self._node(node)
        if self.unsupported:
            items = sorted(self.unsupported.items(), key=lambda kv: (-kv[1][0], kv[0]))
            listing = "; ".join(f"{reason} x{count} (first: node {first})" for reason, (count, first) in items)
            raise GraphError(f"unsupported ONNX ops: {listing}", field="model")
        missing = [n for n in self.named if n not in self.made_params]
        if missing:
            raise GraphError(f"'{missing[0]}' is not a float initializer, input or constant of the model, so it "
                             "cannot be a parameter", field="params")
        self._loss()
        msg = self.ctx.builder.build()
        self._source_names(msg)
        return msg

    def _source_names(self, msg) -> None:
        """Each initializer parameter's PyTorch names, where they say more than its own (provenance.py);
        the torch parameters a dynamo export lists but holds under none of them: a note (folded_note)."""
        params = self.made_params & set(self.inits)
        found = self._tied_names(source_names(self.model, params | set(self.ties),
                                              {n: self.inits[n].shape for n in params | set(self.ties)}))
        for inp in msg.inputs:
            for entry in found.get(inp.name, ()):
                inp.source_names.add(**entry)
        if "weights" in self.groups or "initializers" in self.groups:
            # held by the model (a parameter, or a constant by choice: scalars, masks) or named by provenance
            named = set(self.inits) | {e["name"] for entries in found.values() for e in entries}
            # the tables a parameter can fold into (a folded scalar is an exporter's own number, not listed)
            readers = self._readers(may_hold(self.model.graph, self.inits, {
                n for n in self.made_constants if self.inits[n].size > 1}))
            note = folded_note(self.model, named, readers)
            if note:
                msg.notes.append(note)
            note = self._constants_note(named, readers)
            if note:
                msg.notes.append(note)

    def _constants_note(self, named: set[str], readers: dict) -> str:
        """The warning for constants a dynamo export's optimizer made that may be expressions of a parameter still
        read elsewhere (tables.unexplained_constants), less those the folded note names as a vanished
        parameter's holders; "" where there are none, or no parameter is read by the graph."""
        exported = exported_parameters(self.model)
        read = {n for node in self.model.graph.node for n in node.input}
        if not any(p in read for p in exported):
            return ""
        signature = next((p.value for p in self.model.graph.metadata_props if p.key == _SIGNATURE), "")
        found = unexplained_constants(self.model.graph, self.inits, self.made_constants - set(self.ties),
                                      buffer_names(signature))
        missing = [p for p in exported if p not in named]
        held = holders(missing, readers)
        told = ({c for c in readers} if any(not hs for hs in held.values())  # all named as "one of"
                else {h.split(" ", 1)[0] for hs in held.values() for h in hs})
        return constants_note({c: readers[c] for c in sorted(found - told)}, self.inits)  # (found: of readers')


    def _tied_names(self, found: dict) -> dict:
        """source_names with each tied copy's reads under its parameter (relation "tied": ties.py), and a dynamo
        export's tied pair under the name named_parameters() gives it (ties.torch_aliases)."""
        aliases = torch_aliases(self.model, set(self.inits), exported_parameters(self.model))
        out = {p: [dict(e, name=aliases.get(e["name"], e["name"])) for e in entries]
               for p, entries in found.items() if p not in self.ties}
        for copy, (base, _) in sorted(self.ties.items()):
            own = [e for e in out.get(base, []) if e["relation"] == "same" and e["name"]]
            name = own[0]["name"] if len({e["name"] for e in own}) == 1 else aliases.get(base, base)
            if base not in out:  # read by its own name only until now: say so beside the copy's reads
                readers = [n.name or n.output[0] for n in self.model.graph.node if base in n.input]
                out[base] = [{"name": name, "relation": "same", "onnx_name": base, "read_by": readers}] if readers else []
            readers = [r for e in found.get(copy, []) for r in e["read_by"]] or [  # (a copy read by its name only)
                n.name or n.output[0] for n in self.model.graph.node if copy in n.input]
            out[base].append({"name": name, "relation": "tied", "onnx_name": copy, "read_by": readers})
        for p in [p for p in out if p in aliases and not any(e["onnx_name"] == p for e in out[p])]:
            readers = [n.name or n.output[0] for n in self.model.graph.node if p in n.input]
            out[p].insert(0, {"name": aliases[p], "relation": "same", "onnx_name": p, "read_by": readers})
        return {p: entries for p, entries in out.items() if entries}




def _listed(items: list[str], shown: int) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


GENERIC = {"weight", "bias"}  # a parameter's last name part that says nothing of which module it is


def _source_lines(node) -> list[str]:
    """The user's source lines in a dynamo export's stack trace of a node (none from another exporter)."""
    trace = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.stack_trace"), "")[:20_000]
    return [ln.strip() for ln in trace.splitlines() if ln.strip() and not ln.lstrip().startswith("File ")]


def _mentioned(param: str, lines: list[str]) -> bool:
    """A source line reads the parameter's attribute or its module's (`self.wpe(pos)` for wpe.weight)."""
    import re

    parts = param.split(".")
    words = [w for w in (parts[-1], parts[-2] if len(parts) > 1 else "") if w and w not in GENERIC]
    return any(re.search(rf"\bself\.{re.escape(w)}\b", ln) for w in words for ln in lines)


def _reader_label(reader) -> str:
    return reader.name or f"the {reader.op_type} node making '{reader.output[0]}'"


def holders(missing: list[str], made: dict) -> dict[str, list[str]]:
    """{missing parameter: ["embedding_1 read by node_add (`x = ... self.wpe(pos)`)", ...]}: the constants the
    exporter made (made: each with the node reading it, or None) whose reader's source line, from the
    exporter's own metadata, reads that parameter -- those and no others hold what it was folded into."""
    out: dict[str, list[str]] = {p: [] for p in missing}
    for const, reader in sorted(made.items()):
        if reader is None:
            continue
        lines = _source_lines(reader)
        for p in missing:
            line = next((ln for ln in reversed(lines) if _mentioned(p, [ln])), None)
            if line is not None:
                out[p].append(f"{const} read by {_reader_label(reader)} (`{line[:160]}`)")
    return out


def unheld_parameters(model, named: set[str], made: dict | None = None) -> dict[str, str]:
    """{torch parameter a dynamo export lists but the model holds under no name (its own or one source_names
    traces to it): what became of it} -- "folded into X read by N (`line`)" with the constants that hold it,
    else that no tensor of the model is told to hold it."""
    missing = [p for p in exported_parameters(model) if p not in named]
    found = holders(missing, made or {})
    # constants no source line ties to a parameter: where the others went, for all the metadata says
    told = {h.split(" ", 1)[0] for hs in found.values() for h in hs}
    untold = [f"{c} read by {_reader_label(r)}" for c, r in sorted((made or {}).items()) if r is not None and c not in told]
    maybe = (f"folded by the exporter into a constant, one of {_listed(untold, 4)} (its metadata does not say which)"
             if untold else "held by no tensor the model names (folded into a Conv, merged into an RNN's W, R, B, "
             "or never read)")
    return {p: (f"folded into {'; '.join(found[p])} by the exporter" if found[p] else maybe) for p in missing}


def folded_note(model, named: set[str], made: dict | None = None, shown: int = 8) -> str:
    """"not checked ..." for the torch parameters the export lists but the model holds under no name, its own
    or one source_names traces to it, each with what became of it (unheld_parameters) and nothing else."""
    unheld = unheld_parameters(model, named, made)
    if not unheld:
        return ""
    items = [f"{p}: {what}" for p, what in unheld.items()]
    head = (f"not checked: {len(unheld)} torch parameter(s) the model holds under no name traced to them, "
            f"constants, not parameters: {_listed(items, shown)}")
    tail = ("; keep them with torch.onnx.export(..., dynamo=True, optimize=False) (the TorchScript exporter: "
            "do_constant_folding=False)")
    room = MAX_NOTE_LENGTH - len(tail)  # a graph's note is bounded (validation): the way to keep them stays
    return (head if len(head) <= room else head[:room - 3] + "...") + tail


def constants_note(found: dict, inits: dict, shown: int = 6) -> str:
    """The warning naming constants a dynamo export's optimizer made that may be expressions of a parameter
    (found: each with its first reader, or None): name, shape, reader, source line; the gradient through
    one is not the graph's, and the way to keep the expression."""
    items = []
    for c, reader in found.items():
        line = next(iter(_source_lines(reader)[-1:]), "") if reader is not None else ""
        where = f" read by {_reader_label(reader)}" if reader is not None else " read by no node"
        items.append(f"{c} {list(inits[c].shape)}{where}" + (f" (`{line[:160]}`)" if line else ""))
    if not items:
        return ""
    head = f"{FOLDED_CONSTANTS}: {_listed(items, shown)}"
    tail = ("; if one was (the optimizer folds an expression of a weight, `self.w[:3].sum(1)`, into a constant), "
            "the gradient through it is not part of the graph: that parameter's gradient here lacks it, and a "
            "correct torch gradient claimed for it fails; keep the expression with torch.onnx.export(..., "
            "dynamo=True, optimize=False)")
    room = MAX_NOTE_LENGTH - len(tail)
    return (head if len(head) <= room else head[:room - 3] + "...") + tail


def unheld_claims(onnx_bytes: bytes, message, keys=()) -> tuple[dict, dict]:
    """({torch name: what became of it}, {parameter: its readers}) for an imported model (`message`) and a
    claimed archive's `keys`: the torch parameters it holds under no name -- a dynamo export's (it lists them:
    unheld_parameters), a TorchScript export's among `keys` (archive.legacy_unheld) -- and the tensors of the
    exporter's own that the import made parameters (archive.unnamed_tensors)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.ParseFromString(onnx_bytes)  # read and checked by the import already
    exported = exported_parameters(model)
    unnamed = unnamed_tensors(model, message, exported)
    named = {t.name for t in model.graph.initializer} | {s.name for i in message.inputs for s in i.source_names}
    if not exported:
        return legacy_unheld([k for k in keys if k not in named], unnamed), unnamed
    inputs = {i.name: i for i in message.inputs}
    tied = {s.onnx_name for i in message.inputs for s in i.source_names if s.relation == "tied"}
    consts = {t.name for t in model.graph.initializer if t.name not in tied and t.name not in exported
              and not (t.name in inputs and inputs[t.name].requires_grad)}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    consts = {t.name for t in model.graph.initializer if t.name in consts and t.data_type in floats
              and math.prod(t.dims) > 1}  # dims, not values: external data stays where it is
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer  # external data: not at hand
             if t.data_location != onnx.TensorProto.EXTERNAL}
    consts = {n for n in consts if n not in inits} | may_hold(model.graph, inits, consts & set(inits))
    readers = {n: next((node for node in model.graph.node if n in node.input), None) for n in consts}
    return unheld_parameters(model, named, readers), unnamed


def import_model(model, options: ImportOptions | None = None, name: str = "", budget: FoldBudget | None = None):
    """A checked ModelProto -> gradcheck.v1.Graph message; folding within `budget` (folding.py)."""
    return Importer(model, options or ImportOptions(), name, budget).run()
