"""The torch front end's ATen table against the op registry (issue 48, item 3): the entries that are the
registry's op of the same name are derived from the registry's own table, and every registry op the
hand-written replays name is one the service's registry has -- a rename or removal there fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)

from gradcheck_client.torch import attention, capture, inplace  # noqa: E402
from gradcheck_core.tracer import Tracer  # noqa: E402
from gradcheck_svc.ops import all_ops  # noqa: E402

REGISTRY = {op.name: op for op in all_ops()}
aten = torch.ops.aten


def _named_ops(module) -> list[tuple[str, int]]:
    """(op name, line) for each registry op the module's replays name: the string first argument of a call to
    _apply / <tracer>.apply / _pool."""
    tree = ast.parse(Path(module.__file__).read_text())
    named = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        fn = call.func
        callee = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        first = call.args[0]
        if callee in ("_apply", "apply", "_pool") and isinstance(first, ast.Constant) and isinstance(first.value, str):
            named.append((first.value, call.lineno))
    return named


@pytest.mark.parametrize("module", [capture, attention, inplace], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_op_a_replay_names_is_in_the_registry(module):
    named = _named_ops(module)
    assert len(named) >= (10 if module is capture else 2)  # the scan sees the replays (it is not vacuous)
    missing = [f"{Path(module.__file__).name}:{line}: '{op}'" for op, line in named if op not in REGISTRY]
    assert missing == []


@pytest.mark.parametrize("name", capture.SAME_AS_REGISTRY)
def test_a_same_named_aten_op_is_the_registrys_op(name):
    op = REGISTRY[name]  # the service's registry, not only the client's generated copy of it
    assert op.attrs == {} and op.arity == len(op.input_kinds)
    t = Tracer()
    xs = [t.input(f"x{i}", np.array([0.5, 0.75]), requires_grad=True) for i in range(op.arity)]
    if op.input_kinds[0] == "bool":
        xs[0] = np.array([True, False])
    y = capture.ATEN[getattr(aten, name)](*xs)
    graph = t.graph(np.sum(y))
    assert [n.op for n in graph.nodes][0] == name


def test_an_argument_the_registry_op_lacks_makes_the_op_opaque_not_wrong():
    """div's rounding_mode has no attribute in the registry's div: a TypeError, which _replay turns into an
    opaque node (checked on its own), never a replay of the plain division."""
    t = Tracer()
    x = t.input("x", np.array([0.5, 0.75]), requires_grad=True)
    value, declined = capture._replay(capture.ATEN[aten.div], [x, x], {"rounding_mode": "floor"})
    assert value is None and "rounding_mode" in declined


def test_a_name_the_registry_lacks_is_refused_at_import():
    with pytest.raises(ImportError, match="'cumsum' is not an op of the registry"):
        capture._registry_op("cumsum")
