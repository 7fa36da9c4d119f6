"""`controlplane up` and `controlplane status` as an operator runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.support.waiting import alive, wait_until

EXE = [sys.executable, "-m", "controlplane.cli.main"]


def test_up_prints_endpoints_status_shows_one_lease_holder_and_sigterm_stops_everything(tmp_path: Path) -> None:
    up = subprocess.Popen(EXE + ["up", "--nodes", "3", "--json", "--dir", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listing = json.loads(up.stdout.readline())
        endpoints = ",".join(n["api_address"] for n in listing["nodes"])
        assert [n["zone"] for n in listing["nodes"]] == ["az-a", "az-b", "az-c"]
        # The API is TLS with the CA `up` generated; the admin token travels in the environment.
        auth = ["--ca-file", listing["ca_file"]]
        env = dict(os.environ, TENANTCTL_TOKEN=Path(listing["admin_token_file"]).read_text().strip())
        deadline = time.monotonic() + 20
        while True:
            res = subprocess.run(EXE + ["status", "--endpoints", endpoints, "--json", *auth], capture_output=True, text=True,
                                 timeout=20, env=env)
            nodes = json.loads(res.stdout)
            holders = [n for n in nodes if n.get("reachable") and n["lease"]["remaining_ms"] > 0]
            if res.returncode == 0 and len(holders) == 1:
                break
            assert time.monotonic() < deadline, res.stdout + res.stderr
            time.sleep(0.2)
        holder = holders[0]
        assert all(n["lease"]["holder"] == holder["node_id"] for n in nodes)
        assert {n["pid"] for n in nodes} == {n["pid"] for n in listing["nodes"]}
        assert all(p["reachable"] for n in nodes for p in n["peers"])
        assert (tmp_path / "coord-a.yaml").stat().st_mode & 0o077 == 0  # holds the Raft password
        text = subprocess.run(EXE + ["status", "--endpoints", endpoints, *auth], capture_output=True, text=True, timeout=20,
                              env=env)
        assert f"lease {holder['node_id']}@{holder['lease']['epoch']}" in text.stdout
        check_up_security(tmp_path, listing)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(20)
    assert up.returncode == 0, up.stderr.read()
    assert not any(alive(n["pid"]) for n in listing["nodes"] + listing["adapters"])
    assert (tmp_path / "admin.token").read_text().strip() not in json.dumps(listing)  # never printed


def check_up_security(root: Path, listing: dict) -> None:
    """`up` wrote a tenantctl config (context local, TLS CA, admin token; 0600), runs simulated
    adapters that demand a token, and its coordinators reach them with it."""
    config = Path(listing["tenantctl_config"])
    assert config == root / "tenantctl.yaml" and config.stat().st_mode & 0o077 == 0
    ctx = yaml.safe_load(config.read_text())["contexts"][0]
    assert ctx["name"] == "local" and ctx["endpoints"] == [n["api_address"] for n in listing["nodes"]]
    assert ctx["ca_file"] == listing["ca_file"] and Path(ctx["ca_file"]).read_bytes().startswith(b"-----BEGIN CERTIFICATE")
    assert ctx["token"] == Path(listing["admin_token_file"]).read_text().strip()
    for a in listing["adapters"]:
        adapter_cfg = yaml.safe_load(Path(a["config"]).read_text())
        assert adapter_cfg["backend"] == "simulated" and adapter_cfg["auth_token_file"]
    logs = [root / f"{n['node_id']}.log" for n in listing["nodes"]]
    wait_until(lambda: all(p.read_text().count('"observe_connected"') >= len(listing["adapters"]) for p in logs),
               20.0, "every coordinator to stream from every adapter", 0.2)
    for a in listing["adapters"]:
        log = (root / f"{a['id']}.log").read_text()
        assert '"authenticated": true' in log and '"call_unauthenticated"' not in log
        # Mutual TLS (coordinator certificates only) and signed epochs: no loopback-dev warning.
        assert '"mutual_tls": true' in log and '"fence_keys": ["' in log and '"level": "warning"' not in log
        assert '"call_not_from_coordinator"' not in log and '"fence_refused"' not in log


def test_status_of_an_unreachable_endpoint_exits_non_zero() -> None:
    res = subprocess.run(EXE + ["status", "--endpoints", "127.0.0.1:1", "--timeout", "0.5"], capture_output=True, text=True, timeout=20)
    assert res.returncode == 1 and "unreachable" in res.stdout and "Traceback" not in res.stderr


def test_bad_coordinator_config_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("node_id: a\nzone: az-a\nraft_address: 127.0.0.1:7001\napi_address: 127.0.0.1:7101\n"
                   f"data_dir: {tmp_path / 'd'}\n")
    res = subprocess.run(EXE + ["coordinator", "--config", str(cfg)], capture_output=True, text=True, timeout=20)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "password" in res.stderr
