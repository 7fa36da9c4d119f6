"""End to end, for real: three `controlplane coordinator` processes (Raft, lease, control loop) drive
one `controlplane adapter` process whose simulated backend runs engine instances in real time.

The adapter's scripted load is calm, then bursts (150 requests/s), then stops. The coordinators must
scale up from the observation stream, take new instances through Pending -> Warming -> Ready -> Busy,
and when the load is gone drain them (Draining -> Terminated) back to ``min_replicas``. The evidence
is the coordinators' ``instance_transition`` log events (JSON lines on stderr).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import yaml

from controlplane.cli.up import plan_group, stop_children
from tests.support.waiting import wait_listening

REPO = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "controlplane.cli.main"]
CALM_S, BURST_END_S = 8, 24
"""Load schedule of the adapter, seconds after it starts: 2 rps, then 150 rps, then nothing."""
DEADLINE_S = 110.0

POLICY = {
    "stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000, "panic_hold_ms": 3_000,
    "scale_down_stabilization_ms": 4_000, "scale_down_cooldown_ms": 1_000, "max_step_down": 4,
}


def transitions(root: Path, node_ids: list[str]) -> list[dict]:
    out = []
    for nid in node_ids:
        path = root / f"{nid}.log"
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"instance_transition"' in line:
                out.append(json.loads(line))
    out.sort(key=lambda e: e["timestamp"])
    return out


def paths(events: list[dict]) -> dict[str, list[str]]:
    by_instance: dict[str, list[str]] = defaultdict(list)
    for e in events:
        states = by_instance[e["instance_id"]]
        if not states:
            states.append(e["from"].lower())
        states.append(e["to"].lower())
    return by_instance


def is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


def test_a_burst_scales_a_simulated_cluster_up_and_the_calm_drains_it(tmp_path: Path) -> None:
    nodes, adapters = plan_group(3, tmp_path)
    cluster = adapters[0]
    for node in nodes:
        cfg = yaml.safe_load(node.config.read_text())
        cfg["clusters"] = [cluster]
        cfg["tenants"] = [{"id": "acme", "priority": 100, "quota": {"h100": 8}}]
        cfg["deployments"] = [{"id": "chat", "tenant": "acme", "engine": "vllm", "model": "llama3-8b-h100",
                               "pool": "h100", "min_replicas": 1, "max_replicas": 6, "warm_pool": 0, "policy": POLICY}]
        node.config.write_text(yaml.safe_dump(cfg))
    adapter_cfg = tmp_path / "adapter.yaml"
    adapter_cfg.write_text(yaml.safe_dump({
        "cluster_id": cluster["id"], "listen": cluster["adapter_address"], "state_dir": "adapter-state",
        "backend": "simulated",
        "simulated": {"seed": 3, "deployments": [{
            "deployment": "chat", "model": "llama3-8b-h100", "cold_start_ms": 1_500, "warm_start_ms": 300,
            "load": [{"at_s": 0, "rps": 2}, {"at_s": CALM_S, "rps": 150}, {"at_s": BURST_END_S, "rps": 0}],
        }]},
    }))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen(EXE + ["adapter", "--config", str(adapter_cfg)], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "adapter.log", "ab"))]
    # The adapter listens before the coordinators start (a readiness probe's job in a deployment): a
    # create sent while it is still starting fails, and the instance is rightly declared failed.
    wait_listening([cluster["adapter_address"]])
    procs += [subprocess.Popen(EXE + ["coordinator", "--config", str(n.config)], env=env, stdout=subprocess.DEVNULL,
                               stderr=open(tmp_path / f"{n.node_id}.log", "ab")) for n in nodes]
    node_ids = [n.node_id for n in nodes]
    started = time.monotonic()
    try:
        while True:
            assert all(p.poll() is None for p in procs), "a process exited; see the logs in " + str(tmp_path)
            events = transitions(tmp_path, node_ids)
            by_instance = paths(events)
            live = [i for i, states in by_instance.items() if states[-1] not in ("terminated", "failed")]
            full = [i for i, states in by_instance.items()
                    if is_subsequence(["pending", "warming", "ready", "busy", "draining", "terminated"], states)]
            if time.monotonic() - started > BURST_END_S and full and len(live) == 1:
                break
            assert time.monotonic() - started < DEADLINE_S, (
                f"no scale-up and drain back to min_replicas within {DEADLINE_S}s: {dict(by_instance)}")
            time.sleep(0.5)
    finally:
        stop_children(procs, grace_s=10.0)

    events = transitions(tmp_path, node_ids)
    by_instance = paths(events)
    assert len(by_instance) >= 3, f"the burst should have needed several instances: {dict(by_instance)}"
    assert not [i for i, s in by_instance.items() if "failed" in s], dict(by_instance)
    # Every transition event carries what an operator needs.
    for e in events:
        assert {"instance_id", "from", "to", "trigger", "latency_ms", "init_method", "level", "timestamp"} <= set(e)
    # Cold starts took about the simulated 1.5 s (+-10 %), measured by the coordinators.
    warmups = [e["latency_ms"] for e in events if (e["from"], e["to"]) == ("Warming", "Ready")]
    assert warmups and all(1_000 <= ms <= 4_000 for ms in warmups), warmups
    # The adapter saw the drains through: its log has no failed commands.
    adapter_log = (tmp_path / "adapter.log").read_text()
    assert '"command_failed"' not in adapter_log
