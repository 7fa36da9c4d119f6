"""Simulated GPU memory for the simulated backend: what the node agents would report for its nodes.

``simulated.gpu_memory`` (:class:`SimGpuConfig`) lays out ``nodes`` x ``gpus_per_node`` GPUs of
``total_bytes`` each (optionally split into MIG devices), then places the backend's live instances
on them in id order, each on ``gpus`` units of one node: a starting, serving or draining instance
holds ``GPU_MEMORY_UTILIZATION`` of its profile's ``gpu_memory_bytes`` per unit (vLLM's
``gpu_memory_utilization``), a sleeping one ``SLEEP_HELD_BYTES`` (sleep level 1 keeps the CUDA
context only). ``foreign`` entries are memory held by processes that are not ours (a leaked
context), ``lost`` entries GPUs fallen off the bus. Absent (the default): no report, placement
counts GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from controlplane.core.gpu_memory import GPU_MEMORY_UTILIZATION
from controlplane.domain.observations import GpuReport, GpuUnit

SLEEP_HELD_BYTES = 1 << 30
"""What a sleeping (level 1) vLLM keeps on each of its GPUs: the CUDA context and allocator slack."""
HOLDING = ("starting", "serving", "draining")


class SimGpuRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: int = Field(ge=0)
    gpu: int = Field(ge=0)


class SimForeign(SimGpuRef):
    bytes: int = Field(ge=0)
    """Held by a process that is not ours."""


class SimGpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: int = Field(2, ge=1, le=1000)
    gpus_per_node: int = Field(8, ge=1, le=64)
    total_bytes: int = Field(80 * 1024**3, ge=1, le=1 << 50)
    mig_devices: int = Field(0, ge=0, le=7, description="MIG devices per GPU, equal slices (0: no MIG)")
    pool: str = Field("", max_length=63)
    foreign: list[SimForeign] = Field(default_factory=list)
    lost: list[SimGpuRef] = Field(default_factory=list)


def simulated_report(cfg: SimGpuConfig, instances: Iterable[object], now_ms: int) -> GpuReport:
    """``instances``: :class:`controlplane.sim.cluster.SimInstance` values (``id``, ``gpus``, ``phase``,
    ``profile.gpu_memory_bytes``)."""
    slices = max(1, cfg.mig_devices)
    per_unit = cfg.total_bytes // slices
    lost = {(r.node, r.gpu) for r in cfg.lost}
    used: dict[tuple[int, int, int], int] = {}
    for f in cfg.foreign:
        for s in range(slices):
            key = (f.node, f.gpu, s)
            used[key] = min(per_unit, used.get(key, 0) + f.bytes // slices)
    order = [(n, g, s) for n in range(cfg.nodes) for g in range(cfg.gpus_per_node) for s in range(slices)
             if (n, g) not in lost]
    for inst in sorted(instances, key=lambda i: i.id):  # type: ignore[attr-defined]
        phase = inst.phase  # type: ignore[attr-defined]
        if phase not in HOLDING and phase != "sleeping":
            continue
        gpus = max(1, inst.gpus)  # type: ignore[attr-defined]
        hold = SLEEP_HELD_BYTES if phase == "sleeping" else int(inst.profile.gpu_memory_bytes * GPU_MEMORY_UTILIZATION)  # type: ignore[attr-defined]
        hold = min(hold, per_unit)
        for node in range(cfg.nodes):
            room = [k for k in order if k[0] == node and per_unit - used.get(k, 0) >= hold][:gpus]
            if len(room) == gpus:
                for k in room:
                    used[k] = used.get(k, 0) + hold
                break
    units = []
    for n in range(cfg.nodes):
        for g in range(cfg.gpus_per_node):
            for s in range(slices):
                name = f"GPU-sim-{n}-{g}" + (f"/mig{s}" if cfg.mig_devices else "")
                if (n, g) in lost:
                    units.append(GpuUnit(f"node-{n}", name, 0, 0, cfg.pool, "lost"))
                else:
                    units.append(GpuUnit(f"node-{n}", name, per_unit - used.get((n, g, s), 0), per_unit, cfg.pool))
    return GpuReport(now_ms, tuple(sorted(units, key=lambda u: (u.node, u.unit))))
