"""The committed generated code under clients/python/gradcheck/v1 matches proto/."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "clients" / "python"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_code_matches_protos(tmp_path):
    outputs = _generator().generate(tmp_path)
    assert outputs, "no .proto files found"
    stale = [str(p.relative_to(tmp_path)) for p in outputs
             if not (COMMITTED / p.relative_to(tmp_path)).exists()
             or (COMMITTED / p.relative_to(tmp_path)).read_bytes() != p.read_bytes()]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"
    assert {"gradcheck/v1/graph_pb2.py", "gradcheck/v1/service_pb2.py"} <= {
        str(p.relative_to(tmp_path)) for p in outputs}
