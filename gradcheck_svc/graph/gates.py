"""A torch RNN parameter's place in the W, R or B that an ONNX LSTM, GRU or RNN node reads (docs/onnx.md).

Both exporters give an `nn.LSTM`/`nn.GRU`/`nn.RNN` layer one node reading W [dirs, G*H, I], R [dirs, G*H, H],
B [dirs, 2*G*H]: direction 0 is torch's `weight_ih_l{k}` (`weight_hh_l{k}`; `bias_ih_l{k}` then `bias_hh_l{k}`),
direction 1 its `_reverse`, and each tensor's G row blocks of H rows are in ONNX's gate order -- ONNX block j
is torch's block ORDER[relation][j] (LSTM i, o, f, c of torch's i, f, g, o; GRU z, r, h of torch's r, z, n).
So a torch gradient's image is a block permutation of its rows placed at its direction (and bias half),
zeros elsewhere: the initializer's gradient is the sum of its torch parameters' images, each element one
torch element exactly. Which part a key is comes from its own name, as torch spells it, never from values.
Used both ways: a claimed torch gradient placed into the initializer (onnx_import/claim_names.py), and an
element of the initializer named as torch's (a report's worst element, verify/run.py).
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import GraphError

ORDER = {"lstm_gates": (0, 3, 1, 2), "gru_gates": (1, 0, 2), "rnn_stacked": (0,)}
KEY = re.compile(r"(?:^|\.)(weight|bias)_(ih|hh)_l\d+(_reverse)?$")


def _part(key: str, relation: str, shape: tuple, where: str) -> tuple[int, int, int]:
    """(direction, first column of B or 0, rows of one gate block) of torch's `key` in a tensor of `shape`."""
    m = KEY.search(key)
    w_or_r = len(shape) == 3
    if m is None or (m[1] == "weight") != w_or_r or len(shape) not in (2, 3):
        raise GraphError(f"is no {'weight' if w_or_r else 'bias'}_ih/hh_l<k> of an RNN, which the model's "
                         f"{relation} tensor of shape {list(shape)} holds (docs/onnx.md)", field=where)
    direction = 1 if m[3] else 0
    rows = shape[1] if w_or_r else shape[1] // 2
    if direction >= shape[0] or rows % len(ORDER[relation]):
        raise GraphError(f"has no place in the model's {relation} tensor of shape {list(shape)} (docs/onnx.md)",
                         field=where)
    return direction, 0 if w_or_r or m[2] == "ih" else rows, rows // len(ORDER[relation])


def placed(value: np.ndarray, relation: str, key: str, p: str, shape: tuple, where: str) -> np.ndarray:
    """torch's gradient `value` of `key` as its part of the model's initializer `p` of `shape`, zeros elsewhere
    (module docstring); GraphError naming the key when it has no such part or its shape does not fit."""
    direction, start, block = _part(key, relation, shape, where)
    order = ORDER[relation]
    need = (block * len(order), *shape[2:])
    if value.shape != need:
        raise GraphError(f"has shape {list(value.shape)}, needs {list(need)} (its gate blocks in the model's "
                         f"'{p}', shape {list(shape)}: {relation}, docs/onnx.md)", field=where)
    out = np.zeros(shape, dtype=value.dtype)
    blocks = [value[j * block:(j + 1) * block] for j in order]
    out[direction, start:start + need[0]] = np.concatenate(blocks)
    return out



def torch_element(names: list[str], relation: str, shape: tuple, index: list) -> str:
    """' = rnn.weight_hh_l0[5, 0] (gate block 2 of torch's)': element `index` of a `relation` tensor of `shape`
    as the torch parameter of `names` that holds it (module docstring); "" when none of them is that part."""
    if relation not in ORDER or len(shape) not in (2, 3) or len(index) != len(shape):
        return ""
    order, d, at = ORDER[relation], int(index[0]), int(index[1])
    rows = shape[1] if len(shape) == 3 else shape[1] // 2
    if not rows or rows % len(order):
        return ""
    block = rows // len(order)
    torch_row = order[(at % rows) // block] * block + at % block
    for name in names:
        m = KEY.search(name)
        if m and (1 if m[3] else 0) == d and (len(shape) == 3 or (m[2] == "hh") == (at >= rows)):
            where = [torch_row, *(int(i) for i in index[2:])]
            return f" = {name}{where} (gate block {order[(at % rows) // block]} of torch's)"
    return ""
