"""The Kubernetes backend's vocabulary: its configuration (:class:`WorkloadConfig`,
:class:`KubernetesConfig`), the annotations and labels it writes, and :class:`PodInfo`, what it reads
of a pod. Split from :mod:`adapters.kubernetes` (which re-exports every name) so that the backend and
its drains (:mod:`adapters.kube_drain`) share one definition.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.engines import DriverAddress, EngineDriver, build_driver
from adapters.engines import entry as engine_entry
from adapters.gpu_report import GpuReportConfig
from adapters.model_cache import ModelCacheConfig
from controlplane.domain.engines import Engine
from controlplane.domain.errors import Unavailable
from controlplane.domain.ids import deployment_id_problem

log = structlog.get_logger("adapters.kubernetes")

FENCE_EPOCH = "controlplane.io/fence-epoch"
FENCE_HOLDER = "controlplane.io/fence-holder"
PENDING_INSTANCES = "controlplane.io/pending-instances"
INSTANCE_ID = "controlplane.io/instance-id"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SERVING_LABEL = "controlplane.io/serving"
"""Pod label the engine's Service selects on (``"true"``); a drain sets it to ``"false"`` so the
EndpointSlice controller stops routing to the pod. Never part of the workload's own selector."""
DRAINED_INSTANCES = "controlplane.io/drained-instances"
"""Workload annotation: the last :data:`MAX_DRAINED` drained instance ids whose replica the adapter
removed, written in the same conditional patch as ``spec.replicas``: a repeated shrink is a no-op."""
MAX_DRAINED = 64
DRAIN_DEADLINE = "controlplane.io/drain-deadline-ms"
"""Pod annotation: the drain's deadline (wall-clock ms), so a restarted adapter resumes the drain."""
VICTIM_COST = str(-(2**31))
"""The lowest int32: the ReplicaSet controller deletes this pod before any other of equal rank."""

MAX_PENDING = 256
"""Most instance ids waiting for a pod per workload (the annotation must stay small)."""
JOIN_TIMEOUT_S = 5.0
"""Bound on joining a watch thread in :meth:`KubernetesBackend.close`."""
WATCH_RETRY_CAP_MS = 5_000
FAILED_WAITING_REASONS = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull",
                                    "CreateContainerConfigError", "InvalidImageName"})


# -- configuration ------------------------------------------------------------------------------------
class WorkloadConfig(BaseModel):
    """One controlplane deployment served by one Kubernetes workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(min_length=1, description="controlplane deployment id: '<tenant>/<name>' for one created "
                            "through the API (names are per tenant), or a legacy / scenario id (one label)")
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kind: Literal["Deployment", "StatefulSet"]
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    engine: Engine
    port: int = Field(ge=1, le=65535, description="engine HTTP port")
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="Triton default 8002")
    model: str | None = Field(default=None, min_length=1, description="Triton model / MII deployment name")
    grpc_port: int = Field(default=50050, ge=1, le=65535, description="DeepSpeed-MII load-balancer port")
    meter_port: int | None = Field(default=None, ge=1, le=65535,
                                   description="DeepSpeed-MII: the pod's mii-meter sidecar (adapters/mii_meter.py)")

    @field_validator("deployment")
    @classmethod
    def _deployment_id(cls, value: str) -> str:
        problem = deployment_id_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _engine_fields(self) -> WorkloadConfig:
        e = engine_entry(self.engine)
        if e.model_required and not self.model:
            raise ValueError(f"model: required for engine {self.engine.value}")
        if self.meter_port is not None and self.engine is not Engine.DEEPSPEED_MII:
            raise ValueError(f"meter_port: only for engine deepspeed-mii, not {self.engine.value}")
        if self.metrics_port is None and e.default_metrics_port is not None:
            object.__setattr__(self, "metrics_port", e.default_metrics_port)
        return self

    def address(self, host: str, timeout_s: float) -> DriverAddress:
        """Where this workload's engine listens in the pod at ``host``."""
        return DriverAddress(base_url=f"http://{host}:{self.port}", timeout_s=timeout_s, model=self.model,
                             metrics_url=None if self.metrics_port is None else f"http://{host}:{self.metrics_port}",
                             grpc_address=f"{host}:{self.grpc_port}",
                             meter_url=None if self.meter_port is None else f"http://{host}:{self.meter_port}")


class KubernetesConfig(BaseModel):
    """The ``kubernetes:`` section of the adapter configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = Field(default=None, description="kubeconfig path; None = in-cluster config")
    context: str | None = None
    workloads: list[WorkloadConfig] = Field(min_length=1)
    conflict_retries: int = Field(default=5, ge=0, le=100)
    conflict_backoff_ms: int = Field(default=50, ge=1, le=10_000)
    conflict_backoff_cap_ms: int = Field(default=1_000, ge=1, le=60_000)
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    watch_timeout_s: int = Field(default=60, ge=1, le=3600, description="server-side watch timeout")
    engine_timeout_s: float = Field(default=2.0, gt=0, le=60)
    model_cache: ModelCacheConfig | None = Field(
        default=None, description="report the node-local model cache (adapters/model_cache.py); None: do not")
    gpu_memory: GpuReportConfig | None = Field(
        default=None, description="report the gpu-agent nodes' GPU memory (adapters/gpu_report.py); None: do not")

    @model_validator(mode="after")
    def _unique(self) -> KubernetesConfig:
        ids = [w.deployment for w in self.workloads]
        if len(set(ids)) != len(ids):
            raise ValueError("workloads: deployment ids must be unique")
        objects = [(w.namespace, w.kind, w.name) for w in self.workloads]
        if len(set(objects)) != len(objects):
            raise ValueError("workloads: two deployments map to the same Kubernetes object")
        if self.conflict_backoff_ms > self.conflict_backoff_cap_ms:
            raise ValueError("conflict_backoff_ms: must not exceed conflict_backoff_cap_ms")
        return self


# -- pods ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the backend needs of one pod, read from the API object."""

    name: str
    resource_version: str
    ip: str | None
    phase: str
    ready: bool
    waiting_reason: str | None
    instance_id: str | None
    deleting: bool
    created: str
    ordinal: int | None
    uid: str = ""
    serving: bool = True
    """The pod carries ``controlplane.io/serving=true`` (or no such label): its Service routes to it."""
    drain_deadline_ms: int | None = None
    """``controlplane.io/drain-deadline-ms``: the adapter is draining it (``adapters/kube_drain.py``)."""

    @property
    def failed(self) -> bool:
        return self.phase == "Failed" or self.waiting_reason in FAILED_WAITING_REASONS

    @property
    def live(self) -> bool:
        return not self.deleting and self.phase not in ("Failed", "Succeeded")


def pod_info(pod: k8s.V1Pod, kind: str) -> PodInfo:
    meta, status = pod.metadata, pod.status
    annotations = (meta.annotations if meta else None) or {}
    labels = (meta.labels if meta else None) or {}
    conditions = (status.conditions if status else None) or []
    waiting = None
    for cs in (status.container_statuses if status else None) or []:
        if cs.state is not None and cs.state.waiting is not None and cs.state.waiting.reason:
            waiting = cs.state.waiting.reason
    name = meta.name or ""
    ordinal = None
    if kind == "StatefulSet" and name.rsplit("-", 1)[-1].isdigit():
        ordinal = int(name.rsplit("-", 1)[-1])
    return PodInfo(
        name=name, resource_version=meta.resource_version or "", ip=status.pod_ip if status else None,
        phase=(status.phase if status else None) or "Pending",
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        waiting_reason=waiting, instance_id=annotations.get(INSTANCE_ID) or None,
        deleting=meta.deletion_timestamp is not None,
        created=str(meta.creation_timestamp or ""), ordinal=ordinal, uid=meta.uid or "",
        serving=labels.get(SERVING_LABEL, "true") != "false",
        drain_deadline_ms=_int_or_none(annotations.get(DRAIN_DEADLINE)),
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


# -- engines ------------------------------------------------------------------------------------------
DriverFactory = Callable[[WorkloadConfig, PodInfo], EngineDriver]
"""Builds the engine driver (:class:`~adapters.engines.EngineDriver`) for one pod."""


def default_driver_factory(timeout_s: float) -> DriverFactory:
    """Drivers from the engine registry, addressed by pod IP and the workload's ports."""

    def build(workload: WorkloadConfig, pod: PodInfo) -> EngineDriver:
        if not pod.ip:
            raise Unavailable(f"pod {pod.name} has no IP yet")
        return build_driver(workload.engine, workload.address(pod.ip, timeout_s))

    return build


def parse_pending(text: str | None) -> tuple[str, ...]:
    """A JSON-list-of-ids annotation (pending instances, drained instances); anything unreadable counts as empty."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        log.warning("kubernetes.pending_unreadable", value=text[:200])
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else ()
