"""Conversions between the domain's observation values and the adapter protocol's messages, in one
place for both ends (the adapter service and the coordinators' client). ``shift_ms`` maps the
adapter's clock onto the receiver's (see :class:`adapters.client.ClockMap`)."""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.api.v1 import adapter_pb2
from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.observations import GpuReport, GpuUnit, InstanceReport, InstanceSample, Observations

STALE_EPOCH_METADATA = ("cp-error", "stale-epoch")
"""Trailing metadata of a FAILED_PRECONDITION that is a stale fencing epoch (the service sets it, the
client reads it); here, not in ``adapters.service``, so the coordinators' client does not import the
adapter server (its gRPC health/reflection services, backends and identity checks)."""


def batch_of(cluster_id: str, seq: int, stream_id: str, obs: Observations,
             observe_failed: bool = False) -> adapter_pb2.ObservationBatch:
    """One batch of ``cluster_id``'s observations (its own entries of ``obs.model_caches`` and
    ``obs.gpu_memory`` only)."""
    gpu = next((r for cid, r in obs.gpu_memory if cid == cluster_id), None)
    return adapter_pb2.ObservationBatch(
        cluster_id=cluster_id, seq=seq, at_ms=obs.at_ms, stream_id=stream_id, observe_failed=observe_failed,
        samples=[sample_message(s) for s in obs.samples],
        reports=[adapter_pb2.InstanceReport(instance_id=r.instance_id, event=r.event, at_ms=r.at_ms, detail=r.detail)
                 for r in obs.reports],
        gateway=[adapter_pb2.GatewayQueue(deployment_id=d, waiting=n) for d, n in obs.gateway_waiting],
        model_cache=next((adapter_pb2.ModelCache(models=list(models)) for cid, models in obs.model_caches
                          if cid == cluster_id), None),
        gpu_memory=None if gpu is None else adapter_pb2.GpuMemoryReport(at_ms=gpu.at_ms, units=[
            adapter_pb2.GpuUnit(node=u.node, unit=u.unit, free_bytes=u.free_bytes, total_bytes=u.total_bytes,
                                pool=u.pool, problem=u.problem) for u in gpu.units]),
    )


def sample_message(s: InstanceSample) -> adapter_pb2.InstanceSample:
    msg = adapter_pb2.InstanceSample(
        instance_id=s.instance_id, deployment_id=s.deployment, at_ms=s.at_ms, running=s.running, waiting=s.waiting,
        kv_usage=s.kv_usage, prompt_tokens_per_s=s.prompt_tokens_per_s,
        generation_tokens_per_s=s.generation_tokens_per_s, gpu_mem_used_bytes=s.gpu_mem_used_bytes,
        gpu_mem_total_bytes=s.gpu_mem_total_bytes, healthy=s.healthy, unknown=list(s.unknown),
    )
    if s.ttft_p99_ms is not None:
        msg.ttft_p99_ms = s.ttft_p99_ms
    if s.queue_p95_ms is not None:
        msg.queue_p95_ms = s.queue_p95_ms
    return msg


def unknown_fields(names: Iterable[str]) -> tuple[str, ...]:
    """A peer's ``unknown`` list as a sample's: only :data:`LOAD_FIELDS` names, sorted, once each. A
    name this version does not know is dropped (a newer adapter may know more fields)."""
    return tuple(sorted({str(n) for n in names} & set(LOAD_FIELDS)))


def observations_of(batch: adapter_pb2.ObservationBatch, shift_ms: int = 0) -> Observations:
    samples = tuple(
        InstanceSample(
            instance_id=InstanceId(m.instance_id), deployment=DeploymentId(m.deployment_id), at_ms=m.at_ms + shift_ms,
            running=m.running, waiting=m.waiting, kv_usage=m.kv_usage, prompt_tokens_per_s=m.prompt_tokens_per_s,
            generation_tokens_per_s=m.generation_tokens_per_s,
            ttft_p99_ms=m.ttft_p99_ms if m.HasField("ttft_p99_ms") else None,
            gpu_mem_used_bytes=m.gpu_mem_used_bytes, gpu_mem_total_bytes=m.gpu_mem_total_bytes, healthy=m.healthy,
            queue_p95_ms=m.queue_p95_ms if m.HasField("queue_p95_ms") else None,
            unknown=unknown_fields(m.unknown),
        )
        for m in batch.samples
    )
    reports = tuple(InstanceReport(InstanceId(r.instance_id), r.event, r.at_ms + shift_ms, r.detail) for r in batch.reports)
    gateway = tuple((DeploymentId(g.deployment_id), g.waiting) for g in batch.gateway)
    caches = ((ClusterId(batch.cluster_id), tuple(batch.model_cache.models)),) if batch.HasField("model_cache") else ()
    gpu: tuple[tuple[ClusterId, GpuReport], ...] = ()
    if batch.HasField("gpu_memory"):
        g = batch.gpu_memory
        # A peer's negative or inconsistent bytes offer nothing (never more than they say).
        units = tuple(sorted(
            (GpuUnit(u.node, u.unit, max(0, min(u.free_bytes, u.total_bytes)), max(0, u.total_bytes), u.pool, u.problem)
             for u in g.units), key=lambda u: (u.node, u.unit)))
        gpu = ((ClusterId(batch.cluster_id), GpuReport(g.at_ms + shift_ms, units)),)
    return Observations(batch.at_ms + shift_ms, samples, reports, gateway, caches, gpu)
