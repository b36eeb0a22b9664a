"""gradcheck's core: below both the service (gradcheck_svc) and the client (gradcheck_client).

The protocol and the shared vocabulary: the options table (options.py, onnx_options.py), graph and
claims I/O (graphio.py, claims.py, onnx_files.py), the request builder (request_message.py), the
Report and its row status and labels (report.py), text escapes and the report outputs (outputs/),
the NumPy tracer behind check() (tracer.py, check_call.py), the gRPC client (client.py) and the one
error family (errors.py). It imports neither gradcheck_svc nor gradcheck_client
(tests/project/test_architecture.py). Kept light: each module imports what it needs.
"""
