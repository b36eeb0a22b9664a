"""The bad-input corpus (tests/bad_inputs.py) through the CLI and over gRPC, unary and stream.

Every case gets the documented outcome -- exit 2 from `gradcheck-svc verify`; INVALID_ARGUMENT,
RESOURCE_EXHAUSTED (kind `limit`) or FAILED_PRECONDITION from the server -- with a message on one
line, under a fixed length, without a traceback, and the server is alive and serving afterwards.
"""
from __future__ import annotations


import grpc
import pytest

from bad_inputs import LIMIT_FLAGS, cases
from gradcheck.v1 import service_pb2
from gradcheck_client import Client
from grpc_helpers import _env, module_server, seed_graph
import forked_cli

CASES = cases()
MAX_MESSAGE = 600  # characters: what a person reads and what gRPC trailers carry
CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT, "limit": grpc.StatusCode.RESOURCE_EXHAUSTED,
         "unavailable": grpc.StatusCode.FAILED_PRECONDITION}
LIMIT_ARGS = [a for k, v in LIMIT_FLAGS.items() for a in ("--" + k.replace("_", "-"), str(v))]
IDS = [c.name for c in CASES]


def test_the_corpus_is_large_and_covers_every_outcome():
    assert len(CASES) >= 100
    assert {c.kind for c in CASES} >= {"invalid", "limit"}
    assert len({c.name for c in CASES}) == len(CASES)


def assert_one_safe_line(text: str) -> None:
    assert text and "\n" not in text.rstrip("\n") and "\r" not in text, repr(text[:300])
    assert len(text) <= MAX_MESSAGE, len(text)
    assert "Traceback" not in text.split(": ", 1)[0] and "internal error" not in text
    assert all(c.isprintable() for c in text.rstrip("\n")), repr(text[:300])


@pytest.fixture(scope="module", autouse=True)
def sympy_imported_before_the_forks():
    """`gradcheck-svc verify` checks each graph in a forked child (gradcheck_svc/bounded.py), and an `expr`
    node's formula is parsed with SymPy: imported here once, every child inherits it instead of importing it
    again (~0.5 s a case, the formula cases were most of this file's time). The CLI path run is the same."""
    import sympy  # noqa: F401


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1", *LIMIT_ARGS)


@pytest.fixture(scope="module")
def raw(server):
    """Unary and stream callables that send request bytes as they are (malformed ones too)."""
    channel = grpc.insecure_channel(server.target)
    unary = channel.unary_unary("/gradcheck.v1.GradCheckService/Verify",
                                response_deserializer=service_pb2.VerifyResponse.FromString)
    stream = channel.stream_stream("/gradcheck.v1.GradCheckService/VerifyStream",
                                   response_deserializer=service_pb2.VerifyResponse.FromString)
    yield unary, stream
    channel.close()


def _payload(case) -> bytes:
    req = case.request()
    return req if req is not None else case.data  # bad JSON has no protobuf form: send its bytes


def run_cli(case, tmp_path) -> tuple[int, str, str]:
    """`gradcheck-svc verify` in-process (its real main: parsing, limits, error mapping)."""
    import contextlib
    import io

    from gradcheck_svc.cli import main

    path = tmp_path / ("graph" + case.suffix)
    path.write_bytes(case.data)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(["verify", str(path), *LIMIT_ARGS, *case.flags])
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cli_and_unary(case, tmp_path, raw):
    rc, out, err = run_cli(case, tmp_path)
    assert rc == 2 and out == "", (rc, err[:300])
    assert_one_safe_line(err)

    unary, _ = raw
    with pytest.raises(grpc.RpcError) as info:
        unary(_payload(case), timeout=30)
    rpc = info.value
    meta = dict(rpc.trailing_metadata() or ())
    assert rpc.code() == CODES[case.kind], (rpc.code(), rpc.details())
    assert meta.get("gradcheck-error-kind") == case.kind
    assert_one_safe_line(rpc.details())
    assert sum(len(k) + len(v) for k, v in meta.items()) < 4096  # far below gRPC's 8 KiB metadata limit
    if not case.options and case.same_message and case.request() is not None:  # one validation, one message, both front ends
        assert err == f"gradcheck-svc: error: {rpc.details()}\n"


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith(("control_", "name_", "pb_garbage_0",
                                                                          "formula_0", "nan_in"))],
                         ids=lambda c: c.name)
def test_cli_subprocess(case, tmp_path):
    """A few through a real process too: stderr is exactly one line, stdout empty."""
    path = tmp_path / ("graph" + case.suffix)
    path.write_bytes(case.data)
    done = forked_cli.run("gradcheck_svc.cli", "verify", path, *LIMIT_ARGS, *case.flags, env=_env(), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert_one_safe_line(done.stderr)


def test_stream_every_case_in_one_stream(raw, server):
    _, stream = raw
    requests = [c for c in CASES if c.request() is not None]
    items = {r.id: r for r in stream(iter(_payload(c) for c in requests), timeout=120)}
    for case in requests:
        err = items[case.name].error
        assert err.kind == case.kind and err.code == CODES[case.kind].value[0], (case.name, err)
        assert_one_safe_line(err.message)
    malformed = [_payload(c) for c in CASES if c.request() is None]
    items = list(stream(iter(malformed), timeout=60))
    assert len(items) == len(malformed) and all(i.error.kind == "invalid" for i in items)


def test_server_alive_and_serving_after_the_corpus(server):
    with Client(server.target, timeout=30, retries=0) as c:
        assert c.verify(seed_graph()).passed
    assert server.proc.poll() is None
    assert server.metric("gradcheck_requests_total", code="INTERNAL") == 0


def test_server_info_lists_every_limit_in_force(server):
    """GetServerInfo shows each limit of gradcheck_svc/limits.py, with the value the server runs with."""
    from gradcheck_svc.limits import LIMITS

    with Client(server.target, timeout=30, retries=0) as c:
        limits = c.server_info()["limits"]
    for spec in LIMITS:
        want = LIMIT_FLAGS.get(spec.name, spec.default)
        assert float(limits[spec.name]) == float(want), spec.name


def test_serve_help_shows_every_limit():
    from gradcheck_svc import cli
    from gradcheck_svc.limits import LIMITS

    serve = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["serve"]
    text = serve.format_help()
    for spec in LIMITS:
        assert "--" + spec.name.replace("_", "-") in text and f"(default {spec.default})" in " ".join(text.split())
