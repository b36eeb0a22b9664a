"""Verify one graph in-process or on a server, and say what happened as a record's fields.

Both verifiers turn every outcome a graph can cause into a status -- pass,
fail, invalid (the graph or its options are at fault), timeout (over the
per-graph limit), error (the verifier failed on this graph) -- and raise
InfraError only for what retrying elsewhere can fix: an unreadable volume,
out of memory, an unreachable or saturated server, a missing GPU.

A graph over the per-graph limit fails that graph only: its record says `timeout` and names the limit
and the flag that raises it, and the shard goes on (exit 0). Failing the shard instead (exit 75) would
have the Job retry it into the same limit until the index failed, and the merge would report the graph
missing rather than say why.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from gradcheck_core.request_message import make_request

from ..bounded import WorkerDied, bounded_call
from ..errors import OptionError, TimeLimitError
from ..outcome import RETRY, Internal, OverLimit, Refused, batch_status
from ..shell import run_bounded, verify_request

PROBE_SECONDS = 60.0  # the CUDA probe: a driver that hangs is a node's fault, retried elsewhere


class InfraError(Exception):
    """The machine, volume or server failed, not the graph: the shard exits for the Job to retry it."""


def cuda_usable() -> bool:
    """Whether this node's GPU can be used, asked in the child that verifies (bounded.py): a process that
    has initialized CUDA cannot hand it to a child it forks, so this one never initializes it."""
    from ..backend import cuda_available

    try:
        return bounded_call(PROBE_SECONDS, None, cuda_available)
    except (TimeLimitError, WorkerDied) as exc:
        raise InfraError(f"the CUDA probe failed: {exc}") from None


def gradient_digest(values) -> str:
    """sha256 of the gradient as float64 bytes: equal digests mean bit-for-bit equal gradients (a float32
    engine's gradient widens to float64 exactly)."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(values, dtype=np.float64)).tobytes()).hexdigest()


def _listed_digests(data: dict) -> tuple[dict, str]:
    params = data.get("parameters", [])
    digests = {p.get("name", ""): gradient_digest([float(v) for v in p.get("gradient", [])]) for p in params}
    return digests, "listed" if any(p.get("truncated") for p in params) else "full"


def decode(data: bytes, path, onnx_import=None):
    """The graph message from a file's bytes (read once, so the bytes verified are the bytes hashed), or for
    an .onnx file the model with its import options (imported by the verifier, as the server does);
    GraphFileError when they do not decode (a result)."""
    from gradcheck_core.graphio import decode_graph, sniff_format
    from gradcheck_core.onnx_options import OnnxModel, is_onnx

    if is_onnx(path):
        from gradcheck.v1 import service_pb2

        return OnnxModel(data, onnx_import if onnx_import is not None else service_pb2.OnnxImport())
    return decode_graph(data, sniff_format(data, path), path)


def present_faults(graph, faults: tuple) -> tuple:
    """Only the faults whose node exists in this graph (screening plants one fault across a whole suite)."""
    if not hasattr(graph, "nodes"):  # an ONNX model: its nodes are known only once imported
        return faults
    names = {n.name for n in graph.nodes} | {i.name for i in graph.inputs}
    return tuple(f for f in faults if f.split(":", 1)[0] in names)


def _record_fields(report) -> dict:
    """The record's fields of one report, computed in the child (shell.run_bounded): only JSON values cross
    back, never the gradients."""
    return {"status": report.verdict, "report": report.to_dict(), "device": report.device,
            "dtype": report.dtype, "digests": {p.name: gradient_digest(p.gradient) for p in report.parameters},
            "digest_scope": "full"}


class LocalVerifier:
    """In a child of this process killed at the per-graph limit (bounded.py: a signal cannot stop one long
    C call), as `gradcheck-svc verify` does; the server's own request path: validate against the server's
    default limits (or the `--max-...` given), then verify. `limit_flag` is the flag that raises the
    per-graph limit, named in a timeout's record."""

    where = "in-process"

    def __init__(self, options: dict, limits=None, limit_flag: str = "--time-limit"):
        from ..limits import ServerLimits
        from ..store.records import code_version

        self.options, self.limits, self.limit_flag = options, limits or ServerLimits(), limit_flag
        self.version = code_version()  # what answers: this process's code

    def check(self) -> None:
        from ..request import preload

        preload(self.options.get("symbolic", True))  # before the first child is forked (request.preload)

        if self.options.get("device") == "cuda" and not cuda_usable():
            raise InfraError("no usable CUDA device on this node")

    def verify(self, graph, rel: str, options: dict, limit: float) -> dict:
        request = make_request(graph, rel, **options)
        size = request.ByteSize()
        if size > self.limits.max_message_bytes:  # what the server's transport would refuse
            return {"status": "invalid", "error": f"the request is {size} bytes, over the limit of "
                    f"{self.limits.max_message_bytes} (raise it with --max-message-bytes)"}
        # the server's own request path (ONNX and allow_nonfinite included), in a child killed at the limit
        outcome = run_bounded(limit, None, verify_request, request, self.limits, then=_record_fields,
                              size_checked=True)  # measured above, once
        if isinstance(outcome, Internal) and isinstance(outcome.error, WorkerDied):
            raise InfraError(str(outcome.error))  # killed from outside (the OOM killer's SIGKILL): the node's fault
        return self._record(outcome, limit) if isinstance(outcome, (Refused, OverLimit, Internal)) else outcome

    def _record(self, outcome, limit: float) -> dict:
        """A Refused, OverLimit or Internal outcome as its record, by the batch column of outcome.CHANNELS."""
        status = batch_status(outcome)
        if status == RETRY:  # the device is not on this node, or its memory is too small: another node may do
            raise InfraError("out of memory" if isinstance(outcome, OverLimit) else outcome.message) from None
        if status == "timeout":  # the graph is not invalid, it is unfinished
            return {"status": "timeout", "error": f"over the per-graph time limit of {limit:g} s "
                    f"(raise it with {self.limit_flag})"}
        if status == "invalid":
            return {"status": "invalid", "error": outcome.message}
        # a fault of the verifier on this graph: a result, retrying cannot help
        first = (str(outcome.error).splitlines() or [""])[0][:300]
        return {"status": "error", "error": f"internal error: {outcome.type_name}: {first}"}


class RemoteVerifier:
    """On a gradcheck server (e.g. the headless Service: dns:///gradcheck-headless:50051 spreads shards
    over the replicas), through the client library."""

    BUSY_RETRIES = 30  # RESOURCE_EXHAUSTED: the server is saturated; wait, then let the Job retry

    def __init__(self, target: str, options: dict, token: str | None = None):
        from gradcheck_core.client import Client

        self.where = target
        self.options = options
        self.version = None  # what answers: the server's code version, known after check()
        self.client = Client(target, token=token, retries=4, backoff=0.2)  # ~2 s; then the Job retries

    def check(self) -> None:
        from gradcheck_core.client import VerifyError

        try:
            info = self.client.server_info()
        except VerifyError as exc:
            self._raise_for_connection(exc)
        # the server's source digest, as an in-process run keys on this process's: a server whose
        # engine changed under the same release number must not find the old server's records
        code = info.get("code_version")
        if not code:
            raise OptionError(f"server {self.where} (gradcheck {info.get('version') or 'unknown'}) does not "
                              "report the code version its answers are keyed by: upgrade it to this "
                              "gradcheck's release", field="--server")
        self.version = f"server {code}"

    def _raise_for_connection(self, exc) -> None:
        import grpc

        if exc.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise OptionError(f"the server refused the token: {exc.message}", field="--token-file")
        raise InfraError(f"server {self.where}: {exc.code.name}: {exc.message}")

    def verify(self, graph, rel: str, options: dict, limit: float) -> dict:
        import grpc

        from gradcheck_core.client import VerifyError

        for attempt in range(self.BUSY_RETRIES + 1):
            try:
                report = self.client.verify(graph, id=rel, timeout=limit, **options)
                break
            except VerifyError as exc:
                if exc.kind == "busy" and attempt < self.BUSY_RETRIES:
                    time.sleep(min(5.0, 0.1 * 2 ** attempt))
                    continue
                if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED or exc.kind == "timeout":
                    return {"status": "timeout", "error": f"over the per-graph time limit of {limit:g} s "
                            f"({exc.code.name}: {exc.message})"}
                if exc.kind == "unavailable":  # e.g. the server has no GPU: another replica may
                    raise InfraError(f"server {self.where}: {exc.message}") from None
                if exc.kind in ("worker_died", "internal"):
                    return {"status": "error", "error": f"{exc.kind}: {exc.message}"}
                if exc.invalid_input and exc.code not in (grpc.StatusCode.UNAUTHENTICATED,
                                                          grpc.StatusCode.PERMISSION_DENIED):
                    return {"status": "invalid", "error": exc.message}
                self._raise_for_connection(exc)
        digests, scope = _listed_digests(report.data)
        return {"status": report.verdict, "report": report.data, "device": report.device, "dtype": report.dtype,
                "digests": digests, "digest_scope": scope}

    def close(self) -> None:
        self.client.close()
