"""`controlplane up` and `controlplane status` as an operator runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXE = [sys.executable, "-m", "controlplane.cli.main"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_prints_endpoints_status_shows_one_lease_holder_and_sigterm_stops_everything(tmp_path: Path) -> None:
    up = subprocess.Popen(EXE + ["up", "--nodes", "3", "--json", "--dir", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listing = json.loads(up.stdout.readline())
        endpoints = ",".join(n["api_address"] for n in listing["nodes"])
        assert [n["zone"] for n in listing["nodes"]] == ["az-a", "az-b", "az-c"]
        deadline = time.monotonic() + 20
        while True:
            res = subprocess.run(EXE + ["status", "--endpoints", endpoints, "--json"], capture_output=True, text=True, timeout=20)
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
        text = subprocess.run(EXE + ["status", "--endpoints", endpoints], capture_output=True, text=True, timeout=20)
        assert f"lease {holder['node_id']}@{holder['lease']['epoch']}" in text.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(20)
    assert up.returncode == 0, up.stderr.read()
    assert not any(alive(n["pid"]) for n in listing["nodes"])


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
