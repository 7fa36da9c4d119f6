"""What a fleet asks of its pools: per-pool GPU demand over time and how short each pool is at its
peak (the issue-15 check that a reference fleet is 30-50 % short of the summed demand at its bursts,
so that preemption has to act).

Demand is what a clairvoyant must *hold* to serve the known load: per deployment and second,
:func:`controlplane.sim.baselines.required_replicas` (a fluid lower bound: prefill work within the
TTFT SLO, batch slots, KV cache) rounded up to whole instances within ``[min_replicas,
max_replicas]``, then held over the next cold start (:func:`~controlplane.sim.baselines.oracle_schedule`
with :func:`hold_lead_ms`: an instance must be asked for that long before it serves, so capacity for
a burst is held from one cold start before it), times the GPUs per instance, summed per pool. This is
the schedule the ``oracle`` baseline follows, which meets the SLOs when the pools are large enough
(measured on the built-in fleet with 400-GPU pools: 99.8 % attainment, docs/simulator.md); the
bare per-second bound, without the hold, is ``hold=False`` (on that fleet its mean is 1.35x (H100)
and 1.7x (A100) below the held one). Nothing here depends on a policy's result: it is a property of the fleet file
and its workloads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from controlplane.domain.ids import DeploymentId
from controlplane.domain.profiles import PROFILES
from controlplane.domain.profiles import ModelProfile
from controlplane.sim.baselines import oracle_schedule, required_replicas
from controlplane.sim.scenario import Scenario
from controlplane.sim.workload import Request

DRAIN_TAIL_S = 120
"""As the simulation: without ``duration_s`` a run lasts until the last arrival + 120 s."""


@dataclass(frozen=True, slots=True)
class PoolShortfall:
    pool: str
    peak_demand_gpus: int
    """Most GPUs the pool's deployments need at once (the summed demand at its peak)."""
    pool_gpus: int
    """GPUs of that pool over all clusters."""
    short_fraction: float
    """``(peak_demand_gpus - pool_gpus) / peak_demand_gpus``, 0 when the pool suffices."""
    at_s: int
    """Second of the run at which the peak is first reached."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def run_seconds(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]]) -> int:
    if scenario.spec.duration_s:
        return math.ceil(scenario.spec.duration_s)
    last = max((r.arrival_ms for reqs in workloads.values() for r in reqs), default=0)
    return last // 1000 + DRAIN_TAIL_S


def hold_lead_ms(profile: ModelProfile, tick_ms: int) -> int:
    """How long before it serves an instance must be asked for: a cold start (with 10 % margin for
    the simulator's start-time jitter), two control ticks, and a second of sampling."""
    return int(profile.cold_start_ms * 1.1) + 2 * tick_ms + 1000


def tenant_demand_gpus(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]], *,
                       hold: bool = True) -> dict[str, dict[str, list[int]]]:
    """Per pool and tenant (both sorted), the GPUs the tenant's deployments in that pool need in each
    second of the run (see the module doc). A reference fleet's top tenant must fit its pool on its
    own (docs/simulator.md, "The two reference fleets")."""
    seconds = run_seconds(scenario, workloads)
    slo_of = {t.id: t.slo.ttft_p99_ms for t in scenario.tenants}
    out: dict[str, dict[str, list[int]]] = {}
    for d in scenario.deployments:
        profile = PROFILES[d.model]
        need = required_replicas(workloads.get(d.id, ()), profile, slo_ms=slo_of[d.tenant], duration_s=seconds)
        if hold:
            replicas = oracle_schedule(need, lead_ms=hold_lead_ms(profile, scenario.spec.tick_ms),
                                       lo=d.min_replicas, hi=d.max_replicas)
        else:
            replicas = [min(d.max_replicas, max(d.min_replicas, math.ceil(x - 1e-9))) for x in need]
        total = out.setdefault(str(d.pool), {}).setdefault(str(d.tenant), [0] * len(need))
        for s, n in enumerate(replicas):
            total[s] += n * d.gpus_per_instance
    return {pool: dict(sorted(by.items())) for pool, by in sorted(out.items())}


def demand_gpus(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]], *,
                hold: bool = True) -> dict[str, list[int]]:
    """Per pool, the GPUs its deployments need in each second of the run (see the module doc)."""
    return {pool: [sum(col) for col in zip(*by.values(), strict=True)]
            for pool, by in tenant_demand_gpus(scenario, workloads, hold=hold).items()}


def fleet_shortfall(scenario: Scenario, workloads: Mapping[DeploymentId, Sequence[Request]], *,
                    hold: bool = True) -> dict[str, PoolShortfall]:
    """Per pool (sorted by name): its peak summed demand, its size, and how short it is then."""
    size: dict[str, int] = {}
    for c in scenario.clusters:
        for pool, n in c.capacity.items():
            size[str(pool)] = size.get(str(pool), 0) + n
    out = {}
    for pool, series in sorted(demand_gpus(scenario, workloads, hold=hold).items()):
        peak = max(series, default=0)
        have = size.get(pool, 0)
        short = (peak - have) / peak if peak > have else 0.0
        out[pool] = PoolShortfall(pool, peak, have, round(short, 4), series.index(peak) if series else 0)
    return out
