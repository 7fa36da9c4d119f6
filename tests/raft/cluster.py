"""Helpers for the Raft tests: free ports, member configs, in-process clusters, polling waits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from controlplane.cli.up import free_ports
from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.records import BreakerRecord
from controlplane.domain.state import snapshot
from controlplane.tls import make_raft_pki
from controlplane.runtime.lease_guard import LeaseGuard
from raft.node import RaftNode

T = TypeVar("T")
PASSWORD = "test-password-0123456789"

# Timings for tests on 2 shared cores: the production defaults scaled up ~2x so that GIL stalls of
# three in-process members do not cause spurious elections, while keeping failover quick.
TEST_TIMINGS: dict[str, Any] = dict(
    raft_min_timeout_ms=300,
    raft_max_timeout_ms=600,
    append_entries_period_ms=50,
    leader_fallback_timeout_ms=280,
    lease_duration_ms=1200,
    lease_renew_ms=200,
    lease_margin_ms=100,
    commit_timeout_ms=2000,
    step_down_timeout_ms=2000,
)


def member(i: int, raft_port: int, api_port: int) -> dict[str, str]:
    return {
        "node_id": f"coord-{i}",
        "zone": f"az-{i}",
        "raft_address": f"127.0.0.1:{raft_port}",
        "api_address": f"127.0.0.1:{api_port}",
    }


def cluster_configs(base: Path, n: int, extra: int = 0, **overrides: Any) -> list[dict[str, Any]]:
    """Config dicts for n members (+ ``extra`` spare ones that list all others as peers)."""
    total = n + extra
    ports = free_ports(2 * total)
    members = [member(i, ports[2 * i], ports[2 * i + 1]) for i in range(total)]
    pki = make_raft_pki(base / "raft-pki", [m["node_id"] for m in members])
    out = []
    for i in range(total):
        peers = [m for j, m in enumerate(members[: max(n, i + 1)]) if j != i]
        out.append({
            **members[i], "peers": peers, "data_dir": str(base / members[i]["node_id"]),
            "password": PASSWORD, "raft_tls": pki.tls_fields(members[i]["node_id"]), **TEST_TIMINGS, **overrides,
        })
    return out


def breaker_write(i: int) -> c.Command:
    """A small command that always applies: one breaker record per key."""
    return c.PutBreaker(key=f"w{i:06d}", record=BreakerRecord(failures=i % 1000))


class Member:
    def __init__(self, cfg: CoordinatorConfig, *, guard: bool = True, node_class: Any = None) -> None:
        self.cfg = cfg
        self.node = RaftNode(cfg, node_class=node_class)
        self.guard = LeaseGuard(self.node) if guard else None

    def start(self) -> None:
        self.node.start()
        if self.guard is not None:
            self.guard.start()

    def stop(self) -> None:
        if self.guard is not None:
            self.guard.stop()
        self.node.stop()

    def snap(self) -> dict[str, object]:
        return snapshot(self.node.state_copy())


@contextmanager
def running(members: list[Member]) -> Iterator[list[Member]]:
    try:
        for m in members:
            m.start()
        yield members
    finally:
        for m in members:
            m.stop()


def leader_of(members: list[Member]) -> Member | None:
    leaders = [m for m in members if m.node.running and m.node.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


def holder_of(members: list[Member]) -> Member | None:
    holders = [m for m in members if m.guard is not None and m.guard.authority(m.node.clock_ms()) is not None]
    return holders[0] if len(holders) == 1 else None
