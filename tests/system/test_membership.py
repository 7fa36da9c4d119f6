"""Membership changes with real coordinator processes: add a fourth, remove one of the first three;
the group keeps a lease holder and keeps committing throughout. The Admin calls carry the admin token
that the coordinators' ``admin_token_file`` registers (membership changes need an admin)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from controlplane.api.admin import Credentials, fetch_status
from controlplane.cli.up import free_ports, plan_group
from controlplane.tls import RaftPki, issue_coordinator_cert
from controlplane.tokens import new_token
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]


def start(config: Path, root: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(EXE + ["coordinator", "--config", str(config)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=open(root / f"{name}.log", "ab"))


TOKEN = new_token()[0]
CREDS = Credentials(token=TOKEN)


def status(endpoints: list[str]) -> list[dict]:
    return fetch_status(endpoints, 1.0, CREDS)


def holder(endpoints: list[str]):
    st = [s for s in status(endpoints) if s["reachable"]]
    return next((s for s in st if s["lease"]["remaining_ms"] > 0), None)


def test_add_a_fourth_member_and_remove_one_while_committing(tmp_path: Path) -> None:
    nodes, _ = plan_group(3, tmp_path)
    (tmp_path / "admin.token").write_text(TOKEN + "\n")
    for n in nodes:
        n.config.write_text(yaml.safe_dump(dict(yaml.safe_load(n.config.read_text()), admin_token_file=str(tmp_path / "admin.token"))))
    raft4, api4 = (f"127.0.0.1:{p}" for p in free_ports(2))
    base = yaml.safe_load(nodes[0].config.read_text())
    # the new member gets its own Raft certificate from the group's Raft CA (plan_group's pki/raft)
    raft_pki = RaftPki(tmp_path / "pki" / "raft", tmp_path / "pki" / "raft" / "raft-ca.pem",
                       tmp_path / "pki" / "raft" / "raft-ca-key.pem")
    issue_coordinator_cert(raft_pki, "coord-d")
    cfg4 = dict(base, node_id="coord-d", zone="az-d", raft_address=raft4, api_address=api4,
                data_dir=str(tmp_path / "coord-d"), raft_tls=raft_pki.tls_fields("coord-d"),
                peers=[{"node_id": n.node_id, "zone": n.zone, "raft_address": n.raft_address, "api_address": n.api_address}
                       for n in nodes])
    (tmp_path / "coord-d.yaml").write_text(yaml.safe_dump(cfg4))
    procs = {n.node_id: start(n.config, tmp_path, n.node_id) for n in nodes}
    try:
        first = [n.api_address for n in nodes]
        h = wait_until(lambda: holder(first), 20.0, "a lease holder", 0.1)
        procs["coord-d"] = start(tmp_path / "coord-d.yaml", tmp_path, "coord-d")
        # Any member's endpoint works: a follower points the CLI at the leader.
        follower = next(n.api_address for n in nodes if n.node_id != h["node_id"])
        res = subprocess.run(EXE + ["members", "add", "--endpoint", follower, "--node-id", "coord-d",
                                    "--raft-address", raft4, "--api-address", api4], check=False, capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, TENANTCTL_TOKEN=TOKEN))
        assert res.returncode == 0, res.stderr
        four = first + [api4]
        wait_until(lambda: all(
            s["reachable"] for s in status(four)) and status([api4])[0]["applied_index"] >= h["commit_index"],
            20.0, "coord-d to catch up", 0.1)
        # Remove a member that does not hold the lease, stop it, and check the group keeps going.
        gone = next(n for n in nodes if n.node_id != h["node_id"])
        res = subprocess.run(EXE + ["members", "remove", "--endpoint", h["api_address"], "--raft-address", gone.raft_address,
                                    "--token", TOKEN], check=False, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        procs[gone.node_id].send_signal(signal.SIGTERM)
        procs[gone.node_id].wait(10)
        rest = [a for a in four if a != gone.api_address]
        before = holder(rest)["commit_index"]
        after = wait_until(lambda: (x := holder(rest)) and x["commit_index"] > before + 5 and x, 20.0, "commits after the removal", 0.1)
        assert after["lease"]["holder"] in {"coord-a", "coord-b", "coord-c", "coord-d"}
        peers = {p["raft_address"] for p in status([after["api_address"]])[0]["peers"]}
        assert gone.raft_address not in peers and raft4 in peers | {after["raft_address"]}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
