"""Drains that really drain, for the Kubernetes backend (:mod:`adapters.kubernetes`).

A ``drain`` command (``adapters/backend.py``: stop routing, let in-flight requests finish or abort
them at ``deadline_ms``, then remove) runs in three steps:

1. **Stop routing, at once.** The pod's ``controlplane.io/serving`` label is patched to ``"false"``
   (and its deadline recorded in the ``controlplane.io/drain-deadline-ms`` annotation) after the
   usual fence write on the workload, so a stale coordinator cannot start a drain. The engine's
   Service selects ``controlplane.io/serving: "true"``, so the EndpointSlice controller drops the
   pod from the Service's endpoints; the workload's own selector never names the label (checked at
   :meth:`~adapters.kubernetes.KubernetesBackend.start`: a ReplicaSet whose selector stopped matching
   would orphan the pod and start a replacement). Why a label and not a readiness gate or endpoint
   removal: it needs no controller of ours (a readiness gate needs ``pods/status`` writes and keeps
   the pod "not ready" for every other reader; hand-written EndpointSlices fight the controller).
2. **Wait, without blocking.** Each observation interval :meth:`Drainer.due` hands the backend at
   most :data:`MAX_CHECKS_PER_OBSERVE` drains (least recently checked first); for each, one bounded
   :meth:`~adapters.engines.EngineDriver.in_flight` call (the engine timeout) decides
   (:func:`drain_reason`): 0 -> done (``in_flight_zero``); past the deadline -> done (``deadline``),
   without asking the engine; ``None`` (the engine cannot tell: MII without its meter, Triton without TensorRT-LLM
   gauges) or an engine error -> wait for the deadline. A pod gone or terminating early (someone
   else deleted it, the node died) -> done (``pod_gone``).
3. **Remove.** Deployment: the pod is deleted with a ``preconditions.uid`` (only the pod that was
   drained, never a namesake), after a fence write, then replicas go down by one so the ReplicaSet
   does not keep the replacement it may have started: one conditional patch of the workload writes
   the fence, ``spec.replicas`` and the id into ``controlplane.io/drained-instances`` together, so a
   retry never lowers replicas twice for one drain; a pod gone already skips the delete. StatefulSet: the drain started by moving the instance onto the highest ordinal
   (the ordinal swap of ``docs/adapters-kubernetes.md``), and ends by lowering replicas by one when
   its pod is the highest live ordinal (a drain lower down waits for the ones above it). ``drained``
   is reported once the pod is gone.

Structlog events: ``kubernetes.drain_started`` (instance, pod, deadline_ms), ``kubernetes.drain_done``
(reason ``in_flight_zero`` | ``deadline`` | ``pod_gone``, in_flight, waited_ms),
``kubernetes.drain_waiting`` (no fence token yet after a restart), ``kubernetes.drain_blocked``.

Idempotent and restartable: a repeated ``drain`` keeps the first deadline (and takes a newer fence);
a restarted adapter finds ``serving=false`` + the deadline annotation on the pod and resumes the
drain, using the fence of the next command it receives for that deployment.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from adapters.backend import FenceToken
from adapters.engines import EngineDriver
from adapters.kube_model import (
    DRAIN_DEADLINE,
    DRAINED_INSTANCES,
    FENCE_EPOCH,
    FENCE_HOLDER,
    MAX_DRAINED,
    SERVING_LABEL,
    PodInfo,
    parse_pending,
)
from controlplane.domain.errors import ControlPlaneError, Unavailable, ValidationError

__all__ = ["MAX_CHECKS_PER_OBSERVE", "Drain", "DrainReason", "Drainer", "check_selector", "drain_reason"]

log = structlog.get_logger("adapters.kubernetes")

MAX_CHECKS_PER_OBSERVE = 8
"""Most engine ``in_flight`` calls one observation makes (each bounded by the engine timeout)."""


class DrainReason(enum.Enum):
    IN_FLIGHT_ZERO = "in_flight_zero"
    DEADLINE = "deadline"
    POD_GONE = "pod_gone"


@dataclass(slots=True)
class Drain:
    instance_id: str
    deployment: str
    pod: str
    pod_uid: str
    deadline_ms: int
    started_ms: int
    fence: FenceToken | None
    """None after a restart until a command for the deployment brings one."""
    checked_ms: int = -1
    in_flight: int | None = None
    pod_deleted: bool = False
    """The delete was accepted (or the pod was gone): only the replicas are left to lower."""
    blocked_logged: bool = False
    waiting_logged: bool = False


def drain_reason(now_ms: int, deadline_ms: int, pod_present: bool,
                 in_flight: Callable[[], int | None]) -> tuple[DrainReason | None, int | None]:
    """Whether a drain is done, and why; ``in_flight`` is asked only when the answer depends on it."""
    if not pod_present:
        return DrainReason.POD_GONE, None
    if now_ms >= deadline_ms:
        return DrainReason.DEADLINE, None
    count = in_flight()
    return (DrainReason.IN_FLIGHT_ZERO if count == 0 else None), count


def check_selector(workload: str, selector: str) -> None:
    """The workload's own selector must not name the serving label (a drained pod would be orphaned)."""
    if any(term.split("=")[0].strip() == SERVING_LABEL for term in selector.split(",")):
        raise ValidationError(f"workloads[{workload}]", f"the workload's selector {selector!r} names {SERVING_LABEL}: "
                                                        "only the engine's Service may select on it")


FencedWrite = Callable[..., None]
"""``KubernetesBackend._fenced_write(wl, fence, pending_fn, replicas_fn, before_scale)``."""
Translate = Callable[[ApiException, Any, str], ControlPlaneError]


class Drainer:
    """The drains of one backend. Called with the backend's lock held, except :meth:`check`, which
    makes the engine call and must not hold it."""

    def __init__(self, core: k8s.CoreV1Api, apps: k8s.AppsV1Api, request_timeout_s: float, conflict_retries: int,
                 fenced_write: FencedWrite, read: Callable[[Any], Any], check_fence: Callable[[Any, dict[str, str],
                                                                                                FenceToken], None],
                 translate: Translate) -> None:
        """``read(wl)`` reads the workload object; ``check_fence(wl, annotations, fence)`` raises
        ``StaleEpoch``; both are the backend's own."""
        self._core = core
        self._apps = apps
        self._timeout_s = request_timeout_s
        self._retries = conflict_retries
        self._fenced_write = fenced_write
        self._read = read
        self._check_fence = check_fence
        self._translate = translate
        self._drains: dict[str, Drain] = {}
        self._fences: dict[str, FenceToken] = {}

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._drains

    def get(self, instance_id: str) -> Drain | None:
        return self._drains.get(instance_id)

    def saw_fence(self, deployment: str, fence: FenceToken) -> None:
        """Any command's fence: what an adopted drain (after a restart) writes with."""
        known = self._fences.get(deployment)
        if known is None or fence.epoch >= known.epoch:
            self._fences[deployment] = fence

    # -- step 1 ---------------------------------------------------------------------------------
    def begin(self, wl: Any, instance_id: str, pod: PodInfo, deadline_ms: int, fence: FenceToken, now_ms: int,
              before: Callable[[Any], PodInfo] | None = None) -> Drain:
        """Fence write, then (``before``: the StatefulSet ordinal swap, which returns the pod to
        drain) the label patch. A repeated drain keeps its first deadline and takes a newer fence."""
        known = self._drains.get(instance_id)
        if known is not None:
            if known.fence is None or fence.epoch >= known.fence.epoch:
                known.fence = fence
            return known
        drained = [pod]

        def unroute(fenced: Any) -> None:
            if before is not None:
                drained[0] = before(fenced)
            self._patch(wl, drained[0].name, {"metadata": {"labels": {SERVING_LABEL: "false"},
                                                           "annotations": {DRAIN_DEADLINE: str(deadline_ms)}}})

        self._fenced_write(wl, fence, lambda pending: pending, lambda current, old, new: None, unroute)
        target = drained[0]
        drain = Drain(instance_id, wl.cfg.deployment, target.name, target.uid, deadline_ms, now_ms, fence)
        self._drains[instance_id] = drain
        log.info("kubernetes.drain_started", deployment=drain.deployment, instance=instance_id, pod=target.name,
                 deadline_ms=deadline_ms, in_ms=max(0, deadline_ms - now_ms))
        return drain

    def adopt(self, deployment: str, instance_id: str, pod: PodInfo, now_ms: int) -> bool:
        """A pod found draining after a restart: resume its drain (True) from the annotations."""
        if pod.serving or pod.drain_deadline_ms is None or instance_id in self._drains:
            return instance_id in self._drains
        self._drains[instance_id] = Drain(instance_id, deployment, pod.name, pod.uid, pod.drain_deadline_ms, now_ms,
                                          None)
        log.info("kubernetes.drain_adopted", deployment=deployment, instance=instance_id, pod=pod.name,
                 deadline_ms=pod.drain_deadline_ms)
        return True

    # -- step 2 ---------------------------------------------------------------------------------
    def due(self, now_ms: int) -> list[Drain]:
        """The drains to look at in this observation: least recently checked first, at most
        :data:`MAX_CHECKS_PER_OBSERVE` of those that would ask their engine (past-deadline ones and
        finished ones needing a retry cost no engine call and always come)."""
        ordered = sorted(self._drains.values(), key=lambda d: (d.checked_ms, d.started_ms, d.instance_id))
        free = [d for d in ordered if d.pod_deleted or now_ms >= d.deadline_ms]
        asking = [d for d in ordered if d not in free][:MAX_CHECKS_PER_OBSERVE]
        return free + asking

    def check(self, drain: Drain, pod_present: bool, driver: EngineDriver | None, now_ms: int) -> DrainReason | None:
        """One bounded look (no lock held): the engine is asked at most once."""

        def ask() -> int | None:
            if driver is None:
                return None
            try:
                return driver.in_flight()
            except ControlPlaneError as exc:  # cannot tell now: wait for the deadline
                log.info("kubernetes.drain_in_flight_unknown", instance=drain.instance_id, error=str(exc))
                return None

        reason, count = drain_reason(now_ms, drain.deadline_ms, pod_present and not drain.pod_deleted, ask)
        drain.checked_ms, drain.in_flight = now_ms, count
        return reason

    # -- step 3 ---------------------------------------------------------------------------------
    def fence_of(self, drain: Drain) -> FenceToken | None:
        seen = self._fences.get(drain.deployment)
        if drain.fence is None or (seen is not None and seen.epoch > drain.fence.epoch):
            drain.fence = seen
        if drain.fence is None and not drain.waiting_logged:
            drain.waiting_logged = True
            log.info("kubernetes.drain_waiting", instance=drain.instance_id, pod=drain.pod,
                     why="no fence token since the restart: waiting for a command for this deployment")
        return drain.fence

    def delete_and_shrink(self, wl: Any, drain: Drain, fence: FenceToken) -> None:
        """Deployment: delete the drained pod (uid precondition) after a fence write, then lower
        replicas by one. Safe to repeat after a failure anywhere (see :meth:`_shrink`)."""
        if not drain.pod_deleted:
            self._fenced_write(wl, fence, lambda pending: pending, lambda current, old, new: None,
                               lambda fenced: self._delete(wl, drain))
            drain.pod_deleted = True
        self._shrink(wl, drain, fence)

    def _shrink(self, wl: Any, drain: Drain, fence: FenceToken) -> None:
        """One conditional merge patch of the workload (``metadata.resourceVersion`` precondition)
        writing the fence, ``spec.replicas - 1`` and the instance id into ``drained-instances``
        together: a retry after a lost answer finds the id and does nothing, so replicas never go
        down twice for one drain; a newer fence written meanwhile makes it 409 and re-read."""
        patch = self._apps.patch_namespaced_deployment
        for _ in range(self._retries + 1):
            obj = self._read(wl)
            annotations = obj.metadata.annotations or {}
            self._check_fence(wl, annotations, fence)
            done = parse_pending(annotations.get(DRAINED_INSTANCES))
            if drain.instance_id in done:
                return
            current = int(obj.spec.replicas if obj.spec.replicas is not None else 1)
            body = {"metadata": {"resourceVersion": obj.metadata.resource_version, "annotations": {
                FENCE_EPOCH: str(fence.epoch), FENCE_HOLDER: fence.holder,
                DRAINED_INSTANCES: json.dumps([*done, drain.instance_id][-MAX_DRAINED:], separators=(",", ":"))}},
                "spec": {"replicas": max(0, current - 1)}}
            try:
                patch(wl.cfg.name, wl.cfg.namespace, body, _content_type="application/merge-patch+json",
                      _request_timeout=self._timeout_s)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise self._translate(exc, wl, f"shrink after drain of {drain.instance_id}") from exc
            except (Urllib3Error, OSError) as exc:
                raise Unavailable(f"Kubernetes API unreachable (shrink {wl.cfg.name}): {exc}") from exc
        raise Unavailable(f"{wl.cfg.kind} {wl.cfg.namespace}/{wl.cfg.name}: still conflicting (409) lowering "
                          f"replicas after the drain of {drain.instance_id}")

    def blocked(self, drain: Drain, why: str) -> None:
        if not drain.blocked_logged:
            drain.blocked_logged = True
            log.warning("kubernetes.drain_blocked", instance=drain.instance_id, pod=drain.pod, why=why)

    def done(self, drain: Drain, reason: DrainReason, now_ms: int) -> None:
        self._drains.pop(drain.instance_id, None)
        log.info("kubernetes.drain_done", deployment=drain.deployment, instance=drain.instance_id, pod=drain.pod,
                 reason=reason.value, in_flight=drain.in_flight, waited_ms=max(0, now_ms - drain.started_ms))

    def forget(self, instance_id: str) -> None:
        """A ``terminate`` overtook the drain: the pod goes now, by the ordinary removal."""
        self._drains.pop(instance_id, None)

    # -- API calls ------------------------------------------------------------------------------
    def _patch(self, wl: Any, pod: str, body: dict[str, Any]) -> None:
        try:
            self._core.patch_namespaced_pod(pod, wl.cfg.namespace, body, _request_timeout=self._timeout_s)
        except ApiException as exc:
            if exc.status != 404:  # gone already: the next step finds the pod gone
                raise self._translate(exc, wl, f"unroute pod {pod}") from exc
        except (Urllib3Error, OSError) as exc:
            raise Unavailable(f"Kubernetes API unreachable (unroute pod {pod}): {exc}") from exc

    def _delete(self, wl: Any, drain: Drain) -> None:
        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=drain.pod_uid or None))
        try:
            self._core.delete_namespaced_pod(drain.pod, wl.cfg.namespace, body=options,
                                             _request_timeout=self._timeout_s)
        except ApiException as exc:
            if exc.status not in (404, 409):  # 404 gone; 409 precondition: a namesake, ours is gone
                raise self._translate(exc, wl, f"delete drained pod {drain.pod}") from exc
        except (Urllib3Error, OSError) as exc:
            raise Unavailable(f"Kubernetes API unreachable (delete pod {drain.pod}): {exc}") from exc
