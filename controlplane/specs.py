"""Tenant and deployment specifications as people write them (YAML; later the API): strict pydantic
models whose fields mirror the domain dataclasses, and their conversion into domain values.

Shared by simulator scenarios (``controlplane/sim/scenario.py``) and the coordinator's configuration,
which may seed tenants and deployments (``controlplane/config.py``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain.errors import ValidationError, clip
from controlplane.domain.ids import DeploymentId, PoolId, TenantId, id_problem
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant, engine_policy


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    return pydantic.create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)


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
    """Raises the domain's :class:`ValidationError` (its ``field`` names the problem)."""
    return Tenant(TenantId(t.id), t.priority, dict(t.quota), dict(t.borrow_limit), Slo(**t.slo.model_dump()))


def deployment_of(d: DeploymentBase, where: str) -> Deployment:
    """``where`` prefixes messages (``file: deployments[2]``). Raises ``ValueError`` subclasses of
    the domain (``ValidationError``) with the field path in the message."""
    profile = PROFILES.get(d.model)
    if profile is None:
        raise ValidationError(f"{where}.model", f"unknown model profile {clip(d.model)} (known: {', '.join(sorted(PROFILES))})")
    try:
        return Deployment(
            id=DeploymentId(d.id), tenant=TenantId(d.tenant), engine=Engine(d.engine), model=d.model,
            pool=PoolId(d.pool), gpus_per_instance=profile.gpus_per_instance, min_replicas=d.min_replicas,
            max_replicas=d.max_replicas, warm_pool=d.warm_pool, policy=engine_policy(Engine(d.engine), d.policy.model_dump(exclude_unset=True)),
        )
    except ValidationError as exc:
        raise ValidationError(f"{where}.{exc.field.removeprefix('deployment.')}", exc.problem) from None


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

