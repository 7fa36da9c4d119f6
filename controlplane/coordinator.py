"""A coordinator process: one Raft member, its lease guard, the control loop and the gRPC API.

This is the composition root for real processes (the simulator composes the same loop with
in-process parts). Threads (see ``docs/concurrency.md``): pysyncobj's tick thread (owned by
``RaftNode``), the lease guard, the control loop, and gRPC's worker pool.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from adapters.client import RemoteAdapter, RemoteObservations
from controlplane.api.admin import ApiServer, NodeStatus, PeerStatus, serve
from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.errors import ControlPlaneError, TemporaryError
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.topology import Cluster
from controlplane.runtime.clock import wall_ms
from controlplane.runtime.lease_guard import LeaseGuard
from controlplane.runtime.loop import ControlLoop
from controlplane.runtime.transitions import TransitionRecorder
from controlplane.specs import deployment_of, tenant_of
from raft.node import RaftNode, dial_override_node_class
from raft.replicator import RaftReplicator

log = structlog.get_logger("controlplane.coordinator")


@dataclass(frozen=True, slots=True)
class Topology:
    """Clusters this group manages and where their adapters listen, and the tenants and deployments
    to create if missing (all from the configuration)."""

    clusters: tuple[Cluster, ...] = ()
    adapters: Mapping[str, str] | None = None
    tenants: tuple[Tenant, ...] = ()
    deployments: tuple[Deployment, ...] = ()


class Coordinator:
    def __init__(self, cfg: CoordinatorConfig, topology: Topology = Topology(), *, node_class=None) -> None:
        self.cfg = cfg
        self.topology = topology
        if node_class is None and cfg.raft_dial_overrides:
            node_class = dial_override_node_class(dict(cfg.raft_dial_overrides))
        self.node = RaftNode(cfg, node_class=node_class)
        self.guard = LeaseGuard(self.node, cfg)
        self.registry = CollectorRegistry()
        self.replicator = RaftReplicator(self.node, cfg, fence=self.guard.fence,
                                         on_transitions=TransitionRecorder(self.registry).record)
        self.adapter = RemoteAdapter(dict(topology.adapters or {}))
        self.observations = RemoteObservations(dict(topology.adapters or {}), wall_ms)
        self.loop = ControlLoop(
            self.replicator, self.adapter, self.observations, rng=random.Random(),
            authority=self._authority, holder=cfg.node_id, act_delay_s=cfg.fault_act_delay_ms / 1000,
        )
        self.api: ApiServer | None = None
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._bootstrapped_epoch: int | None = None

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.node.start()
        self.guard.start()
        self.observations.start()  # every member follows the adapters: warm filters at failover
        self.api = serve(self.cfg.api_address, self.status, members=self)
        self._loop_thread = threading.Thread(target=self._run_loop, name=f"control-loop-{self.cfg.node_id}", daemon=True)
        self._loop_thread.start()
        log.info("coordinator_started", node_id=self.cfg.node_id, zone=self.cfg.zone,
                 raft=self.cfg.raft_address, api=self.cfg.api_address, pid=os.getpid())

    def stop(self) -> None:
        self._stop.set()
        if self._loop_thread is not None:
            self._loop_thread.join(5.0)
        if self.api is not None:
            self.api.stop(0.5)
        self.observations.close()
        self.adapter.close()
        self.guard.stop(release=True)
        self.node.stop()
        log.info("coordinator_stopped", node_id=self.cfg.node_id)

    # --- the control loop thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        period_s = self.cfg.tick_ms / 1000
        next_at = time.monotonic()
        while not self._stop.is_set():
            now_ms = wall_ms()
            try:
                self._bootstrap(now_ms)
                self.loop.tick(now_ms)
            except TemporaryError as exc:  # not leader any more, commit timed out...: next tick decides
                log.info("tick_skipped", reason=type(exc).__name__, detail=str(exc))
            except ControlPlaneError as exc:
                log.error("tick_failed", error=str(exc))
            next_at += period_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - period_s)  # never try to catch up a backlog

    def _authority(self, now_ms: int) -> int | None:
        """The lease epoch while this node may act. ``now_ms`` is the loop's wall clock; the lease
        itself is judged on this node's monotonic clock (a wall-clock step must not extend it)."""
        return self.guard.authority(self.node.clock_ms())

    def _bootstrap(self, now_ms: int) -> None:
        """Once per epoch, the holder upserts the configured clusters (idempotent PutCluster) and
        creates the configured tenants and deployments that do not exist yet (never overwriting
        what the API may have changed since)."""
        epoch = self._authority(now_ms)
        if epoch is None or epoch == self._bootstrapped_epoch:
            return
        state = self.replicator.state
        cmds: list[c.Command] = [c.PutCluster(cl) for cl in self.topology.clusters if state.clusters.get(cl.id) != cl]
        cmds += [c.PutTenant(t) for t in self.topology.tenants if t.id not in state.tenants]
        cmds += [c.PutDeployment(d) for d in self.topology.deployments if d.id not in state.deployments]
        if cmds:
            result = self.replicator.commit(cmds, now_ms)
            for r in result.results or (result,):
                if not r.ok:
                    log.error("bootstrap_rejected", error=r.error)
        self._bootstrapped_epoch = epoch

    # --- membership (Admin.AddMember / RemoveMember) ----------------------------------------------
    def add_member(self, node_id: str, raft_address: str, api_address: str) -> int:
        self.node.add_member(raft_address, node_id=node_id, api_address=api_address)
        log.info("member_added", node_id=node_id, raft_address=raft_address)
        return self.node.status().commit_index

    def remove_member(self, raft_address: str) -> int:
        self.node.remove_member(raft_address)
        log.info("member_removed", raft_address=raft_address)
        return self.node.status().commit_index

    # --- status ----------------------------------------------------------------------------------
    def status(self) -> NodeStatus:
        raft = self.node.status()
        lease = self.guard.statistics()
        now = self.node.clock_ms()
        holding = lease.epoch is not None and self.guard.authority(now) is not None
        rec, _ = self.node.lease_view()
        members = {m.node_id: m for m in self.cfg.members()}
        peers = tuple(
            PeerStatus(pid, members[pid].zone if pid in members else "", members[pid].raft_address if pid in members else pid,
                       members[pid].api_address if pid in members else "", reachable)
            for pid, reachable in raft.peers
        )
        return NodeStatus(
            node_id=self.cfg.node_id, zone=self.cfg.zone, role=raft.role, term=raft.term,
            leader_id=raft.leader_id or "", lease_holder=rec.holder, lease_epoch=rec.epoch,
            lease_remaining_ms=max(0, lease.valid_until_ms - now) if holding else 0,
            commit_index=raft.commit_index, applied_index=raft.applied_index,
            raft_address=self.cfg.raft_address, api_address=self.cfg.api_address, peers=peers,
        )


def topology_of(cfg: CoordinatorConfig) -> Topology:
    """The configured clusters, adapters, tenants and deployments as domain values (the
    configuration was validated when loaded, so the conversions cannot fail here)."""
    clusters = tuple(Cluster(s.id, s.zone, s.region, dict(s.capacity)) for s in cfg.clusters)
    return Topology(
        clusters, {s.id: s.adapter_address for s in cfg.clusters if s.adapter_address},
        tuple(tenant_of(t) for t in cfg.tenants),
        tuple(deployment_of(d, f"deployments[{i}]") for i, d in enumerate(cfg.deployments)),
    )
