"""The policies ``controlplane bench fleet`` replays: name -> how to build the simulation.

Every policy runs on the same fleet, seed and service model; allocation of scarce GPUs is part of
each policy, so an entry gives both the replica policy (None: this project's ``core.scaling``) and
the allocator (None: this project's allocation and preemption, ``core.preemption``).

A policy whose parts are not importable here is registered as *unavailable* with the reason: the
report shows it as such a row, it is never replaced by something else. The seams:

* :data:`KUBE_ALLOCATOR` builds the Kubernetes scheduler stand-in (Pending pods, PriorityClass per
  tenant with DefaultPreemption, termination grace) for ``hpa+k8s``, ``kpa+k8s`` and the Dynamo
  rows; it is passed as ``Simulation(..., allocator=...)``.
* :data:`DYNAMO_POLICY` builds NVIDIA Dynamo's planner as a ``ReplicaPolicy``:
  ``DYNAMO_POLICY(mode="throughput" | "load", gpu_budgets={deployment: GPUs})``.

Wiring them in is one assignment each (see docs/fleet-bench.md, "Registry").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.bench import policies as single
from controlplane.core.reconcile import ReconcileConfig
from controlplane.domain.ids import DeploymentId, PoolId
from controlplane.domain.tenants import Deployment
from controlplane.sim import baselines as b
from controlplane.sim.scenario import Scenario
from controlplane.sim.workload import Request


@dataclass(frozen=True)
class FleetContext:
    """What a builder may read: the fleet, its workloads (already cut to ``--limit-s``) and the seed."""

    scenario: Scenario
    workloads: Mapping[DeploymentId, Sequence[Request]]
    seed: int

    def schedules(self) -> dict[DeploymentId, list[int]]:
        """Per deployment, the clairvoyant replica schedule (``bench policies``' oracle)."""
        return single.oracle_schedules(self.scenario, dict(self.workloads), self.scenario.spec.tick_ms)


@dataclass(frozen=True)
class Setup:
    policy: b.ReplicaPolicy | None
    """None: this project's scaling policy."""
    allocator: Any = None
    """None: this project's allocation; else passed as ``Simulation(..., allocator=...)``."""


@dataclass(frozen=True)
class FleetPolicy:
    name: str
    description: str
    build: Callable[[FleetContext], Setup] | None
    unavailable: str | None = None
    """Why it cannot run here (then ``build`` is None)."""


def _kube_allocator(ctx: FleetContext) -> Any:
    """A fresh Kubernetes scheduler per simulation (it keeps its Pending pods between ticks): one
    PriorityClass per tenant, DefaultPreemption, a GPU ResourceQuota of quota + borrow limit, and the
    victims' termination grace of the fleet (docs/baselines-k8s.md)."""
    from controlplane.sim.kube import KubeScheduler

    return KubeScheduler(termination_grace_ms=int(ctx.scenario.fleet.termination_grace_s * 1000))


KUBE_ALLOCATOR: Callable[[FleetContext], Any] | None = _kube_allocator
KUBE_MISSING = "the Kubernetes scheduler stand-in (controlplane.sim.kube.KubeScheduler) is not available"
def _dynamo_policy(*, mode: str, gpu_budgets: Mapping[DeploymentId, int], scenario: Scenario) -> b.ReplicaPolicy:
    from controlplane.sim.dynamo import policy_for

    return policy_for(mode, scenario, gpu_budgets)  # type: ignore[arg-type]


def _dynamo_missing() -> str | None:
    from controlplane.sim.dynamo import dynamo_available

    return dynamo_available()


DYNAMO_POLICY: Callable[..., b.ReplicaPolicy] | None = _dynamo_policy
"""At merge: ``controlplane.sim.dynamo.DynamoPolicy`` (keywords ``mode``, ``gpu_budgets``)."""
DYNAMO_MISSING: str | None = _dynamo_missing()
"""At merge: ``dynamo_available()`` (None when importable, else why not)."""

ORDER = ("controlplane", "hpa+k8s", "kpa+k8s", "dynamo-throughput", "dynamo-load", "static", "oracle")
BASELINES = ("hpa+k8s", "kpa+k8s", "dynamo-throughput", "dynamo-load", "static")
"""What the targets compare ``controlplane`` with (the oracle is a bound, not a baseline)."""


def serve_order(scenario: Scenario) -> list[Deployment]:
    """Tenant priority descending, then tenant id, then deployment id (``core.preemption``'s order)."""
    prio = {t.id: t.priority for t in scenario.tenants}
    return sorted(scenario.deployments, key=lambda d: (-prio[d.tenant], d.tenant, d.id))


def pool_capacity(scenario: Scenario) -> dict[PoolId, int]:
    out: dict[PoolId, int] = {}
    for cl in scenario.clusters:
        for pool, n in cl.capacity.items():
            out[pool] = out.get(pool, 0) + n
    return out


def cap_by_priority(scenario: Scenario, wants: Mapping[DeploymentId, int]) -> dict[DeploymentId, int]:
    """``wants`` fitted into each pool, highest priority first: every deployment first gets its
    ``min_replicas`` (as far as they fit, in serve order), then in serve order as much of the rest
    as the pool still holds. Deployments missing from ``wants`` get their minimum."""
    free = pool_capacity(scenario)
    order = serve_order(scenario)
    out: dict[DeploymentId, int] = {}
    for d in order:
        n = min(d.min_replicas, wants.get(d.id, d.min_replicas), free.get(d.pool, 0) // d.gpus_per_instance)
        out[d.id] = n
        free[d.pool] = free.get(d.pool, 0) - n * d.gpus_per_instance
    for d in order:
        extra = min(max(0, wants.get(d.id, 0) - out[d.id]), free.get(d.pool, 0) // d.gpus_per_instance)
        out[d.id] += extra
        free[d.pool] -= extra * d.gpus_per_instance
    return out


def static_replicas(scenario: Scenario, schedules: Mapping[DeploymentId, Sequence[int]]) -> dict[DeploymentId, int]:
    """Each deployment's clairvoyant peak, capped by the pool by priority, fixed for the run."""
    return cap_by_priority(scenario, {k: max(v, default=0) for k, v in schedules.items()})


def pooled_oracle(scenario: Scenario, schedules: Mapping[DeploymentId, Sequence[int]]) -> dict[DeploymentId, list[int]]:
    """The clairvoyant schedules extended to the pool: every second, higher priorities first, the
    pool caps the lower ones (:func:`cap_by_priority` per second). The caps look one drain grace
    ahead (the longer of ``preemption_grace_ms`` and the simulator's scale-in grace,
    ``ReconcileConfig.scale_in_grace_ms``): a GPU a lower priority gives up is free only once its
    instance has drained, so a clairvoyant releases it that much before the higher priority's
    schedule (already one cold start ahead) claims it; each deployment follows the smaller of its
    own schedule and its share under those look-ahead wants."""
    length = max((len(v) for v in schedules.values()), default=0)
    by_id = {d.id: d for d in scenario.deployments}
    release_ms = max(scenario.spec.preemption_grace_ms, ReconcileConfig().scale_in_grace_ms)
    ahead = {k: b.oracle_schedule(v, lead_ms=release_ms, lo=0, hi=max(v, default=0))
             for k, v in schedules.items() if v and k in by_id}
    out: dict[DeploymentId, list[int]] = {k: [] for k in schedules}
    for s in range(length):
        capped = cap_by_priority(scenario, {k: v[min(s, len(v) - 1)] for k, v in ahead.items()})
        for k in out:
            own = schedules[k][min(s, len(schedules[k]) - 1)] if schedules[k] else 0
            out[k].append(min(own, capped.get(k, own)))
    return out


def gpu_budgets(scenario: Scenario) -> dict[DeploymentId, int]:
    """Dynamo's ``max_gpu_budget`` per deployment: its tenant's quota in the deployment's pool, and
    at least one instance's GPUs (a team deploying Dynamo gives it room for one engine; a budget
    below one engine is refused by Dynamo's own budget guard)."""
    tenants = {t.id: t for t in scenario.tenants}
    return {d.id: max(tenants[d.tenant].quota_in(d.pool), d.gpus_per_instance) for d in scenario.deployments}


def _controlplane(ctx: FleetContext) -> Setup:
    return Setup(None)


def _static(ctx: FleetContext) -> Setup:
    return Setup(b.StaticPolicy(static_replicas(ctx.scenario, ctx.schedules())))


def _oracle(ctx: FleetContext) -> Setup:
    return Setup(b.OraclePolicy(pooled_oracle(ctx.scenario, ctx.schedules())))


def _autoscaler_with_k8s(kind: str) -> Callable[[FleetContext], Setup]:
    def build(ctx: FleetContext) -> Setup:
        assert KUBE_ALLOCATOR is not None
        # HPA / KPA exactly as ``bench policies`` configures them (per-deployment targets).
        return Setup(single.make_policy(kind, ctx.scenario, dict(ctx.workloads), ctx.seed), KUBE_ALLOCATOR(ctx))

    return build


def _dynamo(mode: str) -> Callable[[FleetContext], Setup]:
    def build(ctx: FleetContext) -> Setup:
        assert DYNAMO_POLICY is not None and KUBE_ALLOCATOR is not None
        return Setup(DYNAMO_POLICY(mode=mode, gpu_budgets=gpu_budgets(ctx.scenario), scenario=ctx.scenario),
                     KUBE_ALLOCATOR(ctx))

    return build


def registry() -> dict[str, FleetPolicy]:
    """Every policy in report order, each buildable or unavailable with its reason."""
    kube_missing = None if KUBE_ALLOCATOR is not None else KUBE_MISSING
    dynamo_missing = DYNAMO_MISSING or ("DYNAMO_POLICY is not wired" if DYNAMO_POLICY is None else None)
    dyn_reason = "; ".join(r for r in (dynamo_missing, kube_missing) if r) or None

    def entry(name: str, description: str, build: Callable[[FleetContext], Setup], reason: str | None) -> FleetPolicy:
        return FleetPolicy(name, description, None if reason else build, reason)

    rows = [
        entry("controlplane", "this project: core.scaling defaults, product allocation and preemption", _controlplane, None),
        entry("hpa+k8s", "Kubernetes HPA (bench policies' port, default behavior) per deployment + kube-scheduler",
              _autoscaler_with_k8s("hpa"), kube_missing),
        entry("kpa+k8s", "Knative KPA (bench policies' port) per deployment + kube-scheduler",
              _autoscaler_with_k8s("kpa"), kube_missing),
        entry("dynamo-throughput", "NVIDIA Dynamo planner, throughput-based (180 s, ARIMA), budget = tenant quota "
              "+ kube-scheduler", _dynamo("throughput"), dyn_reason),
        entry("dynamo-load", "NVIDIA Dynamo planner, load-based (5 s), budget = tenant quota + kube-scheduler",
              _dynamo("load"), dyn_reason),
        entry("static", "clairvoyant peak per deployment, capped by the pool by priority, fixed; product allocation",
              _static, None),
        entry("oracle", "clairvoyant schedule per deployment, capped by the pool by priority each second, one drain grace ahead; "
              "product allocation", _oracle, None),
    ]
    return {r.name: r for r in rows}


def select(names: str | None) -> list[FleetPolicy]:
    """``--policies a,b`` (None: all), in report order; an unknown name is a clear error."""
    reg = registry()
    if names is None:
        return list(reg.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in reg]
    if unknown or not wanted:
        from controlplane.domain.errors import ControlPlaneError

        raise ControlPlaneError(f"--policies: unknown policy {', '.join(map(repr, unknown)) or '(none given)'} "
                                f"(known: {', '.join(reg)})")
    return [reg[n] for n in ORDER if n in wanted]
