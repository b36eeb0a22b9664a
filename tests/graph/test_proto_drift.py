"""The committed generated protobuf code matches proto/: regenerate into a
temporary folder with scripts/gen_proto.py and compare byte for byte."""
import importlib.util

from conftest import ROOT


def test_generated_code_matches_proto(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    outputs = gen.generate(tmp_path)
    assert outputs
    committed_root = ROOT / "clients" / "python"
    for fresh in outputs:
        rel = fresh.relative_to(tmp_path)
        committed = committed_root / rel
        assert committed.exists(), f"{rel} is not committed: run `make proto`"
        assert committed.read_bytes() == fresh.read_bytes(), f"{rel} is stale: run `make proto`"


def test_vendored_google_rpc_protos_are_googleapis():
    """proto/google/rpc/ (for other languages' clients: the rich error details) holds googleapis'
    files exactly as the googleapis-common-protos package the server encodes them with ships them."""
    import google.rpc
    from pathlib import Path

    shipped = Path(next(iter(google.rpc.__path__)))
    for name in ("status.proto", "error_details.proto"):
        assert (ROOT / "proto" / "google" / "rpc" / name).read_bytes() == (shipped / name).read_bytes(), name
