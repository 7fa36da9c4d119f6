"""The discrete-event simulator: virtual time, seeded, byte-for-byte reproducible.

One heap of events (request arrivals, completions, warm-ups, drain deadlines, failures, control
ticks) ordered by ``(time, sequence)``. Every ``tick_ms`` the production :class:`ControlLoop` runs
against the simulated fleet through the same ports it uses in production, with the in-process
replicator. Randomness comes from ``random.Random`` instances seeded from the scenario seed.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry

from controlplane.core import model_cache, placement, scaling
from controlplane.core.allocator import Allocator
from controlplane.core.reconcile import ReconcileConfig, current_replicas
from controlplane.core.signals import FilteredSignals
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, instance_prefix
from controlplane.domain.instances import InstanceEvent, InstanceState, Transitioned
from controlplane.domain.observations import Observations
from controlplane.domain.profiles import PROFILES
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment
from controlplane.forecast.service import Forecaster, HistoryForecaster
from controlplane.runtime.loop import ControlLoop, TickReport
from controlplane.runtime.replicator import LocalReplicator
from controlplane.runtime.transitions import TransitionRecorder
from controlplane.sim.baselines import PodView, PolicyView, ReplicaPolicy
from controlplane.sim.cluster import (
    BATCH_DUE,
    COMPLETE,
    DRAIN_DEADLINE,
    WARM_DONE,
    SimFleet,
    SimRequest,
)
from controlplane.sim.metrics import Collector, SimResult
from controlplane.sim.scale_audit import ScaleDownAudit
from controlplane.sim.scenario import Scenario, ScenarioError
from controlplane.sim.traffic import TrafficMeter, engine_loads
from controlplane.sim.workload import Request

ARRIVAL, TICK, CLUSTER_DOWN, CLUSTER_UP = 10, 11, 12, 13
DRAIN_TAIL_MS = 120_000
"""Simulated time after the last arrival, so that queued requests finish or time out."""
MAX_EVENTS = 50_000_000
"""Safety bound on processed events."""


@dataclass(frozen=True, slots=True)
class Outage:
    cluster: ClusterId
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class WarmupFailures:
    cluster: ClusterId
    deployment: DeploymentId | None
    probability: float
    start_ms: int
    end_ms: int


class SimObserver(Protocol):
    """A measurement beside the :class:`Collector`, told about every committed transition (with the
    state after the commit) and every control tick (with the loop's report); read-only."""

    def transitions(self, records: Sequence[Transitioned], state: ControlState) -> None: ...

    def tick(self, now_ms: int, report: TickReport, state: ControlState) -> None: ...


class Simulation:
    def __init__(
        self,
        scenario: Scenario,
        workloads: dict[DeploymentId, Sequence[Request]],
        *,
        seed: int,
        progress: Callable[[int, int], None] | None = None,
        logger: object | None = None,
        policy: ReplicaPolicy | None = None,
        allocator: Allocator | None = None,
        observers: Sequence[SimObserver] = (),
        forecaster: Forecaster | None | bool = True,
    ) -> None:
        """``policy``: a baseline autoscaler (:mod:`controlplane.sim.baselines`) that sets every
        deployment's replica target instead of ``core.scaling`` (None: this project's policy). The
        rest of the control loop (allocation, placement, lifecycle) is the same either way.
        ``allocator``: replaces the product's allocation of scarce GPUs, preemption and placement
        (``ReconcileConfig.allocator``; e.g. :class:`controlplane.sim.kube.KubeScheduler`); None: the
        product's own.
        ``observers``: extra measurements fed every transition and every tick's report (the fleet
        benchmark's :mod:`controlplane.sim.fleet_metrics`); they must not change the state.
        ``forecaster``: the demand forecasts of this project's policy (True: the product default,
        :class:`HistoryForecaster`; False or None: reactive only); ignored with a baseline ``policy``."""
        self.scenario = scenario
        self._observers = tuple(observers)
        self.seed = seed
        self._policy = policy
        self._allocator = allocator
        self._spec: dict[DeploymentId, int] = {}
        """With an allocator: each deployment's latest replica target (its ``spec.replicas``), which
        a baseline policy reads as ``PolicyView.current`` (the grant may be lower: pods Pending)."""
        self._progress = progress
        spec = scenario.spec
        self.tick_ms = spec.tick_ms
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._outages = [
            Outage(ClusterId(f.cluster), int(f.start_s * 1000), int(f.end_s * 1000))
            for f in spec.failures if f.kind == "cluster_outage"
        ]
        self._warmup_failures = [
            WarmupFailures(ClusterId(f.cluster), DeploymentId(f.deployment) if f.deployment else None,
                           f.probability, int(f.start_s * 1000), int(f.end_s * 1000))
            for f in spec.failures if f.kind == "warmup_failures"
        ]
        profiles = {d.id: PROFILES[d.model] for d in scenario.deployments}
        self.collector = Collector(scenario, self.tick_ms)
        # Traffic windows only for a policy that reads them (Dynamo's planner); they only observe.
        self._traffic = TrafficMeter(d.id for d in scenario.deployments) if policy is not None and policy.wants_traffic else None
        self.fleet = SimFleet(
            profiles, self._schedule, random.Random(f"{seed}:fleet"), self._failure_probability,
            self.collector.request_done if self._traffic is None else self._request_done,
            caches=scenario.model_caches(), engines={d.id: d.engine for d in scenario.deployments},
            service_options=scenario.service_options(),
        )
        self.audit = ScaleDownAudit(scenario.deployments)
        self.registry = CollectorRegistry()
        # Transitions are counted always but logged only when a logger is given (--events): a long
        # simulation makes hundreds of thousands of them.
        quiet = structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        self.recorder = TransitionRecorder(self.registry, logger or quiet)
        self.state = ControlState()
        self.replicator = LocalReplicator(self.state, self._on_transitions)
        self._source = _Source(self.fleet, self.tick_ms)
        config = ReconcileConfig(
            preemption_grace_ms=spec.preemption_grace_ms,
            decider=self._decide_by_policy if policy is not None else None, allocator=allocator,
        )
        if forecaster is True:
            forecaster = HistoryForecaster()
        self.forecaster = forecaster if policy is None and forecaster else None
        self.loop = ControlLoop(
            self.replicator, self.fleet, self._source, rng=random.Random(f"{seed}:control"), config=config,
            forecaster=self.forecaster,
        )
        self._bootstrap(scenario)
        self._requests = self._load(workloads)
        last = max((r.arrival_ms for r in self._requests), default=0)
        self.end_ms = int(spec.duration_s * 1000) if spec.duration_s else last + DRAIN_TAIL_MS

    def _bootstrap(self, scenario: Scenario) -> None:
        cmds: list[c.Command] = [c.PutCluster(cl) for cl in scenario.clusters]
        cmds += [c.PutTenant(t) for t in scenario.tenants]
        cmds += [c.PutDeployment(d) for d in scenario.deployments]
        self._commit_or_fail(cmds)
        # The clusters' model caches as their adapters report them (the same facts every tick puts).
        caches = model_cache.facts(self.state, Observations(0, model_caches=self.fleet.model_caches()), 0)
        if caches:
            self._commit_or_fail(list(caches))
        if scenario.spec.start == "warm":
            self._preprovision(scenario)

    def _commit_or_fail(self, cmds: list[c.Command]) -> None:
        result = self.replicator.commit(cmds, 0)
        if not result.ok:
            errors = "; ".join(r.error for r in result.results if not r.ok)
            raise ScenarioError(f"scenario rejected by the state machine: {errors}")

    def _preprovision(self, scenario: Scenario) -> None:
        """``start: warm``: each deployment begins with ``min_replicas`` instances already serving,
        as a fleet that has been running for a while would (placed by the production placement)."""
        clusters = [self.state.clusters[k] for k in sorted(self.state.clusters)]
        for d in scenario.deployments:
            free = {cl.id: self.state.free_gpus(cl.id, d.pool) for cl in clusters}
            existing = list(self.state.instances_of(d.id))
            initial = d.min_replicas if self._policy is None else self._policy.initial_replicas(d)
            chosen = placement.place(d, initial, clusters, free, existing, (),
                                     cached=model_cache.cached_clusters(self.state, d.model)).clusters
            cmds: list[c.Command] = [c.SetDesired(d.id, initial, 0, "initial fleet", 0)]
            for k, cid in enumerate(chosen):
                iid = InstanceId(f"{instance_prefix(d.id)}-init-{k}")
                cmds += [c.CreateInstance(iid, d.id, cid, 0), c.TransitionInstance(iid, InstanceEvent.START_WARMUP, 0),
                         c.TransitionInstance(iid, InstanceEvent.WARMED, 0)]
            self._commit_or_fail(cmds)
            for k in range(len(chosen)):
                self.fleet.preprovision(self.state.instances[InstanceId(f"{instance_prefix(d.id)}-init-{k}")], 0)

    def _load(self, workloads: dict[DeploymentId, Sequence[Request]]) -> list[SimRequest]:
        reqs: list[SimRequest] = []
        for dep_id in sorted(workloads):
            for r in workloads[dep_id]:
                reqs.append(SimRequest(0, dep_id, r.arrival_ms, r.prompt_tokens, r.output_tokens))
        reqs.sort(key=lambda r: (r.arrival_ms, r.deployment))
        for rid, r in enumerate(reqs):
            r.rid = rid
        return reqs

    def _decide_by_policy(
        self, state: ControlState, d: Deployment, sig: FilteredSignals | None, now_ms: int
    ) -> scaling.ScaleDecision:
        """The planner's decision step for a baseline policy: it sees this tick's per-instance
        samples (the same ones the production filters read) and the instances' lifecycle states."""
        assert self._policy is not None
        obs = self._source.last
        samples = {s.instance_id: s for s in obs.samples} if obs is not None else {}
        pods = []
        for inst in sorted(state.instances_of(d.id), key=lambda i: i.id):
            if inst.state.terminal:
                continue
            s = samples.get(inst.id) if inst.state.serving else None
            pods.append(PodView(inst.id, inst.state, None if s is None else float(s.running + s.waiting)))
        gateway = dict(obs.gateway_waiting).get(d.id, 0) if obs is not None else 0
        current = current_replicas(state, d)
        if self._allocator is not None:
            current = self._spec.get(d.id, current)
        traffic = None
        if self._traffic is not None:
            traffic = self._traffic.take(d.id, now_ms, engine_loads(self.fleet.by_deployment[d.id].values(), now_ms))
        want = self._policy.target(d, PolicyView(current, tuple(pods), gateway, traffic), now_ms)
        target = min(max(want, d.min_replicas), d.max_replicas)
        if self._allocator is not None:
            self._spec[d.id] = target
        if target > current:
            reason = scaling.ScaleReason.SCALE_UP
        elif target < current:
            reason = scaling.ScaleReason.SCALE_DOWN
        else:
            reason = scaling.ScaleReason.WITHIN_TOLERANCE
        return scaling.ScaleDecision(target, 0, state.memory_of(d.id), reason,
                                     f"{self._policy.name}: {current} -> {target} (asked {want})")

    def _request_done(self, req: SimRequest, now_ms: int) -> None:
        self.collector.request_done(req, now_ms)
        if self._traffic is not None:
            self._traffic.done(req, now_ms)

    def _schedule(self, at_ms: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_ms, self._seq, kind, payload))

    def _failure_probability(self, cluster: ClusterId, deployment: DeploymentId, now_ms: int) -> float:
        p = 0.0
        for f in self._warmup_failures:
            if f.cluster == cluster and f.deployment in (None, deployment) and f.start_ms <= now_ms < f.end_ms:
                p = max(p, f.probability)
        return p

    def _on_transitions(self, records: Sequence[Transitioned]) -> None:
        self.recorder.record(records)
        for rec in records:
            inst = self.state.instances.get(rec.instance_id)
            preempted = inst is not None and inst.preempted and rec.to_state is InstanceState.DRAINING
            self.collector.transition(rec, inst.deployment if inst else None, preempted)
        for obs in self._observers:
            obs.transitions(records, self.state)

    def run(self) -> SimResult:
        for r in self._requests:
            self._schedule(r.arrival_ms, ARRIVAL, r)
        for o in self._outages:
            self._schedule(o.start_ms, CLUSTER_DOWN, o.cluster)
            self._schedule(o.end_ms, CLUSTER_UP, o.cluster)
        self._schedule(0, TICK, None)
        handlers = {
            ARRIVAL: lambda p, now: self.fleet.arrive(p, now),
            COMPLETE: self.fleet.on_complete,
            WARM_DONE: self.fleet.on_warm_done,
            DRAIN_DEADLINE: self.fleet.on_drain_deadline,
            BATCH_DUE: self.fleet.on_batch_due,
            CLUSTER_DOWN: self.fleet.cluster_down,
            CLUSTER_UP: lambda p, now: self.fleet.cluster_up(p),
            TICK: lambda p, now: self._tick(now),
        }
        processed = 0
        while self._heap and processed < MAX_EVENTS:
            at, _, kind, payload = heapq.heappop(self._heap)
            now = int(at)
            if now > self.end_ms:
                break
            processed += 1
            if kind == ARRIVAL:
                self.collector.arrival(payload, now)
                if self._traffic is not None:
                    self._traffic.arrival(payload)
            handlers[kind](payload, now)
        result = self.collector.finish(self.end_ms, self.fleet, self.state, self.loop, self.seed, processed)
        if isinstance(self.forecaster, HistoryForecaster):
            result.summary["forecast"] = self.forecaster.summary()
        audit = self.audit.summary()
        engines = {str(d.id): d.engine.value for d in self.scenario.deployments}
        for did, entry in result.summary["deployments"].items():
            entry["engine"] = engines.get(did)
            entry["scale_downs"] = audit.get(did)
        return result

    def _tick(self, now_ms: int) -> None:
        for d in self.scenario.deployments:
            slo = self.state.tenants[d.tenant].slo
            self.fleet.drop_expired(d.id, slo.max_queue_ms, now_ms)
        self.audit.before(self.state)
        report = self.loop.tick(now_ms)
        self.audit.after(report, self.loop)
        for d in self.scenario.deployments:
            self.fleet.dispatch_gateway(d.id, now_ms)
        self.collector.tick(now_ms, self.state)
        for obs in self._observers:
            obs.tick(now_ms, report, self.state)
        if self._progress is not None and (now_ms // self.tick_ms) % 400 == 0:
            self._progress(now_ms, self.end_ms)
        if now_ms + self.tick_ms <= self.end_ms:
            self._schedule(now_ms + self.tick_ms, TICK, None)


class _Source:
    """The fleet as an ObservationSource with the sample interval of the scenario."""

    def __init__(self, fleet: SimFleet, interval_ms: int) -> None:
        self._fleet = fleet
        self._interval_ms = interval_ms
        self.last = None
        """The latest observations gathered (what a baseline policy reads in the same tick)."""

    def gather(self, now_ms: int):
        self.last = self._fleet.gather(now_ms, self._interval_ms)
        return self.last


