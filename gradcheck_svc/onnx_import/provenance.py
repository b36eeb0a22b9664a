"""The PyTorch names behind each initializer that became a parameter (a report's `source_names`).

PyTorch's exporters do not always keep one initializer per torch parameter:
- the TorchScript exporter merges equal initializers (freshly initialized zero biases, LayerNorm's
  ones) into one and gives the others back as Identity outputs under their own names
  (`conv1.bias` -> Identity -> `conv3.bias`): the merged tensor's gradient is the sum of theirs;
- it stores an nn.Linear weight that a MatMul reads (inputs of rank > 2) transposed, as a new
  initializer `onnx::MatMul_N`; the dynamo exporter likewise as `val_N`;
- it folds BatchNorm into the Conv before it (a new `onnx::Conv_N`; the dynamo exporter keeps the
  Conv weight's name and marks the Conv node FuseBatchNormIntoConv): no torch parameter has that
  tensor's gradient.
Each name a parameter is read by, and each node that reads it, says which torch parameter it
stands for: the name itself when the exporter kept it, else the reading node's module path (the
TorchScript exporter's node names, `/layer1/layer1.0/conv1/Conv`; the dynamo exporter's
`pkg.torch.onnx.name_scopes`) and the input's role in the op (a Conv's input 1 is its module's
`weight`, as nn.Conv2d names it). Nothing here changes the graph; it is read by people only.
"""
from __future__ import annotations

import ast
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
MAX_NAME = 256  # characters of a name or node label in source_names (the report echoes them)
MAX_META = 20_000  # characters of a node's scope metadata read at most (a real one: a few hundred)


def _legacy_module(node_name: str) -> str:
    """`/layer1/layer1.0/conv1/Conv` -> `layer1.0.conv1`. Each scope is a module's qualified name cut
    after its last non-numeric part (torch.onnx's _unqualified_variable_name): `layer1.0` under
    `layer1`, `conv1` under `layer1.0`."""
    path = ""
    for scope in node_name.split("/")[1:-1]:
        if not scope:
            return ""
        last = scope.rsplit(".", 1)[-1]
        path = scope if not path else f"{path}.{last if '.' in scope else scope}"
    return path


def _meta(node) -> dict:
    return {p.key: p.value for p in node.metadata_props}


def _module(node) -> tuple[str, bool]:
    """(the torch module path of the node, whether its class is a torch.nn one, so ROLES apply)."""
    meta = _meta(node)
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes is not None:  # the dynamo exporter: qualified names, the last one the op's own
        classes = meta.get("pkg.torch.onnx.class_hierarchy", "[]")
        if len(scopes) + len(classes) > MAX_META:
            return "", False
        try:  # a model's strings are hostile: literals only, and any failure means "not known"
            scopes, classes = ast.literal_eval(scopes), ast.literal_eval(classes)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return "", False
        module = scopes[-2] if isinstance(scopes, list) and len(scopes) >= 3 else ""
        nn = isinstance(classes, list) and len(classes) >= 2 and str(classes[-2]).startswith("torch.nn.modules.")
        return str(module), nn
    if node.name.startswith("/"):
        return _legacy_module(node.name), True
    return "", False


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


def _entry(alias: str, node, slot: int, ndim: int) -> tuple[str, str]:
    """(torch name, relation) of the parameter `alias` as input `slot` of `node` reads it."""
    module, nn = _module(node)
    role = ROLES.get(node.op_type, {}).get(slot) if nn else None
    if MADE.match(alias):
        if not module or role is None:
            return "", "derived"
        transposed = ndim == 2 and slot == 1 and (node.op_type == "MatMul" or
                                                  (node.op_type == "Gemm" and not _attr(node, "transB", 0)))
        return f"{module}.{role}", "transposed" if transposed else "derived"
    if "BatchNorm" in _meta(node).get("pkg.onnxscript.rewriter.rule_name", "") and slot in (1, 2):
        return alias, "derived"  # the dynamo exporter folded BatchNorm in, keeping the Conv's names
    owner = alias.rsplit(".", 1)[0] if "." in alias else ""
    if role is not None and module and owner and owner != module and not module.startswith(owner + "."):
        # one module reads another's parameter: the exporter merged their equal tensors into one
        return f"{module}.{role}", "same"
    return alias, "same"


def source_names(model, params, ndims: dict) -> dict:
    """{parameter (an initializer's name): [{name, relation, onnx_name, read_by}]} for the parameters
    whose names say more than their own name does (merged, transposed, derived); ndims: each
    initializer's rank."""
    root = {}  # an Identity output of a parameter -> the parameter
    readings: dict[str, dict] = {}  # parameter -> {(name, relation, alias): [node labels]}
    for node in model.graph.node:
        ins = [root.get(n, n) if n else n for n in node.input]
        if node.op_type == "Identity" and ins and ins[0] in params:
            root[node.output[0]] = ins[0]
            continue
        for slot, (alias, param) in enumerate(zip(node.input, ins)):
            if param in params:
                key = (*_entry(alias, node, slot, ndims.get(param, 0)), alias)
                readings.setdefault(param, {}).setdefault(key, []).append(node.name or node.output[0])
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
