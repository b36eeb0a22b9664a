"""The PyTorch names behind each initializer that became a parameter (a report's `source_names`).

PyTorch's exporters do not always keep one initializer per torch parameter:
- the TorchScript exporter merges equal initializers (freshly initialized zero biases, LayerNorm's
  ones) into one and gives the others back as Identity outputs under their own names
  (`conv1.bias` -> Identity -> `conv3.bias`): the merged tensor's gradient is the sum of theirs;
- it stores an nn.Linear weight that a MatMul reads (inputs of rank > 2) transposed, as a new
  initializer `onnx::MatMul_N`; the dynamo exporter likewise as `val_N`;
- it folds BatchNorm into the Conv before it (a new `onnx::Conv_N`; the dynamo exporter keeps the
  Conv weight's name and marks the Conv node FuseBatchNormIntoConv): no torch parameter has that
  tensor's gradient;
- GroupNorm becomes InstanceNormalization over the groups (its scale and shift: ones and zeros, no
  torch tensor) then `* weight + bias` with the module's tensors reshaped to (C, 1, 1); PReLU's
  slope likewise: "reshaped";
- an LSTM, GRU or RNN's tensors become one W, R, B per ONNX node, stacked by direction with the
  gate blocks in ONNX's order ("lstm_gates", "gru_gates", "rnn_stacked": docs/onnx.md).
Each name a parameter is read by, and each node that reads it, says which torch parameter it
stands for: the name itself when the exporter kept it; else the parameter the dynamo exporter's
`pkg.torch.onnx.fx_node` says the torch op read (`%p_layer_self_attn_in_proj_weight`); else the
reading node's module path (the TorchScript exporter's node names, `/layer1/layer1.0/conv1/Conv`;
the dynamo exporter's `pkg.torch.onnx.name_scopes`) and the input's role in the op (a Conv's input
1 is its module's `weight`, as nn.Conv2d names it). Every name given is a named_parameters() key
or empty (tests/onnx/test_model_zoo.py). Nothing here changes the graph; it is read by people only.
"""
from __future__ import annotations

import ast
import math
import re

# which torch.nn parameter an op's input is, by position (as nn.Conv*, nn.Linear, nn.LayerNorm,
# nn.BatchNorm*, nn.InstanceNorm*, nn.PReLU name them)
ROLES = {
    "Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"},
    "Gemm": {1: "weight", 2: "bias"}, "MatMul": {1: "weight"},
    "LayerNormalization": {1: "weight", 2: "bias"}, "InstanceNormalization": {1: "weight", 2: "bias"},
    "BatchNormalization": {1: "weight", 2: "bias", 3: "running_mean", 4: "running_var"},
    "PRelu": {1: "weight"},
}
# initializers an exporter made (no torch parameter has this name): TorchScript's onnx::Op_N, dynamo's val_N
MADE = re.compile(r"onnx::|val_\d+$")
_SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"  # the dynamo exporter's graph metadata
MAX_NAME = 256  # characters of a name or node label in source_names (the report echoes them)
MAX_META = 20_000  # characters of a node's scope metadata read at most (a real one: a few hundred)


def _legacy_module(node_name: str) -> str:
    """`/layer1/layer1.0/conv1/Conv` -> `layer1.0.conv1`; `/m/layers.0/norm/LayerNormalization` ->
    `m.layers.0.norm`. Each scope is a module's qualified name cut before its last non-numeric part
    (torch.onnx's _unqualified_variable_name: `layer1.0`, `layers.0`, `conv1`), so a scope with
    numeric parts either continues the path (`layer1.0` under `layer1`) or adds a container that was
    never called (`layers.0` under `m`: the ModuleList `m.layers`)."""
    atoms: list[str] = []
    for scope in node_name.split("/")[1:-1]:
        if not scope:
            return ""
        parts = scope.split(".")
        # the longest tail of the path that the scope starts with, leaving it one new part at least
        k = next((k for k in range(min(len(atoms), len(parts) - 1), 0, -1) if atoms[-k:] == parts[:k]), 0)
        atoms += parts[k:]
    return ".".join(atoms)


def _meta(node) -> dict:
    return {p.key: p.value for p in node.metadata_props}


def _module(node) -> tuple[str, str]:
    """(the torch module path of the node, its class: a qualified name from the dynamo exporter, ""
    when the exporter does not say -- the TorchScript one: its modules are taken to be torch.nn's)."""
    meta = _meta(node)
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes is not None:  # the dynamo exporter: qualified names, the last one the op's own
        classes = meta.get("pkg.torch.onnx.class_hierarchy", "[]")
        if len(scopes) + len(classes) > MAX_META:
            return "", "?"
        try:  # a model's strings are hostile: literals only, and any failure means "not known"
            scopes, classes = ast.literal_eval(scopes), ast.literal_eval(classes)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return "", "?"
        module = scopes[-2] if isinstance(scopes, list) and len(scopes) >= 3 else ""
        cls = str(classes[-2]) if isinstance(classes, list) and len(classes) >= 2 else "?"
        return str(module), cls
    if node.name.startswith("/"):
        return _legacy_module(node.name), ""
    return "", "?"


def _is_nn(cls: str) -> bool:
    return cls == "" or cls.startswith("torch.nn.modules.")


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


# the parameter names torch.nn modules give their own tensors (the last part of a named_parameters() key)
LEAF = re.compile(r"(?<![^_])(?:in_proj_weight|in_proj_bias|[qkv]_proj_weight|bias_[kv]|"
                  r"(?:weight|bias)_(?:ih|hh|hr)_l\d+(?:_reverse)?|weight|bias)$")
PLACEHOLDER = re.compile(r"%p_(\w+)")  # torch.export's name of a parameter input: p_ + its key, dots as _


def _split(placeholder: str, vocab: set) -> str | None:
    """The one named_parameters() key that `placeholder` spells with `_` for `.` (`encoder_layers_1_
    self_attn_out_proj_weight`: `encoder.layers.1.self_attn.out_proj.weight`), its parts words of the
    model's own names (`vocab`), numbers, or a torch.nn leaf name last; None when there is no such
    key or more than one (`a_b_weight`: `a_b.weight` or `a.b.weight`). Counted from the end, each
    rest's readings capped at 2: linear in the cuts, whatever the string."""
    p = placeholder
    if len(p) > MAX_NAME:
        return None
    cuts = [j for j, c in enumerate(p) if c == "_"] + [len(p)]
    ways, first = {len(p) + 1: 1}, {}  # start of a rest -> its readings; the end of its first part
    for i in reversed([0] + [j + 1 for j in cuts[:-1]]):
        ways[i] = 0
        for j in (j for j in cuts if j > i):
            part = p[i:j]
            if ways[j + 1] and (part in vocab or part.isdigit() or (j == len(p) and LEAF.fullmatch(part))):
                ways[i] = min(ways[i] + ways[j + 1], 2)
                first.setdefault(i, j)
    if ways[0] != 1:
        return None
    parts, i = [], 0
    while i <= len(p):
        parts.append(p[i:first[i]])
        i = first[i] + 1
    return ".".join(parts)


def _fx_parameters(node, module: str, ctx: dict) -> list[str]:
    """The torch parameters the dynamo exporter says the node's torch op read (its fx_node's `%p_...`
    arguments), as named_parameters() keys (_split, with the words of the node's module path too);
    one that cannot be told is left out."""
    fx = _meta(node).get("pkg.torch.onnx.fx_node", "")[:MAX_META]
    vocab = ctx["vocab"] | set(module.split(".")) - {""}
    out = []
    for p in PLACEHOLDER.findall(fx.split("args = ", 1)[-1]):
        name = ctx["underscored"].get(p) or _split(p, vocab)
        if name:
            out.append(name)
    return out


def _kind(name: str) -> str:
    """weight or bias, by a torch.nn key's last part."""
    leaf = name.rsplit(".", 1)[-1]
    return "bias" if leaf.startswith("bias") or leaf.endswith("bias") else "weight"


# ONNX's recurrent ops keep one W, R, B for all directions (W[d], R[d]; B[d] = input then hidden bias),
# their gate blocks in another order than torch's: the relation names the op, docs/onnx.md the order
RNN_OPS = {"LSTM": "lstm_gates", "GRU": "gru_gates", "RNN": "rnn_stacked"}


def _rnn_entries(alias: str, node, slot: int, layer: int, shape: tuple) -> list[tuple[str, str]]:
    """(torch name, relation) for each part of an ONNX LSTM/GRU/RNN node's W (slot 1), R (2) or B (3):
    torch's weight_ih_l{layer}, weight_hh_l{layer}, bias_ih/bias_hh (`_reverse`: direction 1)."""
    module, cls = _module(node)
    if not module or not _is_nn(cls) or slot not in (1, 2, 3) or len(shape) < 2 or not MADE.match(alias):
        return [("", "derived")]
    relation = RNN_OPS[node.op_type]
    out = []
    for d in range(shape[0]):
        suffix = f"_l{layer}" + ("_reverse" if d else "")
        kinds = {1: ["weight_ih"], 2: ["weight_hh"], 3: ["bias_ih", "bias_hh"]}[slot]
        out += [(f"{module}.{k}{suffix}", relation) for k in kinds]
    return out


def _mha_weight(module: str, shape: tuple, known: set) -> str | None:
    """A MultiheadAttention's weight a MatMul reads transposed, without the dynamo exporter's word for
    it: None when the module is no MultiheadAttention (it has neither in_proj_bias nor out_proj's
    tensors), its packed q, k, v projection `in_proj_weight` when the weight is E x 3E, else "" (not
    told: such a module has no `weight`)."""
    if not any(f"{module}.{n}" in known for n in ("in_proj_bias", "out_proj.weight", "out_proj.bias")):
        return None
    return f"{module}.in_proj_weight" if len(shape) == 2 and shape[1] == 3 * shape[0] else ""


def _linear_entry(node, slot: int, shape: tuple, ctx: dict, module: str) -> tuple[str, str]:
    """(torch name, relation) of an exporter-made 2-D tensor a MatMul reads as its weight outside a torch.nn
    module (`F.linear(x, self.qkv.weight, self.qkv.bias)` on a rank-4 input, as Swin's attention calls it):
    the weight the dynamo exporter's fx node says `aten.linear` read, else -- the TorchScript exporter says
    nothing of it -- `X.weight` when the MatMul's output is added to the model's own `X.bias` of as many
    elements as the weight has columns (F.linear's bias is its weight's module's), transposed either way."""
    if node.op_type != "MatMul" or slot != 1 or len(shape) != 2:
        return "", "derived"
    if "aten.linear" in _meta(node).get("pkg.torch.onnx.fx_node", "")[:MAX_META]:
        read = [n for n in _fx_parameters(node, module, ctx) if _kind(n) == "weight"]
        return (read[0], "transposed") if len(read) == 1 else ("", "derived")
    bias = ctx["bias_after"].get(node.output[0], "")
    if bias.endswith(".bias") and ctx["sizes"].get(bias) == shape[1] and bias[:-5] + ".weight" not in ctx["known"]:
        return bias[:-5] + ".weight", "transposed"
    return "", "derived"


def _made_entry(node, slot: int, shape: tuple, ctx: dict, module: str, role: str | None) -> tuple[str, str]:
    """(torch name, relation) of a tensor the exporter made, as input `slot` of `node` reads it."""
    if node.op_type == "InstanceNormalization":
        return "", "derived"  # GroupNorm's (and an affine-free InstanceNorm's) ones and zeros
    if node.op_type in ("Mul", "Add") and module in ctx["instance_norm"] and len(shape) >= 2 and \
            all(d == 1 for d in shape[1:]):  # GroupNorm: normalized per group, then x * weight + bias
        return f"{module}.{'weight' if node.op_type == 'Mul' else 'bias'}", "reshaped"
    if role is None or not module:
        return _linear_entry(node, slot, shape, ctx, module)
    if node.op_type == "PRelu":  # the slope given the dimensions it broadcasts over: (C, 1, 1)
        return f"{module}.weight", "reshaped"
    if node.op_type in ("Conv", "ConvTranspose"):  # BatchNorm folded in: the bias may be no module's
        return (f"{module}.weight", "derived") if role == "weight" else ("", "derived")
    transposed = len(shape) == 2 and slot == 1 and (node.op_type == "MatMul" or
                                                    (node.op_type == "Gemm" and not _attr(node, "transB", 0)))
    read = [n for n in _fx_parameters(node, module, ctx) if _kind(n) == role]
    mha = _mha_weight(module, shape, ctx["known"]) if len(read) != 1 else None
    name = read[0] if len(read) == 1 else f"{module}.{role}" if mha is None else mha
    return (name, "transposed" if transposed else "derived") if name else ("", "derived")


def _entry(alias: str, node, slot: int, shape: tuple, ctx: dict) -> tuple[str, str]:
    """(torch name, relation) of the parameter `alias` as input `slot` of `node` reads it."""
    module, cls = _module(node)
    role = ROLES.get(node.op_type, {}).get(slot) if _is_nn(cls) else None
    if MADE.match(alias):
        return _made_entry(node, slot, shape, ctx, module, role)
    if "BatchNorm" in _meta(node).get("pkg.onnxscript.rewriter.rule_name", "") and slot in (1, 2):
        # the dynamo exporter folded BatchNorm in, keeping the Conv's names (its bias's too: the folded bias is
        # no more torch's than the weight is), or making a bias where the Conv had none (no torch name)
        return (alias, "derived") if slot == 1 or alias in ctx["exported"] else ("", "derived")
    owner = alias.rsplit(".", 1)[0] if "." in alias else ""
    if module and owner and owner != module and not module.startswith(owner + ".") and \
            not owner.startswith(module + "."):
        # one module reads another's parameter: the exporter merged their equal tensors into one (or
        # the model ties them); the reader's own is the one the dynamo exporter names (any op: an Add
        # of in_proj_bias too), else its module's `role` in a torch.nn op
        read = [n for n in _fx_parameters(node, module, ctx) if _kind(n) == (role or _kind(alias))]
        if len(read) == 1:
            return read[0], "same"
        if role is not None:
            return f"{module}.{role}", "same"
    return alias, "same"


def exported_parameters(model) -> list[str]:
    """The torch parameters (named_parameters() keys) a dynamo export's graph signature lists."""
    import re

    text = next((p.value for p in model.graph.metadata_props if p.key == _SIGNATURE), "")
    return re.findall(r": PARAMETER target='([^']*)'", text)


def _context(model) -> dict:
    """What the entries need to know about the whole model: the names it kept (torch's keys), the same
    spelled as torch.export's placeholders, the words they are made of, the modules with an
    InstanceNormalization node."""
    inits = {t.name for t in model.graph.initializer}
    # an Identity's output of an initializer: a name the TorchScript exporter gave back to a merged tensor
    given_back = {n.output[0] for n in model.graph.node if n.op_type == "Identity" and n.input and n.input[0] in inits}
    known = {k for k in inits | given_back if not MADE.match(k) and len(k) <= MAX_NAME}
    norms = {_module(n)[0] for n in model.graph.node if n.op_type == "InstanceNormalization"}
    # a MatMul's output -> the kept-name initializer an Add adds to it (F.linear's bias)
    bias_after = {i: j for n in model.graph.node if n.op_type == "Add" and len(n.input) == 2
                  for i, j in (n.input, n.input[::-1]) if j in known}
    sizes = {t.name: math.prod(t.dims) for t in model.graph.initializer}
    return {"known": known, "underscored": {k.replace(".", "_"): k for k in known}, "bias_after": bias_after,
            "vocab": {part for k in known for part in k.split(".") if part}, "instance_norm": norms - {""},
            "sizes": sizes, "exported": set(exported_parameters(model))}


def source_names(model, params, shapes: dict) -> dict:
    """{parameter (an initializer's name): [{name, relation, onnx_name, read_by}]} for the parameters
    whose names say more than their own name does (merged, transposed, reshaped, derived, an RNN's
    gates); shapes: each initializer's shape."""
    ctx = _context(model)
    root = {}  # an Identity output of a parameter -> the parameter
    readings: dict[str, dict] = {}  # parameter -> {(name, relation, alias): [node labels]}
    layers: dict[str, int] = {}  # module -> recurrent nodes seen in it (a layer each, in order)
    for node in model.graph.node:
        ins = [root.get(n, n) if n else n for n in node.input]
        if node.op_type == "Identity" and ins and ins[0] in params:
            root[node.output[0]] = ins[0]
            continue
        layer = None
        if node.op_type in RNN_OPS:
            module = _module(node)[0]
            layer = layers[module] = layers.get(module, -1) + 1
        for slot, (alias, param) in enumerate(zip(node.input, ins)):
            if param not in params:
                continue
            shape = tuple(shapes.get(param, ()))
            found = (_rnn_entries(alias, node, slot, layer, shape) if layer is not None
                     else [_entry(alias, node, slot, shape, ctx)])
            label = node.name or node.output[0]
            for name, relation in found:
                readings.setdefault(param, {}).setdefault((name, relation, alias), []).append(label)
    out = {}
    for param, entries in readings.items():
        if list(entries) == [(param, "same", param)]:
            continue  # read by its own name only: nothing to add
        # names past MAX_NAME are left out rather than cut (a cut name would name nothing), so that
        # what only informs never makes a graph fail its name-length limit
        found = [{"name": n, "relation": r, "onnx_name": a, "read_by": [b for b in by if len(b) <= MAX_NAME]}
                 for (n, r, a), by in entries.items() if len(n) <= MAX_NAME and len(a) <= MAX_NAME]
        if found:
            out[param] = found
    return out
