"""A strict fake Kubernetes API server for the paths and verbs the Kubernetes backend uses
(``shared/design/CONTRACTS.md`` section 4), served over real HTTP on 127.0.0.1 so the official
``kubernetes`` 37.0.2 client talks to it unchanged (``Configuration(host="http://127.0.0.1:PORT")``).

Why our own: no real ``kube-apiserver`` can run here (kwok/envtest download binaries), and the
Python fakes on PyPI lack resourceVersion optimistic concurrency, which is exactly what fencing relies on.

What it reproduces:

* Routes: ``GET|PUT .../apis/apps/v1/namespaces/{ns}/{deployments|statefulsets}/{name}/scale``,
  ``GET|PATCH .../{deployments|statefulsets}/{name}``, ``GET /api/v1/namespaces/{ns}/pods`` (list with
  ``labelSelector``; ``watch=true`` streams newline-delimited JSON events in chunked encoding),
  ``GET|PATCH|DELETE .../pods/{name}``, ``PATCH .../pods/{name}/status``, and coordination Leases
  (``POST .../leases``, ``GET|PUT .../leases/{name}``). Anything else: 404 (unknown path) or 405.
* One global integer ``resourceVersion`` counter; every write bumps the written object's version.
  ``PUT`` whose ``metadata.resourceVersion`` differs -> 409 Status (``errors.NewConflict`` message);
  ``PATCH`` is unconditional unless the patched object still carries a ``metadata.resourceVersion``
  that differs (i.e. the body set one) -> 409. Creating an existing Lease -> 409 ``AlreadyExists``.
* Patch content types: ``application/strategic-merge-patch+json`` and ``application/merge-patch+json``
  (both RFC 7386 merge here: our patches only touch maps), ``application/json-patch+json`` (RFC 6902
  add/remove/replace/test), anything else -> 415. A PUT without Content-Type is read as JSON.
* Scale responses always carry ``status.replicas`` and the string ``status.selector``; the Scale's
  resourceVersion is its parent's.
* ``controller.kubernetes.io/pod-deletion-cost`` must be an int32 string -> otherwise 422 Invalid.
* ``DELETE`` honours ``DeleteOptions.preconditions`` (``uid``, ``resourceVersion``): a mismatch is a 409
  Conflict "Precondition failed: UID in precondition: ..." as the apiserver answers.
* Pods get the workload's *template* labels; a pod whose labels stop matching the workload's selector
  is released (orphaned) and replaced, as the real controllers do. :meth:`FakeKubeApiServer.endpoints`
  is what the EndpointSlice controller would publish for a Service selector (matching, Ready, with an
  IP, not terminating).
* Lease ``acquireTime``/``renewTime`` are MicroTime: exactly 6 fractional digits and a zone -> else 400.
* Watch: ``resourceVersion`` absent or "0" -> synthetic ADDED events for the current objects first;
  older than the compaction floor (:meth:`compact`) -> a 200 stream with one ERROR event carrying a
  410 ``Expired`` Status, as the real apiserver does; ``timeoutSeconds`` ends the stream.

The "controller" (deterministic, run after every write): Deployments get pods ``{name}-{5 chars}``
and delete surplus pods in a faithful subset of ``ActivePodsWithRanks`` (Pending < Running, not
ready < ready, lower ``pod-deletion-cost`` first, newer first); StatefulSets (``Parallel`` pod
management) get ``{name}-{ordinal}`` and lose the highest ordinals first. New pods are Pending;
tests move them with :meth:`FakeKubeApiServer.set_pod_ready`, :meth:`fail_pod`, :meth:`delete_pod`.

Fault hooks: :meth:`inject_conflicts` (the next n writes answer 409), :meth:`fail_next` (the next
request(s) answer a given status), :meth:`on_request` (run a callback before a matching request is
served, once: how tests force an interleaving), :meth:`compact` + :meth:`break_watches` (410 Gone).

Threads: one ``serve_forever`` thread plus one daemon thread per connection (HTTP/1.1 keep-alive);
watch streams wait on the store's condition and end on timeout, :meth:`break_watches` or :meth:`stop`.
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from tests.fakes.base import FakeHttpServer, Listener, http_factory

__all__ = ["FakeKubeApiServer", "status_body"]

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MICROTIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json")
UNSUPPORTED_MEDIA = ("the body of the request was in an unknown format - accepted media types include: "
                     "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, "
                     "application/strategic-merge-patch+json")
WORKLOAD_RESOURCES = {"deployments": "Deployment", "statefulsets": "StatefulSet"}
GROUP_OF = {"deployments": "apps", "statefulsets": "apps", "pods": "", "leases": "coordination.k8s.io"}
INT32 = (-(2**31), 2**31 - 1)

Key = tuple[str, str, str]
"""(resource plural, namespace, name)."""


class ApiError(Exception):
    """An HTTP error answer with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``meta/v1`` Status failure body as the apiserver writes it."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason}
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _qualified(resource: str) -> str:
    group = GROUP_OF[resource]
    return f"{resource}.{group}" if group else resource


def _details(resource: str, name: str) -> dict[str, Any]:
    group = GROUP_OF[resource]
    return {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(resource)} "{name}" not found', _details(resource, name))


def conflict(resource: str, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again", _details(resource, name))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- patches ------------------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 add / remove / replace / test on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch body must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            doc = _json_patch_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}") \
                from exc
    return doc


def _json_patch_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if not parts:
        if kind == "test":
            if doc != op["value"]:
                raise ValueError("test failed")
            return doc
        return copy.deepcopy(op["value"])
    parent, last = _parent(doc, parts), parts[-1]
    if kind == "test":
        current = parent[int(last)] if isinstance(parent, list) else parent[last]
        if current != op["value"]:
            raise ValueError(f"testing value {op['path']} failed")
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    elif kind in ("add", "replace"):
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            else:
                parent[index] = copy.deepcopy(op["value"])
        else:
            if kind == "replace" and last not in parent:
                raise KeyError(f"replace operation does not apply: doc is missing key {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"unsupported json patch op {kind!r}")
    return doc


# -- label selectors ----------------------------------------------------------------------------------
def parse_selector(text: str) -> dict[str, str]:
    """Equality-based selector ``a=b,c==d`` (the only form the backend sends)."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep or "!" in key:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        out[key.strip()] = value.strip()
    return out


def matches(labels: dict[str, str] | None, selector: dict[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def selector_string(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


# -- the store ------------------------------------------------------------------------------------------
@dataclass
class _Hook:
    method: str
    path_re: re.Pattern[str]
    callback: Callable[[], None]


@dataclass
class _Fault:
    status: int
    count: int
    method: str | None
    path_contains: str | None


@dataclass
class _Event:
    rv: int
    type: str
    obj: dict[str, Any]


@dataclass
class Store:
    """Objects by (resource, namespace, name), the pod event log, and the global resourceVersion."""

    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    rv: int = 100
    floor: int = 0
    """Watches from a resourceVersion below this answer 410 Gone."""
    watch_epoch: int = 0
    """Bumped by :meth:`FakeKubeApiServer.break_watches`: open watch streams end."""
    created: int = 0

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv


class FakeKubeApiServer:
    """The fake apiserver. ``start()`` / ``stop()`` (or ``with``); ``host`` for ``Configuration(host=...)``."""

    def __init__(self, *, seed: int = 0, auto_reconcile: bool = True) -> None:
        self.cond = threading.Condition()
        self.store = Store()
        self.auto_reconcile = auto_reconcile
        self.requests: list[tuple[str, str, str]] = []
        """(method, path with query, content type) of every request served."""
        self._rng = random.Random(seed)
        self._conflicts = 0
        self._faults: list[_Fault] = []
        self._hooks: list[_Hook] = []
        self._stopping = False
        self._listener = Listener(http_factory(_Server, _Handler, self), "fake-kube-apiserver")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Self:
        self._listener.listen()
        return self

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._listener.port}"

    # -- fault hooks ------------------------------------------------------------------------------
    def inject_conflicts(self, n: int) -> None:
        """The next ``n`` PUT/PATCH requests answer 409 Conflict (as if someone wrote first)."""
        with self.cond:
            self._conflicts += n

    def fail_next(self, status: int, count: int = 1, *, method: str | None = None,
                  path_contains: str | None = None) -> None:
        """The next ``count`` matching requests answer ``status`` with a Status body."""
        with self.cond:
            self._faults.append(_Fault(status, count, method, path_contains))

    def on_request(self, method: str, path_regex: str, callback: Callable[[], None]) -> None:
        """Run ``callback`` (outside the store lock) once, before the next matching request is served."""
        with self.cond:
            self._hooks.append(_Hook(method, re.compile(path_regex), callback))

    def compact(self) -> None:
        """Forget the event history: watches from any older resourceVersion get 410 Gone."""
        with self.cond:
            self.store.floor = self.store.next_rv()
            self.store.events.clear()

    def break_watches(self) -> None:
        """End every open watch stream (clients re-watch from their last resourceVersion)."""
        with self.cond:
            self.store.watch_epoch += 1
            self.cond.notify_all()

    def open_watches(self) -> int:
        return sum(1 for m, p, _ in self.requests if m == "GET" and "watch=true" in p)

    # -- objects for tests ----------------------------------------------------------------------
    def add_workload(self, kind: str, namespace: str, name: str, *, replicas: int = 0,
                     labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
                     template_labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a Deployment or StatefulSet (tests create workloads directly, as an operator would).
        ``labels`` are the selector; the pod template carries them plus ``template_labels``."""
        resource = "deployments" if kind == "Deployment" else "statefulsets"
        labels = labels or {"app": name}
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                                "generation": 1, "creationTimestamp": _now(), "labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        obj = {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
               "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                        "template": {"metadata": {"labels": {**(template_labels or {}), **labels}},
                                     "spec": {"containers": [{"name": "engine", "image": "engine:test"}]}}},
               "status": {"replicas": 0}}
        if kind == "StatefulSet":
            obj["spec"]["serviceName"] = name
            obj["spec"]["podManagementPolicy"] = "Parallel"
        with self.cond:
            self._write(resource, namespace, name, obj)
            self._reconcile_locked(resource, namespace, name)
            return copy.deepcopy(self.store.objects[(resource, namespace, name)])

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            obj = self.store.objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def pods(self, namespace: str, selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Pods of a namespace matching ``selector``, oldest first."""
        with self.cond:
            out = [copy.deepcopy(o) for (r, ns, _), o in self.store.objects.items()
                   if r == "pods" and ns == namespace and matches(o["metadata"].get("labels"), selector or {})]
        return sorted(out, key=lambda p: p["metadata"].get("x-created", 0))

    def pod_names(self, namespace: str, selector: dict[str, str] | None = None) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods(namespace, selector)]

    def endpoints(self, namespace: str, service_selector: dict[str, str]) -> list[str]:
        """The pods a Service with ``service_selector`` routes to, as the EndpointSlice controller
        computes them: labels match, the pod has an IP, is Ready and not terminating."""
        return [p["metadata"]["name"] for p in self.pods(namespace, service_selector)
                if _pod_ready(p) and p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")]

    def put_configmap(self, namespace: str, name: str, data: dict[str, str],
                      labels: dict[str, str] | None = None) -> None:
        """Create or replace a ConfigMap (what the model-cache DaemonSet's pods write)."""
        with self.cond:
            old = self.store.objects.get(("configmaps", namespace, name))
            meta = {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                    "uid": old["metadata"]["uid"] if old else str(uuid.uuid4()),
                    "creationTimestamp": old["metadata"]["creationTimestamp"] if old else _now()}
            self._write("configmaps", namespace, name, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                                                        "data": dict(data)})

    def delete_configmap(self, namespace: str, name: str) -> None:
        with self.cond:
            self._delete_locked("configmaps", namespace, name)

    def list_configmaps(self, namespace: str, selector: dict[str, str], limit: int | None = None) -> dict[str, Any]:
        with self.cond:
            items = [_public(o) for (r, ns, _), o in sorted(self.store.objects.items())
                     if r == "configmaps" and ns == namespace and matches(o["metadata"].get("labels"), selector)]
            meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
            if limit is not None and len(items) > limit:
                items, meta["continue"] = items[:limit], "more"
            return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": items}

    def set_pod_ready(self, namespace: str, name: str, ready: bool = True, *, ip: str | None = None) -> None:
        """Kubelet: the pod runs; its containers are (not) ready."""
        def change(pod: dict[str, Any]) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = "Running"
            status["podIP"] = ip or status.get("podIP") or f"10.0.0.{self._rng.randint(2, 250)}"
            flag = "True" if ready else "False"
            status["conditions"] = [{"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}]
            status["containerStatuses"] = [self._container_status(ready, running=True)]
        self._mutate_pod(namespace, name, change)

    def fail_pod(self, namespace: str, name: str, *, waiting_reason: str | None = None) -> None:
        """Kubelet: phase Failed, or (``waiting_reason``) a container stuck waiting (CrashLoopBackOff...)."""
        def change(pod: dict[str, Any]) -> None:
            status = pod.setdefault("status", {})
            status["conditions"] = [{"type": "Ready", "status": "False"}]
            if waiting_reason is None:
                status["phase"] = "Failed"
                status["containerStatuses"] = [self._container_status(False, running=False)]
            else:
                cs = self._container_status(False, running=False)
                cs["state"] = {"waiting": {"reason": waiting_reason, "message": "back-off"}}
                status["containerStatuses"] = [cs]
        self._mutate_pod(namespace, name, change)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        def change(pod: dict[str, Any]) -> None:
            pod.setdefault("status", {})["phase"] = phase
        self._mutate_pod(namespace, name, change)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Someone else (the node, an operator) deletes a pod; the controller may replace it."""
        with self.cond:
            self._delete_locked("pods", namespace, name)
            self._reconcile_owner_locked(namespace, name)

    def reconcile(self) -> None:
        """Run the controller for every workload (when ``auto_reconcile`` is off)."""
        with self.cond:
            for (r, ns, name) in list(self.store.objects):
                if r in WORKLOAD_RESOURCES:
                    self._reconcile_locked(r, ns, name)

    @staticmethod
    def _container_status(ready: bool, *, running: bool) -> dict[str, Any]:
        state: dict[str, Any] = {"running": {"startedAt": _now()}} if running else \
            {"terminated": {"exitCode": 1, "reason": "Error"}}
        return {"name": "engine", "image": "engine:test", "imageID": "", "ready": ready, "restartCount": 0,
                "state": state}

    def _mutate_pod(self, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        with self.cond:
            pod = self.store.objects.get(("pods", namespace, name))
            if pod is None:
                raise KeyError(f"pod {namespace}/{name} not found")
            pod = copy.deepcopy(pod)
            change(pod)
            self._write("pods", namespace, name, pod)
            self._reconcile_owner_locked(namespace, name)

    # -- store primitives (caller holds self.cond) ---------------------------------------------------
    def _write(self, resource: str, namespace: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        key = (resource, namespace, name)
        event = "MODIFIED" if key in self.store.objects else "ADDED"
        obj["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.objects[key] = obj
        if resource == "pods":
            self.store.events.append(_Event(self.store.rv, event, copy.deepcopy(obj)))
        self.cond.notify_all()
        return obj

    def _delete_locked(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise not_found(resource, name)
        obj["metadata"]["resourceVersion"] = str(self.store.next_rv())
        if resource == "pods":
            self.store.events.append(_Event(self.store.rv, "DELETED", copy.deepcopy(obj)))
        self.cond.notify_all()
        return obj

    # -- the controller -------------------------------------------------------------------------------
    def _owned_pods(self, resource: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """Pods the workload controls: a pod whose labels stop matching the selector is released
        (orphaned), as the ReplicaSet / StatefulSet controllers do, and a replacement is created."""
        selector = self.store.objects[(resource, namespace, name)]["spec"]["selector"]["matchLabels"]
        return [o for (r, ns, _), o in self.store.objects.items()
                if r == "pods" and ns == namespace and o["metadata"].get("x-owner") == f"{resource}/{name}"
                and matches(o["metadata"].get("labels"), selector)]

    def _reconcile_owner_locked(self, namespace: str, pod_name: str) -> None:
        for (r, ns, name) in list(self.store.objects):
            if r in WORKLOAD_RESOURCES and ns == namespace and self.auto_reconcile:
                self._reconcile_locked(r, ns, name)

    def _reconcile_locked(self, resource: str, namespace: str, name: str) -> None:
        workload = self.store.objects[(resource, namespace, name)]
        desired = int(workload["spec"].get("replicas") or 0)
        pods = [p for p in self._owned_pods(resource, namespace, name)
                if p.get("status", {}).get("phase") not in ("Failed", "Succeeded")]
        if resource == "deployments":
            self._reconcile_deployment(workload, pods, desired)
        else:
            self._reconcile_statefulset(workload, pods, desired)
        pods = self._owned_pods(resource, namespace, name)
        ready = sum(1 for p in pods if _pod_ready(p))
        status = {"replicas": len(pods), "readyReplicas": ready, "observedGeneration": workload["metadata"]["generation"]}
        if workload.get("status") != status:
            workload = copy.deepcopy(workload)
            workload["status"] = status
            self._write(resource, namespace, name, workload)

    def _reconcile_deployment(self, workload: dict[str, Any], pods: list[dict[str, Any]], desired: int) -> None:
        ns, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        for _ in range(desired - len(pods)):
            suffix = "".join(self._rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
            self._create_pod(workload, "deployments", f"{name}-{suffix}")
        if len(pods) > desired:
            for pod in sorted(pods, key=_deletion_rank)[: len(pods) - desired]:
                self._delete_locked("pods", ns, pod["metadata"]["name"])

    def _reconcile_statefulset(self, workload: dict[str, Any], pods: list[dict[str, Any]], desired: int) -> None:
        ns, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        existing = {p["metadata"]["name"] for p in pods}
        for ordinal in range(desired):
            if f"{name}-{ordinal}" not in existing:
                self._create_pod(workload, "statefulsets", f"{name}-{ordinal}")
        for pod in pods:
            if int(pod["metadata"]["name"].rsplit("-", 1)[1]) >= desired:
                self._delete_locked("pods", ns, pod["metadata"]["name"])

    def _create_pod(self, workload: dict[str, Any], resource: str, pod_name: str) -> None:
        meta = workload["metadata"]
        self.store.created += 1
        labels = dict(workload["spec"]["template"]["metadata"]["labels"])  # pods get the template's labels
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": meta["namespace"], "uid": str(uuid.uuid4()),
                            "labels": labels, "creationTimestamp": _now(),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": workload["kind"],
                                                 "name": meta["name"], "uid": meta["uid"], "controller": True}],
                            "x-owner": f"{resource}/{meta['name']}", "x-created": self.store.created},
               "spec": {"containers": [{"name": "engine", "image": "engine:test"}], "nodeName": "node-1"},
               "status": {"phase": "Pending"}}
        self._write("pods", meta["namespace"], pod_name, pod)

    # -- request handling -----------------------------------------------------------------------------
    def before_request(self, method: str, path: str, content_type: str) -> None:
        """Record the request, run a matching hook (outside the lock), then raise an injected fault."""
        hook = None
        with self.cond:
            self.requests.append((method, path, content_type))
            for h in self._hooks:
                if h.method == method and h.path_re.search(path):
                    hook = h
                    self._hooks.remove(h)
                    break
        if hook is not None:
            hook.callback()
        with self.cond:
            for fault in self._faults:
                if (fault.method in (None, method)) and (fault.path_contains is None or fault.path_contains in path):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                    reason = {404: "NotFound", 409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
                              503: "ServiceUnavailable", 504: "Timeout"}.get(fault.status, "Unknown")
                    raise ApiError(fault.status, reason, f"injected fault {fault.status}")

    def take_conflict(self, resource: str, name: str) -> None:
        with self.cond:
            if self._conflicts > 0:
                self._conflicts -= 1
                raise conflict(resource, name)

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self.cond:
            obj = self.store.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return _public(obj)

    def read_scale(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self.cond:
            obj = self.store.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return _scale_of(obj)

    def replace_scale(self, resource: str, namespace: str, name: str, body: Any) -> dict[str, Any]:
        self.take_conflict(resource, name)
        if not isinstance(body, dict) or not isinstance(body.get("spec", {}).get("replicas", 0), int):
            raise ApiError(400, "BadRequest", "Scale in version \"v1\" cannot be handled as a Scale")
        replicas = body.get("spec", {}).get("replicas", 0)
        if replicas < 0:
            raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                                           f"{replicas}: must be greater than or equal to 0")
        with self.cond:
            obj = self.store.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv not in (None, "") and rv != obj["metadata"]["resourceVersion"]:
                raise conflict(resource, name)
            obj = copy.deepcopy(obj)
            if obj["spec"].get("replicas") != replicas:
                obj["spec"]["replicas"] = replicas
                obj["metadata"]["generation"] += 1
            self._write(resource, namespace, name, obj)
            if self.auto_reconcile:
                self._reconcile_locked(resource, namespace, name)
            return _scale_of(self.store.objects[(resource, namespace, name)])

    def patch(self, resource: str, namespace: str, name: str, content_type: str, body: Any,
              *, status_only: bool = False) -> dict[str, Any]:
        media = content_type.split(";")[0].strip()
        if media not in PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", UNSUPPORTED_MEDIA)
        self.take_conflict(resource, name)
        with self.cond:
            current = self.store.objects.get((resource, namespace, name))
            if current is None:
                raise not_found(resource, name)
            public = _public(current)
            patched = json_patch(public, body) if media == "application/json-patch+json" else \
                merge_patch(public, body) if isinstance(body, dict) else None
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise ApiError(400, "BadRequest", "patch body must be a JSON object")
            rv = patched["metadata"].get("resourceVersion")
            if rv not in (None, "") and rv != current["metadata"]["resourceVersion"]:
                raise conflict(resource, name)
            _check_immutable(resource, name, public, patched)
            if resource == "pods":
                _validate_pod(name, patched)
            if resource == "leases":
                _lease_body(patched)
            merged = copy.deepcopy(current)
            if status_only:
                merged["status"] = patched.get("status", {})
            else:
                private = {k: v for k, v in current["metadata"].items() if k.startswith("x-")}
                merged["metadata"] = {**patched["metadata"], **private}
                merged["spec"] = patched.get("spec", {})
            if resource in WORKLOAD_RESOURCES and merged["spec"] != current["spec"]:
                merged["metadata"]["generation"] = current["metadata"]["generation"] + 1
            self._write(resource, namespace, name, merged)
            if self.auto_reconcile and resource in WORKLOAD_RESOURCES:
                self._reconcile_locked(resource, namespace, name)
            elif self.auto_reconcile and resource == "pods":
                self._reconcile_owner_locked(namespace, name)
            return _public(self.store.objects[(resource, namespace, name)])

    def delete(self, resource: str, namespace: str, name: str, options: Any = None) -> dict[str, Any]:
        """``DELETE`` with optional ``DeleteOptions``: ``preconditions.uid`` / ``.resourceVersion``
        that differ from the object's answer 409 Conflict (apiserver ``rest.BeforeDelete``)."""
        with self.cond:
            current = self.store.objects.get((resource, namespace, name))
            if current is None:
                raise not_found(resource, name)
            pre = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
            for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                want = pre.get(key)
                if want not in (None, "") and want != current["metadata"].get(key):
                    raise ApiError(409, "Conflict",
                                   f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": Precondition '
                                   f"failed: {label} in precondition: {want}, {label} in object meta: "
                                   f"{current['metadata'].get(key)}", _details(resource, name))
            obj = self._delete_locked(resource, namespace, name)
            if self.auto_reconcile:
                self._reconcile_owner_locked(namespace, name)
            return _public(obj)

    def list_pods(self, namespace: str, selector: dict[str, str]) -> dict[str, Any]:
        with self.cond:
            items = [_public(o) for (r, ns, _), o in sorted(self.store.objects.items())
                     if r == "pods" and ns == namespace and matches(o["metadata"].get("labels"), selector)]
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": items}

    # -- leases ---------------------------------------------------------------------------------------
    def create_lease(self, namespace: str, body: Any) -> dict[str, Any]:
        name = _lease_body(body)
        with self.cond:
            if ("leases", namespace, name) in self.store.objects:
                raise ApiError(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists',
                               _details("leases", name))
            obj = _lease_object(namespace, body)
            obj["metadata"]["creationTimestamp"] = _now()
            obj["metadata"]["uid"] = str(uuid.uuid4())
            return _public(self._write("leases", namespace, name, obj))

    def replace_lease(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        self.take_conflict("leases", name)
        body_name = _lease_body(body)
        if body_name != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({body_name}) does not match the name on the "
                                              f"URL ({name})")
        with self.cond:
            current = self.store.objects.get(("leases", namespace, name))
            if current is None:
                raise not_found("leases", name)
            rv = body["metadata"].get("resourceVersion")
            if rv not in (None, "") and rv != current["metadata"]["resourceVersion"]:
                raise conflict("leases", name)
            obj = _lease_object(namespace, body)
            for k in ("uid", "creationTimestamp"):
                obj["metadata"][k] = current["metadata"][k]
            return _public(self._write("leases", namespace, name, obj))

    # -- watch --------------------------------------------------------------------------------------
    def watch_events(self, namespace: str, selector: dict[str, str], since: str | None, timeout_s: float,
                     emit: Callable[[dict[str, Any]], None]) -> None:
        """Stream pod events after ``since`` until the timeout, :meth:`break_watches` or :meth:`stop`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            epoch = self.store.watch_epoch
            if since in (None, "", "0"):
                initial = [{"type": "ADDED", "object": o} for o in self.list_pods(namespace, selector)["items"]]
                position = self.store.rv
            else:
                position = int(since)
                if position < self.store.floor:
                    initial = [{"type": "ERROR", "object": status_body(
                        410, "Expired", f"too old resource version: {position} ({self.store.floor})")}]
                    deadline = 0.0
                else:
                    initial = []
        for event in initial:
            emit(event)
        while True:
            with self.cond:
                pending = [e for e in self.store.events if e.rv > position]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._stopping or self.store.watch_epoch != epoch:
                        return
                    self.cond.wait(min(remaining, 0.5))
                    continue
                position = pending[-1].rv
                batch = [e for e in pending if e.obj["metadata"]["namespace"] == namespace
                         and matches(e.obj["metadata"].get("labels"), selector)]
            for e in batch:
                emit({"type": e.type, "object": _public(e.obj)})


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def _deletion_rank(pod: dict[str, Any]) -> tuple[int, int, int, int]:
    """Who goes first when a ReplicaSet shrinks: the subset of ``ActivePodsWithRanks`` the fake follows."""
    phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(pod.get("status", {}).get("phase", "Pending"), 0)
    cost = int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, "0"))
    return (phase, 1 if _pod_ready(pod) else 0, cost, -int(pod["metadata"]["x-created"]))


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as served: without the fake's private ``x-`` bookkeeping fields."""
    out = copy.deepcopy(obj)
    out["metadata"] = {k: v for k, v in out["metadata"].items() if not k.startswith("x-")}
    return out


def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                         "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
            "spec": {"replicas": int(obj["spec"].get("replicas") or 0)},
            "status": {"replicas": int((obj.get("status") or {}).get("replicas") or 0),
                       "selector": selector_string(obj["spec"]["selector"]["matchLabels"])}}


def _check_immutable(resource: str, name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    for path in ("name", "namespace", "uid"):
        if before["metadata"].get(path) != after["metadata"].get(path):
            raise ApiError(422, "Invalid", f'{WORKLOAD_RESOURCES.get(resource, "Pod")} "{name}" is invalid: '
                                           f"metadata.{path}: Invalid value: field is immutable")
    if resource in WORKLOAD_RESOURCES and before["spec"].get("selector") != after["spec"].get("selector"):
        raise ApiError(422, "Invalid", f'{WORKLOAD_RESOURCES[resource]}.apps "{name}" is invalid: spec.selector: '
                                       "Invalid value: field is immutable")


def _validate_pod(name: str, pod: dict[str, Any]) -> None:
    annotations = pod["metadata"].get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        raise ApiError(400, "BadRequest", "annotations must be a map of strings")
    value = annotations.get(DELETION_COST)
    if value is None:
        return
    try:
        ok = re.fullmatch(r"-?\d+", value) is not None and INT32[0] <= int(value) <= INT32[1]
    except ValueError:
        ok = False
    if not ok:
        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: metadata.annotations[{DELETION_COST}]: '
                                       f'Invalid value: "{value}": must be a 32bit integer',
                       {"name": name, "kind": "Pod", "causes": [
                           {"reason": "FieldValueInvalid", "message": f'Invalid value: "{value}"',
                            "field": f"metadata.annotations[{DELETION_COST}]"}]})


def _lease_body(body: Any) -> str:
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict) or not body["metadata"].get("name"):
        raise ApiError(400, "BadRequest", "Lease in version \"v1\" cannot be handled as a Lease: missing metadata.name")
    for key in ("acquireTime", "renewTime"):
        value = (body.get("spec") or {}).get(key)
        if value is not None and (not isinstance(value, str) or not MICROTIME.match(value)):
            raise ApiError(400, "BadRequest",
                           f'Lease in version "v1" cannot be handled as a Lease: parsing time "{value}" as '
                           f'"2006-01-02T15:04:05.000000Z07:00": cannot parse {key}')
    return str(body["metadata"]["name"])


def _lease_object(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in body["metadata"].items() if k in ("name", "labels", "annotations")}
    meta["namespace"] = namespace
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": copy.deepcopy(body.get("spec") or {})}


# -- HTTP ---------------------------------------------------------------------------------------------
APPS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/(deployments|statefulsets)/([^/]+)(/scale)?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/status)?)?$")
CONFIGMAPS = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps$")
LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$")


class _Server(FakeHttpServer):
    fake: FakeKubeApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        fake = self.server.fake
        raw = self._read_body()
        content_type = self.headers.get("Content-Type", "")
        try:
            fake.before_request(method, self.path, content_type)
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            if method == "GET" and query.get("watch") in ("true", "1") and PODS.match(parts.path):
                self._watch(fake, parts.path, query)
                return
            self._json(200, self._route(fake, method, parts.path, query, content_type, raw))
        except ApiError as exc:
            self._json(exc.code, status_body(exc.code, exc.reason, exc.message, exc.details))

    def _route(self, fake: FakeKubeApiServer, method: str, path: str, query: dict[str, str], content_type: str,
               raw: bytes) -> dict[str, Any]:
        if m := APPS.match(path):
            ns, resource, name, scale = m.groups()
            if scale:
                if method == "GET":
                    return fake.read_scale(resource, ns, name)
                if method == "PUT":
                    return fake.replace_scale(resource, ns, name, _json_body(raw, content_type, put=True))
            elif method == "GET":
                return fake.read(resource, ns, name)
            elif method == "PATCH":
                return fake.patch(resource, ns, name, content_type, _json_body(raw, content_type))
            raise _not_allowed(method)
        if m := PODS.match(path):
            ns, name, status = m.groups()
            if name is None and method == "GET":
                return fake.list_pods(ns, parse_selector(query.get("labelSelector", "")))
            if name is not None and status and method == "PATCH":
                return fake.patch("pods", ns, name, content_type, _json_body(raw, content_type), status_only=True)
            if name is not None and not status:
                if method == "GET":
                    return fake.read("pods", ns, name)
                if method == "PATCH":
                    return fake.patch("pods", ns, name, content_type, _json_body(raw, content_type))
                if method == "DELETE":
                    return fake.delete("pods", ns, name, _json_body(raw, content_type, put=True) if raw else None)
            raise _not_allowed(method)
        if m := CONFIGMAPS.match(path):
            (ns,) = m.groups()
            if method == "GET":
                limit = query.get("limit")
                return fake.list_configmaps(ns, parse_selector(query.get("labelSelector", "")), int(limit) if limit else None)
            raise _not_allowed(method)
        if m := LEASES.match(path):
            ns, name = m.groups()
            if name is None and method == "POST":
                return fake.create_lease(ns, _json_body(raw, content_type, put=True))
            if name is not None and method == "GET":
                return fake.read("leases", ns, name)
            if name is not None and method == "PUT":
                return fake.replace_lease(ns, name, _json_body(raw, content_type, put=True))
            if name is not None and method == "PATCH":
                return fake.patch("leases", ns, name, content_type, _json_body(raw, content_type))
            raise _not_allowed(method)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _watch(self, fake: FakeKubeApiServer, path: str, query: dict[str, str]) -> None:
        m = PODS.match(path)
        assert m is not None
        selector = parse_selector(query.get("labelSelector", ""))
        timeout_s = float(query.get("timeoutSeconds", "1800"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()

        try:
            fake.watch_events(m.group(1), selector, query.get("resourceVersion"), timeout_s, emit)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _not_allowed(method: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                                             f"({method})")


def _json_body(raw: bytes, content_type: str, *, put: bool = False) -> Any:
    media = content_type.split(";")[0].strip()
    if put and media not in ("", "application/json"):
        raise ApiError(415, "UnsupportedMediaType", UNSUPPORTED_MEDIA)
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from exc
