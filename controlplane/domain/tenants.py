"""Tenants, their model deployments, and the scaling policy of a deployment.

A tenant owns a guaranteed GPU quota per pool and may *borrow* idle GPUs beyond it, up to a
borrowing limit; borrowed GPUs are the first to be reclaimed when another tenant needs its own
quota back. ``priority`` orders tenants when the fleet is short: a higher number wins.

Constructors validate their invariants and raise :class:`ValidationError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.domain.engines import Engine  # noqa: F401 - re-exported: Engine has always been imported from here
from controlplane.domain.errors import Problems, ValidationError, clip
from controlplane.domain.ids import DeploymentId, PoolId, TenantId, deployment_id_problem, id_problem, split_deployment_id
from controlplane.domain.labels import check_labels

MAX_PRIORITY = 1_000_000
HOUR_MS = 3_600_000
"""Upper bound of every policy and SLO duration: longer windows are configuration mistakes."""


def check_id(field_name: str, value: object) -> None:
    problem = id_problem(value)
    if problem:
        raise ValidationError(field_name, problem)


def check_range(field_name: str, value: float, lo: float, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field_name, f"must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(field_name, f"must be a finite number, got {value}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValidationError(field_name, f"must be {bound}, got {value}")


def check_int(field_name: str, value: int, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field_name, f"must be an integer, got {clip(value)}")
    check_range(field_name, value, lo, hi)


def check_gpu_map(field_name: str, values: Mapping[PoolId, int]) -> None:
    for pool, n in values.items():
        check_id(f"{field_name}.{pool}", pool)
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValidationError(f"{field_name}.{pool}", f"must be an integer, got {type(n).__name__}")
        check_range(f"{field_name}.{pool}", n, 0)


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives of a tenant."""

    ttft_p99_ms: int = 2_000
    """Time to first token that 99 % of requests must meet."""
    max_queue_ms: int = 60_000
    """A request still waiting for an instance after this long is dropped (answered 503)."""

    def __post_init__(self) -> None:
        p = Problems()
        p.check(check_int, "slo.ttft_p99_ms", self.ttft_p99_ms, 1, HOUR_MS)
        p.check(check_int, "slo.max_queue_ms", self.max_queue_ms, 1, HOUR_MS)
        p.raise_any()


@dataclass(frozen=True, slots=True)
class Tenant:
    id: TenantId
    priority: int
    quota: Mapping[PoolId, int] = field(default_factory=dict)
    """Guaranteed GPUs per pool."""
    borrow_limit: Mapping[PoolId, int] = field(default_factory=dict)
    """GPUs the tenant may hold beyond its quota when they are idle (reclaimable at any time)."""
    slo: Slo = field(default_factory=Slo)
    labels: Mapping[str, str] = field(default_factory=dict)
    """``metadata.labels`` (:mod:`controlplane.domain.labels`); not part of any decision."""

    def __post_init__(self) -> None:
        p = Problems()
        p.check(check_id, "tenant.id", self.id)
        p.check(check_labels, "tenant.labels", self.labels)
        p.check(check_int, "tenant.priority", self.priority, 0, MAX_PRIORITY)
        p.check(check_gpu_map, "tenant.quota", self.quota)
        p.check(check_gpu_map, "tenant.borrow_limit", self.borrow_limit)
        p.raise_any()

    def quota_in(self, pool: PoolId) -> int:
        return self.quota.get(pool, 0)

    def ceiling_in(self, pool: PoolId) -> int:
        """Most GPUs the tenant may ever hold in ``pool``: quota plus borrowing limit."""
        return self.quota.get(pool, 0) + self.borrow_limit.get(pool, 0)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How a deployment's replica count follows its load. Defaults are the product's defaults.

    Every signal proposes a replica count; the largest proposal wins (as in the Kubernetes HPA), so a
    deployment is sized for whichever resource runs out first.
    """

    target_concurrency: float = 24.0
    """Running + waiting requests one replica should carry (vLLM ``num_requests_running/waiting``)."""
    target_kv_usage: float = 0.70
    """KV-cache usage fraction (``vllm:kv_cache_usage_perc``) to aim for."""
    target_token_utilization: float = 0.90
    """Share of the profile's token throughput one replica should run at. The TTFT signal backs it
    up when queueing at this utilisation breaks the SLO; a lower share buys headroom at a steady
    cost. On the Azure traces (``controlplane bench policies``, seed 0) 0.9 instead of 0.8 kept SLO
    attainment (code 96.42 % vs 96.47 %, conv 100 %) for 6 % / 3 % fewer GPU-hours; 1.0 cost code
    2.7 points of attainment."""
    tolerance: float = 0.10
    """No change while desired/current is within [1 - tolerance, 1 + tolerance]."""
    stable_window_ms: int = 30_000
    """Sliding window of the stable signal."""
    ewma_half_life_ms: int = 4_000
    """Half-life of the EWMA that smooths each signal inside the window."""
    panic_window_ms: int = 3_000
    """Short window that detects bursts."""
    panic_threshold: float = 1.6
    """Enter panic when the panic-window demand is this many times the current capacity."""
    panic_hold_ms: int = 30_000
    """Stay in panic (no scale-down) this long after the last over-threshold tick."""
    scale_down_stabilization_ms: int = 600_000
    """Scale down only to the highest recommendation of this trailing window. Long on purpose: an
    LLM replica released between bursts costs a cold start (90 s for a 70B model) and an SLO miss
    on the next burst to get back, while holding it costs only its GPU time; on the bursty Azure
    code trace 600 s instead of 60 s raised SLO attainment from 55 % to 96 % and cut scale
    reversals from 43 to 5 (``controlplane bench policies``). The Kubernetes HPA holds 300 s."""
    max_step_up: int = 32
    """Most replicas added by one decision."""
    max_step_down: int = 2
    """Most replicas removed by one decision."""
    scale_down_cooldown_ms: int = 5_000
    """Least time between two scale-down steps."""
    ttft_slo_weight: float = 1.0
    """How strongly a TTFT p99 above the SLO pushes the replica count up (0 disables the signal)."""
    target_queue_p95_ms: float = 0.0
    """p95 of the time requests wait in the engine's queue that the deployment should stay under;
    above it, ``serving x p95 / target`` replicas are asked for (a feedback signal like TTFT: it
    only ever asks for more). 0 disables it; Triton defaults to 120 ms
    (:data:`~controlplane.domain.engines.TRITON_QUEUE_P95_TARGET_MS`)."""

    def __post_init__(self) -> None:
        p = Problems()  # every problem at once, in field order
        p.check(check_range, "policy.target_concurrency", self.target_concurrency, 0.01, 100_000)
        p.check(check_range, "policy.target_kv_usage", self.target_kv_usage, 0.01, 1.0)
        p.check(check_range, "policy.target_token_utilization", self.target_token_utilization, 0.01, 1.0)
        p.check(check_range, "policy.tolerance", self.tolerance, 0.0, 0.9)
        p.check(check_int, "policy.stable_window_ms", self.stable_window_ms, 1_000, HOUR_MS)
        p.check(check_int, "policy.ewma_half_life_ms", self.ewma_half_life_ms, 1, HOUR_MS)
        p.check(check_int, "policy.panic_window_ms", self.panic_window_ms, 250)
        if not p.has("policy.panic_window_ms", "policy.stable_window_ms") and self.panic_window_ms > self.stable_window_ms:
            p.add("policy.panic_window_ms",
                  f"must not exceed stable_window_ms ({self.stable_window_ms}), got {self.panic_window_ms}")
        p.check(check_range, "policy.panic_threshold", self.panic_threshold, 1.0, 100.0)
        p.check(check_int, "policy.panic_hold_ms", self.panic_hold_ms, 0, HOUR_MS)
        p.check(check_int, "policy.scale_down_stabilization_ms", self.scale_down_stabilization_ms, 0, HOUR_MS)
        p.check(check_int, "policy.max_step_up", self.max_step_up, 1, 100_000)
        p.check(check_int, "policy.max_step_down", self.max_step_down, 1, 100_000)
        p.check(check_int, "policy.scale_down_cooldown_ms", self.scale_down_cooldown_ms, 0, HOUR_MS)
        p.check(check_range, "policy.ttft_slo_weight", self.ttft_slo_weight, 0.0, 10.0)
        p.check(check_range, "policy.target_queue_p95_ms", self.target_queue_p95_ms, 0.0, HOUR_MS)
        p.raise_any()


def engine_policy(engine: Engine, settings: Mapping[str, object] | None = None) -> ScalingPolicy:
    """The policy of a deployment of ``engine``: the product defaults, then the engine's own defaults
    (``Engine.capabilities.policy_defaults``: Triton's 120 ms queue target, MII's 0.85 token
    utilisation), then what the deployment sets itself (``settings``: only the fields it set)."""
    return ScalingPolicy(**{**engine.capabilities.policy_defaults, **(settings or {})})  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Deployment:
    id: DeploymentId
    tenant: TenantId
    engine: Engine
    model: str
    """Name of a :class:`~controlplane.domain.profiles.ModelProfile`."""
    pool: PoolId
    gpus_per_instance: int
    min_replicas: int = 1
    """Guaranteed minimum: never preempted below this, never scaled below it."""
    max_replicas: int = 64
    warm_pool: int = 1
    """Sleeping (Standby) instances kept ready for a warm start."""
    policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    created_ms: int = 0
    deleting: bool = False
    """Deletion requested: the planner scales it to zero (no warm pool), and the lease holder removes
    it once no instance is left (like a Kubernetes finalizer)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """``metadata.labels`` (:mod:`controlplane.domain.labels`); not part of any decision."""

    def __post_init__(self) -> None:
        p = Problems()
        problem = deployment_id_problem(self.id)
        if problem:
            p.add("deployment.id", problem)
        p.check(check_id, "deployment.tenant", self.tenant)
        owner = split_deployment_id(self.id)[0] if not problem else None
        if owner is not None and owner != self.tenant:
            p.add("deployment.id", f"{clip(self.id)} names tenant {clip(owner)}, but the deployment's "
                                   f"tenant is {clip(self.tenant)}")
        p.check(check_id, "deployment.pool", self.pool)
        if not isinstance(self.engine, Engine):
            p.add("deployment.engine", f"unknown engine {clip(self.engine)}")
        if not self.model:
            p.add("deployment.model", "must not be empty")
        p.check(check_int, "deployment.gpus_per_instance", self.gpus_per_instance, 1, 64)
        p.check(check_int, "deployment.min_replicas", self.min_replicas, 0)
        p.check(check_int, "deployment.max_replicas", self.max_replicas, 1, 100_000)
        if not p.has("deployment.min_replicas", "deployment.max_replicas") and self.min_replicas > self.max_replicas:
            p.add("deployment.min_replicas", f"must not exceed max_replicas ({self.max_replicas}), got {self.min_replicas}")
        p.check(check_int, "deployment.warm_pool", self.warm_pool, 0, 1_000)
        if not isinstance(self.deleting, bool):
            p.add("deployment.deleting", "must be true or false")
        p.check(check_labels, "deployment.labels", self.labels)
        p.raise_any()
