"""verify/fd_record.py: one parameter's finite differences and their check, to a shard's record (JSON metadata
and named arrays, through JSON and .npz as a shard file holds them) and back, unchanged -- for every field of
FDResult and FDCheck, so a field added to either cannot be dropped on the way."""
import dataclasses
import io
import json

import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.oracles.finite_diff import FDOptions, FDResult, FiniteDifferences
from gradcheck_svc.verify import fd_record
from gradcheck_svc.verify.compare import Tolerance
from gradcheck_svc.verify.fd_check import FDCheck
from gradcheck_svc.verify.run import parameter_fd

from fd_graphs import mlp


def _through_a_file(meta: dict, arrays: dict) -> tuple[dict, dict]:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as z:
        return json.loads(json.dumps(meta)), {k: z[k] for k in z.files}


@pytest.mark.parametrize("mode", ["full", "projection"])
@pytest.mark.parametrize("name", ["W0", "scale"])  # a matrix and a 0-d parameter
def test_a_record_round_trips_every_field(mode, name):
    graph = load_graph(mlp(layers=2))
    fd = FiniteDifferences(graph, FDOptions(mode=mode, directions=4))
    g = np.asarray(fd.base[name], dtype=np.float64) * 0.5 + 1.0  # a gradient under test, wrong: refined values
    ref, check = parameter_fd(fd, name, g, Tolerance.for_dtype("float64"))
    meta, arrays = fd_record.to_record(ref, check)
    back_ref, back_check = fd_record.from_record(*_through_a_file(meta, arrays), ref.directions)
    assert back_ref.mode == ref.mode and back_check.comparison == check.comparison
    for cls, a, b in ((FDResult, ref, back_ref), (FDCheck, check, back_check)):
        for f in dataclasses.fields(cls):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
                assert np.array_equal(x, y) and np.shape(x) == np.shape(y), f.name
            else:
                assert x == y, f.name
