"""Bearer-token auth and TLS (a self-signed certificate made here), on one server with both."""
from __future__ import annotations

import datetime
import ipaddress

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcheck_client import Client, VerifyError
from grpc_helpers import ServerProcess, seed_graph

TOKEN = "s3cret-token"


def self_signed(tmp) -> tuple:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(tmp)
    s = ServerProcess("--workers", "1", "--tls-cert", str(cert), "--tls-key", str(key),
                      env={"GRADCHECK_TOKEN": TOKEN}, log_path=tmp / "log")
    s.cert = cert
    assert s.info["tls"] and s.info["auth"]
    yield s
    assert s.stop() == 0


def _client(server, token):
    return Client(f"localhost:{server.port}", token=token, root_certificates=server.cert, timeout=30, retries=0)


def test_right_token_over_tls(server):
    with _client(server, TOKEN) as c:
        assert c.verify(seed_graph()).passed
        assert c.server_info()["auth_required"] is True


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", TOKEN[:-1]])
def test_missing_or_wrong_token_is_unauthenticated(server, token):
    before = server.metric("gradcheck_auth_failures_total", method="Verify")
    with _client(server, token) as c:
        with pytest.raises(VerifyError) as info:
            c.verify(seed_graph())
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(VerifyError) as info:
            list(c.verify_many([seed_graph()]))
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    # counted by method, logged with method and peer, never with the token that was sent
    assert server.metric("gradcheck_auth_failures_total", method="Verify") == before + 1
    assert server.metric("gradcheck_auth_failures_total", method="VerifyStream") >= 1
    denied = [r for r in server.log_lines() if r["msg"] == "authentication failed"]
    assert denied and all(r["code"] == "UNAUTHENTICATED" and r["peer"] for r in denied)
    log_text = server.log_path.read_text()
    assert "wrong" not in log_text and TOKEN not in log_text


def test_health_needs_no_token(server):
    creds = grpc.ssl_channel_credentials(server.cert.read_bytes())
    with grpc.secure_channel(f"localhost:{server.port}", creds) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_client_cannot_talk_to_tls_server(server):
    with Client(server.target, token=TOKEN, timeout=5, retries=0) as c:
        with pytest.raises(VerifyError) as info:
            c.verify(seed_graph())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and not info.value.invalid_input


def test_untrusted_certificate_is_refused(server, tmp_path):
    other, _ = self_signed(tmp_path)
    with Client(f"localhost:{server.port}", token=TOKEN, root_certificates=other, timeout=5, retries=0) as c:
        with pytest.raises(VerifyError) as info:
            c.verify(seed_graph())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def _serve_error(*args) -> str:
    import subprocess
    import sys

    from grpc_helpers import _env

    done = subprocess.run([sys.executable, "-m", "gradcheck_svc.cli", "serve", "--port", "0", *map(str, args)],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1
    return done.stderr


def test_tls_misconfiguration_names_the_file_and_the_problem(tmp_path):
    cert, key = self_signed(tmp_path)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    _, other_key = self_signed(other_dir)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert _serve_error("--tls-cert", cert, "--tls-key", other_key) == \
        f"gradcheck-svc: error: --tls-key: {other_key} is not the key of the certificate in {cert}\n"
    assert _serve_error("--tls-cert", junk, "--tls-key", key) == \
        f"gradcheck-svc: error: --tls-cert: {junk} is not a PEM certificate\n"
    assert _serve_error("--tls-cert", cert, "--tls-key", cert) == \
        f"gradcheck-svc: error: --tls-key: {cert} is not a PEM private key\n"
    assert "no such file" in _serve_error("--tls-cert", tmp_path / "missing.pem", "--tls-key", key)
