"""A coordinator process: one Raft member, its lease guard, the control loop and the gRPC API.

This is the composition root for real processes (the simulator composes the same loop with
in-process parts). Threads (see ``docs/concurrency.md``): pysyncobj's tick thread (owned by
``RaftNode``), the lease guard, the control loop, and gRPC's worker pool.

Secrets: ``admin_token_file`` and ``adapter_token_file`` are read once at construction. The admin
token's hash is committed by the lease holder's bootstrap when no token with its id exists (so
revoking it through the API lasts only until the next epoch: rotate the file instead); the adapter
token travels on every call to the adapters. Neither is ever logged.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from adapters.client import RemoteAdapter, RemoteObservations
from controlplane.api.admin import FencedClusterStatus, NodeStatus, PeerStatus
from controlplane.api.server import ApiServer, serve
from controlplane.config import ConfigError, CoordinatorConfig, read_token_file
from controlplane.domain import commands as c
from controlplane.domain.instances import Transitioned
from controlplane.domain.errors import ControlPlaneError, TemporaryError
from controlplane.domain.ids import DeploymentId
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.tokens import Role, TokenRecord, parse_token
from controlplane.domain.topology import Cluster
from controlplane.fencing import FenceSigner
from controlplane.member import RaftMember, build_member
from controlplane.core.signals import FilteredSignals
from controlplane.runtime.clock import wall_ms
from controlplane.runtime.loop import ControlLoop
from controlplane.forecast.service import HistoryForecaster
from controlplane.runtime.forecast_metrics import ForecastMetrics
from controlplane.runtime.metrics import CoordinatorCollector, MetricsView
from controlplane.runtime.transitions import TransitionRecorder
from controlplane.specs import deployment_of, tenant_of
from controlplane.tokens import hash_secret
from raft.node import RaftNode
from raft.replicator import RaftReplicator

log = structlog.get_logger("controlplane.coordinator")

MIN_TICK_GAP_S = 0.02
TICK_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""``controlplane_tick_duration_seconds`` buckets: a tick is budgeted well under its 250 ms period."""
"""Least time between two ticks when observation batches wake the lease holder's loop."""


@dataclass(frozen=True, slots=True)
class Topology:
    """Clusters this group manages and where their adapters listen, and the tenants and deployments
    to create if missing (all from the configuration)."""

    clusters: tuple[Cluster, ...] = ()
    adapters: Mapping[str, str] | None = None
    tenants: tuple[Tenant, ...] = ()
    deployments: tuple[Deployment, ...] = ()


class Coordinator:
    def __init__(self, cfg: CoordinatorConfig, topology: Topology = Topology(), *, node_class=None,
                 member: RaftMember | None = None) -> None:
        """``member``: a Raft member already started by ``controlplane.member.launch`` (Raft first,
        then this half); without it one is built here and started by :meth:`start`."""
        self.cfg = cfg
        self.topology = topology
        self._member_started = member is not None
        member = member or build_member(cfg, node_class=node_class)
        self.node = member.node
        self.guard = member.guard
        self.api: ApiServer | None = None
        """Set by :meth:`start`. None until then: a member started by ``launch`` whose storage already
        failed calls ``_on_storage_failure`` at once, from ``add_fatal_listener`` below."""
        self.registry = CollectorRegistry()
        self.registry.register(CoordinatorCollector(self._metrics_view))
        self._tick_seconds = Histogram("controlplane_tick_duration_seconds", "One control-loop tick, I/O included.",
                                       buckets=TICK_BUCKETS_S, registry=self.registry)
        self._ticks = Counter("controlplane_ticks", "Control-loop ticks by outcome.", ["outcome"], registry=self.registry)
        self._metrics_server = None
        # --- Raft storage failure (corrupt journal/metadata/snapshot, full disk): see docs/reliability.md
        self._storage_failed = Gauge("controlplane_raft_storage_failed",
                                     "1 when this member stopped taking part in Raft because its storage failed.",
                                     ["kind"], registry=self.registry)
        self.node.add_fatal_listener(self._on_storage_failure)
        self.forecast_metrics = ForecastMetrics(self.registry)
        recorder = TransitionRecorder(self.registry)

        def on_transitions(records: Sequence[Transitioned]) -> None:
            recorder.record(records)
            self.forecast_metrics.transitions(records)

        self.replicator = RaftReplicator(self.node, cfg, fence=self.guard.fence, on_transitions=on_transitions)
        adapter_token = _token_from(cfg.adapter_token_file, "adapter_token_file")
        self._admin_token = _admin_record(cfg)
        adapter_tls = cfg.adapter_tls.client() if cfg.adapter_tls is not None else None
        self.adapter = RemoteAdapter(dict(topology.adapters or {}), token=adapter_token, tls=adapter_tls)
        self._wake = threading.Event()
        """Set by the observation streams when a batch shows pressure: the holder ticks at once."""
        self.observations = RemoteObservations(dict(topology.adapters or {}), wall_ms, token=adapter_token,
                                               tls=adapter_tls, on_pressure=self._wake.set)
        signer = FenceSigner.from_file(cfg.fence_key_file) if cfg.fence_key_file is not None else None
        self.loop = ControlLoop(
            self.replicator, self.adapter, self.observations, rng=random.Random(),
            authority=self._authority, holder=cfg.node_id, act_delay_s=cfg.fault_act_delay_ms / 1000, signer=signer,
            forecaster=HistoryForecaster(on_fallback=self.forecast_metrics.on_fallback,
                                         on_score=self.forecast_metrics.on_score),
        )
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._bootstrapped_epoch: int | None = None
        self._bad_adapters: dict[str, str] = {}
        """Cluster -> adapter address that could not be used (logged once per address)."""

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if not self._member_started:
            self.node.start()
            self.guard.start()
            self._member_started = True
        self.observations.start()  # every member follows the adapters: warm filters at failover
        self.api = serve(self.cfg, self.node, status=self.status, members=self, holder=_HolderView(self))
        if self.node.fatal_error():  # failed before the API existed (e.g. at load)
            self.api.set_stopped(self.node.fatal_error())
        if self.cfg.metrics_address is not None:
            host, port = self.cfg.metrics_address.rsplit(":", 1)
            self._metrics_server, _ = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        self._loop_thread = threading.Thread(target=self._run_loop, name=f"control-loop-{self.cfg.node_id}", daemon=True)
        self._loop_thread.start()
        log.info("coordinator_started", node_id=self.cfg.node_id, zone=self.cfg.zone,
                 raft=self.cfg.raft_address, api=self.cfg.api_address, pid=os.getpid())

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()  # the loop may be waiting for a batch
        if self._loop_thread is not None:
            self._loop_thread.join(5.0)
        if self.api is not None:
            self.api.stop(0.5)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.observations.close()
        self.adapter.close()
        self.guard.stop(release=True)
        self.node.stop()
        log.info("coordinator_stopped", node_id=self.cfg.node_id)

    def _on_storage_failure(self, kind: str, reason: str) -> None:
        """The Raft member stopped (RaftNode logged the one line): metric, health, API."""
        self._storage_failed.labels(kind).set(1)
        if self.api is not None:
            self.api.set_stopped(reason)

    # --- the control loop thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        """Tick every ``tick_ms``, and on the lease holder also as soon as an observation batch
        shows new pressure (a queue that grew, a jump in load, lifecycle reports), at most once per
        ``MIN_TICK_GAP_S``: a burst is acted on when it is seen, not up to a period later."""
        period_s = self.cfg.tick_ms / 1000
        next_at = time.monotonic()
        early = False
        while not self._stop.is_set():
            now_ms = wall_ms()
            self._wake.clear()
            last_tick = time.monotonic()
            outcome = "ok"
            try:
                self._bootstrap(now_ms)
                self._follow_adapters()
                report = self.loop.tick(now_ms)
                if report.plan is not None:
                    self.forecast_metrics.tick(report.plan.decisions, self.loop.last_signals, now_ms)
            except TemporaryError as exc:  # not leader any more, commit timed out...: next tick decides
                outcome = "skipped"
                log.info("tick_skipped", reason=type(exc).__name__, detail=str(exc))
            except ControlPlaneError as exc:
                outcome = "failed"
                log.error("tick_failed", error=str(exc))
            self._tick_seconds.observe(time.monotonic() - last_tick)
            self._ticks.labels(outcome).inc()
            if not early:  # an early tick keeps the periodic schedule where it was
                next_at = max(next_at + period_s, time.monotonic() - period_s)  # never catch up a backlog
            early = self._wait_for_next_tick(next_at, last_tick)

    def _wait_for_next_tick(self, next_at: float, last_tick: float) -> bool:
        """Wait for the periodic tick at ``next_at``; True when the holder is woken earlier by new
        pressure (and has waited out ``MIN_TICK_GAP_S`` since ``last_tick``)."""
        while not self._stop.is_set():
            left = next_at - time.monotonic()
            if left <= 0:
                return False
            if not self._wake.wait(left):
                return False  # the periodic tick is due
            self._wake.clear()
            if self._stop.is_set():
                return False
            if self._authority(wall_ms()) is not None:
                self._stop.wait(max(0.0, last_tick + MIN_TICK_GAP_S - time.monotonic()))
                return True  # the holder acts on the batch now
        return False

    def _authority(self, now_ms: int) -> int | None:
        """The lease epoch while this node may act. ``now_ms`` is the loop's wall clock; the lease
        itself is judged on this node's monotonic clock (a wall-clock step must not extend it)."""
        return self.guard.authority(self.node.clock_ms())

    def _bootstrap(self, now_ms: int) -> None:
        """Once per epoch, the holder creates the configured clusters, tenants and deployments that do
        not exist yet (the configuration seeds them; afterwards the API owns them, so a new epoch never
        reverts a capacity change, a cordon or a spec applied through it), and registers the admin
        token of ``admin_token_file`` when no token has its id."""
        epoch = self._authority(now_ms)
        if epoch is None or epoch == self._bootstrapped_epoch:
            return
        state = self.replicator.state
        cmds: list[c.Command] = [c.PutCluster(cl, c.MUST_NOT_EXIST, now_ms) for cl in self.topology.clusters
                                 if cl.id not in state.clusters]
        cmds += [c.PutTenant(t, c.MUST_NOT_EXIST, now_ms) for t in self.topology.tenants if t.id not in state.tenants]
        cmds += [c.PutDeployment(d, c.MUST_NOT_EXIST, now_ms) for d in self.topology.deployments
                 if d.id not in state.deployments]
        if self._admin_token is not None and self._admin_token.id not in getattr(state, "tokens", {}):
            cmds.append(c.PutToken(dataclasses.replace(self._admin_token, created_ms=now_ms)))
        if cmds:
            result = self.replicator.commit(cmds, now_ms)
            for r in result.results or (result,):
                if not r.ok and r.code != "already_exists":  # created through the API meanwhile: theirs
                    log.error("bootstrap_rejected", error=r.error)
        self._bootstrapped_epoch = epoch

    def _follow_adapters(self) -> None:
        """Reach and follow the adapter of every cluster in the replicated state: a cluster's own
        ``adapter_address`` (registered through the API) wins over the configuration's. Every member
        does this, so a new holder already streams from clusters registered after it started."""
        for cl in self.replicator.state.clusters.values():
            address = cl.adapter_address or (self.topology.adapters or {}).get(cl.id)
            if not address:
                continue
            try:
                self.adapter.ensure(cl.id, address)
                if self.observations.ensure(cl.id, address):
                    log.info("adapter_followed", cluster=cl.id, address=address)
            except ControlPlaneError as exc:  # one unusable address must not stop the loop for all
                if self._bad_adapters.get(cl.id) != address:
                    log.error("adapter_unusable", cluster=cl.id, address=address, error=str(exc))
                self._bad_adapters[cl.id] = address

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
    def _metrics_view(self) -> MetricsView:
        st = self.status()
        state = self.node.state_copy()
        ttft: dict[str, float] = {}
        unknown: dict[str, frozenset[str]] = {}
        if st.lease_remaining_ms > 0:  # only the acting holder filters live signals
            holder = _HolderView(self)
            for dep_id in state.deployments:
                sig = holder.signals_of(str(dep_id))
                value = getattr(sig, "ttft_p99_ms", None)
                if value is not None:
                    ttft[str(dep_id)] = value
                if isinstance(sig, FilteredSignals) and (sig.unknown or sig.partial):
                    unknown[str(dep_id)] = sig.unknown | sig.partial
        return MetricsView(
            node_id=st.node_id, zone=st.zone, raft_leader=st.role == "leader", term=st.term,
            commit_index=st.commit_index, applied_index=st.applied_index,
            peers=tuple((p.node_id, p.reachable) for p in st.peers), lease_holder=st.lease_remaining_ms > 0,
            lease_epoch=st.lease_epoch, lease_remaining_ms=st.lease_remaining_ms, state=state, ttft_p99_ms=ttft,
            fenced_clusters=frozenset(map(str, self.loop.fenced_out)), stale_answers=dict(self.loop.stale_answers),
            raft_transport=_transport_counters(self.node), load_unknown=unknown,
        )

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
            fenced_clusters=tuple(FencedClusterStatus(str(f.cluster_id), f.epoch, f.adapter_epoch, f.since_ms)
                                  for f in self.loop.fenced_out.values()),
        )


class _HolderView:
    """What the API asks the lease holder's control loop (``server.HolderView``)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._c = coordinator

    def holds_lease(self) -> bool:
        return self._c.guard.authority(self._c.node.clock_ms()) is not None

    def live_decision(self, deployment_id: str) -> object | None:
        return self._c.loop.live_decisions.get(DeploymentId(deployment_id))

    def signals_of(self, deployment_id: str) -> object | None:
        return self._c.loop.signals_of(DeploymentId(deployment_id))

    def adapter_links(self) -> dict[str, tuple[bool, int]] | None:
        """Per cluster the loop has heard from: (its adapter delivers now, since when)."""
        return {str(k): v for k, v in self._c.loop.adapter_links(wall_ms()).items()}


def _token_from(path: Path | None, field: str) -> str | None:
    if path is None:
        return None
    try:
        return read_token_file(path)
    except ValueError as exc:
        raise ConfigError(f"{field}: {exc}", field=field) from None


def _admin_record(cfg: CoordinatorConfig) -> TokenRecord | None:
    """The token record of ``admin_token_file`` (its id and the hash of its secret), or None."""
    token = _token_from(cfg.admin_token_file, "admin_token_file")
    parsed = parse_token(token) if token is not None else None
    if token is not None and parsed is None:
        raise ConfigError("admin_token_file: does not hold a token of the form cp_<id>_<secret>", field="admin_token_file")
    if parsed is None:
        return None
    token_id, secret = parsed
    return TokenRecord(token_id, hash_secret(secret), Role.ADMIN, "", 0, 0, "bootstrap")


def topology_of(cfg: CoordinatorConfig) -> Topology:
    """The configured clusters, adapters, tenants and deployments as domain values (the
    configuration was validated when loaded, so the conversions cannot fail here)."""
    clusters = tuple(Cluster(s.id, s.zone, s.region, dict(s.capacity)) for s in cfg.clusters)
    return Topology(
        clusters, {s.id: s.adapter_address for s in cfg.clusters if s.adapter_address},
        tuple(tenant_of(t) for t in cfg.tenants),
        tuple(deployment_of(d, f"deployments[{i}]") for i, d in enumerate(cfg.deployments)),
    )


def _transport_counters(node: RaftNode) -> dict[str, int]:
    stats = node.transport_stats()
    return {} if stats is None else stats.counters
