"""Fleet figures beside the :class:`~controlplane.sim.metrics.Collector` (``controlplane bench fleet``).

A :class:`FleetObserver` is a :class:`~controlplane.sim.engine.SimObserver`: it is told every
committed instance transition and every control tick (the loop's ``TickReport``, whose plan carries
each deployment's decision and grant), and makes one pass over the instances per tick. It does no
per-request work: request figures (SLO attainment, TTFT, dropped, GPU-hours) stay the Collector's.
Every definition below is also in docs/fleet-bench.md.

* **Claims and preemption success.** A *claim* is a scale-up of a deployment *b* (tenant *s*,
  priority *p*, pool *P*) that needs GPUs held by lower priorities. One is opened at a tick when *b*
  has no open claim, wants more replicas than it holds (decision target > live replicas, after the
  caps below), and either the tick's plan preempted a lower-priority tenant for *b*, or *P* has not
  enough free GPUs for one replica of *b* while a tenant of lower priority holds GPUs there above its
  guaranteed minimums that may be taken (it borrows, or *s* is within its quota). The claimed
  replicas are the target capped by *s*'s ceiling (quota + borrowing limit) and by what the pool can
  give *b* at all (capacity minus what tenants of priority >= *p* hold, minus the lower tenants'
  guaranteed minimums). The claim is **met** when *b*'s serving (Ready/Busy) replicas reach
  ``min(claimed, current target)`` no later than ``grace + start`` after it opened: the fleet's drain
  grace (``preemption_grace_ms``) plus the deployment's cold start with its +10 % jitter bound plus
  one tick. Success rate = met / (met + missed); claims whose deadline is past the end are censored.
  The test is policy-independent: a policy that never preempts still owes these claims.
* **Preemption pairs and loops.** Each drained ``preempted`` instance is attributed to a
  beneficiary: from ``Plan.preemptions`` ``(beneficiary, victim, replicas)`` when the plan has it,
  else (the product allocation of today) to every deployment of another tenant in the same pool
  whose grant rose in that tick. A *preemption loop* is a pair (tenant A preempts tenant B) when B
  preempted A in the :data:`LOOP_WINDOW_MS` before.
* **Bursts.** From the workload's clairvoyant need (``baselines.required_replicas``, averaged over
  the trailing :data:`BURST_SMOOTH_S` seconds, rounded up, within the deployment's bounds): a burst
  starts at second *s* when the need reaches ``base + max(2, ceil(base / 2))``, ``base`` being the
  least need of the :data:`BURST_BASE_S` seconds before; it lasts until the need falls back to
  ``base``; its peak is the most it needs (capped at the tenant's ceiling). Time to capacity: from
  *s* to the first tick with serving replicas >= the peak; bursts never served so by the end are
  *unreached*. Lag: the longest a new high of the need, on the way up to the peak, waited for
  serving replicas to reach it (0 for a policy that is ready ahead of the need).
* **Warm-pool hit rate.** Scale-ups (after t = 0, the initial fleet) = warm starts (Standby ->
  Warming) + cold starts that serve; a cold-started instance put to Standby within two ticks of its
  first Ready is a warm-pool fill, not a scale-up. Hit rate = warm starts / scale-ups.
* **Held below quota.** Per tenant and pool, every tick: it *asks* when one of its deployments'
  decision target exceeds its live replicas (Pending..Busy); it is *below quota while asking* when
  one more replica of an asking deployment would still fit in its quota (GPUs it holds, not
  Draining, + that replica's GPUs <= quota: the allocation's "grows within its quota"); *starved*
  counts only the time beyond ``grace + start`` of one uninterrupted stretch below (the time a
  preemption legitimately takes).
* **Pool invariant.** GPUs held (every non-terminal instance) per cluster and pool <= capacity,
  checked every tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.domain.ids import ClusterId, DeploymentId, PoolId, TenantId
from controlplane.domain.instances import InstanceEvent, InstanceState, Transitioned
from controlplane.domain.profiles import PROFILES
from controlplane.domain.state import ControlState
from controlplane.sim.metrics import TIMELINE_STEP_MS, percentile

S = InstanceState
LOOP_WINDOW_MS = 300_000
"""A preemption back within this long of the opposite one is a loop."""
BURST_BASE_S = 60
BURST_SMOOTH_S = 10
"""The need is averaged over this many seconds (trailing) before it is rounded up: a one-second
spike of the fluid bound is not a burst."""
START_JITTER = 1.1
"""The simulated cold start varies by +-10 % (``sim.cluster``): a claim's deadline allows the top."""
_SERVING = (S.READY, S.BUSY)


@dataclass(frozen=True, slots=True)
class Burst:
    start_s: int
    peak: int
    """The most replicas the burst needs."""
    rises: tuple[tuple[int, int], ...]
    """``(second, need)`` at each new high of the need, from the start to the peak."""


def bursts(required: Sequence[float], *, lo: int, hi: int, base_s: int = BURST_BASE_S,
           smooth_s: int = BURST_SMOOTH_S) -> list[Burst]:
    """Every burst of a per-second need (module doc)."""
    need = []
    acc = 0.0
    for s, x in enumerate(required):
        acc += x - (required[s - smooth_s] if s >= smooth_s else 0.0)
        need.append(min(hi, max(lo, math.ceil(acc / min(s + 1, smooth_s) - 1e-9))))
    out: list[Burst] = []
    s = 1
    while s < len(need):
        floor = min(need[max(0, s - base_s):s])
        if need[s] < floor + max(2, math.ceil(floor / 2)):
            s += 1
            continue
        end = next((u for u in range(s + 1, len(need)) if need[u] <= floor), len(need))
        rises, high = [], 0
        for u in range(s, end):
            if need[u] > high:
                high = need[u]
                rises.append((u, high))
        out.append(Burst(s, high, tuple(rises)))
        s = end + 1
    return out


def burst_starts(required: Sequence[float], *, lo: int, hi: int) -> list[tuple[int, int]]:
    """``(second, replicas needed then)`` of every burst start."""
    return [(b.start_s, b.rises[0][1]) for b in bursts(required, lo=lo, hi=hi)]


@dataclass
class _Claim:
    opened_ms: int
    replicas: int
    deadline_ms: int


@dataclass
class _Track:
    start_ms: int
    peak: int
    due: list[tuple[int, int]]
    """(at_ms, need) of the rises not yet served."""
    worst_lag_ms: int = 0
    reached: bool = False


@dataclass
class _Dep:
    cold: int = 0
    warm: int = 0
    fills: int = 0
    bursts: list[_Track] = field(default_factory=list)
    """Not started yet, in order."""
    next_burst: int = 0
    active: list[_Track] = field(default_factory=list)
    to_capacity_ms: list[int] = field(default_factory=list)
    lag_ms: list[int] = field(default_factory=list)
    burst_count: int = 0
    claim: _Claim | None = None
    claims_met: int = 0
    claims_missed: int = 0
    claims_censored: int = 0
    claim_ms: list[int] = field(default_factory=list)
    grant: int = 0
    target: int = 0


@dataclass
class _Stretch:
    below_ms: int = 0
    starved_ms: int = 0
    asking_ms: int = 0
    since_ms: int | None = None


def _secs(ms: float | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def _rate(met: int, total: int) -> float | None:
    return round(met / total, 6) if total else None


class FleetObserver:
    def __init__(self, scenario, required: Mapping[DeploymentId, Sequence[float]]) -> None:
        spec = scenario.spec
        self._tick_ms = spec.tick_ms
        self._deps = {d.id: d for d in sorted(scenario.deployments, key=lambda d: d.id)}
        self._tenants = {t.id: t for t in scenario.tenants}
        self._prio = {t.id: t.priority for t in scenario.tenants}
        self._capacity: dict[tuple[ClusterId, PoolId], int] = {}
        self._pool_cap: dict[PoolId, int] = {}
        for cl in scenario.clusters:
            for pool, n in cl.capacity.items():
                self._capacity[(cl.id, pool)] = n
                self._pool_cap[pool] = self._pool_cap.get(pool, 0) + n
        self._deadline = {
            d.id: spec.preemption_grace_ms + math.ceil(PROFILES[d.model].cold_start_ms * START_JITTER) + self._tick_ms
            for d in scenario.deployments
        }
        self._tenant_pools = sorted({(d.tenant, d.pool) for d in scenario.deployments})
        self._mins = {(t, p): sum(d.min_replicas * d.gpus_per_instance for d in self._deps.values()
                                  if d.tenant == t and d.pool == p) for t, p in self._tenant_pools}
        self._tolerance = {(t, p): max(self._deadline[d.id] for d in self._deps.values() if d.tenant == t and d.pool == p)
                           for t, p in self._tenant_pools}
        self._dep = {k: _Dep() for k in self._deps}
        for k, d in self._deps.items():
            req = required.get(k, ())
            cap = max(d.min_replicas, self._tenants[d.tenant].ceiling_in(d.pool) // d.gpus_per_instance)
            self._dep[k].bursts = [
                _Track(x.start_s * 1000, min(cap, x.peak), [(u * 1000, min(cap, n)) for u, n in x.rises])
                for x in bursts(req, lo=d.min_replicas, hi=d.max_replicas)
            ]
        self._stretch = {k: _Stretch() for k in self._tenant_pools}
        self._ready_at: dict[str, int] = {}
        self._cold_ids: set[str] = set()
        self._pairs: list[tuple[int, TenantId, TenantId]] = []
        self._last_pair_ms: dict[tuple[TenantId, TenantId], int] = {}
        self._loops: list[tuple[int, TenantId, TenantId]] = []
        self._preempted = dict.fromkeys(self._deps, 0)
        self._pool_violations = 0
        self._first_violation: dict[str, Any] | None = None
        self._max_used: dict[tuple[ClusterId, PoolId], int] = dict.fromkeys(self._capacity, 0)
        self._next_sample_ms = 0
        tenants = sorted(self._tenants)
        self.timeline_t_s: list[float] = []
        self.gpus_by_tenant: dict[str, list[int]] = {t: [] for t in tenants}

    # --- feeds --------------------------------------------------------------------------------

    def transitions(self, records: Sequence[Transitioned], state: ControlState) -> None:
        for rec in records:
            inst = state.instances.get(rec.instance_id)
            if inst is None or inst.deployment not in self._dep:
                continue
            dep = self._dep[inst.deployment]
            iid = rec.instance_id
            to, frm = rec.to_state, rec.from_state
            if to is S.WARMING and rec.at_ms > 0:  # t = 0: the initial fleet, not a scale-up
                if frm is S.PENDING:
                    dep.cold += 1
                    self._cold_ids.add(iid)
                elif frm is S.STANDBY:
                    dep.warm += 1
            elif to is S.READY and frm is S.WARMING:
                if iid in self._cold_ids:
                    self._ready_at[iid] = rec.at_ms
            elif to is S.STANDBY and rec.event is InstanceEvent.SLEEP:
                at = self._ready_at.pop(iid, None)
                self._cold_ids.discard(iid)
                if at is not None and rec.at_ms - at <= 2 * self._tick_ms:
                    dep.fills += 1
            elif to is S.DRAINING and inst.preempted:
                self._preempted[inst.deployment] += 1
            if to is not S.READY and frm in _SERVING:
                self._ready_at.pop(iid, None)
                self._cold_ids.discard(iid)

    def tick(self, now_ms: int, report, state: ControlState) -> None:
        plan = report.plan
        if plan is not None:
            for did, dec in plan.decisions:
                if did in self._dep:
                    self._dep[did].target = dec.target
            for did, grant, _warm in plan.grants:
                if did in self._dep:
                    self._dep[did].grant = grant
        used: dict[tuple[ClusterId, PoolId], int] = {}
        held: dict[tuple[TenantId, PoolId], int] = {}
        held_all: dict[TenantId, int] = {}
        live = dict.fromkeys(self._deps, 0)
        serving = dict.fromkeys(self._deps, 0)
        for inst in state.instances.values():
            st = inst.state
            if st.terminal:
                continue
            key = (inst.cluster, inst.pool)
            used[key] = used.get(key, 0) + inst.gpus
            held_all[inst.tenant] = held_all.get(inst.tenant, 0) + inst.gpus
            if st is S.DRAINING:
                continue
            tp = (inst.tenant, inst.pool)
            held[tp] = held.get(tp, 0) + inst.gpus
            if inst.deployment in live:
                if st is not S.STANDBY:
                    live[inst.deployment] += 1
                if st in _SERVING:
                    serving[inst.deployment] += 1
        self._check_pool(now_ms, used)
        beneficiaries = self._record_pairs(now_ms, plan)
        self._claims(now_ms, held, used, live, serving, beneficiaries)
        self._bursts(now_ms, serving)
        self._quota(now_ms, held, live)
        if now_ms >= self._next_sample_ms:
            self._next_sample_ms = now_ms + TIMELINE_STEP_MS
            self.timeline_t_s.append(now_ms / 1000)
            for t, series in self.gpus_by_tenant.items():
                series.append(held_all.get(t, 0))

    # --- per tick ------------------------------------------------------------------------------

    def _check_pool(self, now_ms: int, used: Mapping[tuple[ClusterId, PoolId], int]) -> None:
        for key, n in used.items():
            cap = self._capacity.get(key, 0)
            if n > self._max_used.get(key, 0):
                self._max_used[key] = n
            if n > cap:
                self._pool_violations += 1
                if self._first_violation is None:
                    self._first_violation = {"t_s": now_ms / 1000, "cluster": key[0], "pool": key[1], "gpus": n,
                                             "capacity": cap}

    def _record_pairs(self, now_ms: int, plan) -> set[tuple[DeploymentId, TenantId]]:
        """This tick's (beneficiary deployment, victim tenant) pairs, from ``Plan.preemptions`` (both
        allocators fill it); loops are counted on tenants."""
        pairs: set[tuple[DeploymentId, TenantId]] = set()
        for ben, victim, _n in plan.preemptions if plan is not None else ():
            if ben in self._deps and victim in self._deps:
                pairs.add((ben, self._deps[victim].tenant))
        for ben_tenant, vten in sorted({(self._deps[k].tenant, v) for k, v in pairs}):
            back = self._last_pair_ms.get((vten, ben_tenant))
            if back is not None and now_ms - back <= LOOP_WINDOW_MS:
                self._loops.append((now_ms, ben_tenant, vten))
            self._last_pair_ms[(ben_tenant, vten)] = now_ms
            self._pairs.append((now_ms, ben_tenant, vten))
        return pairs

    def _claims(self, now_ms, held, used, live, serving, pairs) -> None:
        free: dict[PoolId, int] = dict(self._pool_cap)
        for (_cl, pool), n in used.items():
            free[pool] = free.get(pool, 0) - n
        for k, d in self._deps.items():
            dep = self._dep[k]
            c = dep.claim
            if c is not None:
                if serving[k] >= min(c.replicas, dep.target):
                    dep.claims_met += 1
                    dep.claim_ms.append(now_ms - c.opened_ms)
                    dep.claim = None
                elif now_ms > c.deadline_ms:
                    dep.claims_missed += 1
                    dep.claim = None
                continue
            tenant = self._tenants[d.tenant]
            prio, pool, g = tenant.priority, d.pool, d.gpus_per_instance
            own = held.get((d.tenant, pool), 0)
            own_others = own - live[k] * g
            stronger = sum(n for (t, p), n in held.items() if p == pool and t != d.tenant and self._prio[t] >= prio)
            weaker_mins = sum(m for (t, p), m in self._mins.items() if p == pool and self._prio[t] < prio)
            reachable = (self._pool_cap.get(pool, 0) - stronger - weaker_mins - own_others) // g
            ceiling = (tenant.ceiling_in(pool) - own_others) // g
            want = min(dep.target, reachable, ceiling)
            if want <= live[k] or want <= serving[k]:
                continue
            preempted_for = any(b == k and self._prio[v] < prio for b, v in pairs)
            within_quota = own + g <= tenant.quota_in(pool)
            takable = any(
                self._prio[t] < prio and n > self._mins.get((t, p), 0)
                and (within_quota or n > self._tenants[t].quota_in(p))
                for (t, p), n in held.items() if p == pool
            )
            if preempted_for or (free.get(pool, 0) < g and takable):
                dep.claim = _Claim(now_ms, want, now_ms + self._deadline[k])

    def _bursts(self, now_ms: int, serving: Mapping[DeploymentId, int]) -> None:
        for k, dep in self._dep.items():
            while dep.next_burst < len(dep.bursts) and dep.bursts[dep.next_burst].start_ms <= now_ms:
                dep.active.append(dep.bursts[dep.next_burst])
                dep.next_burst += 1
                dep.burst_count += 1
            if not dep.active:
                continue
            n = serving[k]
            still = []
            for tr in dep.active:
                if not tr.reached and n >= tr.peak:
                    tr.reached = True
                    dep.to_capacity_ms.append(now_ms - tr.start_ms)
                while tr.due and tr.due[0][0] <= now_ms and n >= tr.due[0][1]:
                    tr.worst_lag_ms = max(tr.worst_lag_ms, now_ms - tr.due.pop(0)[0])
                if tr.reached and not tr.due:
                    dep.lag_ms.append(tr.worst_lag_ms)
                else:
                    still.append(tr)
            dep.active = still

    def _quota(self, now_ms: int, held: Mapping[tuple[TenantId, PoolId], int],
               live: Mapping[DeploymentId, int]) -> None:
        # Per tenant and pool: the fewest GPUs of one more replica of a deployment that asks for it.
        smallest: dict[tuple[TenantId, PoolId], int] = {}
        for k, d in self._deps.items():
            if self._dep[k].target > live[k]:
                key = (d.tenant, d.pool)
                smallest[key] = min(smallest.get(key, d.gpus_per_instance), d.gpus_per_instance)
        for key, st in self._stretch.items():
            h = held.get(key, 0)
            quota = self._tenants[key[0]].quota_in(key[1])
            if key in smallest:
                st.asking_ms += self._tick_ms
            if key in smallest and h + smallest[key] <= quota:
                st.below_ms += self._tick_ms
                if st.since_ms is None:
                    st.since_ms = now_ms
                elif now_ms - st.since_ms > self._tolerance[key]:
                    st.starved_ms += self._tick_ms
            else:
                st.since_ms = None

    # --- result --------------------------------------------------------------------------------

    def finish(self, end_ms: int) -> dict[str, Any]:
        """The figures of the run that ended at ``end_ms`` (bursts starting later are not counted)."""
        deployments: dict[str, Any] = {}
        for k, dep in self._dep.items():
            if dep.claim is not None:
                dep.claims_censored += 1
            dep.bursts = [x for x in dep.bursts[dep.next_burst:] if x.start_ms <= end_ms]
            dep.next_burst = 0
            dep.burst_count += len(dep.bursts)
            deployments[k] = self._dep_figures(k, dep)
        tenants: dict[str, Any] = {}
        for t in sorted(self._tenants):
            mine = [self._dep[k] for k, d in self._deps.items() if d.tenant == t]
            stretches = [st for (tt, _p), st in self._stretch.items() if tt == t]
            tenants[t] = {
                "priority": self._prio[t],
                **self._claim_figures(mine),
                "preempted_replicas": sum(self._preempted[k] for k, d in self._deps.items() if d.tenant == t),
                "below_quota_while_asking_s": _secs(sum(s.below_ms for s in stretches)),
                "starved_below_quota_s": _secs(sum(s.starved_ms for s in stretches)),
                "asking_s": _secs(sum(s.asking_ms for s in stretches)),
                **self._warm_figures(mine),
            }
        allc = list(self._dep.values())
        loops = [{"t_s": t / 1000, "beneficiary": a, "victim": b} for t, a, b in self._loops]
        starved = {t: v["starved_below_quota_s"] for t, v in tenants.items() if v["starved_below_quota_s"]}
        total = {
            **self._claim_figures(allc),
            "preemption_pairs": len(self._pairs),
            "preemption_loops": len(loops),
            **self._warm_figures(allc),
        }
        invariants = {
            "pool_never_exceeded": {"ok": self._pool_violations == 0, "violating_ticks": self._pool_violations,
                                    "first": self._first_violation,
                                    "peak": [{"cluster": c, "pool": p, "gpus": n, "capacity": self._capacity[(c, p)]}
                                             for (c, p), n in sorted(self._max_used.items())]},
            "no_tenant_starved_below_quota": {"ok": not starved, "starved_s": starved},
            "no_preemption_loops": {"ok": not loops, "loops": loops[:20]},
        }
        return {"total": total, "tenants": tenants, "deployments": deployments, "invariants": invariants}

    @staticmethod
    def _claim_figures(deps: Sequence[_Dep]) -> dict[str, Any]:
        met = sum(d.claims_met for d in deps)
        missed = sum(d.claims_missed for d in deps)
        lat = sorted(x for d in deps for x in d.claim_ms)
        return {"claims": met + missed, "claims_met": met, "claims_censored": sum(d.claims_censored for d in deps),
                "preemption_success": _rate(met, met + missed),
                "claim_to_serving_s": {"p50": _secs(percentile(lat, 0.5)), "p99": _secs(percentile(lat, 0.99))}}

    @staticmethod
    def _warm_figures(deps: Sequence[_Dep]) -> dict[str, Any]:
        warm = sum(d.warm for d in deps)
        ups = warm + sum(d.cold - d.fills for d in deps)
        return {"scale_ups": ups, "warm_scale_ups": warm, "warm_pool_fills": sum(d.fills for d in deps),
                "warm_hit_rate": _rate(warm, ups)}

    def _dep_figures(self, k: DeploymentId, dep: _Dep) -> dict[str, Any]:
        lat = sorted(dep.to_capacity_ms)
        lag = sorted(dep.lag_ms)
        return {
            "tenant": self._deps[k].tenant,
            "bursts": dep.burst_count,
            "bursts_unreached": sum(not tr.reached for tr in dep.active) + len(dep.bursts),
            "burst_to_capacity_s": {"p50": _secs(percentile(lat, 0.5)), "p99": _secs(percentile(lat, 0.99)),
                                    "max": _secs(lat[-1] if lat else None)},
            "burst_lag_s": {"p50": _secs(percentile(lag, 0.5)), "p99": _secs(percentile(lag, 0.99)),
                            "max": _secs(lag[-1] if lag else None)},
            "preempted_replicas": self._preempted[k],
            **self._claim_figures([dep]),
            **self._warm_figures([dep]),
        }
