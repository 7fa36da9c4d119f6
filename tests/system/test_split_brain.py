"""Split brain, for real: three `controlplane coordinator` processes and three recording adapters
(`controlplane adapter`) on 127.0.0.1. The lease holder is paused (SIGSTOP) or cut off from its
peers (a fault-injecting TCP proxy per Raft link) while it can still reach the adapters. The
adapters' records are the evidence: they list every accepted fence and command and every rejected
(stale) attempt, in the order the adapter decided them.

Both tests widen the holder's check-to-send gap with ``fault_act_delay_ms`` (a pause between the
lease check and the first adapter call), so that the old holder really does send with its old epoch
after the new holder took over, and the adapters' epoch check is what stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from controlplane.api.admin import Credentials, fetch_status
from controlplane.cli.up import plan_group
from controlplane.tokens import new_token
from tests.support.faultproxy import Partitioner
from tests.support.waiting import wait_listening

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]
DEADLINE_S = 20.0


class Group:
    def __init__(self, root: Path, *, act_delay_ms: int) -> None:
        self.root = root
        self.nodes, self.adapters = plan_group(3, root)
        self.procs: dict[str, subprocess.Popen] = {}
        self.adapter_procs: list[subprocess.Popen] = []
        token = new_token()[0]  # Admin.Status needs a token: the coordinators register this one
        (root / "admin.token").write_text(token + "\n")
        self.creds = Credentials(token=token)
        for node in self.nodes:
            cfg = yaml.safe_load(node.config.read_text())
            cfg["fault_act_delay_ms"] = act_delay_ms
            cfg["admin_token_file"] = str(root / "admin.token")
            node.config.write_text(yaml.safe_dump(cfg))

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for a in self.adapters:
            self.adapter_procs.append(subprocess.Popen(
                EXE + ["adapter", "--cluster", a["id"], "--listen", a["adapter_address"], "--state-dir",
                       str(self.root / "adapters"), "--record", str(self.record(a["id"]))],
                env=env, stdout=subprocess.DEVNULL, stderr=open(self.root / f"{a['id']}.log", "ab")))
        # The adapters listen before the coordinators start, as a readiness probe would ensure: on a
        # busy machine an adapter still importing would otherwise miss the first holder's fences.
        wait_listening([a["adapter_address"] for a in self.adapters])
        for node in self.nodes:
            self.procs[node.node_id] = subprocess.Popen(
                EXE + ["coordinator", "--config", str(node.config)], env=env,
                stdout=subprocess.DEVNULL, stderr=open(self.root / f"{node.node_id}.log", "ab"))

    def stop(self) -> None:
        everything = list(self.procs.values()) + self.adapter_procs
        for p in everything:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in everything:
            try:
                p.wait(8)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3)

    def record(self, cluster: str) -> Path:
        return self.root / "adapters" / f"{cluster}.jsonl"

    def records(self) -> dict[str, list[dict]]:
        out = {}
        for a in self.adapters:
            path = self.record(a["id"])
            out[a["id"]] = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return out

    def status(self, node_ids=None) -> dict[str, dict]:
        nodes = [n for n in self.nodes if node_ids is None or n.node_id in node_ids]
        return {s["node_id"]: s for s in fetch_status([n.api_address for n in nodes], 1.0, self.creds) if s["reachable"]}

    def wait_holder(self, among=None, newer_than: int = 0) -> tuple[str, int]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            for nid, s in self.status(among).items():
                if s["lease"]["remaining_ms"] > 0 and s["lease"]["holder"] == nid and s["lease"]["epoch"] > newer_than:
                    return nid, s["lease"]["epoch"]
            time.sleep(0.1)
        raise AssertionError(f"no lease holder with an epoch above {newer_than} within {DEADLINE_S}s")

    def wait_adapters_fenced(self, epoch: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            recs = self.records()
            if all(any(r["accepted"] and r["epoch"] >= epoch for r in rs) for rs in recs.values()):
                return
            time.sleep(0.1)
        raise AssertionError(f"adapters did not all accept epoch {epoch}")


def check_no_stale_accepted(records: dict[str, list[dict]], old: tuple[str, int], new_epoch: int) -> int:
    """Per adapter, accepted epochs never go down, and nothing of the old epoch is accepted once the
    new one was. Returns how many attempts of the old holder were rejected."""
    rejected = 0
    for cluster, recs in records.items():
        highest = 0
        for r in recs:
            if r["accepted"]:
                assert r["epoch"] >= highest, f"{cluster}: accepted epoch {r['epoch']} after {highest}: {r}"
                highest = r["epoch"]
            elif (r["holder"], r["epoch"]) == old:
                rejected += 1
                assert highest >= new_epoch, f"{cluster}: rejected before the new epoch arrived?: {r}"
    return rejected


@pytest.fixture
def tmp_group(tmp_path: Path):
    groups: list[Group] = []
    yield groups
    for g in groups:
        g.stop()


def test_paused_holder_is_fenced_and_steps_down(tmp_path: Path, tmp_group) -> None:
    group = Group(tmp_path, act_delay_ms=1000)
    tmp_group.append(group)
    group.start()
    old, old_epoch = group.wait_holder()
    group.wait_adapters_fenced(old_epoch)
    # Pause the holder right after one of its fences: it is then inside its 1 s check-to-send gap,
    # holding a lease check it will act on when it resumes.
    seen = sum(len(v) for v in group.records().values())
    deadline = time.monotonic() + DEADLINE_S
    while sum(len(v) for v in group.records().values()) == seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    group.procs[old].send_signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    others = [n.node_id for n in group.nodes if n.node_id != old]
    new, new_epoch = group.wait_holder(among=others, newer_than=old_epoch)
    group.wait_adapters_fenced(new_epoch)
    time.sleep(max(0.0, 3.0 - (time.monotonic() - paused_at)))  # paused well beyond the lease
    group.procs[old].send_signal(signal.SIGCONT)
    time.sleep(3.0)
    rejected = check_no_stale_accepted(group.records(), (old, old_epoch), new_epoch)
    assert rejected >= 1, "the resumed holder never tried its old epoch: the test did not test fencing"
    st = group.status([old])[old]
    assert st["lease"]["remaining_ms"] == 0 and st["role"] != "leader"
    assert group.status()[new]["lease"]["holder"] == new


def test_holder_cut_off_from_its_peers_is_fenced_and_after_healing_one_leader_remains(tmp_path: Path, tmp_group) -> None:
    group = Group(tmp_path, act_delay_ms=600)
    addrs = [n.raft_address for n in group.nodes]
    with Partitioner(addrs) as net:
        for node in group.nodes:
            cfg = yaml.safe_load(node.config.read_text())
            cfg["raft_dial_overrides"] = {p: f"127.0.0.1:{port}" for p, port in net.mapping_for(node.raft_address).items()}
            node.config.write_text(yaml.safe_dump(cfg))
        tmp_group.append(group)
        group.start()
        old, old_epoch = group.wait_holder()
        group.wait_adapters_fenced(old_epoch)
        before = group.status()
        committed = max(s["commit_index"] for s in before.values())
        old_addr = next(n.raft_address for n in group.nodes if n.node_id == old)
        net.cut_off(old_addr)
        others = [n.node_id for n in group.nodes if n.node_id != old]
        new, new_epoch = group.wait_holder(among=others, newer_than=old_epoch)
        group.wait_adapters_fenced(new_epoch)
        time.sleep(2.0)  # the isolated node keeps running (and may try to act) during the cut
        net.heal()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            st = group.status()
            leaders = {s["node_id"] for s in st.values() if s["role"] == "leader"}
            holders = {s["node_id"] for s in st.values() if s["lease"]["remaining_ms"] > 0}
            applied = [s["applied_index"] for s in st.values()]
            if len(st) == 3 and len(leaders) == 1 and len(holders) <= 1 and min(applied) >= committed:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"after healing: {group.status()}")
        assert min(s["applied_index"] for s in st.values()) >= committed  # nothing committed was lost
        check_no_stale_accepted(group.records(), (old, old_epoch), new_epoch)
