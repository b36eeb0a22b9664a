"""Generate the Python protobuf/gRPC code for proto/ into clients/python/.

The .proto files live under proto/gradcheck/v1/ so that the package path
mirrors the proto package (gradcheck.v1); protoc's absolute imports then work
without any rewriting. The output is committed; tests/graph/test_proto_drift.py
regenerates into a temporary folder and fails if the committed copy differs.

    python scripts/gen_proto.py [OUT_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "clients" / "python"


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc

    # gradcheck's own: proto/google/rpc/ holds googleapis' status and error details for other languages'
    # clients, whose Python code is googleapis-common-protos's
    protos = sorted((PROTO_DIR / "gradcheck").rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_DIR)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    outputs = []
    for p in protos:
        stem = p.relative_to(PROTO_DIR).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            outputs.append(out_dir / f"{stem}{suffix}")
    return outputs


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(out):
        print(path.relative_to(out))
