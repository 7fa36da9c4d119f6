"""Prometheus metrics of one coordinator (``metrics_address`` in its configuration; docs/operations.md).

What a platform team alerts on, from the replica this coordinator holds (every member exports the
replicated part, so a scrape of any member shows the fleet) plus what only this process knows:

==========================================================  =======================================================
``controlplane_info{node_id,zone,version}``                 1
``controlplane_raft_leader``                                1 on the Raft leader
``controlplane_raft_term`` / ``_commit_index`` / ``_applied_index``
``controlplane_raft_peer_reachable{peer}``                  1 while the Raft link to ``peer`` is up
``controlplane_lease_holder``                               1 while this node holds the lease *and may act*
``controlplane_lease_epoch``                                the replicated lease epoch (``changes()`` = flapping)
``controlplane_lease_remaining_seconds``                    how long this holder may still act (0 elsewhere)
``controlplane_deployment_desired_replicas{tenant,deployment}``
``controlplane_instances{tenant,deployment,zone,state}``    instances by lifecycle state
``controlplane_breaker_open{breaker}``                      1 while a breaker is open or half-open
``controlplane_breaker_trips{breaker}``                     consecutive trips (the backoff exponent)
``controlplane_deployment_slo_ttft_p99_seconds{tenant,deployment}``  the tenant's TTFT SLO
``controlplane_deployment_ttft_p99_seconds{tenant,deployment}``      observed TTFT p99 (lease holder only:
                                                            only it filters live signals)
``controlplane_deployment_load_unknown{tenant,deployment,signal}``  1 while a load signal is unknown for
                                                            some serving instance: its scale-downs are held
                                                            (lease holder only; docs/adapters.md, "Unknown is not zero")
``controlplane_adapter_stale_epoch{cluster}``               1 while this holder sends the cluster's adapter nothing
                                                            because it holds a higher epoch (alert on it: docs/lease.md)
``controlplane_adapter_stale_epoch_answers_total{cluster}`` stale-epoch answers from that adapter (this process)
``controlplane_tick_duration_seconds`` (histogram)          one control-loop tick, I/O included
``controlplane_ticks_total{outcome}``                       ``ok`` / ``skipped`` (not leader, timeout) / ``failed``
``controlplane_instance_transitions_total{...}``            (:mod:`controlplane.runtime.transitions`)
``controlplane_instance_start_seconds{tier}`` (histogram)   start transition to Ready by start tier (same module)
``controlplane_raft_transport_events_total{event}``         Raft transport refusals/timeouts/caps/EMFILE back-offs
==========================================================  =======================================================

:func:`families` is a pure function of a :class:`MetricsView` (tested without processes);
:class:`CoordinatorCollector` builds the view at scrape time. The endpoint is plain HTTP without
authentication (what Prometheus scrapes); it names tenants and deployments, so bind it to a
loopback or pod address that only the monitoring system reaches (the manifests' NetworkPolicy).

The ``deployment`` label is the deployment id: ``<tenant>/<name>`` for one created through the API
(names are per tenant; a label value may hold '/'), the configured or legacy id (one label) otherwise.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane import __version__
from controlplane.domain.records import BreakerPhase
from controlplane.domain.state import ControlState


@dataclass(frozen=True)
class MetricsView:
    """Everything one scrape reports (values, no live objects)."""

    node_id: str
    zone: str
    raft_leader: bool
    term: int
    commit_index: int
    applied_index: int
    peers: tuple[tuple[str, bool], ...]
    lease_holder: bool
    lease_epoch: int
    lease_remaining_ms: int
    state: ControlState
    ttft_p99_ms: Mapping[str, float] = field(default_factory=dict)
    """Observed TTFT p99 per deployment (only on the lease holder)."""
    fenced_clusters: frozenset[str] = frozenset()
    """Clusters whose adapter holds a higher epoch than this holder's (the loop sends them nothing)."""
    stale_answers: Mapping[str, int] = field(default_factory=dict)
    """Cluster -> stale-epoch answers its adapter gave this process."""
    raft_transport: Mapping[str, int] = field(default_factory=dict)
    """The Raft transport's counters (raft/transport.py ``COUNTERS``): refusals, timeouts, caps, EMFILE."""
    load_unknown: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Deployment -> load signals unknown or partly known at the last tick (only on the lease holder)."""


def _gauge(name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    if labels:
        return GaugeMetricFamily(name, doc, labels=list(labels))
    return GaugeMetricFamily(name, doc, value=value)


def families(v: MetricsView) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The metric families of one scrape."""
    info = _gauge("controlplane_info", "This coordinator (value 1).", labels=("node_id", "zone", "version"))
    info.add_metric([v.node_id, v.zone, __version__], 1)
    yield info
    yield _gauge("controlplane_raft_leader", "1 on the Raft leader.", float(v.raft_leader))
    yield _gauge("controlplane_raft_term", "Raft term.", v.term)
    yield _gauge("controlplane_raft_commit_index", "Raft commit index.", v.commit_index)
    yield _gauge("controlplane_raft_applied_index", "Raft index applied to this replica.", v.applied_index)
    peers = _gauge("controlplane_raft_peer_reachable", "1 while the Raft link to the peer is up.", labels=("peer",))
    for peer, up in v.peers:
        peers.add_metric([peer], float(up))
    yield peers
    yield _gauge("controlplane_lease_holder", "1 while this node holds the lease and may act.", float(v.lease_holder))
    yield _gauge("controlplane_lease_epoch", "Replicated lease epoch (a change is a holder change).", v.lease_epoch)
    yield _gauge("controlplane_lease_remaining_seconds", "How long this holder may still act (0 when not holding).",
                 max(0, v.lease_remaining_ms) / 1000)

    s = v.state
    desired = _gauge("controlplane_deployment_desired_replicas", "Replicas the last decision asked for.",
                     labels=("tenant", "deployment"))
    slo = _gauge("controlplane_deployment_slo_ttft_p99_seconds", "The tenant's TTFT p99 objective.",
                 labels=("tenant", "deployment"))
    ttft = _gauge("controlplane_deployment_ttft_p99_seconds", "Observed TTFT p99 (lease holder only).",
                  labels=("tenant", "deployment"))
    unknown = _gauge("controlplane_deployment_load_unknown",
                     "1 while a load signal is unknown for some serving instance (scale-downs held).",
                     labels=("tenant", "deployment", "signal"))
    for dep_id, dep in sorted(s.deployments.items()):
        labels = [str(dep.tenant), str(dep_id)]
        for name in sorted(v.load_unknown.get(str(dep_id), ())):
            unknown.add_metric([*labels, name], 1)
        d = s.desired.get(dep_id)
        if d is not None:
            desired.add_metric(labels, d.replicas)
        tenant = s.tenants.get(dep.tenant)
        if tenant is not None:
            slo.add_metric(labels, tenant.slo.ttft_p99_ms / 1000)
        observed = v.ttft_p99_ms.get(str(dep_id))
        if observed is not None:
            ttft.add_metric(labels, observed / 1000)
    yield desired
    yield slo
    yield ttft
    yield unknown

    counts = Tally((str(i.tenant), str(i.deployment), str(i.zone), i.state.value) for i in s.instances.values())
    instances = _gauge("controlplane_instances", "Instances by lifecycle state.",
                       labels=("tenant", "deployment", "zone", "state"))
    for key, n in sorted(counts.items()):
        instances.add_metric(list(key), n)
    yield instances

    open_ = _gauge("controlplane_breaker_open", "1 while the breaker is open or half-open.", labels=("breaker",))
    trips = _gauge("controlplane_breaker_trips", "Consecutive trips (the backoff exponent).", labels=("breaker",))
    for key, rec in sorted(s.breakers.items()):
        open_.add_metric([key], float(rec.phase is not BreakerPhase.CLOSED))
        trips.add_metric([key], rec.trips)
    yield open_
    yield trips
    stale = _gauge("controlplane_adapter_stale_epoch",
                   "1 while the cluster's adapter holds a higher epoch than this holder's (nothing is sent to it).",
                   labels=("cluster",))
    for cid in sorted(set(map(str, s.clusters)) | set(v.fenced_clusters)):
        stale.add_metric([cid], float(cid in v.fenced_clusters))
    yield stale
    answers = CounterMetricFamily("controlplane_adapter_stale_epoch_answers",
                                  "Stale-epoch answers from the cluster's adapter to this process.", labels=["cluster"])
    for cid, n in sorted(v.stale_answers.items()):
        answers.add_metric([cid], n)
    yield answers
    yield from raft_transport_families(v.raft_transport)


# --- Raft transport (raft/transport.py; docs/security.md "Raft transport") ---------------------------


def raft_transport_families(counters: Mapping[str, int]) -> Iterator[CounterMetricFamily]:
    """``controlplane_raft_transport_events_total{event}``: rejected handshakes (``tls_rejected``,
    ``identity_rejected``, ``password_rejected``), ``oversize_frames``, timeouts (``handshake_timeout``,
    ``idle_timeout``, ``half_frame_timeout``), ``connection_cap`` refusals, ``emfile_backoffs``,
    ``bad_messages``, ``send_queue`` drops, ``filtered_messages``, ``dial_errors``."""
    fam = CounterMetricFamily("controlplane_raft_transport_events", "Raft transport refusals, timeouts and back-offs.",
                              labels=["event"])
    for event, n in sorted(counters.items()):
        fam.add_metric([event], n)
    yield fam


class CoordinatorCollector(Collector):
    """Registers with a ``CollectorRegistry``; builds a :class:`MetricsView` at every scrape."""

    def __init__(self, view: Callable[[], MetricsView]) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return families(self._view())

    def describe(self) -> list:
        return []  # built at scrape time: do not call the view at registration


__all__ = ["CoordinatorCollector", "MetricsView", "families"]
