"""gradcheck's core: below both the service (gradcheck_svc) and the client (gradcheck_client).

The protocol and the shared vocabulary: the options table (options.py, onnx_options.py), graph and
claims I/O (graphio.py, claims.py, onnx_files.py), the request builder (request_message.py), the
Report and its row status and labels (report.py), text escapes and the report outputs (outputs/),
the NumPy tracer behind check() (tracer.py, check_call.py), the gRPC client (client.py) and the one
error family (errors.py). It imports neither gradcheck_svc nor gradcheck_client
(tests/project/test_architecture.py). Kept light: each module imports what it needs.
"""
import os

# Before anything of ours imports gRPC: our in-process checks fork (gradcheck_svc.bounded) in processes that
# may also hold gRPC channels, and gRPC's core, with its fork support on (the Linux wheels' default), runs a
# pre-fork handler on every fork that waits for its own threads to pause -- a process that had used a channel
# was seen to hang there in os.fork(). No child of ours uses gRPC (the server's workers come from a
# forkserver), so the support buys nothing. A value the user set is kept; a user who imported grpc first
# keeps gRPC's own default.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
