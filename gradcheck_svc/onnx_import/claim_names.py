"""Claimed gradients keyed by PyTorch's names, onto an imported model's initializers.

`--claimed GRADS.npz` with an ONNX model (graph.proto's Claims beside VerifyRequest.onnx_model) takes an
archive keyed by the model's initializer names (the graph's parameters, as the report names them) or by
the torch names the importer traced to them (source_names, provenance.py): the `named_parameters()`
keys, so `{n: p.grad for n, p in model.named_parameters()}` of a training step is checked as it is.
Each torch-named gradient reaches its initializer through the relation: `same` as it is, `transposed`
(an nn.Linear weight a MatMul reads) transposed, `reshaped` to the initializer's shape; a merged
initializer (equal tensors the exporter made one) gets the sum of its torch parameters' gradients --
exactly its gradient -- so all of them must be given; likewise an RNN's W, R or B (`lstm_gates`, `gru_gates`,
`rnn_stacked`): each torch key's gradient is placed as its part, its gate blocks in ONNX's order
(graph/gates.py), the parts of all of them making the whole. A key the model has no image of is explained in a
note, not refused (archive.py): a parameter the exporter folded into a tensor of its own, or into a `derived`
one (BatchNorm folded into a Conv: no torch parameter has its gradient); the exporter's own and derived tensors
no key names are then constants, said in a note. Refused, naming the key: a torch name standing for several
initializers (a copied weight the importer could not tie to one: its gradient is their sum, which cannot be
split; a tied copy the importer found is emitted from its parameter, relation "tied", and maps with it), an
initializer given both ways, a key naming nothing, a part of a stacked or merged initializer given without the
others. An archive whose every key is an initializer name is read by initializer names (a merged initializer's
own name is also one of its torch names: alone, it is the initializer's whole gradient).
"""
from __future__ import annotations

import numpy as np
from gradcheck_core.claims import claims_message
from gradcheck_core.hints import hint

from ..errors import GraphError
from ..graph.gates import ORDER, placed
from ..graph.validate import MAX_NOTE_LENGTH, decode_tensor
from .archive import derived_note, unclaimable_note

EXACT = {"same", "transposed", "reshaped", *ORDER}  # relations whose gradient maps element by element


def onto_initializers(message, claims, unheld: dict | None = None, unnamed: dict | None = None):
    """Claims keyed by initializer names: `claims` itself when every key already is one, else each key
    taken as a torch name (or an initializer name) and mapped (module docstring); GraphError naming a key
    that matches nothing or cannot be mapped exactly. unheld: {torch name: what the exporter made of it} for
    the parameters the model holds under no name (importer.unheld_claims): such a key is not checkable,
    which a note on `message` says, naming it and where its value went. unnamed: the parameters that are
    tensors of the exporter's own, traced to no torch name (archive.py): unless a key names one, they are
    made constants on `message`, which a note says."""
    params = {i.name: i for i in message.inputs if i.requires_grad}
    if all(k in params for k in claims.gradients):
        return claims
    unheld, unnamed = unheld or {}, unnamed or {}
    torch_names: dict = {}  # torch name -> [(initializer, relation)]
    for p, inp in params.items():
        for sn in inp.source_names or [_Own(p)]:
            # a tied copy's reads are this parameter's own (ties.py): its "same" entry maps it
            if sn.name and sn.relation != "tied" and (p, sn.relation) not in torch_names.get(sn.name, []):
                torch_names.setdefault(sn.name, []).append((p, sn.relation))
    parts: dict = {}  # initializer -> {key: its gradient, mapped}
    explained = {}  # key -> what became of it
    for key in sorted(claims.gradients):
        where = f"claimed gradient '{key}'"
        if key not in torch_names and key not in params and key in unheld:
            explained[key] = unheld[key]
            continue
        found = torch_names.get(key, [])
        if len(found) == 1 and found[0][1] == "derived" and found[0][0] in unnamed:  # BatchNorm folded in
            explained[key] = derived_note(found[0][0], unnamed[found[0][0]])
            continue
        value, _ = decode_tensor(claims.gradients[key], where)
        p, relation = _target(key, torch_names, params, where)
        parts.setdefault(p, {})[key] = (relation, _mapped(value, relation, key, p, params[p], where))
    held = _with_unnamed(parts, params, explained)
    gradients = {p: _merged(p, got, params[p]) for p, got in parts.items() if p not in held}
    dropped = sorted((set(unnamed) | held) - set(gradients))
    for p in dropped:  # no torch parameter's gradient: not claimable by this archive (archive.py)
        params[p].requires_grad = False
    notes = _explained(explained) + [unclaimable_note(dropped, " ".join(explained.values()))]
    # a graph's note is bounded (validation); names from the archive are the user's, of any length
    message.notes.extend(n if len(n) <= MAX_NOTE_LENGTH else n[:MAX_NOTE_LENGTH - 3] + "..." for n in notes if n)
    out = claims_message(gradients)
    for name, t in claims.adjoints.items():
        out.adjoints[name].CopyFrom(t)
    return out


def _with_unnamed(parts: dict, params: dict, explained: dict) -> set[str]:
    """The initializers given by torch names whose gradient also sums a part no torch parameter's gradient is:
    the exporter merged them with a tensor of no torch name (a BatchNorm-folded Conv's zero bias and zero
    Linear biases: equal tensors made one). Each key given for one is explained (`explained`), not mapped."""
    out = set()
    for p, got in parts.items():
        other = [s for s in params[p].source_names if not s.name and s.relation != "tied"]
        if other and not any(relation == "initializer" for relation, _ in got.values()):
            out.add(p)
            by = ", ".join(r for s in other for r in s.read_by[:2]) or "another node"
            for key in got:
                explained[key] = (f"merged by the exporter into {p} with a tensor that is no torch parameter's "
                                  f"({other[0].relation}, read by {by})")
    return out


def _explained(explained: dict, most: int = 6) -> list[str]:
    """One note per key not checkable, at most `most` (a graph's notes are bounded: validation), the rest's
    keys listed in the last."""
    notes = [f"not checked: claimed gradient '{k}': {what}: not checkable" for k, what in explained.items()]
    if len(notes) <= most:
        return notes
    rest = list(explained)[most - 1:]
    return notes[:most - 1] + [f"not checked: claimed gradients {', '.join(repr(k) for k in rest[:20])}"
                               f"{' and more' if len(rest) > 20 else ''}: folded by the exporter: not checkable"]


class _Own:
    """A parameter read by its own name only (source_names empty): that name is torch's."""

    def __init__(self, name: str):
        self.name, self.relation = name, "same"


def _target(key: str, torch_names: dict, params: dict, where: str) -> tuple[str, str]:
    """(the initializer `key` names, the relation): by torch name first, else by initializer name."""
    found = torch_names.get(key)
    if found is None:
        if key in params:
            return key, "initializer"
        raise GraphError("names no parameter of the model: neither an initializer that is one nor a torch "
                         f"name the importer traced to one (source_names){hint(key, [*torch_names, *params])}",
                         field=where)
    if len(found) > 1:
        inits = ", ".join(f"'{p}'" for p, _ in found)
        raise GraphError(f"stands for {len(found)} of the model's initializers ({inits}: a tied or copied "
                         "weight); its gradient is their sum, which cannot be split: give each initializer's "
                         "gradient under its own name", field=where)
    p, relation = found[0]
    if relation not in EXACT:  # derived: a BatchNorm folded in
        raise GraphError(f"the model's initializer '{p}' is it {relation} (docs/onnx.md): its gradient is not a "
                         "torch parameter's one to one; give that initializer's gradient under its own name",
                         field=where)
    return p, relation


def _mapped(value: np.ndarray, relation: str, key: str, p: str, inp, where: str) -> np.ndarray:
    """The gradient given under `key`, as the initializer `p` (the relation's image); GraphError naming the key
    when its shape does not fit."""
    shape = tuple(int(d) for d in inp.value.shape)
    if relation in ORDER:  # one part of an RNN's stacked W, R or B: the others' keys give the rest
        return placed(value, relation, key, p, shape, where)
    fits = {"transposed": value.shape == shape[::-1],
            "reshaped": value.size == int(np.prod(shape, dtype=np.int64))}.get(relation, value.shape == shape)
    if not fits:
        need = {"transposed": f"shape {list(shape[::-1])} (the model's '{p}', shape {list(shape)}, is it transposed)",
                "reshaped": f"{int(np.prod(shape, dtype=np.int64))} elements (the model's '{p}' is it reshaped to "
                            f"{list(shape)})"}.get(relation, f"shape {list(shape)} (the model's '{p}')")
        raise GraphError(f"has shape {list(value.shape)}, needs {need}", field=where)
    return value.T if relation == "transposed" else value.reshape(shape)


def _merged(p: str, got: dict, inp) -> np.ndarray:
    """One initializer's gradient from what was given for it: by its own name, or its torch names (all of
    them: a merged initializer's gradient is the sum of theirs)."""
    keys = sorted(got)
    if any(relation == "initializer" for relation, _ in got.values()):
        if len(keys) > 1:
            raise GraphError(f"is given twice: by its own name and as {', '.join(repr(k) for k in keys if k != p)} "
                             "(a torch name the importer traced to it)", field=f"claimed gradient '{p}'")
        return got[keys[0]][1]
    names = sorted({sn.name for sn in inp.source_names if sn.relation != "tied"} or {p})
    missing = [n for n in names if n not in got]
    if missing:
        shown = ", ".join(f"'{n}'" if n else "(a tensor with no torch name)" for n in missing)
        relation = next(iter(got.values()))[0]
        how = (f"stacked it with {shown} into one initializer '{p}' ({relation}, docs/onnx.md)" if relation in ORDER
               else f"merged it with {shown} into one initializer '{p}' (its gradient is the sum of theirs)")
        raise GraphError(f"the exporter {how}: give all of them, or the initializer's gradient under '{p}'",
                         field=f"claimed gradient '{keys[0]}'")
    return sum(value for _, value in got.values())
