"""Development TLS material (controlplane/tls.py): files, modes, SANs, and a real TLS handshake."""

from __future__ import annotations

import datetime as dt
import ipaddress
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controlplane.tls import make_dev_pki, write_secret


def test_files_exist_with_private_keys_0600(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path / "pki", client=True)
    for key in (pki.ca_key, pki.server_key, pki.client_key):
        assert key is not None and key.stat().st_mode & 0o777 == 0o600
        assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    for cert in (pki.ca_cert, pki.server_cert, pki.client_cert):
        assert cert is not None and cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert (tmp_path / "pki").stat().st_mode & 0o077 == 0


def test_server_certificate_names_loopback_and_is_signed_by_the_ca(tmp_path: Path) -> None:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    pki = make_dev_pki(tmp_path, now=now, valid_days=10)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert server.issuer == ca.subject
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]  # also forwards calls (mTLS)
    assert server.not_valid_before_utc < now < server.not_valid_after_utc <= now + dt.timedelta(days=10)
    assert pki.client_cert is None


def test_bad_arguments_name_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hosts"):
        make_dev_pki(tmp_path, hosts=())
    with pytest.raises(ValueError, match="valid_days"):
        make_dev_pki(tmp_path, valid_days=0)


def test_write_secret_replaces_a_loose_file_with_a_0600_one(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old")
    path.chmod(0o644)
    write_secret(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_grpc_handshake_with_the_generated_material_including_mutual_tls(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path, client=True)
    assert pki.client_cert is not None and pki.client_key is not None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    creds = grpc.ssl_server_credentials([(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
                                        root_certificates=pki.ca_cert.read_bytes(), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        good = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", good) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with grpc.secure_channel(f"localhost:{port}", good) as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        no_client_cert = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", no_client_cert) as ch, pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)
