"""``controlplane health`` (the coordinators' probe) against real gRPC servers started in-process:
the coordinator API over TLS and mutual TLS (configuration from a file, as the probe reads it),
and an adapter over plaintext."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adapters.service import SERVICE_NAME, RecordingBackend, serve_adapter
from controlplane.api.server import serve
from controlplane.cli.main import main
from controlplane.cli.up import free_ports
from controlplane.config import load_config
from controlplane.tls import make_dev_pki
from tests.support.raft_pki import raft_tls
from tests.unit.test_admin_api import STATUS, StandInNode


@pytest.fixture(autouse=True)
def _no_controlplane_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("CONTROLPLANE_"):
            monkeypatch.delenv(key)


def coordinator_config(tmp_path: Path, *, mutual: bool) -> tuple[Path, object]:
    pki = make_dev_pki(tmp_path / "pki", client=mutual)
    raft, api = free_ports(2)
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "ca_file": str(pki.ca_cert)}
    if mutual:
        tls["client_ca_file"] = str(pki.ca_cert)
    path = tmp_path / "coordinator.yaml"
    path.write_text(yaml.safe_dump({
        "node_id": "coordinator-0", "zone": "az-a", "raft_address": f"127.0.0.1:{raft}",
        "api_address": f"127.0.0.1:{api}", "data_dir": str(tmp_path / "data"),
        "password": "0123456789abcdef", "api_tls": tls, "raft_tls": raft_tls(tmp_path, "coordinator-0")}),
        encoding="utf-8")
    return path, pki


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["health", *args])
    out = capsys.readouterr()
    return rc, out.out.strip(), out.err.strip()


@pytest.mark.parametrize("mutual", [False, True])
def test_a_serving_coordinator_over_tls_passes_the_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         mutual: bool) -> None:
    path, pki = coordinator_config(tmp_path, mutual=mutual)
    cfg = load_config(path, env={})
    api = serve(cfg, StandInNode(), status=lambda: STATUS)
    capsys.readouterr()  # the server's own log lines
    try:
        rc, out, err = run(capsys, "--config", str(path), "--timeout", "10")
        assert (rc, out, err) == (0, f"{cfg.api_address}: SERVING", "")
        if not mutual:
            rc, out, _ = run(capsys, "--endpoint", cfg.api_address, "--ca-file", str(pki.ca_cert), "--timeout", "10")
            assert (rc, out) == (0, f"{cfg.api_address}: SERVING")
        api.set_serving(False)
        rc, out, err = run(capsys, "--config", str(path), "--timeout", "10")
        assert (rc, out) == (1, "")
        assert err == f"controlplane health: {cfg.api_address}: NOT_SERVING"
    finally:
        api.stop(0.1)
    capsys.readouterr()
    rc, out, err = run(capsys, "--config", str(path), "--timeout", "2")
    assert rc == 1 and out == ""
    assert err.startswith(f"controlplane health: {cfg.api_address}: UNAVAILABLE: ") and "\n" not in err


def test_the_wrong_ca_or_plaintext_does_not_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = coordinator_config(tmp_path, mutual=False)
    cfg = load_config(path, env={})
    other = make_dev_pki(tmp_path / "other")
    api = serve(cfg, StandInNode(), status=lambda: STATUS)
    capsys.readouterr()  # the server's own log lines
    try:
        rc, _, err = run(capsys, "--endpoint", cfg.api_address, "--ca-file", str(other.ca_cert), "--timeout", "3")
        assert rc == 1 and "UNAVAILABLE" in err
        rc, _, err = run(capsys, "--endpoint", cfg.api_address, "--timeout", "3")  # plaintext to a TLS port
        assert rc == 1 and "UNAVAILABLE" in err
        rc, _, err = run(capsys, "--endpoint", cfg.api_address, "--ca-file", str(tmp_path / "pki" / "ca.pem"),
                         "--server-name", "somebody-else.example", "--timeout", "3")
        assert rc == 1 and "UNAVAILABLE" in err
    finally:
        api.stop(0.1)


def test_an_adapter_in_plaintext_and_its_named_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = serve_adapter("gpu-a", "127.0.0.1:0", tmp_path / "state", RecordingBackend(tmp_path / "rec.jsonl"),
                           observe=False)
    endpoint = f"127.0.0.1:{server.port}"
    capsys.readouterr()  # the server's own log lines
    try:
        assert run(capsys, "--endpoint", endpoint, "--timeout", "10")[:2] == (0, f"{endpoint}: SERVING")
        rc, out, _ = run(capsys, "--endpoint", endpoint, "--service", SERVICE_NAME, "--timeout", "10")
        assert (rc, out) == (0, f"{endpoint} {SERVICE_NAME!r}: SERVING")
        rc, _, err = run(capsys, "--endpoint", endpoint, "--service", "no.such.Service", "--timeout", "10")
        assert rc == 1 and err == f"controlplane health: {endpoint} 'no.such.Service': NOT_FOUND"
    finally:
        server.stop(0.1)


def test_nothing_listening_is_a_clear_one_line_failure(capsys: pytest.CaptureFixture[str]) -> None:
    [port] = free_ports(1)
    rc, out, err = run(capsys, "--endpoint", f"127.0.0.1:{port}", "--timeout", "2")
    assert rc == 1 and out == ""
    assert err.startswith(f"controlplane health: 127.0.0.1:{port}: UNAVAILABLE: ") and "\n" not in err


def test_usage_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, pki = coordinator_config(tmp_path, mutual=False)
    rc, _, err = run(capsys, "--config", str(path), "--ca-file", str(pki.ca_cert))
    assert rc == 2 and err == "controlplane: error: health: --ca-file cannot be combined with --config (api_tls says it)"
    rc, _, err = run(capsys, "--config", str(tmp_path / "missing.yaml"))
    assert rc == 2 and "missing.yaml: cannot read the configuration" in err
    rc, _, err = run(capsys, "--endpoint", "127.0.0.1:1", "--cert-file", str(pki.server_cert))
    assert rc == 2 and "--cert-file and --key-file go together" in err
    rc, _, err = run(capsys, "--endpoint", "127.0.0.1:1", "--timeout", "0")
    assert rc == 2 and "--timeout must be > 0" in err
    with pytest.raises(SystemExit) as exc:
        main(["health"])
    assert exc.value.code == 2
