"""The processes of a chaos run on 127.0.0.1, and the faults applied to them.

:class:`ChaosCluster` starts N coordinators (``python -m controlplane.chaos.node coordinator``, the
real :class:`~controlplane.coordinator.Coordinator`) whose Raft links all go through a
:class:`~controlplane.chaos.proxy.Partitioner` (one fault-injecting proxy per link:
``raft_dial_overrides``), and M simulated adapters (``python -m controlplane.chaos.node adapter``).
Every child gets a pipe as stdin and exits when it closes, so nothing outlives the harness even if
the harness is killed; :meth:`ChaosCluster.close` SIGCONTs, SIGTERMs, then SIGKILLs what is left.
Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controlplane.chaos.node import read_json, write_atomic
from controlplane.chaos.proxy import Partitioner

TENANT = "chaos"
DEPLOYMENT = "chat"
MODEL = "llama3-8b-h100"
MIN_REPLICAS, MAX_REPLICAS = 1, 3
LOAD_RPS = {"low": 0.0, "high": 40.0}
"""Offered requests/s per adapter: ``low`` (none) decides ``min_replicas``, ``high`` (far beyond what
``max_replicas`` x ``target_concurrency`` serves) decides ``max_replicas``: the decision for the final
load is unambiguous, whatever the engines' request durations."""
POLICY = {
    "target_concurrency": 4.0, "stable_window_ms": 4_000, "ewma_half_life_ms": 500, "panic_window_ms": 1_000,
    "panic_hold_ms": 1_000, "scale_down_stabilization_ms": 2_000, "scale_down_cooldown_ms": 300, "max_step_down": 8,
}
COLD_START_MS, WARM_START_MS = 400, 200
MAX_QUEUE_MS = 5_000
"""``max_queue_ms`` of the simulated deployment on every chaos adapter: how long an offered request
waits at that adapter's gateway for an instance before it is dropped. Each adapter is its own
simulator with its own arrivals and gateway, which reaches only that cluster's instances: while the
deployment runs no instance on a cluster (all of them were placed on the other one), the requests
offered there can only time out, and until they do the control loop counts them as demand. With the
simulator's default (30 s, the settle wait) a ``high -> low`` run whose instances sat on one cluster
kept its demand, hence ``max_replicas``, for the whole settle wait (docs/reliability.md, "Convergence
failures beside CPU burners"). 5 s is still far above one tick, so the queue keeps driving ``high``
to ``max_replicas``."""
GPUS = 64
ACT_DELAY_MS = 150
"""``fault_act_delay_ms`` of every coordinator: a pause between a tick's lease check and its first
adapter call (a test-only knob, 0 in production). With ~250 ms ticks a SIGSTOP of the holder then
often lands between a check and a send, so the resumed process does send with its old epoch and the
adapters' fencing is exercised, not just present."""
STATUS_FRESH_S = 0.6
"""A status file older than this belongs to a process that is paused, dead or starving."""
CHILD = [sys.executable, "-m", "controlplane.chaos.node"]


@dataclass
class Proc:
    name: str
    kind: str  # coordinator | adapter
    config: Path
    directory: Path
    popen: subprocess.Popen | None = None
    paused: bool = False

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class ChaosCluster:
    def __init__(self, root: Path, nodes: int = 3, adapters: int = 2) -> None:
        from controlplane.cli.up import make_local_security, plan_group
        from controlplane.tokens import new_token

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        plans, clusters = plan_group(nodes, root)
        # Adapter channels as in production: mutual TLS with a certificate per coordinator, the
        # adapter token, and epochs signed with the group's fence key (the API stays loopback plaintext).
        security = make_local_security(root)
        self.plans = plans
        self.clusters = clusters[:adapters]
        self.token = new_token()[0]
        (root / "admin.token").write_text(self.token + "\n", encoding="utf-8")
        os.chmod(root / "admin.token", 0o600)
        self.net = Partitioner([p.raft_address for p in plans])
        self.net.start()
        self.coords: list[Proc] = []
        self.adapters: list[Proc] = []
        self.lease_ms = 1200
        self.drift_bound_ms = 12
        deployment = {"id": DEPLOYMENT, "tenant": TENANT, "engine": "vllm", "model": MODEL, "pool": "h100",
                      "min_replicas": MIN_REPLICAS, "max_replicas": MAX_REPLICAS, "warm_pool": 0, "policy": POLICY}
        for p in plans:
            cfg = yaml.safe_load(p.config.read_text(encoding="utf-8"))
            cfg["clusters"] = [dict(c, capacity={"h100": GPUS}) for c in self.clusters]
            cfg["tenants"] = [{"id": TENANT, "priority": 100, "quota": {"h100": GPUS * adapters}}]
            cfg["deployments"] = [deployment]
            cfg["admin_token_file"] = str(root / "admin.token")
            cfg["fault_act_delay_ms"] = ACT_DELAY_MS
            adapter_side = security.coordinator_fields(p.node_id)
            for key in ("adapter_token_file", "adapter_tls", "fence_key_file"):
                cfg[key] = adapter_side[key]
            cfg["raft_dial_overrides"] = {peer: f"127.0.0.1:{port}" for peer, port in self.net.mapping_for(p.raft_address).items()}
            p.config.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
            os.chmod(p.config, 0o600)
            self.lease_ms = int(cfg.get("lease_duration_ms", 1200))
            self.drift_bound_ms = int(float(cfg.get("drift_rho", 0.01)) * self.lease_ms)
            self.coords.append(Proc(p.node_id, "coordinator", p.config, root / "chaos" / p.node_id))
        for i, c in enumerate(self.clusters):
            path = root / f"{c['id']}.adapter.yaml"
            acfg = {"cluster_id": c["id"], "listen": c["adapter_address"], "state_dir": str(root / "adapters"),
                    "nvml": False, **security.adapter_fields(), "backend": "simulated",
                    "simulated": {"seed": 1000 + i, "deployments": [{
                        "deployment": DEPLOYMENT, "model": MODEL, "cold_start_ms": COLD_START_MS,
                        "warm_start_ms": WARM_START_MS, "max_queue_ms": MAX_QUEUE_MS,
                        "load": [{"at_s": 0, "rps": 0}]}]}}
            path.write_text(yaml.safe_dump(acfg, sort_keys=False), encoding="utf-8")
            self.adapters.append(Proc(c["id"], "adapter", path, root / "chaos" / c["id"]))
        for proc in self.coords + self.adapters:
            proc.directory.mkdir(parents=True, exist_ok=True)

    # --- processes ---------------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        return [p.api_address for p in self.plans]

    def start(self, proc: Proc) -> None:
        if proc.alive:
            return
        proc.paused = False
        log = open(proc.directory / "stderr.log", "ab")
        try:
            proc.popen = subprocess.Popen(CHILD + [proc.kind, str(proc.config), str(proc.directory)],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        finally:
            log.close()

    def start_all(self) -> None:
        from controlplane.cli.up import free_ports  # noqa: F401  (same module family; keeps imports light)

        for a in self.adapters:
            self.start(a)
        self.wait_listening([c["adapter_address"] for c in self.clusters], 60.0)
        for c in self.coords:
            self.start(c)

    @staticmethod
    def wait_listening(addresses: list[str], timeout_s: float) -> None:
        import socket

        deadline = time.monotonic() + timeout_s
        for addr in addresses:
            host, port = addr.rsplit(":", 1)
            while True:
                try:
                    socket.create_connection((host, int(port)), 0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{addr} is not listening after {timeout_s:.0f}s") from None
                    time.sleep(0.1)

    def kill(self, proc: Proc) -> None:
        if proc.alive:
            assert proc.popen is not None
            proc.popen.send_signal(signal.SIGKILL)
            proc.popen.wait(10)
        proc.paused = False

    def pause(self, proc: Proc) -> None:
        if proc.alive and not proc.paused:
            assert proc.popen is not None
            proc.popen.send_signal(signal.SIGSTOP)
            proc.paused = True

    def resume(self, proc: Proc) -> None:
        if proc.alive and proc.paused:
            assert proc.popen is not None
            proc.popen.send_signal(signal.SIGCONT)
        proc.paused = False

    def close(self) -> None:
        procs = [p for p in self.coords + self.adapters if p.popen is not None]
        for p in procs:
            if p.alive:
                assert p.popen is not None
                p.popen.send_signal(signal.SIGCONT)
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 6.0
        for p in procs:
            assert p.popen is not None
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(3)
            if p.popen.stdin is not None:
                p.popen.stdin.close()
        try:
            self.net.stop()
        except RuntimeError:
            pass

    # --- faults by files ----------------------------------------------------------------------------
    def set_fault(self, proc: Proc, **fields: Any) -> None:
        data = read_json(proc.directory / "fault.json", {})
        data.update(fields)
        write_atomic(proc.directory / "fault.json", data)

    def clear_faults(self) -> None:
        for c in self.coords:
            if read_json(c.directory / "fault.json", {}):
                write_atomic(c.directory / "fault.json", {})

    def set_load(self, level: str) -> None:
        for a in self.adapters:
            write_atomic(a.directory / "load.json", {DEPLOYMENT: LOAD_RPS[level]})

    def heal_all(self) -> None:
        self.net.heal()
        self.clear_faults()
        for p in self.coords + self.adapters:
            self.resume(p)
            if not p.alive:
                self.start(p)

    # --- status -------------------------------------------------------------------------------------
    def status(self, proc: Proc) -> dict[str, Any] | None:
        """The process's latest status, or None when it is stale (paused, dead, starving)."""
        st = read_json(proc.directory / "status.json", None)
        if not st or not proc.alive or proc.paused or time.monotonic() - float(st.get("t", 0)) > STATUS_FRESH_S:
            return None
        return st

    def holder(self) -> Proc | None:
        best = None
        for c in self.coords:
            st = self.status(c)
            if st and st.get("epoch") is not None and (best is None or st["epoch"] > best[0]):
                best = (st["epoch"], c)
        return best[1] if best else None

    def coord_by_index(self, i: int) -> Proc:
        return self.coords[i % len(self.coords)]

    def address(self, proc: Proc) -> str:
        return next(p.raft_address for p in self.plans if p.node_id == proc.name)

    def tenants(self, proc: Proc) -> tuple[int, list[str]]:
        data = read_json(proc.directory / "tenants.json", {})
        return int(data.get("applied", 0)), list(data.get("tenants", []))

    def serving(self) -> int | None:
        total = 0
        for a in self.adapters:
            st = self.status(a)
            if st is None:
                return None
            total += int(st.get("phases", {}).get(DEPLOYMENT, {}).get("serving", 0))
        return total

    def describe(self) -> str:
        return json.dumps({c.name: self.status(c) and {k: self.status(c).get(k) for k in ("epoch", "role", "applied", "desired")}
                           for c in self.coords})
