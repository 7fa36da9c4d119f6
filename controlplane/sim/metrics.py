"""What a simulation measures, and its machine-readable result.

Per tenant, per deployment and in total: requests, completed, dropped, SLO attainment (share of all
requests, dropped ones included, whose TTFT met the tenant's ``slo.ttft_p99_ms``), TTFT p50/p99/p99.9
(nearest rank, over served requests), GPU-hours (every GPU held from pod creation to termination,
Standby included), scale reversals (direction changes of the desired replica count), cold and warm
starts (``cold_starts``: every new pod; ``warm_starts``: every wake from Standby), starts by tier
(``starts_by_tier``) and start latency by tier (``start_latency_ms``: count, p50, p99 of start
transition to Ready, nearest rank), preemptions. A per-second timeline feeds the plot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controlplane.domain.ids import DeploymentId
from controlplane.domain.instances import InstanceState, Transitioned
from controlplane.domain.state import ControlState

TIMELINE_STEP_MS = 1_000
STATES = ("Pending", "Warming", "Ready", "Busy", "Standby", "Draining")


def percentile(sorted_values: list[int], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    return float(sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)])


@dataclass
class _Counts:
    requests: int = 0
    completed: int = 0
    dropped: int = 0
    slo_met: int = 0
    ttfts: list[int] = field(default_factory=list)
    cold_starts: int = 0
    warm_starts: int = 0
    starts_by_tier: dict[str, int] = field(default_factory=dict)
    start_ms_by_tier: dict[str, list[int]] = field(default_factory=dict)
    """Start latencies (start transition to Ready) by tier."""
    preemptions: int = 0
    scale_reversals: int = 0
    gpu_ms: float = 0.0


@dataclass
class Timeline:
    t_s: list[float] = field(default_factory=list)
    arrivals: dict[str, list[int]] = field(default_factory=dict)
    states: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    desired: dict[str, list[int]] = field(default_factory=dict)
    ttft_p99_ms: dict[str, list[float | None]] = field(default_factory=dict)
    slo_ms: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SimResult:
    summary: dict[str, Any]
    timeline: Timeline


class Collector:
    def __init__(self, scenario, tick_ms: int) -> None:
        self._tenant_of = {d.id: d.tenant for d in scenario.deployments}
        self._slo = {t.id: t.slo.ttft_p99_ms for t in scenario.tenants}
        self._deps = [d.id for d in scenario.deployments]
        self._counts: dict[DeploymentId, _Counts] = {d: _Counts() for d in self._deps}
        self._last_desired: dict[DeploymentId, int] = {}
        self._last_dir: dict[DeploymentId, int] = {}
        self._bucket_arrivals = {d: 0 for d in self._deps}
        self._bucket_ttfts: dict[DeploymentId, list[int]] = {d: [] for d in self._deps}
        self.timeline = Timeline(
            arrivals={d: [] for d in self._deps},
            states={d: {s: [] for s in STATES} for d in self._deps},
            desired={d: [] for d in self._deps},
            ttft_p99_ms={d: [] for d in self._deps},
            slo_ms={d: self._slo[self._tenant_of[d]] for d in self._deps},
        )
        self._next_sample_ms = 0
        self.ticks = 0

    def arrival(self, req, now_ms: int) -> None:
        self._counts[req.deployment].requests += 1
        self._bucket_arrivals[req.deployment] += 1

    def request_done(self, req, now_ms: int) -> None:
        counts = self._counts[req.deployment]
        if req.dropped:
            counts.dropped += 1
            return
        ttft = req.first_token_ms - req.arrival_ms
        counts.completed += 1
        counts.ttfts.append(ttft)
        counts.slo_met += ttft <= self._slo[self._tenant_of[req.deployment]]
        self._bucket_ttfts[req.deployment].append(ttft)

    def transition(self, rec: Transitioned, deployment: DeploymentId | None, preempted: bool) -> None:
        if deployment is None:
            return
        counts = self._counts[deployment]
        if rec.to_state is InstanceState.WARMING:
            if rec.from_state is InstanceState.PENDING:
                counts.cold_starts += 1
            elif rec.from_state is InstanceState.STANDBY:
                counts.warm_starts += 1
            tier = rec.init_method.value
            counts.starts_by_tier[tier] = counts.starts_by_tier.get(tier, 0) + 1
        elif start_latency(rec) is not None:
            counts.start_ms_by_tier.setdefault(rec.init_method.value, []).append(rec.latency_ms)
        counts.preemptions += preempted

    def tick(self, now_ms: int, state: ControlState) -> None:
        self.ticks += 1
        for d in self._deps:
            desired = state.desired.get(d)
            if desired is None:
                continue
            prev = self._last_desired.get(d)
            if prev is not None and desired.replicas != prev:
                direction = 1 if desired.replicas > prev else -1
                if self._last_dir.get(d, direction) != direction:
                    self._counts[d].scale_reversals += 1
                self._last_dir[d] = direction
            self._last_desired[d] = desired.replicas
        if now_ms >= self._next_sample_ms:
            self._sample(now_ms, state)
            self._next_sample_ms = now_ms + TIMELINE_STEP_MS

    def _sample(self, now_ms: int, state: ControlState) -> None:
        tl = self.timeline
        tl.t_s.append(now_ms / 1000)
        for d in self._deps:
            counts = dict.fromkeys(STATES, 0)
            for inst in state.instances_of(d):
                counts[inst.state.value] = counts.get(inst.state.value, 0) + 1
            for s in STATES:
                tl.states[d][s].append(counts[s])
            desired = state.desired.get(d)
            tl.desired[d].append(desired.replicas if desired else 0)
            tl.arrivals[d].append(self._bucket_arrivals[d])
            self._bucket_arrivals[d] = 0
            tl.ttft_p99_ms[d].append(percentile(sorted(self._bucket_ttfts[d]), 0.99))
            self._bucket_ttfts[d] = []

    def finish(self, end_ms: int, fleet, state: ControlState, loop, seed: int, events: int) -> SimResult:
        for sim in list(fleet.instances.values()):
            for req in sim.running.values():
                if 0 <= req.first_token_ms <= end_ms:
                    self.request_done(req, end_ms)
                else:
                    req.dropped = True
                    self.request_done(req, end_ms)
            for req in sim.queue:
                req.dropped = True
                self.request_done(req, end_ms)
        for d in self._deps:
            for req in fleet.gateway[d]:
                req.dropped = True
                self.request_done(req, end_ms)
            self._counts[d].gpu_ms = fleet.gpu_ms[d] + fleet.live_gpu_ms(d, end_ms)
        stats = loop.statistics()
        summary = {
            "seed": seed,
            "simulated_s": round(end_ms / 1000, 3),
            "ticks": self.ticks,
            "events": events,
            "commits": stats.commits,
            "adapter_commands": stats.commands_sent,
            "adapter_send_failures": stats.send_failures,
            "total": _summarise(self._counts.values(), None),
            "tenants": {
                t: _summarise([self._counts[d] for d in self._deps if self._tenant_of[d] == t], self._slo[t])
                for t in sorted(set(self._tenant_of.values()))
            },
            "deployments": {d: _summarise([self._counts[d]], self._slo[self._tenant_of[d]]) for d in sorted(self._deps)},
        }
        return SimResult(summary, self.timeline)


def start_latency(rec: Transitioned) -> int | None:
    """The start latency a ``Warming -> Ready`` record measures (its time in Warming); None for every
    other transition, and for a warm-up that took no time (the instances a ``start: warm`` scenario
    begins with, which never started)."""
    if rec.from_state is InstanceState.WARMING and rec.to_state is InstanceState.READY and rec.latency_ms > 0:
        return rec.latency_ms
    return None


def _by_tier(parts: list[_Counts]) -> tuple[dict[str, int], dict[str, dict[str, float | None]]]:
    starts: dict[str, int] = {}
    latencies: dict[str, list[int]] = {}
    for p in parts:
        for tier, n in p.starts_by_tier.items():
            starts[tier] = starts.get(tier, 0) + n
        for tier, values in p.start_ms_by_tier.items():
            latencies.setdefault(tier, []).extend(values)
    summary = {}
    for tier in sorted(latencies):
        values = sorted(latencies[tier])
        summary[tier] = {"count": len(values), "p50": percentile(values, 0.50), "p99": percentile(values, 0.99)}
    return dict(sorted(starts.items())), summary


def _summarise(parts: Iterable[_Counts], slo_ms: int | None) -> dict[str, Any]:
    parts = list(parts)
    ttfts = sorted(t for p in parts for t in p.ttfts)
    requests = sum(p.requests for p in parts)
    out: dict[str, Any] = {
        "requests": requests,
        "completed": sum(p.completed for p in parts),
        "dropped": sum(p.dropped for p in parts),
        "slo_attainment": round(sum(p.slo_met for p in parts) / requests, 6) if requests else None,
        "ttft_ms": {
            "p50": percentile(ttfts, 0.50),
            "p99": percentile(ttfts, 0.99),
            "p999": percentile(ttfts, 0.999),
        },
        "gpu_hours": round(sum(p.gpu_ms for p in parts) / 3_600_000, 4),
        "scale_reversals": sum(p.scale_reversals for p in parts),
        "cold_starts": sum(p.cold_starts for p in parts),
        "warm_starts": sum(p.warm_starts for p in parts),
        "preemptions": sum(p.preemptions for p in parts),
    }
    out["starts_by_tier"], out["start_latency_ms"] = _by_tier(parts)
    if slo_ms is not None:
        out["slo_ttft_ms"] = slo_ms
    return out
