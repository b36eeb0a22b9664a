"""The client's generated table of trace-time values matches the server's op registry:
regenerate with scripts/gen_client_ops.py and compare with the committed file, byte for byte."""
import importlib.util
import os
import subprocess
import sys

from conftest import ROOT

from gradcheck_core import op_values
from gradcheck_svc.ops import REGISTRY


def _generator():
    spec = importlib.util.spec_from_file_location("gen_client_ops", ROOT / "scripts" / "gen_client_ops.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_generated_op_values_match_the_registry():
    gen = _generator()
    committed = gen.DEFAULT_OUT
    assert committed.read_text() == gen.source(), f"{committed.name} is stale: run `make client-ops`"


def test_every_registry_op_has_a_value_or_is_listed_without_one():
    assert set(op_values.VALUES) | set(op_values.WITHOUT_VALUE) == set(REGISTRY)
    assert not set(op_values.VALUES) & set(op_values.WITHOUT_VALUE)


def test_every_registry_op_is_in_the_tracers_table_with_its_numpy_name_and_attributes():
    assert set(op_values.OPS) == set(REGISTRY)
    for name, op in REGISTRY.items():
        entry = op_values.OPS[name]
        assert entry["numpy"] == op.numpy and entry["arity"] == op.arity and set(entry["attrs"]) == set(op.attrs)


def test_the_tracer_works_without_the_server_package():
    # as if gradcheck-svc were not installed: None in sys.modules blocks the import
    code = ("import sys; sys.modules['gradcheck_svc'] = None; "
            "from gradcheck_client import Tracer, ops; t = Tracer(); x = t.param('x', [1.0, -2.0]); "
            "y = ops.relu(x * 3.0).sum(); print(float(y.value), bool(y > 2), sorted(sys.modules).count('sympy'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "clients" / "python")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.0", "True", "0"]  # a value from the generated table; no SymPy in the client
