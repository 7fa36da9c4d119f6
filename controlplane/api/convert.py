"""Conversions between the API's messages (``api.proto``) and domain values, with validation at the
edge.

Inbound: a message becomes a plain dict holding only the fields the client set (proto3 scalars
without presence count as unset when empty), is validated by the strict pydantic models of
:mod:`controlplane.specs` (the same schema as configuration files and simulator scenarios), then
built into the domain value, whose constructor checks the cross-field rules. Every problem becomes
an :class:`InvalidArgument` holding ``(field, problem)`` pairs with the field as the client wrote it
(``metadata.name``, ``spec.quota.h100``, ``spec.policy.panic_window_ms``): the server answers
INVALID_ARGUMENT with one ``google.rpc.BadRequest`` field violation each.

Outbound: domain values plus the state they live in (status: instances, GPUs in use, desired
counts) become messages. Pure functions, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic
from pydantic import BaseModel

from controlplane.api import conditions as cond
from controlplane.api.limits import clip_path
from controlplane.api.v1 import api_pb2
from controlplane.core import conditions as core_conditions
from controlplane.core.scaling import ScaleReason, wake_fits
from controlplane.domain.demand import BUCKET_MS, Forecast
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import id_problem, local_name
from controlplane.domain.labels import labels_problem
from controlplane.domain.records import ObjectMeta
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment, Slo, Tenant
from controlplane.domain.tokens import TokenRecord
from controlplane.domain.topology import Cluster, Zone
from controlplane.specs import (
    ClusterSpec,
    DeploymentBase,
    Ident,
    TenantSpec,
    ZoneSpec,
    deployment_of,
    tenant_of,
)

MAX_VIOLATIONS = 20
"""Most field violations reported for one request (the rest are counted in the message)."""


class InvalidArgument(Exception):
    """The request is invalid; ``violations`` are ``(field, problem)`` pairs in request order."""

    def __init__(self, violations: Iterable[tuple[str, str]]) -> None:
        # a field path may hold map keys the client chose: clipped like every echoed value
        self.violations = [(clip_path(f), p) for f, p in list(violations)[:MAX_VIOLATIONS]] or [("", "invalid request")]
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return "; ".join(f"{f}: {p}" if f else p for f, p in self.violations)


def invalid(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument([(field, problem)])


def check_name(value: str, field: str = "name") -> str:
    """``value`` if it is a valid object name (DNS-1123 label), else :class:`InvalidArgument`."""
    if not value:
        raise invalid(field, "required")
    problem = id_problem(value)
    if problem:
        raise invalid(field, problem)
    return value


# --- pydantic errors -> field violations -------------------------------------------------------------


def _problem_of(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    return str(err["msg"]).removeprefix("Value error, ")


def _violations(exc: pydantic.ValidationError, field_of: dict[str, str], prefix: str) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [str(x) for x in err["loc"] if x != "[key]"]
        head = loc[0] if loc else ""
        path = field_of.get(head, f"{prefix}{head}") if head else prefix.rstrip(".")
        out.append((".".join([path, *loc[1:]]), _problem_of(err)))
    return out


def _domain_field(field: str, field_of: dict[str, str], prefix: str) -> str:
    """``tenant.quota.h100`` / ``spec.id`` (domain constructors) -> the request's field path."""
    head, _, rest = field.partition(".")
    if head in ("tenant", "deployment", "cluster", "zone", "spec"):
        head, _, rest = rest.partition(".")
    path = field_of.get(head, f"{prefix}{head}")
    return f"{path}.{rest}" if rest else path


def _domain_invalid(exc: ValidationError, field_of: dict[str, str], prefix: str = "spec.") -> InvalidArgument:
    """Every problem a domain constructor found, as the request's fields."""
    return InvalidArgument([(_domain_field(f, field_of, prefix), problem) for f, problem in exc.problems])


def _validate(model: type[BaseModel], data: dict[str, Any], field_of: dict[str, str], prefix: str) -> Any:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise InvalidArgument(_violations(exc, field_of, prefix)) from None


def _set_fields(msg: Any) -> dict[str, Any]:
    """The fields of a message whose scalars all have presence (``optional``): only those set."""
    return {f.name: getattr(msg, f.name) for f in msg.DESCRIPTOR.fields if msg.HasField(f.name)}


def _text(data: dict[str, Any], key: str, value: str) -> None:
    if value:
        data[key] = value


# --- tenants ------------------------------------------------------------------------------------------

_TENANT_FIELDS = {"id": "metadata.name"}


def tenant_from_proto(msg: api_pb2.Tenant) -> Tenant:
    """The tenant a Create/UpdateTenant request describes; raises :class:`InvalidArgument`."""
    spec = msg.spec
    data: dict[str, Any] = {"quota": dict(spec.quota), "borrow_limit": dict(spec.borrow_limit)}
    _text(data, "id", msg.metadata.name)
    if spec.HasField("priority"):
        data["priority"] = spec.priority
    if spec.HasField("slo"):
        data["slo"] = _set_fields(spec.slo)
    model = _validate(TenantSpec, data, _TENANT_FIELDS, "spec.")
    labels = _labels(msg)
    try:
        return dataclasses.replace(tenant_of(model), labels=labels)
    except ValidationError as exc:
        raise _domain_invalid(exc, _TENANT_FIELDS) from None


def meta_to_proto(name: str, meta: ObjectMeta | None, labels: Mapping[str, str] | None = None) -> api_pb2.ObjectMeta:
    if meta is None:
        return api_pb2.ObjectMeta(name=name, labels=labels or {})
    return api_pb2.ObjectMeta(name=name, resource_version=meta.resource_version, created_ms=meta.created_ms,
                              updated_ms=meta.updated_ms, labels=labels or {})


def _labels(msg: Any) -> dict[str, str]:
    """The validated ``metadata.labels`` of an API object, sorted by key (``metadata.labels.<key>``
    names a bad one: :mod:`controlplane.domain.labels` has the rules)."""
    labels = dict(sorted(msg.metadata.labels.items()))
    found = labels_problem(labels)
    if found:
        key, problem = found
        raise invalid(f"metadata.labels.{key}" if key else "metadata.labels", problem)
    return labels


def meta_of(state: ControlState, kind: str, ident: str) -> ObjectMeta | None:
    return getattr(state, "meta", {}).get(f"{kind}/{ident}")


def tenant_to_proto(state: ControlState, t: Tenant) -> api_pb2.Tenant:
    deployments = sum(1 for d in state.deployments.values() if d.tenant == t.id)
    in_use: Counter[str] = Counter()
    for inst in state.instances.values():
        if inst.tenant == t.id and inst.state.holds_gpus:
            in_use[inst.pool] += inst.gpus
    return api_pb2.Tenant(
        metadata=meta_to_proto(t.id, meta_of(state, "tenant", t.id), t.labels),
        spec=api_pb2.TenantSpec(priority=t.priority, quota=dict(t.quota), borrow_limit=dict(t.borrow_limit),
                                slo=api_pb2.Slo(ttft_p99_ms=t.slo.ttft_p99_ms, max_queue_ms=t.slo.max_queue_ms)),
        status=api_pb2.TenantStatus(deployments=deployments, gpus_in_use=dict(in_use)),
    )


# --- deployments -------------------------------------------------------------------------------------

_DEPLOYMENT_FIELDS = {"id": "metadata.name"}
_DEPLOYMENT_OPTIONAL = ("min_replicas", "max_replicas", "warm_pool")


def deployment_from_proto(msg: api_pb2.Deployment) -> Deployment:
    """The deployment an Apply/DryRun request describes (``created_ms`` 0, not deleting); raises
    :class:`InvalidArgument`."""
    spec = msg.spec
    data: dict[str, Any] = {}
    _text(data, "id", msg.metadata.name)
    for key in ("tenant", "engine", "model", "pool"):
        _text(data, key, getattr(spec, key))
    for key in _DEPLOYMENT_OPTIONAL:
        if spec.HasField(key):
            data[key] = getattr(spec, key)
    if spec.HasField("policy"):
        data["policy"] = _set_fields(spec.policy)
    model = _validate(DeploymentBase, data, _DEPLOYMENT_FIELDS, "spec.")
    labels = _labels(msg)
    try:
        return dataclasses.replace(deployment_of(model, "spec"), labels=labels)
    except ValidationError as exc:
        raise _domain_invalid(exc, _DEPLOYMENT_FIELDS) from None


def deployment_to_proto(state: ControlState, d: Deployment, *, instances: bool = True,
                        decision_message: str = "") -> api_pb2.Deployment:
    """``d`` with its status and conditions; ``decision_message``: the message of the decision that
    set its desired count, when the event log holds it (:func:`conditions.decision_message`)."""
    desired = state.desired.get(d.id)
    by_state: Counter[str] = Counter()
    by_zone: Counter[str] = Counter()
    infos = []
    for inst in state.instances_of(d.id):
        by_state[inst.state.value.lower()] += 1
        by_zone[inst.zone] += 1
        if instances:
            infos.append(api_pb2.InstanceInfo(
                id=inst.id, state=inst.state.value.lower(), cluster=inst.cluster, zone=inst.zone,
                init_method=inst.init_method.value, since_ms=inst.state_since_ms, preempted=inst.preempted))
    p = d.policy
    policy = api_pb2.ScalingPolicy(**{f: getattr(p, f) for f in _POLICY_FIELDS})
    status = api_pb2.DeploymentStatus(
        replicas_by_state=dict(by_state), replicas_by_zone=dict(by_zone), gpus_per_instance=d.gpus_per_instance,
        deleting=d.deleting, instances=infos,
        conditions=cond.to_proto(core_conditions.deployment_conditions(state, d, decision_message)))
    if desired is not None:
        status.desired_replicas = desired.replicas
        status.desired_warm_pool = desired.warm_pool
        status.generation = desired.generation
        status.reason = desired.reason
        status.decided_ms = desired.at_ms
    return api_pb2.Deployment(
        metadata=meta_to_proto(local_name(d.id), meta_of(state, "deployment", d.id), d.labels),
        spec=api_pb2.DeploymentSpec(tenant=d.tenant, engine=d.engine.value, model=d.model, pool=d.pool,
                                    min_replicas=d.min_replicas, max_replicas=d.max_replicas,
                                    warm_pool=d.warm_pool, policy=policy),
        status=status,
    )


_POLICY_FIELDS = tuple(f.name for f in api_pb2.ScalingPolicy.DESCRIPTOR.fields)


# --- clusters and zones ------------------------------------------------------------------------------


class ClusterSpecModel(ClusterSpec):
    """A cluster as RegisterCluster takes it: the shared spec plus its name."""

    id: Ident


class ZoneSpecModel(ZoneSpec):
    id: Ident


_TOPOLOGY_FIELDS = {"id": "metadata.name"}


def cluster_from_proto(msg: api_pb2.Cluster, existing: Cluster | None = None) -> Cluster:
    """The cluster a RegisterCluster request describes, keeping ``existing``'s cordon and drain
    state; raises :class:`InvalidArgument`."""
    data: dict[str, Any] = {"capacity": dict(msg.spec.capacity)}
    _text(data, "id", msg.metadata.name)
    for key in ("zone", "region", "adapter_address"):
        _text(data, key, getattr(msg.spec, key))
    m = _validate(ClusterSpecModel, data, _TOPOLOGY_FIELDS, "spec.")
    labels = _labels(msg)
    try:
        return Cluster(m.id, m.zone, m.region, dict(m.capacity), m.adapter_address,
                       cordoned=existing.cordoned if existing else False,
                       draining=existing.draining if existing else False, labels=labels)
    except ValidationError as exc:
        raise _domain_invalid(exc, _TOPOLOGY_FIELDS) from None


def zone_from_proto(msg: api_pb2.Zone, existing: Zone | None = None) -> Zone:
    data: dict[str, Any] = {}
    _text(data, "id", msg.metadata.name)
    _text(data, "region", msg.spec.region)
    m = _validate(ZoneSpecModel, data, _TOPOLOGY_FIELDS, "spec.")
    labels = _labels(msg)
    try:
        return Zone(m.id, m.region, cordoned=existing.cordoned if existing else False,
                    draining=existing.draining if existing else False, labels=labels)
    except ValidationError as exc:
        raise _domain_invalid(exc, _TOPOLOGY_FIELDS) from None


def zones_of(state: ControlState) -> list[str]:
    """Every zone: registered ones and those only named by a cluster, sorted."""
    names = set(getattr(state, "zones", {})) | {c.zone for c in state.clusters.values()}
    return sorted(names)


def zone_record(state: ControlState, zone_id: str) -> Zone | None:
    return getattr(state, "zones", {}).get(zone_id)


def cluster_schedulable(state: ControlState, c: Cluster) -> bool:
    z = zone_record(state, c.zone)
    return c.schedulable and (z is None or z.schedulable)


def cluster_conditions(state: ControlState, c: Cluster, facts: cond.ClusterFacts) -> tuple[core_conditions.Condition, ...]:
    return core_conditions.cluster_conditions(state, c, facts.configured.get(c.id, ""), facts.links, facts.now_ms)


def cluster_to_proto(state: ControlState, c: Cluster, facts: cond.ClusterFacts = cond.NO_FACTS) -> api_pb2.Cluster:
    in_use: Counter[str] = Counter()
    n = 0
    for inst in state.instances.values():
        if inst.cluster == c.id:
            n += 1
            if inst.state.holds_gpus:
                in_use[inst.pool] += inst.gpus
    return api_pb2.Cluster(
        metadata=meta_to_proto(c.id, meta_of(state, "cluster", c.id), c.labels),
        spec=api_pb2.ClusterSpec(zone=c.zone, region=c.region, capacity=dict(c.capacity),
                                 adapter_address=c.adapter_address),
        status=api_pb2.ClusterStatus(cordoned=c.cordoned, draining=c.draining, gpus_in_use=dict(in_use),
                                     instances=n, schedulable=cluster_schedulable(state, c),
                                     conditions=cond.to_proto(cluster_conditions(state, c, facts))),
    )


def zone_to_proto(state: ControlState, zone_id: str, facts: cond.ClusterFacts = cond.NO_FACTS) -> api_pb2.Zone:
    """A zone (registered or only named by clusters) with its clusters' capacity and use."""
    z = zone_record(state, zone_id)
    clusters = sorted(c.id for c in state.clusters.values() if c.zone == zone_id)
    capacity: Counter[str] = Counter()
    for cid in clusters:
        capacity.update(state.clusters[cid].capacity)
    in_use: Counter[str] = Counter()
    for inst in state.instances.values():
        if inst.zone == zone_id and inst.state.holds_gpus:
            in_use[inst.pool] += inst.gpus
    region = z.region if z else next((state.clusters[c].region for c in clusters), "local")
    return api_pb2.Zone(
        metadata=meta_to_proto(zone_id, meta_of(state, "zone", zone_id), z.labels if z else None),
        spec=api_pb2.ZoneSpec(region=region),
        status=api_pb2.ZoneStatus(cordoned=bool(z and z.cordoned), draining=bool(z and z.draining),
                                  clusters=clusters, capacity=dict(capacity), gpus_in_use=dict(in_use),
                                  registered=z is not None,
                                  conditions=cond.to_proto(core_conditions.zone_conditions(
                                      state, zone_id, {cid: cluster_conditions(state, state.clusters[cid], facts)
                                                       for cid in clusters}))),
    )


# --- tokens -------------------------------------------------------------------------------------------


def token_to_proto(t: TokenRecord) -> api_pb2.TokenInfo:
    """Public data of a token (never its hash)."""
    return api_pb2.TokenInfo(id=t.id, role=t.role.value, tenant=t.tenant, created_ms=t.created_ms,
                             expires_ms=t.expires_ms, description=t.description)


# --- Scaling: the lease holder's live decision --------------------------------------------------------------------


def forecast_to_proto(f: Forecast, fits: bool) -> api_pb2.Forecast:
    """``f`` as a message; ``fits``: a Standby instance's wake fits the tenant's TTFT SLO
    (:func:`controlplane.core.scaling.wake_fits`), so only ``ready`` must serve."""
    out = api_pb2.Forecast(
        usable=f.usable, note=f.note, ready=f.ready, total=f.total, expected=f.expected, wake_ms=f.wake_ms,
        restart_ms=f.restart_ms, quantile=f.quantile, buckets=f.buckets, bucket_ms=BUCKET_MS, at_ms=f.at_ms,
        wake_fits=fits,
    )
    if f.mape is not None:
        out.mape = f.mape
    return out


def live_to_proto(live: Any, d: Deployment, slo: Slo) -> api_pb2.LiveDecision:
    """A ``LiveDecision`` of deployment ``d`` (its tenant's SLO ``slo``) as a message. ``live`` comes
    from the lease holder's loop through a Protocol (``ApiCore.holder``): a field it lacks is left
    unset. ``target_before_forecast`` is set only when the forecast raised the target (reason
    ``forecast``; equal to ``target`` when the tenant's quota held the whole raise)."""
    out = api_pb2.LiveDecision(
        at_ms=int(getattr(live, "at_ms", 0)), current=int(getattr(live, "current", 0)),
        target=int(getattr(live, "target", 0)), granted=int(getattr(live, "granted", 0)),
        reason=str(getattr(live, "reason", "")), message=str(getattr(live, "message", "")),
        proposals={str(k): int(v) for k, v in dict(getattr(live, "proposals", {}) or {}).items()},
        panic=bool(getattr(live, "panic", False)),
        signals={str(k): float(v) for k, v in dict(getattr(live, "signals", {}) or {}).items()},
        warm_pool=int(getattr(live, "warm_pool", 0)),
        unknown_signals=[str(n) for n in getattr(live, "unknown", ()) or ()],
    )
    reactive = getattr(live, "reactive", None)
    if reactive is not None and out.reason == ScaleReason.FORECAST.value:
        out.target_before_forecast = int(reactive)
    forecast = getattr(live, "forecast", None)
    if forecast is not None:
        out.forecast.CopyFrom(forecast_to_proto(forecast, wake_fits(d, slo, forecast)))
    return out
