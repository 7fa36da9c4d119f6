"""Tenant and deployment specifications as people write them (YAML; later the API): strict pydantic
models whose fields mirror the domain dataclasses, and their conversion into domain values.

Shared by simulator scenarios (``controlplane/sim/scenario.py``) and the coordinator's configuration,
which may seed tenants and deployments (``controlplane/config.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain.errors import Problems, ValidationError, clip
from controlplane.domain.ids import DeploymentId, PoolId, TenantId, id_problem
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant, engine_policy


STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)
"""Strict types, the same from YAML and JSON: no bool for a number, no string for a number (``"5"``),
no float for an integer; an integer is accepted for a float."""


class Strict(BaseModel):
    model_config = STRICT


def _id_check(value: str) -> str:
    problem = id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Ident = Annotated[str, pydantic.AfterValidator(_id_check)]
GpuMap = dict[Ident, Annotated[int, Field(ge=0, le=1_000_000)]]


def model_from_dataclass(cls: type, name: str) -> type[BaseModel]:
    """A strict pydantic model with the fields, types and defaults of a frozen domain dataclass, so
    the YAML schema cannot drift from the domain type."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {
        f.name: (hints[f.name], f.default) for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }
    return pydantic.create_model(name, __config__=STRICT, **fields)


PolicySpec = model_from_dataclass(ScalingPolicy, "PolicySpec")
SloSpec = model_from_dataclass(Slo, "SloSpec")


class TenantSpec(Strict):
    id: Ident
    priority: int = Field(ge=0, le=1_000_000)
    quota: GpuMap = {}
    borrow_limit: GpuMap = {}
    slo: SloSpec = SloSpec()  # type: ignore[valid-type]


class DeploymentBase(Strict):
    id: Ident
    tenant: Ident
    engine: Literal["vllm", "triton", "deepspeed-mii"]
    model: str
    pool: Ident
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(64, ge=1, le=100_000)
    warm_pool: int = Field(1, ge=0, le=1_000)
    policy: PolicySpec = PolicySpec()  # type: ignore[valid-type]


def tenant_of(t: TenantSpec) -> Tenant:
    """Raises the domain's :class:`ValidationError` (its ``problems`` name every field, the SLO's too)."""
    p = Problems()
    slo = Slo()
    try:
        slo = Slo(**t.slo.model_dump())
    except ValidationError as exc:
        p.items.extend((f"tenant.{f}", problem) for f, problem in exc.problems)
    try:
        built = Tenant(TenantId(t.id), t.priority, dict(t.quota), dict(t.borrow_limit), slo)
    except ValidationError as exc:
        p.items.extend(exc.problems)
    p.raise_any()
    return built


def deployment_of(d: DeploymentBase, where: str) -> Deployment:
    """``where`` prefixes messages (``file: deployments[2]``). Raises the domain's
    :class:`ValidationError` with the field paths in it: every problem (model, policy, replicas) at once."""
    p = Problems()
    profile = PROFILES.get(d.model)
    if profile is None:
        p.add(f"{where}.model", f"unknown model profile {clip(d.model)} (known: {', '.join(sorted(PROFILES))})")
    policy = ScalingPolicy()
    try:
        policy = engine_policy(Engine(d.engine), d.policy.model_dump(exclude_unset=True))
    except ValidationError as exc:
        p.items.extend((f"{where}.{f}", problem) for f, problem in exc.problems)
    try:
        built = Deployment(
            id=DeploymentId(d.id), tenant=TenantId(d.tenant), engine=Engine(d.engine), model=d.model,
            pool=PoolId(d.pool), gpus_per_instance=profile.gpus_per_instance if profile else 1,
            min_replicas=d.min_replicas, max_replicas=d.max_replicas, warm_pool=d.warm_pool, policy=policy,
        )
    except ValidationError as exc:
        p.items.extend((f"{where}.{f.removeprefix('deployment.')}", problem) for f, problem in exc.problems)
    p.raise_any()
    return built


def fields_at(model: type[BaseModel], loc: typing.Sequence[str | int]) -> list[str]:
    """The field names allowed at ``loc`` (a pydantic error's location, without its last part) in
    ``model``; empty when the location does not lead to a model."""
    tp: Any = model
    for part in loc:
        tp = _model_in(tp, part)
        if tp is None:
            return []
        if isinstance(part, str):
            if part not in tp.model_fields:
                if len(tp.model_fields) == 0:
                    return []
                continue  # a union's tag (``poisson``): stay on the member found
            tp = tp.model_fields[part].annotation
        else:
            tp = _element(tp)
    found = _model_in(tp, None)
    return list(found.model_fields) if found is not None else []


def _element(tp: Any) -> Any:
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (list, tuple, dict) and args:
        return args[-1] if origin is dict else args[0]
    return tp


def _model_in(tp: Any, tag: str | int | None) -> type[BaseModel] | None:
    """``tp`` itself when it is a model, else the model inside Annotated / Optional / a union (for a
    union, the member with the field or tag ``tag``)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _model_in(typing.get_args(tp)[0], tag)
    if origin in (typing.Union, types.UnionType):
        members = [m for m in (_model_in(a, tag) for a in typing.get_args(tp)) if m is not None]
        for m in members:
            if isinstance(tag, str) and (tag in m.model_fields or tag == getattr(m, "__name__", "").lower()):
                return m
        return members[0] if len(members) == 1 else None
    if origin in (list, tuple, dict) and isinstance(tag, int):
        return tp
    return None


def without(data: typing.Mapping[str, Any], locs: typing.Iterable[tuple[Any, ...]]) -> dict[str, Any]:
    """``data`` without the values at ``locs`` (pydantic error locations, map keys included): what
    is left of a document once the values its schema refused are taken out, so the domain's checks
    can still run on the rest and every problem is reported in one run."""
    out: dict[str, Any] = _copy(data)
    for loc in locs:
        parts = [p for p in loc if p != "[key]"]
        node: Any = out
        for part in parts[:-1]:
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                node = None
        if isinstance(node, dict) and parts:
            node.pop(parts[-1], None)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, typing.Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return [_copy(v) for v in value] if isinstance(value, list) else value


def lenient(model: type[BaseModel], data: typing.Mapping[str, Any]) -> Any:
    """``model`` of ``data``, or of what is left :func:`without` the refused values; None when even
    that is invalid (a required field refused)."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        try:
            return model.model_validate(without(data, [e["loc"] for e in exc.errors()]))
        except pydantic.ValidationError:
            return None


def did_you_mean(name: object, allowed: typing.Iterable[str]) -> str:
    """`` (did you mean 'max_replicas'?)`` for a mistyped field name, else ``""``."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_field(model: type[BaseModel], loc: typing.Sequence[str | int]) -> str:
    """The problem text of an unknown field at ``loc``: ``unknown field (did you mean 'x'?)``."""
    if not loc:
        return "unknown field"
    return "unknown field" + did_you_mean(loc[-1], fields_at(model, list(loc[:-1])))


def _adapter_address(value: str) -> str:
    # controlplane.config imports this module, so this import waits until a value is checked
    from controlplane.config import address_problem

    problem = address_problem(value) if value else None
    if problem:
        raise ValueError(problem)
    return value


class ClusterSpec(Strict):
    """A cluster as the API and tenantctl manifests take it (its name is ``metadata.name``)."""

    zone: Ident
    region: Ident = "local"
    capacity: GpuMap = {}
    adapter_address: Annotated[str, pydantic.AfterValidator(_adapter_address)] = ""


class ZoneSpec(Strict):
    """A zone as the API and tenantctl manifests take it."""

    region: Ident = "local"

