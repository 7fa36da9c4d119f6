"""Per-node GPU memory records: the node agent writes them, the cluster adapter reads them.

On Kubernetes the adapter is one pod per cluster on an ordinary node: it cannot read the GPUs of
the GPU nodes. The **node agent** (``controlplane gpu-agent``, the DaemonSet in
``deploy/base/gpu-agent/``, one pod per GPU node, with the NVIDIA runtime's ``utility``
capability and no GPU request) reads :class:`adapters.gpu.GpuMonitor` every ``interval_s`` and
writes the ConfigMap ``gpu-memory-<node>`` (label ``controlplane.io/gpu-memory=node``, owned by
its pod, so the record goes when the pod or its node goes) with one JSON document under
``gpus.json``::

    {"version": 1, "node": "gpu-node-7", "pool": "h100", "at_ms": 1764680000000,
     "gpus": [{"unit": "GPU-8c0e...", "total_bytes": 85520809984, "used_bytes": 524288,
               "reserved_bytes": 553648128, "problem": ""}, ...]}

One entry per unit an instance can be given: a whole GPU, or each MIG device of a GPU in MIG mode
(the parent itself is then no unit). ``reserved_bytes`` is null with NVML's v1 memory call (whose
``used`` includes the reserved memory). A lost GPU (``NVML_ERROR_GPU_IS_LOST``) or one whose read
failed is listed with its ``problem`` and offers nothing. ConfigMaps rather than node annotations
for the same reason as the model cache (:mod:`adapters.model_cache`): writing node objects needs
cluster-wide RBAC.

The adapter (:class:`NodeGpuReader`, the ``kubernetes.gpu_memory`` section) lists those ConfigMaps
at most every ``refresh_s`` and sends each new :class:`~controlplane.domain.observations.GpuReport`
in one batch (the coordinators keep each cluster's latest; a large cluster's report is not resent
every 250 ms), each unit's free memory being
``total - used - reserved``: memory any process holds is not free for a new instance, ours
included. A record that does not parse or is inconsistent (not JSON, a negative byte count, used +
reserved above total, a missing field) is a typed :class:`ValidationError` naming the ConfigMap and
the field, logged once per content and ignored, like a record older than ``max_age_s`` (a stalled
agent): that node then offers nothing, never a wrong placement. An API failure keeps the last
report.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from adapters.gpu import GpuMemory
from adapters.node_maps import NodeMapLister
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId
from controlplane.domain.observations import GpuReport, GpuUnit

log = structlog.get_logger("adapters.gpu_report")

NODE_LABEL = "controlplane.io/gpu-memory"
"""Label of the per-node ConfigMaps (value ``node``)."""
DATA_KEY = "gpus.json"
MAX_RECORD_BYTES = 256 * 1024
"""A node record above this is refused (a node has at most a few dozen units)."""
MAX_BYTES = 1 << 50
"""Upper bound of any byte count (1 PiB: far above any GPU)."""


def configmap_name(node: str) -> str:
    return f"gpu-memory-{node}"


# --------------------------------------------------------------------------------- the record


class AgentGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    unit: str = Field(min_length=1, max_length=200)
    total_bytes: int = Field(ge=0, le=MAX_BYTES)
    used_bytes: int = Field(ge=0, le=MAX_BYTES)
    reserved_bytes: int | None = Field(None, ge=0, le=MAX_BYTES)
    problem: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _within_total(self) -> AgentGpu:
        if self.used_bytes + (self.reserved_bytes or 0) > self.total_bytes:
            field = "used_bytes" if self.reserved_bytes is None else "used_bytes + reserved_bytes"
            raise ValueError(f"{field}: {self.used_bytes + (self.reserved_bytes or 0)} is above "
                             f"total_bytes {self.total_bytes}")
        return self

    @property
    def free_for_us(self) -> int:
        return 0 if self.problem else self.total_bytes - self.used_bytes - (self.reserved_bytes or 0)


class AgentRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[1]
    node: str = Field(min_length=1, max_length=253)
    pool: str = Field("", max_length=63)
    at_ms: int = Field(ge=0)
    nvml: str = Field("ok", max_length=500)
    """``ok``, or why NVML is unavailable on the node (then ``gpus`` is empty)."""
    gpus: list[AgentGpu] = Field(default_factory=list, max_length=1024)


def units_of(readings: Iterable[GpuMemory]) -> list[AgentGpu]:
    """The agent's entries for one :meth:`GpuMonitor.read`: a unit per GPU, or per MIG device."""
    out: list[AgentGpu] = []
    for g in readings:
        name = g.uuid or f"gpu{g.index}"
        if not g.ok:
            out.append(AgentGpu(unit=name, total_bytes=0, used_bytes=0,
                                problem="lost" if g.lost else (g.error or "error")[:500]))
            continue
        if g.mig_enabled:
            for m in g.mig_devices:
                mname = m.uuid or f"{name}/mig{m.index}"
                if not m.ok or m.total is None or m.used is None:
                    out.append(AgentGpu(unit=mname, total_bytes=0, used_bytes=0, problem=(m.error or "error")[:500]))
                else:
                    out.append(_entry(mname, m.total, m.used, m.reserved))
            continue
        assert g.total is not None and g.used is not None
        out.append(_entry(name, g.total, g.used, g.reserved))
    return out


def _entry(unit: str, total: int, used: int, reserved: int | None) -> AgentGpu:
    # NVML's own numbers can disagree by a page at the edges; never claim more than total.
    reserved = None if reserved is None else min(reserved, total)
    used = min(used, total - (reserved or 0))
    return AgentGpu(unit=unit, total_bytes=total, used_bytes=used, reserved_bytes=reserved)


def record_of(node: str, pool: str, at_ms: int, readings: Iterable[GpuMemory], nvml: str = "ok") -> AgentRecord:
    return AgentRecord(version=1, node=node, pool=pool, at_ms=at_ms, nvml=nvml, gpus=units_of(readings))


def parse_record(name: str, text: object) -> AgentRecord:
    """One ConfigMap's ``gpus.json``; :class:`ValidationError` naming ``<name>.gpus.json[.field]``."""
    where = f"configmap {name}: {DATA_KEY}"
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(where, "missing or empty")
    if len(text) > MAX_RECORD_BYTES:
        raise ValidationError(where, f"{len(text)} bytes, above the {MAX_RECORD_BYTES} limit")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValidationError(where, f"not JSON: {exc}") from None
    try:
        return AgentRecord.model_validate(doc)
    except PydanticValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValidationError(f"{where}.{loc}" if loc else where, err["msg"].removeprefix("Value error, ")) from None


def report_of(records: Iterable[AgentRecord], at_ms: int) -> GpuReport:
    units = [GpuUnit(r.node, g.unit, g.free_for_us, g.total_bytes, r.pool, g.problem) for r in records for g in r.gpus]
    return GpuReport(at_ms, tuple(sorted(units, key=lambda u: (u.node, u.unit))))


# --------------------------------------------------------------------------------- the adapter side


class GpuReportConfig(BaseModel):
    """The ``kubernetes.gpu_memory`` section: where the node agents' records are."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = Field("serving", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                           description="namespace of the gpu-agent DaemonSet and its per-node ConfigMaps")
    selector: str = Field(f"{NODE_LABEL}=node", min_length=1, max_length=1000,
                          description="label selector of the per-node ConfigMaps")
    refresh_s: float = Field(5.0, ge=1, le=3600, description="how often the ConfigMaps are read")
    max_age_s: float = Field(60.0, ge=1, le=86_400, description="an older node record (a stalled agent) is ignored")


class NodeGpuReader:
    """Lists the per-node ConfigMaps through the Kubernetes API (``list configmaps`` in one namespace)."""

    def __init__(self, core: Any, config: GpuReportConfig, clock_ms: Callable[[], int], timeout_s: float) -> None:
        self._cfg = config
        self._lister = NodeMapLister(core, config.namespace, config.selector, config.refresh_s, clock_ms, timeout_s,
                                     what="gpu_report")
        self._report: GpuReport | None = None
        self._sent: GpuReport | None = None
        self._warned: dict[str, str] = {}
        """ConfigMap -> the last problem logged for it (each bad content is logged once)."""
        self.rejected = 0

    @property
    def failures(self) -> int:
        return self._lister.failures

    def report(self) -> GpuReport | None:
        """The latest report (refreshed when due); None until a list has succeeded (a failed list
        keeps the last one)."""
        listed = self._lister.due()
        if listed is not None:
            self._report = self.report_from(listed[1], listed[0])
        return self._report

    def report_from(self, maps: Iterable[tuple[str, Mapping[str, str] | None]], now_ms: int) -> GpuReport:
        """The report of these ``(ConfigMap name, data)``: bad and stale records left out, with a warning."""
        records: list[AgentRecord] = []
        seen: set[str] = set()
        for name, data in maps:
            try:
                rec = parse_record(name, (data or {}).get(DATA_KEY))
                age_ms = now_ms - rec.at_ms
                if age_ms > self._cfg.max_age_s * 1000:
                    raise ValidationError(f"configmap {name}: {DATA_KEY}.at_ms",
                                          f"{age_ms // 1000} s old, above max_age_s {self._cfg.max_age_s:g}")
                if rec.node in seen:
                    raise ValidationError(f"configmap {name}: {DATA_KEY}.node", f"node {rec.node!r} has another record")
            except ValidationError as exc:
                self.rejected += 1
                if self._warned.get(name) != exc.problem:
                    self._warned[name] = exc.problem
                    log.warning("gpu_report.bad_record", configmap=name, field=exc.field, problem=exc.problem,
                                effect="the node offers no GPU memory")
                continue
            self._warned.pop(name, None)
            seen.add(rec.node)
            records.append(rec)
        return report_of(records, now_ms)


    def fresh(self) -> GpuReport | None:
        """The report when it was (re)read since the previous call, else None: a batch carries it once
        per ``refresh_s``, not every 250 ms (the coordinators keep each cluster's latest)."""
        report = self.report()
        if report is None or report is self._sent:
            return None
        self._sent = report
        return report


def observed(reader: NodeGpuReader | None, cluster_id: ClusterId) -> tuple[tuple[ClusterId, GpuReport], ...]:
    """``Observations.gpu_memory`` of a backend with this reader: each new report once (none without
    a reader, before the first list, or between refreshes)."""
    report = None if reader is None else reader.fresh()
    return () if report is None else ((cluster_id, report),)


# --------------------------------------------------------------------------------- the agent side


class ConfigMapPublisher:
    """Creates or replaces the node's ConfigMap with the pod's ServiceAccount (get, create, update)."""

    def __init__(self, core: Any, namespace: str, node: str, pod: str = "", pod_uid: str = "") -> None:
        self._core, self._ns, self._node, self._pod, self._uid = core, namespace, node, pod, pod_uid

    def body(self, record: AgentRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": configmap_name(self._node), "namespace": self._ns,
                                "labels": {NODE_LABEL: "node"}}
        if self._pod and self._uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": self._pod, "uid": self._uid}]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {DATA_KEY: record.model_dump_json()}}

    def __call__(self, record: AgentRecord) -> None:
        from kubernetes.client.exceptions import ApiException

        body = self.body(record)
        name = body["metadata"]["name"]
        try:
            self._core.replace_namespaced_config_map(name, self._ns, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._core.create_namespaced_config_map(self._ns, body)


def run_agent(monitor: Any, publish: Callable[[AgentRecord], None], node: str, pool: str, interval_s: float,
              stop: threading.Event, clock_ms: Callable[[], int], once: bool = False) -> int:
    """Read the GPUs and publish the node's record every ``interval_s`` until ``stop``; returns the
    number of failed publishes. A publish failure is logged and retried at the next interval."""
    monitor.start()
    failed = 0
    try:
        while True:
            nvml = "ok" if monitor.available else f"unavailable: {monitor.unavailable_reason or 'not started'}"
            record = record_of(node, pool, clock_ms(), monitor.read(), nvml=nvml[:500])
            try:
                publish(record)
            except Exception as exc:  # noqa: BLE001 - an API hiccup must not end the agent
                failed += 1
                log.warning("gpu_agent.publish_failed", node=node, error=f"{type(exc).__name__}: {exc}"[:500])
            if once or stop.wait(interval_s):
                return failed
    finally:
        monitor.close()
