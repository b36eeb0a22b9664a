"""Claimed gradients into a graph message: the gradients other code computed, to be verified.

An .npz archive (`--claimed GRADS.npz` of both verify commands) holds one array per parameter, by
its name; an array under `adjoint:NODE` is the claimed adjoint of node NODE (dL/d its output).
`np.savez("grads.npz", w=dw, b=db, **{"adjoint:h": dh})` writes one. The arrays go into the graph's
`claimed` field (graph.proto's Claims); the verifier checks names, shapes and values (gradcheck_svc/
graph/claims.py), so a request, a graph file and an archive are refused with the same words. An ONNX
model's archive may be keyed by torch's names instead: the importer maps them to its initializers
(gradcheck_svc/onnx_import/claim_names.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gradcheck.v1 import graph_pb2

from .errors import InvalidInput
from .npz_bounded import CLIENT_MESSAGE_BYTES, NpzError, read_npz
from .onnx_options import OnnxModel
from .outputs.text import clip

ADJOINT_PREFIX = "adjoint:"
# the dtype kinds a claimed gradient may hold (float, int, uint): a complex one would lose its imaginary part
# and a string or object one be parsed into numbers on the way to float64 -- a wrong claim turned right
NUMBER_KINDS = "fiu"


class ClaimsFileError(InvalidInput, ValueError):
    """An archive that cannot be read as claims: one line naming the file or the entry."""


def claims_message(gradients: dict, adjoints: dict | None = None) -> graph_pb2.Claims:
    """Claims from arrays by name (float32 arrays stay float32; everything else goes as float64)."""
    msg = graph_pb2.Claims()
    for target, arrays in ((msg.gradients, gradients), (msg.adjoints, adjoints or {})):
        for name, value in arrays.items():
            _tensor(target[name], value)
    return msg


def _tensor(t, value) -> None:
    a = np.asarray(value)
    dtype = "float32" if a.dtype == np.float32 else "float64"
    t.dtype, t.shape[:] = dtype, list(a.shape)
    t.raw = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def claims_for(path: str | None, graphs: list, max_elements: int | None = None,
               max_bytes: int | None = None) -> graph_pb2.Claims | None:
    """`--claimed PATH` of a verify command given these graph paths: the claims, or None without the flag;
    the archive read within the request limits (npz_bounded.py)."""
    if path is None:
        return None
    if len(graphs) != 1:
        raise ClaimsFileError("claimed gradients are one graph's: give one graph file (.json, .pb or .onnx)")
    return read_claims(path, max_elements, max_bytes)


def claimed_flag(path: str | None, graphs: list, limits=None) -> graph_pb2.Claims | None:
    """`--claimed PATH` of either verify command (gradcheck-svc verify, gradcheck verify): claims_for within
    `limits` (ServerLimits: in process, the run's own) or, with a server (None), within the most this client
    sends in one message (the server's limits are its own)."""
    if limits is None:
        return claims_for(path, graphs, None, CLIENT_MESSAGE_BYTES)
    return claims_for(path, graphs, limits.max_elements, limits.max_message_bytes)


def read_claims(path: str, max_elements: int | None = None, max_bytes: int | None = None) -> graph_pb2.Claims:
    """The claims in an .npz archive (module docstring), read within the limits before anything is inflated
    (npz_bounded.read_npz); ClaimsFileError naming the file or entry."""
    try:
        arrays = read_npz(path, max_elements, max_bytes)
    except NpzError as exc:
        raise ClaimsFileError(str(exc)) from None
    if not arrays:
        raise ClaimsFileError(f"{path}: holds no array (one per parameter, by its name)")
    gradients, adjoints = {}, {}
    for key, value in arrays.items():
        if value.dtype.kind not in NUMBER_KINDS:
            raise ClaimsFileError(f"{path}: entry '{clip(key, 200)}' holds {value.dtype} values, not numbers")
        if key.startswith(ADJOINT_PREFIX):
            adjoints[key[len(ADJOINT_PREFIX):]] = value
        else:
            gradients[key] = value
    return claims_message(gradients, adjoints)


def with_claims(graph, claims: graph_pb2.Claims):
    """A copy of the graph message (or OnnxModel) carrying the claims (replacing any it had). An ONNX model's
    may be keyed by the torch names its initializers stand for: the importer maps them
    (gradcheck_svc/onnx_import/claim_names.py)."""
    if isinstance(graph, OnnxModel):
        return dataclasses.replace(graph, claims=claims)
    out = graph_pb2.Graph()
    out.CopyFrom(graph)
    out.claimed.CopyFrom(claims)
    return out
