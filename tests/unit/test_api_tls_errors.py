"""Issue 18 point 7: TLS and CA mistakes named as such, in one line, with no gRPC C-core log line on
stderr: the real ``tenantctl`` in a subprocess against a real TLS API server (certificates from
``controlplane.tls.make_dev_pki``), and :func:`controlplane.api.tls_errors.reason` on the strings gRPC
really gives."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.api.server import serve
from controlplane.api.tls_errors import reason
from controlplane.config import CoordinatorConfig
from controlplane.tls import make_dev_pki
from tests.raft.cluster import cluster_configs
from tests.unit.test_admin_api import ADMIN, STATUS, StandInNode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    base = tmp_path_factory.mktemp("tlserr")
    pki, other = make_dev_pki(base / "pki"), make_dev_pki(base / "other")
    [raw] = cluster_configs(base, 1, api_tls={"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)})
    api = serve(CoordinatorConfig.model_validate(raw), StandInNode(), status=lambda: STATUS, address="127.0.0.1:0")
    try:
        yield f"127.0.0.1:{api.port}", Path(pki.ca_cert), Path(other.ca_cert)
    finally:
        api.stop(0.1)


def tenantctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(REPO)
    env["TENANTCTL_CONFIG"] = "/nonexistent/tenantctl.yaml"
    return subprocess.run([sys.executable, "-m", "controlplane.cli.tenantctl", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_a_wrong_ca_is_named_in_one_line(tls_server) -> None:
    endpoint, _, other = tls_server
    got = tenantctl("--endpoint", endpoint, "--ca-file", str(other), "--token", ADMIN, "whoami")
    assert got.returncode == 3
    assert got.stderr.count("\n") == 1, got.stderr
    assert (f"{endpoint}: TLS handshake failed: the server's certificate is not signed by the CA in ca_file "
            f"({other})") in got.stderr
    assert "ssl_transport_security" not in got.stderr and not got.stderr.rstrip().endswith(": OK")


def test_plaintext_against_the_tls_port_says_so(tls_server) -> None:
    endpoint, _, _ = tls_server
    got = tenantctl("--endpoint", endpoint, "--token", ADMIN, "whoami")
    assert got.returncode == 3 and got.stderr.count("\n") == 1, got.stderr
    assert f"{endpoint}: the endpoint speaks TLS; set ca_file" in got.stderr


def test_status_rows_stay_short_and_the_right_ca_works(tls_server) -> None:
    endpoint, ca, other = tls_server
    good = tenantctl("--endpoint", f"{endpoint},127.0.0.1:1", "--ca-file", str(ca), "--token", ADMIN, "status")
    assert good.returncode == 1 and good.stderr == ""
    lines = good.stdout.splitlines()
    assert lines[0].split()[:3] == ["ENDPOINT", "NODE", "PID"]
    assert lines[1].split()[:3] == [endpoint, STATUS.node_id, str(STATUS.pid)]
    assert lines[2].split() == ["127.0.0.1:1", "-", "unreachable", "(connection", "refused)"]
    assert all(ln == ln.rstrip() for ln in lines) and max(map(len, lines)) < 120
    bad = tenantctl("--endpoint", endpoint, "--ca-file", str(other), "--token", ADMIN, "status")
    assert bad.returncode == 3 and bad.stderr == ""
    assert "TLS handshake failed: the server's certificate is not signed by the CA" in bad.stdout


def test_controlplane_status_is_quiet_too(tls_server) -> None:
    endpoint, _, other = tls_server
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(REPO)
    got = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "status", "--endpoints", endpoint,
                          "--ca-file", str(other), "--token", ADMIN], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 1 and "ssl_transport_security" not in got.stderr, got.stderr
    assert "not signed by the CA in ca_file" in got.stdout


@pytest.mark.parametrize(("details", "tls", "want"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:40033: Tls handshake failed "
     "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
     "unable to get local issuer certificate: OK", True,
     "TLS handshake failed: the server's certificate is not signed by the CA in ca_file (/x/ca.pem)"),
    ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:40033: Socket closed", False,
     "the endpoint speaks TLS; set ca_file (or the endpoint is not a controlplane API)"),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:40083: Tls handshake failed "
     "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: "
     "Invalid certificate verification context: OK", True,
     "TLS handshake failed: the endpoint does not speak TLS (drop ca_file, or set insecure: true)"),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:40033: Custom verification check "
     "failed with error: UNAUTHENTICATED: Hostname Verification Check failed.", True,
     "TLS handshake failed: the server's certificate does not name nothere.example (set server_name to a name it has)"),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
     "Connection refused", False, "unreachable (connection refused)"),
    ("errors resolving nonexistent.invalid:7001: [field:hostname lookup error:address lookup failed for "
     "nonexistent.invalid:7001: Domain name not found]", False, "unreachable (cannot resolve the host name)"),
    ("Deadline Exceeded", False, "unreachable (no answer in time)"),
])
def test_reason(details: str, tls: bool, want: str) -> None:
    assert reason(details, "UNAVAILABLE", tls=tls, ca_file="/x/ca.pem" if tls else None,
                  server_name="nothere.example") == want
