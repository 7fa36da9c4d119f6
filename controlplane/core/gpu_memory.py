"""GPU memory in placement: the per-GPU free memory the adapters report caps where new instances go.

Today's placement counts GPUs: a cluster's pool has ``capacity - GPUs our instances hold`` free
(:meth:`ControlState.free_gpus`). That count cannot see memory that is not ours: a process outside
the control plane (a debugging session, a leaked CUDA context, a crashed engine whose memory the
driver has not returned), a lost GPU, a GPU with an NVML error. The adapters report, per cluster, a
:class:`~controlplane.domain.observations.GpuReport`: one :class:`GpuUnit` per GPU, or per MIG device
of a GPU in MIG mode, each with the bytes free *for us* (``total - used - reserved``; memory held by
any process counts as not free, ours included: see docs/adapters.md). This module turns it into a
per-tick :class:`MemoryView`:

* an instance of a deployment needs ``gpus_per_instance`` units **on one node**, each with at least
  :func:`need_bytes` free: ``GPU_MEMORY_UTILIZATION`` x the profile's ``gpu_memory_bytes``. That is
  vLLM's own start-up check (``gpu_memory_utilization``, default 0.9: the engine refuses to start
  when the device's free memory is below that share of its memory), so a unit below it would only
  produce a failed warm-up;
* the instances that fit on a cluster's pool are ``sum over nodes of floor(fitting units / gpus)``,
  and at most ``floor((fitting units - units of our Pending instances there) / gpus)``: a Pending
  instance's pod has not started, so its GPUs still look free in the report although the GPU count
  already gives them away;
* :meth:`MemoryView.cap` lowers each cluster's free GPUs for placement to ``fits x gpus`` (never
  raises it: the GPU count still holds for our own instances), and says which clusters memory cut;
  :meth:`MemoryView.take` consumes the units of each instance placed, so one tick never places more
  than the memory holds, over all deployments of the pool;
* **fallback**: a cluster with no report (an adapter that does not report GPU memory, a report
  older than ``REPORT_MAX_AGE_MS``, or no unit for the pool) is placed by GPU counting alone, as
  before.

Units match a pool by their ``pool`` field (the node agent's ``--pool``); a unit without one belongs
to the cluster's only pool (ignored on a cluster with several pools). Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controlplane.domain.ids import ClusterId, PoolId
from controlplane.domain.instances import Instance, InstanceState
from controlplane.domain.observations import GpuReport
from controlplane.domain.profiles import PROFILES, ModelProfile
from controlplane.domain.tenants import Deployment
from controlplane.domain.topology import Cluster

GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of a GPU's memory an engine claims at start
(and checks is free). The profiles' ``gpu_memory_bytes`` is the GPU memory the profile runs on."""
REPORT_MAX_AGE_MS = 30_000
"""A report older than this (a silent adapter, a stalled agent) is no report: counting decides."""
GiB = 1024**3


def need_bytes(profile: ModelProfile) -> int:
    """Free bytes one of the instance's GPUs must offer."""
    return int(profile.gpu_memory_bytes * GPU_MEMORY_UTILIZATION)


def fresh_reports(reports: Iterable[tuple[ClusterId, GpuReport]], now_ms: int,
                  max_age_ms: int = REPORT_MAX_AGE_MS) -> dict[ClusterId, GpuReport]:
    """The reports at most ``max_age_ms`` old (a later one wins for a cluster listed twice)."""
    out: dict[ClusterId, GpuReport] = {}
    for cid, rep in reports:
        if now_ms - rep.at_ms <= max_age_ms and (cid not in out or rep.at_ms >= out[cid].at_ms):
            out[cid] = rep
    return out


@dataclass(slots=True)
class _Pool:
    nodes: dict[str, list[int]] = field(default_factory=dict)
    """node -> free bytes of its units, sorted ascending (consumed by :meth:`MemoryView.take`)."""
    units: int = 0
    offline: int = 0
    """Units that offer nothing because of a problem (lost, NVML error)."""
    pending: int = 0
    """GPUs of our Pending instances here (their pods have not claimed their memory yet)."""


class MemoryView:
    """The GPU memory of one tick (mutable: :meth:`take` consumes units; never escapes ``plan``)."""

    def __init__(self, reports: Mapping[ClusterId, GpuReport], clusters: Mapping[ClusterId, Cluster],
                 instances: Iterable[Instance]) -> None:
        self._pools: dict[tuple[ClusterId, PoolId], _Pool] = {}
        for cid in sorted(reports):
            cl = clusters.get(cid)
            if cl is None:
                continue
            only = next(iter(cl.capacity)) if len(cl.capacity) == 1 else None
            for u in reports[cid].units:
                pool = PoolId(u.pool) if u.pool else only
                if pool is None or pool not in cl.capacity:
                    continue
                p = self._pools.setdefault((cid, pool), _Pool())
                p.units += 1
                p.offline += 1 if u.problem else 0
                p.nodes.setdefault(u.node, []).append(-1 if u.problem else max(0, u.free_bytes))  # -1: never fits
        for p in self._pools.values():
            for free in p.nodes.values():
                free.sort()
        for inst in instances:
            p = self._pools.get((inst.cluster, inst.pool))
            if p is not None and inst.state is InstanceState.PENDING:
                p.pending += inst.gpus

    def covers(self, cluster: ClusterId, pool: PoolId) -> bool:
        """Memory decides for this cluster's pool (else: GPU counting alone)."""
        return (cluster, pool) in self._pools

    def fits(self, cluster: ClusterId, d: Deployment) -> int | None:
        """How many more instances of ``d`` the memory holds there; None: no report (count)."""
        p = self._pools.get((cluster, d.pool))
        if p is None:
            return None
        need, g = _need(d), max(1, d.gpus_per_instance)
        fitting = [sum(1 for b in free if b >= need) for free in p.nodes.values()]
        return max(0, min(sum(k // g for k in fitting), (sum(fitting) - p.pending) // g))

    def cap(self, d: Deployment, free: Mapping[ClusterId, int],
            count: int | None = None) -> tuple[dict[ClusterId, int], dict[ClusterId, str]]:
        """``free`` (GPUs per cluster for ``d``'s pool) lowered to what memory holds, and a note for
        each cluster where memory, not the GPU count, keeps out some of ``count`` new instances
        (None: any)."""
        out = dict(free)
        why: dict[ClusterId, str] = {}
        g = max(1, d.gpus_per_instance)
        for cid in sorted(free):
            n = self.fits(cid, d)
            if n is None or out[cid] <= n * g:
                continue
            before, out[cid] = out[cid], n * g
            wanted = before if count is None else min(before, count * g)
            if before >= g and n * g < wanted:
                why[cid] = self._explain(cid, d, n, before)
        return out, why

    def cap_pools(self, free: Mapping[tuple[ClusterId, PoolId], int],
                  deployments: Iterable[Deployment]) -> dict[tuple[ClusterId, PoolId], int]:
        """``free`` per (cluster, pool) lowered for the most demanding of ``deployments`` in each pool
        (what :func:`controlplane.core.room.make_room` may count on)."""
        out = dict(free)
        for d in deployments:
            g = max(1, d.gpus_per_instance)
            for (cid, pool), n in free.items():
                held = self.fits(cid, d) if pool == d.pool else None
                if held is not None:
                    out[(cid, pool)] = min(out[(cid, pool)], n, held * g)
        return out

    def take(self, cluster: ClusterId, d: Deployment) -> None:
        """One instance of ``d`` placed there: its units (on the fullest node that holds it) are used."""
        p = self._pools.get((cluster, d.pool))
        if p is None:
            return
        need, g = _need(d), max(1, d.gpus_per_instance)
        best: tuple[int, str] | None = None
        for node in sorted(p.nodes):
            k = sum(1 for b in p.nodes[node] if b >= need)
            if k >= g and (best is None or k < best[0]):
                best = (k, node)
        if best is None:
            return
        free = p.nodes[best[1]]
        taken = 0
        for i, b in enumerate(free):
            if b >= need and taken < g:
                free[i] = -1
                taken += 1
        free.sort()

    def _explain(self, cid: ClusterId, d: Deployment, n: int, counted: int) -> str:
        p = self._pools[(cid, d.pool)]
        need = _need(d)
        fitting = sum(1 for free in p.nodes.values() for b in free if b >= need)
        parts = [f"{fitting} of {p.units} {d.pool} GPUs have {need / GiB:.1f} GiB free"]
        if p.offline:
            parts.append(f"{p.offline} lost or failing")
        if p.pending:
            parts.append(f"{p.pending} claimed by Pending instances")
        if d.gpus_per_instance > 1:
            parts.append(f"{d.gpus_per_instance} needed on one node")
        return f"{cid}: GPU memory holds {n} more instance(s), the GPU count {counted // max(1, d.gpus_per_instance)} ({', '.join(parts)})"


def _need(d: Deployment) -> int:
    profile = PROFILES.get(d.model)
    return 0 if profile is None else need_bytes(profile)
