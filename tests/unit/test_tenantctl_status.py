"""Issue 18 point 7: ``tenantctl status`` with PID and ``-o wide``, every node asked at once with a
short deadline (a silent node costs well under a second, whatever --timeout says), error rows one
short line; nonsensical flags are usage errors. The real CLI against the real in-process coordinator."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.support.real_ctl import RealCtl, real_ctl


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCtl]:
    with real_ctl(tmp_path_factory.mktemp("status")) as g:
        yield g


@pytest.fixture()
def silent() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never says a word (a hung node)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def test_status_has_a_pid_column_and_wide_has_more(rc: RealCtl) -> None:
    code, out, err = rc.ctl("status")
    assert code == 0, err
    head, row = out.splitlines()
    assert head.split() == ["ENDPOINT", "NODE", "PID", "ZONE", "ROLE", "TERM", "LEADER", "LEASE", "APPLIED"]
    cells = row.split()
    assert cells[:3] == [rc.endpoint, rc.co.cfg.node_id, str(os.getpid())]  # the coordinator runs in this process
    code, out, err = rc.ctl("status", "-o", "wide")
    assert code == 0, err
    head, row = out.splitlines()
    assert head.split()[9:] == ["COMMIT", "LEASE-LEFT", "VERSION", "RAFT", "API", "PEERS"]
    cells = row.split()
    assert cells[12] == rc.co.cfg.raft_address and cells[13] == rc.co.cfg.api_address
    assert int(cells[10]) > 0  # this node holds the lease: validity left
    assert out == "\n".join(ln.rstrip() for ln in out.splitlines()) + "\n"  # no trailing spaces


def test_a_down_and_a_silent_node_cost_under_a_second_and_one_short_line(rc: RealCtl, silent: str) -> None:
    down = _closed_port()
    path = rc.base / "three.yaml"
    data = yaml.safe_load(rc.config.read_text())
    data["contexts"][0]["endpoints"] = [rc.endpoint, down, silent]
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    started = time.monotonic()
    code, out, err = rc.ctl("--timeout", "10", "status", config=path)
    took = time.monotonic() - started
    assert code == 1 and err == ""
    assert took < 5.0, f"status took {took:.1f} s"  # the 1 s per-node deadline, not --timeout 10 (slack for a busy machine)
    lines = out.splitlines()
    assert lines[2].split() == [down, "-", "unreachable", "(connection", "refused)"]
    assert lines[3].split() == [silent, "-", "unreachable", "(no", "answer", "in", "time)"]
    assert max(map(len, lines)) < 120
    code, out, _ = rc.ctl("status", "-o", "json", config=path)
    nodes = json.loads(out)
    assert [n["reachable"] for n in nodes] == [True, False, False]
    assert nodes[0]["pid"] == os.getpid() and nodes[1]["error"] == "unreachable (connection refused)"


@pytest.mark.parametrize("flags", [
    ("--timeout", "-1", "status"), ("--timeout", "0", "get", "tenants"), ("--timeout", "nan", "status"),
    ("--timeout", "inf", "status"), ("events", "--limit", "0"), ("events", "--since", "-3"),
    ("explain", "x", "--limit", "0"), ("delete", "tenant", "x", "--resource-version", "-1"),
])
def test_nonsensical_flags_are_usage_errors(rc: RealCtl, flags: tuple[str, ...]) -> None:
    code, out, err = rc.ctl(*flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tenantctl: error: --"), err


def test_controlplane_status_honours_tenantctl_config(rc: RealCtl, monkeypatch, capsys) -> None:
    from controlplane.cli.main import main

    monkeypatch.setenv("TENANTCTL_CONFIG", str(rc.config))
    monkeypatch.delenv("TENANTCTL_TOKEN", raising=False)
    assert main(["status", "--json"]) == 0
    [node] = json.loads(capsys.readouterr().out)
    assert node["endpoint"] == rc.endpoint and node["reachable"] and node["pid"] == os.getpid()
    assert main(["status"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(rc.endpoint) and f"pid {os.getpid()}" in line
    monkeypatch.setenv("TENANTCTL_CONFIG", str(rc.base / "missing.yaml"))
    assert main(["status"]) == 2
    assert "missing.yaml does not exist" in capsys.readouterr().err
    assert main(["status", "--timeout", "-1", "--endpoints", rc.endpoint]) == 2
