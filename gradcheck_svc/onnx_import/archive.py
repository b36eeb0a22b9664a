"""A `--claimed` archive of torch's whole `named_parameters()` against an imported model: every key accounted for.

claim_names.py maps each key the importer traced (source_names) onto its initializer. What is left:
- **keys the model holds under no name**: the exporter folded the parameter into a tensor of its own naming
  (Swin's position-bias table gathered into `onnx::Add_N`, DETR's queries unsqueezed into `onnx::Expand_N`,
  the dynamo optimizer's `permute_1`, `repeat`). Such a key's gradient has no image in the model: it is
  explained, "folded into X read by N by the exporter: not checkable", naming the tensors that hold it
  (a dynamo export: those its metadata's source lines tie to it, importer.unheld_parameters; a TorchScript
  export, which names no torch parameter anywhere: its own tensors read in the key's module or one above
  it -- an op reads its own module's parameters and its submodules' -- all of them when none is).
- **derived tensors** (BatchNorm folded into the Conv before it, provenance.py): a key whose only image is one
  is explained the same way, "folded with another parameter ... into onnx::Conv_N": its gradient is not the
  derived tensor's.
- **the exporter's own tensors** that the import made parameters (a TorchScript export's `onnx::Add_N`: every
  float initializer of rank >= 1 is a weight by default), and derived ones, that no key of the archive names:
  their gradient is no torch parameter's, so an archive keyed by torch names cannot claim it. Under such an
  archive they are constants (claim_names.onto_initializers), each said in a note (unclaimable_note, or the
  key's explanation naming it) -- never a "not provided" row failing torch's correct gradients, nor an `ok` one.
  Also explained, not mapped: the keys of an initializer the exporter merged with such a tensor (a folded
  zero bias made one with zero biases): its gradient sums a part no key's gradient is.
Values never decide a mapping here: the archive holds gradients, the subject under test, and the model's
tensors hold no folded parameter's value.
"""
from __future__ import annotations

from .provenance import MADE, _module

SHOWN = 4  # tensors named in one explanation at most


def unnamed_tensors(model, message, exported: list[str]) -> dict[str, list]:
    """{parameter of the imported `message` that no torch-keyed claim can name: the nodes reading it} -- a tensor
    the exporter made, traced to no torch name (an exporter's name, onnx::Op_N or val_N, or in a dynamo export,
    `exported` its signature's parameters, any name it does not list), or a derived one (every entry of its
    source_names "derived": BatchNorm folded into a Conv, no torch parameter's gradient)."""
    listed, inits = set(exported), {t.name for t in model.graph.initializer}  # a graph input is the user's
    out = {}
    for inp in message.inputs:
        made = inp.name in inits and (MADE.match(inp.name) or (listed and inp.name not in listed))
        entries = inp.source_names
        derived = bool(entries) and all(s.relation == "derived" for s in entries)
        if inp.requires_grad and (derived or (made and not any(s.name for s in entries))):
            out[inp.name] = [n for n in model.graph.node if inp.name in n.input]
    return out


def derived_note(p: str, readers: list) -> str:
    """What became of a torch parameter whose only image is the derived tensor `p`."""
    return f"folded with another parameter (a BatchNorm into its Conv) into {label(p, readers)} by the exporter"


def _within(reader_module: str, key: str) -> bool:
    """An op of module `reader_module` may read parameter `key`: the key's own module or one below it."""
    owner = key.rsplit(".", 1)[0] if "." in key else ""
    return reader_module == "" or owner == reader_module or owner.startswith(reader_module + ".")


def label(tensor: str, readers: list) -> str:
    names = [n.name or f"the {n.op_type} node making '{n.output[0]}'" for n in readers[:2]]
    return f"{tensor} read by {', '.join(names)}{' and more' if len(readers) > 2 else ''}" if names else tensor


def legacy_unheld(keys, unnamed: dict[str, list]) -> dict[str, str]:
    """{key: what became of it, as importer.unheld_parameters says it of a dynamo export's} for a TorchScript
    export's archive keys that the import traced to nothing (`keys`), when the model has tensors of the
    exporter's own naming (`unnamed`) that may hold them (module
    docstring); none without such tensors (a key is then refused as naming no parameter)."""
    if not unnamed:
        return {}
    out = {}
    for key in keys:
        near = [t for t, readers in unnamed.items() if readers and all(_within(_module(n)[0], key) for n in readers)]
        held = near or list(unnamed)
        shown = ", ".join(label(t, unnamed[t]) for t in held[:SHOWN]) + (
            f" and {len(held) - SHOWN} more" if len(held) > SHOWN else "")
        out[key] = (f"folded into {shown} by the exporter" if len(held) == 1 else
                    f"folded by the exporter into one of {shown} (the TorchScript export does not say which)")
    return out


def unclaimable_note(dropped: list[str], explained: str) -> str:
    """The note for the exporter's own tensors made constants under a torch-keyed archive (module docstring);
    `explained`: the archive's explanations so far (a tensor they name is said there already)."""
    said = set(explained.replace(",", " ").split())  # whole names: onnx::Add_1 is not said by onnx::Add_10
    rest = [t for t in dropped if t not in said]
    if not rest:
        return ""
    more = f" and {len(rest) - SHOWN} more" if len(rest) > SHOWN else ""
    return (f"not checked: {', '.join(rest[:SHOWN])}{more}: made by the exporter and traced to no torch "
            "parameter, so no key of the claimed archive is its gradient: a constant here")

