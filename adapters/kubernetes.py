"""The Kubernetes backend of the per-cluster adapter: instances are pods of a Deployment or StatefulSet.

Why it looks the way it does (``docs/adapters-kubernetes.md`` has the tables):

* **The cluster is the shared store, so fencing happens there too.** Two adapter processes for one
  cluster each pass their local :class:`~adapters.service.FencingGuard`; only a precondition on a
  shared object decides between them. Before every write that changes replicas (or marks victim
  pods) the backend writes ``controlplane.io/fence-epoch`` / ``fence-holder`` on the workload object
  with a ``metadata.resourceVersion`` precondition, refusing with :class:`StaleEpoch` when the
  annotation holds a higher epoch (or the same epoch of another holder), and then replaces the Scale
  with the resourceVersion that patch returned. Whoever writes the fence later makes every earlier
  writer's scale fail with 409; the earlier writer re-reads, sees the newer epoch and gives up.
* **Instance ids live in the cluster, not in memory.** ``create`` records the id in
  ``controlplane.io/pending-instances`` (same conditional patch as the fence) and raises replicas;
  when an unbound pod of the workload appears it is bound with the pod annotation
  ``controlplane.io/instance-id`` (conditional on the pod's resourceVersion), and the id leaves the
  pending list (conditional on the workload's resourceVersion). Whoever removes the id from the
  pending list owns the binding; a loser reverts its pod annotation. A restarted adapter rebuilds
  everything from annotations.
* **Scale-down picks victims through the controllers' own rules**: Deployments honour
  ``controller.kubernetes.io/pod-deletion-cost`` (best effort, ReplicaSet only); StatefulSets always
  remove the highest ordinals, so a victim elsewhere swaps its instance id with an *interchangeable*
  pod among the highest ordinals (same lifecycle phase and readiness), else the command is refused
  with :class:`OrdinalConflict`.
* **Pods are watched, not polled**: one thread per workload lists once, then watches from the list's
  resourceVersion (re-listing on 410 Gone), keeps a pod cache and turns pod changes into lifecycle
  reports. Engine readiness and samples come from the engine drivers in :meth:`observe`.

Every library error is translated at the boundary: 409 after ``conflict_retries`` ->
:class:`~controlplane.domain.errors.Unavailable` naming the object; 404 -> ``NotFound``; other API
and connection errors -> ``Unavailable``.
"""

from __future__ import annotations

import enum
import functools
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from urllib3.exceptions import HTTPError as Urllib3Error

from adapters.backend import MAX_REPLICAS, FenceToken, InstanceCommand, ScaleCommand
from adapters.deepspeed_mii import MiiDriver
from adapters.engine_http import WarmPathUnavailable
from adapters.model_cache import ModelCacheConfig, NodeCacheReader
from adapters.triton import TritonDriver
from adapters.vllm import VllmDriver
from controlplane.core.backoff import backoff_ms
from controlplane.domain.errors import (
    Conflict,
    ControlPlaneError,
    Forbidden,
    NotFound,
    QueueFull,
    StaleEpoch,
    Unavailable,
    ValidationError,
)
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, deployment_id_problem
from controlplane.domain.start_tiers import VLLM_SLEEP_LEVEL
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.runtime.clock import wall_ms
from raft.lease import check_fence

__all__ = [
    "DELETION_COST", "FENCE_EPOCH", "FENCE_HOLDER", "INSTANCE_ID", "PENDING_INSTANCES", "DriverFactory",
    "KubernetesBackend", "KubernetesConfig", "OrdinalConflict", "PodInfo", "WorkloadConfig",
    "default_driver_factory",
]

log = structlog.get_logger("adapters.kubernetes")

FENCE_EPOCH = "controlplane.io/fence-epoch"
FENCE_HOLDER = "controlplane.io/fence-holder"
PENDING_INSTANCES = "controlplane.io/pending-instances"
INSTANCE_ID = "controlplane.io/instance-id"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
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
    engine: Literal["vllm", "triton", "deepspeed-mii"]
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
        if self.engine in ("triton", "deepspeed-mii") and not self.model:
            raise ValueError(f"model: required for engine {self.engine}")
        if self.meter_port is not None and self.engine != "deepspeed-mii":
            raise ValueError(f"meter_port: only for engine deepspeed-mii, not {self.engine}")
        if self.engine == "triton" and self.metrics_port is None:
            object.__setattr__(self, "metrics_port", 8002)
        return self


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

    @property
    def failed(self) -> bool:
        return self.phase == "Failed" or self.waiting_reason in FAILED_WAITING_REASONS

    @property
    def live(self) -> bool:
        return not self.deleting and self.phase not in ("Failed", "Succeeded")


def pod_info(pod: k8s.V1Pod, kind: str) -> PodInfo:
    meta, status = pod.metadata, pod.status
    annotations = (meta.annotations if meta else None) or {}
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
        created=str(meta.creation_timestamp or ""), ordinal=ordinal,
    )


# -- engines ------------------------------------------------------------------------------------------
class Driver(Protocol):
    def sample(self, instance_id: InstanceId, deployment: DeploymentId, now_ms: int) -> InstanceSample: ...


DriverFactory = Callable[[WorkloadConfig, PodInfo], Any]
"""Builds the engine driver (VllmDriver / TritonDriver / MiiDriver) for one pod."""


def default_driver_factory(timeout_s: float) -> DriverFactory:
    """Drivers addressed by pod IP and the configured ports."""

    def build(workload: WorkloadConfig, pod: PodInfo) -> Any:
        if not pod.ip:
            raise Unavailable(f"pod {pod.name} has no IP yet")
        base = f"http://{pod.ip}:{workload.port}"
        if workload.engine == "vllm":
            return VllmDriver(base, timeout_s)
        if workload.engine == "triton":
            assert workload.model is not None and workload.metrics_port is not None  # config validator
            return TritonDriver(base, f"http://{pod.ip}:{workload.metrics_port}", workload.model, timeout_s)
        meter = f"http://{pod.ip}:{workload.meter_port}" if workload.meter_port is not None else None
        return MiiDriver(f"{base}/mii/{workload.model}", f"{pod.ip}:{workload.grpc_port}", timeout_s, meter_url=meter)

    return build


def engine_ready(engine: str, driver: Any) -> bool:
    if engine == "vllm":
        return bool(driver.health())
    if engine == "triton":
        return bool(driver.model_ready())
    return bool(driver.ready())


def engine_sleep(engine: str, driver: Any, level: int = VLLM_SLEEP_LEVEL) -> None:
    """The warm path down: vLLM ``POST /sleep?level=<level>`` (the product's
    ``start_tiers.VLLM_SLEEP_LEVEL``), Triton an explicit model unload. Raises
    :class:`WarmPathUnavailable` when the server refuses it (vLLM without dev mode), and
    :class:`ValidationError` for DeepSpeed-MII, which has no sleep at all (the coordinators never
    ask: their state refuses to put one to sleep)."""
    if engine == "vllm":
        driver.sleep(level=level, mode="wait")
    elif engine == "triton":
        driver.unload_model()
    else:
        raise ValidationError("action", f"engine {engine} has no sleep mode (its only warm path is a restart "
                                        "from the node's model cache); drain the instance instead")


def engine_wake(engine: str, driver: Any) -> None:
    """vLLM ``POST /wake_up``, Triton an explicit model load; DeepSpeed-MII: see :func:`engine_sleep`."""
    if engine == "vllm":
        driver.wake_up()
    elif engine == "triton":
        driver.load_model()
    else:
        raise ValidationError("action", f"engine {engine} has no sleep mode, so nothing to wake")


# -- instance tracking ----------------------------------------------------------------------------------
class Phase(enum.Enum):
    WARMING = "warming"
    SERVING = "serving"
    SLEEPING = "sleeping"
    HOT_STANDBY = "hot_standby"
    """Asked to sleep, but the engine has no warm path: kept loaded (the pod keeps its GPUs anyway)."""
    REMOVING = "removing"
    GONE = "gone"


@dataclass(slots=True)
class _Instance:
    instance_id: str
    pod: str
    phase: Phase


@dataclass(slots=True)
class _Workload:
    cfg: WorkloadConfig
    selector: str = ""
    pods: dict[str, PodInfo] = field(default_factory=dict)
    thread: threading.Thread | None = None
    watch: k8s_watch.Watch | None = None


class UnexpectedAnswer(Unavailable):
    """The Kubernetes API answered with a body the client or the backend could not use (not JSON, the
    wrong shape, a required field missing: a broken proxy or another API version). Temporary: the
    next call may get a proper answer; nothing is assumed from this one."""


_MALFORMED = (AttributeError, TypeError, KeyError, IndexError, ValueError, UnicodeDecodeError)
"""What the client's deserializer and our reads of its objects raise on a malformed answer."""


def _typed(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Public backend methods raise the control plane's errors only: a malformed answer of the
    apiserver (whatever the client made of it) becomes :class:`UnexpectedAnswer`, logged once."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def typed(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except ControlPlaneError:
                raise
            except _MALFORMED as exc:
                log.error("kubernetes.unexpected_answer", during=what, error=f"{type(exc).__name__}: {exc}")
                raise UnexpectedAnswer(f"Kubernetes API: unexpected answer during {what}: "
                                       f"{type(exc).__name__}: {str(exc)[:200]}") from exc

        return typed

    return wrap


class OrdinalConflict(Conflict):
    """A StatefulSet victim cannot be moved onto a removed (highest) ordinal."""

    def __init__(self, workload: str, instance_id: str, reason: str) -> None:
        super().__init__(f"statefulset {workload}: cannot remove instance {instance_id}: {reason}")
        self.workload = workload
        self.instance_id = instance_id
        self.reason = reason


@dataclass(slots=True)
class Statistics:
    lists: int = 0
    watch_streams: int = 0
    gone: int = 0
    watch_errors: int = 0
    conflicts: int = 0
    bindings: int = 0
    binding_races_lost: int = 0
    swaps: int = 0


@dataclass(frozen=True, slots=True)
class _Fenced:
    """The workload object after the fence patch: what the scale replace is conditional on."""

    resource_version: str
    replicas: int
    """spec.replicas before this write."""
    target: int | None
    """spec.replicas this write sets (None: unchanged)."""
    pending: tuple[str, ...]
    dropped: tuple[str, ...] = ()
    """Pending ids this write removed (cancelled before a pod was bound to them)."""


class KubernetesBackend:
    """:class:`~adapters.backend.Backend` over one cluster's Deployments / StatefulSets.

    ``api_client`` is injected (tests point it at the fake apiserver); :meth:`from_config` builds one
    from a kubeconfig or the in-cluster service account. :meth:`start` lists pods and starts the watch
    threads (called lazily by the first command or observation); :meth:`close` stops them.
    """

    def __init__(self, config: KubernetesConfig, api_client: k8s.ApiClient, *,
                 driver_factory: DriverFactory | None = None, rng: random.Random | None = None,
                 sleep_s: Callable[[float], None] = time.sleep,
                 clock_ms: Callable[[], int] = wall_ms, cluster_id: str = "") -> None:
        """``cluster_id``: the cluster this backend serves, which its model-cache report names."""
        self.config = config
        self._cluster_id = ClusterId(cluster_id)
        self._api = api_client
        self._apps = k8s.AppsV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._driver_factory = driver_factory or default_driver_factory(config.engine_timeout_s)
        self._rng = rng or random.Random()
        self._sleep_s = sleep_s
        self._clock_ms = clock_ms
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._started = False
        self._workloads = {DeploymentId(w.deployment): _Workload(w) for w in config.workloads}
        self._instances: dict[str, dict[str, _Instance]] = {d: {} for d in self._workloads}
        self._drivers: dict[tuple[str, str], Any] = {}
        self._reports: list[InstanceReport] = []
        self._warm_path_logged: set[str] = set()
        self._stats = Statistics()
        self._cache = None if config.model_cache is None else NodeCacheReader(
            self._core, config.model_cache, clock_ms, config.request_timeout_s)

    @classmethod
    def from_config(cls, config: KubernetesConfig, **kwargs: Any) -> KubernetesBackend:
        """Client from ``config.kubeconfig`` (and ``context``), or in-cluster when no kubeconfig is set."""
        if config.kubeconfig is not None:
            api = k8s_config.new_client_from_config(config_file=str(config.kubeconfig), context=config.context)
        else:
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            api = k8s.ApiClient(configuration)
        return cls(config, api, **kwargs)

    # -- lifecycle ----------------------------------------------------------------------------------
    @_typed("start")
    def start(self) -> KubernetesBackend:
        """Read each workload's selector, list its pods, then watch them in a background thread."""
        with self._lock:
            if self._started:
                return self
            for deployment, wl in self._workloads.items():
                scale = self._call(wl, "read scale", self._read_scale, wl.cfg)
                wl.selector = scale.status.selector or ""
                if not wl.selector:
                    raise ValidationError(f"workloads[{wl.cfg.deployment}]", "the workload's Scale has no selector")
                rv = self._relist(deployment, wl)
                wl.thread = threading.Thread(target=self._watch_loop, args=(deployment, wl, rv),
                                             name=f"kube-watch-{wl.cfg.name}", daemon=True)
            self._started = True
        for wl in self._workloads.values():
            assert wl.thread is not None
            wl.thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        for wl in self._workloads.values():
            if wl.watch is not None:
                wl.watch.stop()
        for wl in self._workloads.values():
            if wl.thread is not None and wl.thread is not threading.current_thread():
                wl.thread.join(timeout=JOIN_TIMEOUT_S)

    def statistics(self) -> dict[str, int]:
        with self._lock:
            s = self._stats
            return {"lists": s.lists, "watch_streams": s.watch_streams, "gone": s.gone,
                    "watch_errors": s.watch_errors, "conflicts": s.conflicts, "bindings": s.bindings,
                    "binding_races_lost": s.binding_races_lost, "swaps": s.swaps}

    # -- Backend --------------------------------------------------------------------------------------
    @_typed("apply")
    def apply(self, command: InstanceCommand, now_ms: int) -> None:
        self.start()
        deployment = DeploymentId(command.instance.deployment_id)
        wl = self._workload(deployment)
        iid = command.instance.instance_id
        with self._lock:
            if command.action == "create":
                self._create(deployment, wl, iid, command.fence)
            elif command.action == "sleep":
                self._sleep(deployment, wl, iid)
            elif command.action == "wake":
                self._wake(deployment, wl, iid, now_ms)
            elif command.action in ("drain", "cancel", "terminate"):
                self._remove(deployment, wl, (iid,), None, command.fence)
            else:
                raise ValidationError("action", f"unknown action {command.action!r}")

    @_typed("scale")
    def scale(self, command: ScaleCommand, now_ms: int) -> None:
        self.start()
        if not 0 <= command.replicas <= MAX_REPLICAS:
            raise ValidationError("replicas", f"must be between 0 and {MAX_REPLICAS}, got {command.replicas}")
        deployment = DeploymentId(command.deployment_id)
        wl = self._workload(deployment)
        with self._lock:
            self._remove(deployment, wl, command.victims, command.replicas, command.fence)

    @_typed("observe")
    def observe(self, now_ms: int) -> Observations:
        self.start()
        self._confirm_warm(now_ms)
        samples = self._samples(now_ms)
        with self._lock:
            reports, self._reports = tuple(self._reports), []
        models = None if self._cache is None else self._cache.models()
        caches = () if models is None else ((self._cluster_id, models),)
        return Observations(at_ms=now_ms, samples=samples, reports=reports, model_caches=caches)

    # -- commands -------------------------------------------------------------------------------------
    def _workload(self, deployment: DeploymentId) -> _Workload:
        wl = self._workloads.get(deployment)
        if wl is None:
            raise NotFound("deployment", deployment)
        return wl

    def _create(self, deployment: DeploymentId, wl: _Workload, iid: str, fence: FenceToken) -> None:
        if iid in self._instances[deployment]:
            self._fenced_write(wl, fence, lambda pending: pending, lambda current, old, new: None)
            return
        surplus = sum(1 for p in wl.pods.values() if p.live and p.instance_id is None)

        def add(pending: tuple[str, ...]) -> tuple[str, ...]:
            if iid in pending:
                return pending
            if len(pending) >= MAX_PENDING:
                raise QueueFull(f"{wl.cfg.kind} {wl.cfg.namespace}/{wl.cfg.name}: {MAX_PENDING} instances pending")
            return (*pending, iid)

        def replicas(current: int, old: tuple[str, ...], new: tuple[str, ...]) -> int | None:
            if iid in old:
                return None  # a repeated create: already counted
            return None if surplus > len(old) else current + 1

        self._fenced_write(wl, fence, add, replicas)
        log.info("kubernetes.create", deployment=deployment, instance=iid, adopt_existing_pod=surplus > 0)
        self._bind_pending(deployment, wl)

    def _sleep(self, deployment: DeploymentId, wl: _Workload, iid: str) -> None:
        inst = self._tracked(deployment, iid)
        if inst.phase in (Phase.SLEEPING, Phase.HOT_STANDBY):
            return
        try:
            engine_sleep(wl.cfg.engine, self._driver(wl, inst.pod))
            inst.phase = Phase.SLEEPING
        except WarmPathUnavailable as exc:
            inst.phase = Phase.HOT_STANDBY
            if iid not in self._warm_path_logged:
                self._warm_path_logged.add(iid)
                log.warning("warm_path_unavailable", deployment=deployment, instance=iid, pod=inst.pod,
                            engine=wl.cfg.engine, reason=str(exc), fallback="hot_standby")

    def _wake(self, deployment: DeploymentId, wl: _Workload, iid: str, now_ms: int) -> None:
        inst = self._tracked(deployment, iid)
        if inst.phase is Phase.HOT_STANDBY:
            inst.phase = Phase.SERVING
            self._report(iid, "warmed", now_ms, "hot standby: engine never slept")
        elif inst.phase is Phase.SLEEPING:
            engine_wake(wl.cfg.engine, self._driver(wl, inst.pod))
            inst.phase = Phase.WARMING  # observe() reports warmed once the engine answers ready

    def _tracked(self, deployment: DeploymentId, iid: str) -> _Instance:
        inst = self._instances[deployment].get(iid)
        if inst is None or inst.phase in (Phase.GONE, Phase.REMOVING):
            raise NotFound("instance", iid)
        return inst

    def _remove(self, deployment: DeploymentId, wl: _Workload, victims: Sequence[str], replicas: int | None,
                fence: FenceToken) -> None:
        """Lower replicas so that exactly ``victims`` go (or set ``replicas`` for a ScaleCommand)."""
        tracked = self._instances[deployment]
        bound = [v for v in victims if v in tracked and tracked[v].phase is not Phase.GONE]
        fresh = [v for v in bound if tracked[v].phase is not Phase.REMOVING]
        others = [v for v in victims if v not in tracked]
        victim_pods = [tracked[v].pod for v in fresh]

        def drop(pending: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(p for p in pending if p not in others)

        def target(current: int, old: tuple[str, ...], new: tuple[str, ...]) -> int | None:
            if replicas is not None:
                return replicas
            gone = len(fresh) + len(old) - len(new)
            return max(0, current - gone) if gone else None

        def mark(fenced: _Fenced) -> None:
            if wl.cfg.kind == "StatefulSet":
                self._statefulset_victims(deployment, wl, fresh, fenced)
            else:
                self._mark_victims(wl, victim_pods + self._unbound_victims(wl, len(fenced.dropped)))
            for v in fresh:
                tracked[v].phase = Phase.REMOVING

        self._fenced_write(wl, fence, drop, target, mark)
        log.info("kubernetes.remove", deployment=deployment, victims=list(victims), replicas=replicas)

    def _unbound_victims(self, wl: _Workload, cancels: int) -> list[str]:
        """For cancelled pending ids: the newest unbound pods (they would have been bound to the ids)."""
        unbound = sorted((p for p in wl.pods.values() if p.live and p.instance_id is None),
                         key=lambda p: p.created, reverse=True)
        return [p.name for p in unbound[:cancels]]

    def _mark_victims(self, wl: _Workload, pods: Iterable[str]) -> None:
        for name in pods:
            body = {"metadata": {"annotations": {DELETION_COST: VICTIM_COST}}}
            self._call(wl, f"annotate victim pod {name}", self._core.patch_namespaced_pod, name,
                       wl.cfg.namespace, body, _request_timeout=self.config.request_timeout_s)

    # -- StatefulSet victims ----------------------------------------------------------------------------
    def _statefulset_victims(self, deployment: DeploymentId, wl: _Workload, victims: Sequence[str],
                             fenced: _Fenced) -> None:
        """Make the victims occupy the ordinals a shrink removes, swapping ids with interchangeable pods.

        Kubernetes removes ordinals ``[new_replicas, replicas)``; a victim elsewhere swaps its instance
        id with a non-victim pod among those ordinals that is in the same phase and readiness. Refuses
        with :class:`OrdinalConflict` when no such partner exists."""
        tracked = self._instances[deployment]
        new_replicas = fenced.replicas if fenced.target is None else fenced.target
        removed = [p for p in wl.pods.values() if p.ordinal is not None and p.ordinal >= new_replicas and p.live]
        partners = [p for p in sorted(removed, key=lambda p: p.ordinal or 0)
                    if p.instance_id is not None and p.instance_id not in victims]
        plan: list[tuple[PodInfo, PodInfo]] = []
        for iid in victims:
            pod = wl.pods.get(tracked[iid].pod)
            if pod is None or (pod.ordinal is not None and pod.ordinal >= new_replicas):
                continue
            partner = next((p for p in partners if self._interchangeable(deployment, pod, p)), None)
            if partner is None:
                raise OrdinalConflict(wl.cfg.name, iid, f"Kubernetes removes the highest ordinals "
                                      f">= {new_replicas}; pod {pod.name} is not among them and no pod there is in "
                                      "the same phase and readiness to swap instance ids with")
            partners.remove(partner)
            plan.append((pod, partner))
        if partners:
            raise OrdinalConflict(wl.cfg.name, partners[0].instance_id or "", f"lowering replicas to {new_replicas} "
                                  f"would remove pod {partners[0].name}, which is not a victim")
        for pod, partner in plan:
            self._swap(deployment, wl, pod, partner)

    def _interchangeable(self, deployment: DeploymentId, a: PodInfo, b: PodInfo) -> bool:
        tracked = self._instances[deployment]
        ia, ib = tracked.get(a.instance_id or ""), tracked.get(b.instance_id or "")
        return ia is not None and ib is not None and ia.phase is ib.phase and a.ready == b.ready

    def _swap(self, deployment: DeploymentId, wl: _Workload, low: PodInfo, high: PodInfo) -> None:
        """Victim on ``low``, partner on ``high``: the victim's id moves to ``high`` and vice versa."""
        tracked = self._instances[deployment]
        victim, partner = tracked[low.instance_id or ""], tracked[high.instance_id or ""]
        victim.pod, partner.pod = high.name, low.name
        for pod, iid in ((high, victim.instance_id), (low, partner.instance_id)):
            body = {"metadata": {"resourceVersion": pod.resource_version, "annotations": {INSTANCE_ID: iid}}}
            self._call(wl, f"swap instance id on pod {pod.name}", self._core.patch_namespaced_pod, pod.name,
                       wl.cfg.namespace, body, _request_timeout=self.config.request_timeout_s)
        self._stats.swaps += 1
        log.info("kubernetes.ordinal_swap", deployment=deployment, victim=victim.instance_id, to_pod=high.name,
                 partner=partner.instance_id, partner_pod=low.name)

    # -- the fenced write -------------------------------------------------------------------------------
    def _fenced_write(self, wl: _Workload, fence: FenceToken,
                      pending_fn: Callable[[tuple[str, ...]], tuple[str, ...]],
                      replicas_fn: Callable[[int, tuple[str, ...], tuple[str, ...]], int | None],
                      before_scale: Callable[[_Fenced], None] | None = None) -> None:
        """Fence annotation (conditional patch), then victims, then the Scale (conditional replace).

        On 409 the whole sequence starts over from a fresh read, so the epoch is re-checked each time.
        """
        for attempt in range(self.config.conflict_retries + 1):
            obj = self._call(wl, "read", self._read_workload, wl.cfg)
            annotations = obj.metadata.annotations or {}
            self._check_fence(wl, annotations, fence)
            pending = parse_pending(annotations.get(PENDING_INSTANCES))
            new_pending = pending_fn(pending)
            current = int(obj.spec.replicas if obj.spec.replicas is not None else 1)
            target = replicas_fn(current, pending, new_pending)
            try:
                fenced = self._patch_fence(wl, obj.metadata.resource_version, fence, new_pending, current, target)
                fenced = _Fenced(fenced.resource_version, current, target, new_pending,
                                 tuple(p for p in pending if p not in new_pending))
                if before_scale is not None:
                    before_scale(fenced)
                if target is not None and target != current:
                    self._replace_scale(wl, fenced.resource_version, target)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise _translate(exc, wl, "fenced write") from exc
                self._stats.conflicts += 1
                log.info("kubernetes.conflict", workload=wl.cfg.name, attempt=attempt, epoch=fence.epoch)
                if attempt < self.config.conflict_retries:
                    delay = backoff_ms(attempt, self.config.conflict_backoff_ms,
                                       self.config.conflict_backoff_cap_ms, self._rng)
                    self._sleep_s(delay / 1000.0)
        raise Unavailable(f"{wl.cfg.kind} {wl.cfg.namespace}/{wl.cfg.name}: still conflicting (409) after "
                          f"{self.config.conflict_retries + 1} attempts")

    def _check_fence(self, wl: _Workload, annotations: dict[str, str], fence: FenceToken) -> None:
        try:
            stored = int(annotations.get(FENCE_EPOCH, "0"))
        except ValueError:
            stored = 0
        verdict = check_fence(stored, annotations.get(FENCE_HOLDER, ""), fence.epoch, fence.holder)
        if not verdict.accepted:
            log.warning("kubernetes.stale_epoch", workload=wl.cfg.name, epoch=fence.epoch, stored=stored,
                        reason=verdict.reason)
            raise StaleEpoch(fence.epoch, stored)

    def _patch_fence(self, wl: _Workload, rv: str | None, fence: FenceToken, pending: tuple[str, ...],
                     replicas: int, target: int | None) -> _Fenced:
        body = {"metadata": {"resourceVersion": rv, "annotations": {
            FENCE_EPOCH: str(fence.epoch), FENCE_HOLDER: fence.holder,
            PENDING_INSTANCES: json.dumps(list(pending), separators=(",", ":"))}}}
        patch = self._apps.patch_namespaced_deployment if wl.cfg.kind == "Deployment" \
            else self._apps.patch_namespaced_stateful_set
        obj = patch(wl.cfg.name, wl.cfg.namespace, body, _content_type="application/merge-patch+json",
                    _request_timeout=self.config.request_timeout_s)
        return _Fenced(obj.metadata.resource_version or "", replicas, target, pending)

    def _replace_scale(self, wl: _Workload, rv: str, replicas: int) -> None:
        scale = k8s.V1Scale(metadata=k8s.V1ObjectMeta(name=wl.cfg.name, namespace=wl.cfg.namespace,
                                                       resource_version=rv),
                            spec=k8s.V1ScaleSpec(replicas=replicas))
        replace = self._apps.replace_namespaced_deployment_scale if wl.cfg.kind == "Deployment" \
            else self._apps.replace_namespaced_stateful_set_scale
        replace(wl.cfg.name, wl.cfg.namespace, scale, _request_timeout=self.config.request_timeout_s)

    def _read_workload(self, cfg: WorkloadConfig) -> Any:
        read = self._apps.read_namespaced_deployment if cfg.kind == "Deployment" \
            else self._apps.read_namespaced_stateful_set
        return read(cfg.name, cfg.namespace, _request_timeout=self.config.request_timeout_s)

    def _read_scale(self, cfg: WorkloadConfig) -> k8s.V1Scale:
        read = self._apps.read_namespaced_deployment_scale if cfg.kind == "Deployment" \
            else self._apps.read_namespaced_stateful_set_scale
        return read(cfg.name, cfg.namespace, _request_timeout=self.config.request_timeout_s)

    def _call(self, wl: _Workload, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise _translate(exc, wl, what) from exc
        except (Urllib3Error, OSError) as exc:
            raise Unavailable(f"Kubernetes API unreachable ({what} {wl.cfg.namespace}/{wl.cfg.name}): {exc}") \
                from exc

    # -- binding pods to instance ids ---------------------------------------------------------------------
    def _bind_pending(self, deployment: DeploymentId, wl: _Workload) -> None:
        """Bind unbound live pods to pending ids, oldest pod (lowest ordinal) to oldest id."""
        free = sorted((p for p in wl.pods.values() if p.live and not p.failed and p.instance_id is None),
                      key=lambda p: (p.ordinal if p.ordinal is not None else 0, p.created, p.name))
        if not free:
            return
        obj = self._call(wl, "read", self._read_workload, wl.cfg)
        pending = parse_pending((obj.metadata.annotations or {}).get(PENDING_INSTANCES))
        for pod, iid in zip(free, pending, strict=False):
            self._bind(deployment, wl, pod, iid)

    def _bind(self, deployment: DeploymentId, wl: _Workload, pod: PodInfo, iid: str) -> None:
        body = {"metadata": {"resourceVersion": pod.resource_version, "annotations": {INSTANCE_ID: iid}}}
        try:
            patched = self._core.patch_namespaced_pod(pod.name, wl.cfg.namespace, body,
                                                      _request_timeout=self.config.request_timeout_s)
        except ApiException as exc:
            if exc.status in (404, 409):
                return  # the pod changed or went away; the next event retries
            raise _translate(exc, wl, f"bind pod {pod.name}") from exc
        if not self._claim_pending(wl, iid):
            self._stats.binding_races_lost += 1
            revert = {"metadata": {"resourceVersion": patched.metadata.resource_version,
                                   "annotations": {INSTANCE_ID: None}}}
            self._call(wl, f"unbind pod {pod.name}", self._core.patch_namespaced_pod, pod.name, wl.cfg.namespace,
                       revert, _request_timeout=self.config.request_timeout_s)
            return
        bound = pod_info(patched, wl.cfg.kind)
        wl.pods[pod.name] = bound
        self._track_new(deployment, wl, bound, report_start=True)
        self._stats.bindings += 1
        log.info("kubernetes.bound", deployment=deployment, instance=iid, pod=pod.name)

    def _claim_pending(self, wl: _Workload, iid: str) -> bool:
        """Remove ``iid`` from the pending annotation (conditional); False when it was no longer there."""
        for _ in range(self.config.conflict_retries + 1):
            obj = self._call(wl, "read", self._read_workload, wl.cfg)
            pending = parse_pending((obj.metadata.annotations or {}).get(PENDING_INSTANCES))
            if iid not in pending:
                return False
            body = {"metadata": {"resourceVersion": obj.metadata.resource_version, "annotations": {
                PENDING_INSTANCES: json.dumps([p for p in pending if p != iid], separators=(",", ":"))}}}
            patch = self._apps.patch_namespaced_deployment if wl.cfg.kind == "Deployment" \
                else self._apps.patch_namespaced_stateful_set
            try:
                patch(wl.cfg.name, wl.cfg.namespace, body, _content_type="application/merge-patch+json",
                      _request_timeout=self.config.request_timeout_s)
                return True
            except ApiException as exc:
                if exc.status != 409:
                    raise _translate(exc, wl, "claim pending instance") from exc
                self._stats.conflicts += 1
        raise Unavailable(f"{wl.cfg.kind} {wl.cfg.namespace}/{wl.cfg.name}: could not claim pending {iid}")

    def _track_new(self, deployment: DeploymentId, wl: _Workload, pod: PodInfo, *, report_start: bool) -> None:
        """Start tracking the instance bound to ``pod``. A binding found after a restart is adopted
        without repeating ``start_warmup``: a ready pod counts as serving, otherwise warming."""
        iid = pod.instance_id
        assert iid is not None
        if report_start:
            self._instances[deployment][iid] = _Instance(iid, pod.name, Phase.WARMING)
            self._report(iid, "start_warmup", self._clock_ms(), f"pod {pod.name}")
        else:
            phase = Phase.SERVING if pod.ready else Phase.WARMING
            self._instances[deployment][iid] = _Instance(iid, pod.name, phase)
            log.info("kubernetes.adopted", deployment=deployment, instance=iid, pod=pod.name, phase=phase.value)

    # -- watching pods ------------------------------------------------------------------------------------
    def _relist(self, deployment: DeploymentId, wl: _Workload) -> str:
        pods = self._call(wl, "list pods", self._core.list_namespaced_pod, wl.cfg.namespace,
                          label_selector=wl.selector, _request_timeout=self.config.request_timeout_s)
        with self._lock:
            self._stats.lists += 1
            wl.pods = {p.name: p for p in (pod_info(item, wl.cfg.kind) for item in pods.items)}
            self._pods_changed(deployment, wl)
        return str(pods.metadata.resource_version)

    def _watch_loop(self, deployment: DeploymentId, wl: _Workload, rv: str | None) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist(deployment, wl)
                rv = self._watch_once(deployment, wl, rv)
                attempt = 0
            except ApiException as exc:
                with self._lock:
                    if exc.status == 410:
                        self._stats.gone += 1
                    else:
                        self._stats.watch_errors += 1
                log.info("kubernetes.watch_restart", workload=wl.cfg.name, status=exc.status, relist=True)
                rv = None
                if exc.status != 410:
                    attempt = self._watch_backoff(attempt)
            except (ControlPlaneError, Urllib3Error, OSError, ValueError) as exc:
                with self._lock:
                    self._stats.watch_errors += 1
                log.warning("kubernetes.watch_error", workload=wl.cfg.name, error=str(exc))
                rv = None
                attempt = self._watch_backoff(attempt)

    def _watch_backoff(self, attempt: int) -> int:
        self._stop.wait(backoff_ms(attempt, 100, WATCH_RETRY_CAP_MS, self._rng) / 1000.0)
        return attempt + 1

    def _watch_once(self, deployment: DeploymentId, wl: _Workload, rv: str) -> str:
        """One watch stream from ``rv``; returns the last resourceVersion seen."""
        w = k8s_watch.Watch()
        wl.watch = w
        with self._lock:
            self._stats.watch_streams += 1
        try:
            if self._stop.is_set():
                return rv
            stream = w.stream(self._core.list_namespaced_pod, wl.cfg.namespace, label_selector=wl.selector,
                              resource_version=rv, timeout_seconds=self.config.watch_timeout_s,
                              _request_timeout=self.config.watch_timeout_s + self.config.request_timeout_s)
            for event in stream:
                if self._stop.is_set():
                    w.stop()
                    break
                pod = event["object"]
                rv = pod.metadata.resource_version or rv
                with self._lock:
                    info = pod_info(pod, wl.cfg.kind)
                    if event["type"] == "DELETED":
                        wl.pods.pop(info.name, None)
                    else:
                        wl.pods[info.name] = info
                    self._pods_changed(deployment, wl)
        finally:
            wl.watch = None
        return rv

    def _pods_changed(self, deployment: DeploymentId, wl: _Workload) -> None:
        """Pod cache changed (caller holds the lock): reports, adoption, binding. Never raises."""
        now_ms = self._clock_ms()
        tracked = self._instances[deployment]
        for inst in list(tracked.values()):
            self._pod_to_report(deployment, wl, inst, now_ms)
        for pod in list(wl.pods.values()):
            if pod.instance_id and pod.instance_id not in tracked and pod.live:
                self._track_new(deployment, wl, pod, report_start=False)
        try:
            self._bind_pending(deployment, wl)
        except ControlPlaneError as exc:
            log.warning("kubernetes.bind_failed", workload=wl.cfg.name, error=str(exc))

    def _pod_to_report(self, deployment: DeploymentId, wl: _Workload, inst: _Instance, now_ms: int) -> None:
        if inst.phase is Phase.GONE:
            return
        pod = wl.pods.get(inst.pod)
        if pod is not None and pod.instance_id not in (None, inst.instance_id):
            return  # an ordinal swap is in flight; the pod's own event settles it
        if pod is None or pod.deleting:
            event = "drained" if inst.phase is Phase.REMOVING else "lost"
            if pod is None or inst.phase is not Phase.REMOVING:
                self._finish(inst, event, now_ms, f"pod {inst.pod} {'deleted' if pod is None else 'terminating'}")
                self._drivers.pop((deployment, inst.pod), None)
            return
        if inst.phase is Phase.WARMING and pod.failed:
            self._finish(inst, "warmup_failed", now_ms, f"pod {pod.name}: {pod.waiting_reason or pod.phase}")
        elif inst.phase in (Phase.SERVING, Phase.SLEEPING, Phase.HOT_STANDBY) and pod.phase in ("Failed", "Unknown"):
            self._finish(inst, "lost", now_ms, f"pod {pod.name} phase {pod.phase}")

    def _finish(self, inst: _Instance, event: str, now_ms: int, detail: str) -> None:
        inst.phase = Phase.GONE
        self._report(inst.instance_id, event, now_ms, detail)

    def _report(self, iid: str, event: str, at_ms: int, detail: str = "") -> None:
        self._reports.append(InstanceReport(InstanceId(iid), event, at_ms, detail))
        log.info("kubernetes.report", instance=iid, event_name=event, detail=detail)

    # -- engines ------------------------------------------------------------------------------------------
    def _driver(self, wl: _Workload, pod_name: str) -> Any:
        key = (wl.cfg.deployment, pod_name)
        driver = self._drivers.get(key)
        if driver is None:
            pod = wl.pods.get(pod_name)
            if pod is None:
                raise Unavailable(f"pod {pod_name} is not in the cache")
            driver = self._driver_factory(wl.cfg, pod)
            self._drivers[key] = driver
        return driver

    def _snapshot(self, phase: Phase, need_ready: bool) -> list[tuple[DeploymentId, _Workload, str, Any]]:
        out = []
        with self._lock:
            for deployment, wl in self._workloads.items():
                for inst in self._instances[deployment].values():
                    pod = wl.pods.get(inst.pod)
                    if inst.phase is not phase or pod is None or (need_ready and not pod.ready):
                        continue
                    try:
                        out.append((deployment, wl, inst.instance_id, self._driver(wl, inst.pod)))
                    except ControlPlaneError as exc:
                        log.warning("kubernetes.driver_unavailable", instance=inst.instance_id, error=str(exc))
        return out

    def _confirm_warm(self, now_ms: int) -> None:
        """Warming instances whose pod is Ready and whose engine answers ready -> ``warmed``."""
        for deployment, wl, iid, driver in self._snapshot(Phase.WARMING, need_ready=True):
            try:
                ok = engine_ready(wl.cfg.engine, driver)
            except ControlPlaneError as exc:
                log.info("kubernetes.engine_not_ready", instance=iid, error=str(exc))
                continue
            with self._lock:
                inst = self._instances[deployment].get(iid)
                if ok and inst is not None and inst.phase is Phase.WARMING:
                    inst.phase = Phase.SERVING
                    self._report(iid, "warmed", now_ms, f"pod {inst.pod} ready")

    def _samples(self, now_ms: int) -> tuple[InstanceSample, ...]:
        out = []
        for deployment, _wl, iid, driver in self._snapshot(Phase.SERVING, need_ready=True):
            try:
                out.append(driver.sample(InstanceId(iid), deployment, now_ms))
            except Exception as exc:  # noqa: BLE001 - one bad engine must never break the observation pump
                log.warning("kubernetes.sample_failed", instance=iid, error=str(exc))
                out.append(_unhealthy(iid, deployment, now_ms))
        # A serving pod that is not Ready now (readiness probe failing, container restarting) still
        # exists: name it, unhealthy and idle, so that the coordinator does not take its silence for
        # a vanished instance (docs/lifecycle.md, "Instances an adapter stops reporting") and leave
        # the pod orphaned; Kubernetes' own probes restart a wedged engine.
        with self._lock:
            for deployment, wl in self._workloads.items():
                for inst in self._instances[deployment].values():
                    pod = wl.pods.get(inst.pod)
                    if inst.phase is Phase.SERVING and pod is not None and not pod.ready:
                        out.append(_unhealthy(inst.instance_id, deployment, now_ms))
        return tuple(out)


def _unhealthy(iid: str, deployment: DeploymentId, now_ms: int) -> InstanceSample:
    return InstanceSample(InstanceId(iid), deployment, now_ms, running=0, waiting=0, kv_usage=0.0,
                          prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0, healthy=False)


def parse_pending(text: str | None) -> tuple[str, ...]:
    """The pending-instances annotation (a JSON list of ids); anything unreadable counts as empty."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        log.warning("kubernetes.pending_unreadable", value=text[:200])
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _translate(exc: ApiException, wl: _Workload, what: str) -> ControlPlaneError:
    where = f"{wl.cfg.kind} {wl.cfg.namespace}/{wl.cfg.name} ({what})"
    if exc.status == 404:
        return NotFound(wl.cfg.kind.lower(), f"{wl.cfg.namespace}/{wl.cfg.name}")
    if exc.status == 403:
        return Forbidden(f"{where}: {exc.reason}")
    if exc.status in (400, 415, 422):
        return ValidationError(what, f"{where}: HTTP {exc.status} {exc.reason}")
    if exc.status == 409:
        return Unavailable(f"{where}: conflict (409)")
    return Unavailable(f"{where}: HTTP {exc.status} {exc.reason}")
