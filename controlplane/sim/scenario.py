"""Scenario files: YAML validated with pydantic (unknown fields rejected), turned into domain values.

Every error names the file and the field path (``tenants[1].quota.h100: ...``) and is raised as a
:class:`ScenarioError`; the CLI prints it as one line and exits non-zero.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.ids import ClusterId, DeploymentId, PoolId, TenantId, id_problem
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant
from controlplane.domain.topology import Cluster
from controlplane.sim.workload import GeneratorSpec

MAX_SCENARIO_BYTES = 4 * 1024 * 1024


class ScenarioError(PermanentError):
    """A scenario could not be loaded; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _id_check(value: str) -> str:
    problem = id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Ident = Annotated[str, pydantic.AfterValidator(_id_check)]
GpuMap = dict[Ident, Annotated[int, Field(ge=0, le=1_000_000)]]


def _model_from_dataclass(cls: type, name: str) -> type[BaseModel]:
    """A strict pydantic model with the fields, types and defaults of a frozen domain dataclass, so
    the YAML schema cannot drift from the domain type."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {
        f.name: (hints[f.name], f.default) for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }
    return pydantic.create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)


PolicySpec = _model_from_dataclass(ScalingPolicy, "PolicySpec")
SloSpec = _model_from_dataclass(Slo, "SloSpec")
GeneratorModel = _model_from_dataclass(GeneratorSpec, "GeneratorModel")


class ClusterSpec(_Strict):
    id: Ident
    zone: Ident
    region: Ident = "local"
    capacity: GpuMap


class TenantSpec(_Strict):
    id: Ident
    priority: int = Field(ge=0, le=1_000_000)
    quota: GpuMap = {}
    borrow_limit: GpuMap = {}
    slo: SloSpec = SloSpec()  # type: ignore[valid-type]


class TraceWorkload(_Strict):
    trace: str
    rate_scale: float = Field(1.0, gt=0, le=1000)
    offset_s: float = Field(0.0, ge=0)
    limit_s: float | None = Field(None, gt=0)


class GeneratedWorkload(_Strict):
    generator: GeneratorModel  # type: ignore[valid-type]
    offset_s: float = Field(0.0, ge=0)


class DeploymentSpec(_Strict):
    id: Ident
    tenant: Ident
    engine: Literal["vllm", "triton", "deepspeed-mii"]
    model: str
    pool: Ident
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(64, ge=1, le=100_000)
    warm_pool: int = Field(1, ge=0, le=1_000)
    policy: PolicySpec = PolicySpec()  # type: ignore[valid-type]
    workload: TraceWorkload | GeneratedWorkload


class FailureSpec(_Strict):
    kind: Literal["warmup_failures", "cluster_outage"]
    cluster: Ident
    deployment: Ident | None = None
    probability: float = Field(1.0, ge=0, le=1)
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)


class ScenarioSpec(_Strict):
    name: str = "scenario"
    seed: int = 0
    tick_ms: int = Field(250, ge=10, le=60_000)
    sample_interval_ms: int = Field(250, ge=10, le=60_000)
    duration_s: float | None = Field(None, gt=0, le=30 * 86_400)
    preemption_grace_ms: int = Field(30_000, ge=0)
    start: Literal["warm", "cold"] = "warm"
    """warm: each deployment starts with min_replicas instances serving; cold: with none."""
    clusters: list[ClusterSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(min_length=1)
    deployments: list[DeploymentSpec] = Field(min_length=1)
    failures: list[FailureSpec] = []


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A validated scenario as domain values."""

    spec: ScenarioSpec
    base_dir: Path
    clusters: tuple[Cluster, ...]
    tenants: tuple[Tenant, ...]
    deployments: tuple[Deployment, ...]


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("TraceWorkload", "GeneratedWorkload") or str(part).startswith("function-"):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SCENARIO_BYTES:
            raise ScenarioError(f"{path}: larger than {MAX_SCENARIO_BYTES} bytes")
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return scenario_from_data(raw, source=str(path), base_dir=path.parent)


def scenario_from_data(raw: object, *, source: str, base_dir: Path) -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: the top level must be a mapping of scenario fields")
    try:
        spec = ScenarioSpec.model_validate(raw)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise ScenarioError(f"{source}: {_fmt_loc(err['loc'])}: {err['msg']}{more}") from None
    return _to_domain(spec, source, base_dir)


def _to_domain(spec: ScenarioSpec, source: str, base_dir: Path) -> Scenario:
    _unique(source, "clusters", [c.id for c in spec.clusters])
    _unique(source, "tenants", [t.id for t in spec.tenants])
    _unique(source, "deployments", [d.id for d in spec.deployments])
    try:
        clusters = tuple(
            Cluster(ClusterId(c.id), c.zone, c.region, {PoolId(k): v for k, v in c.capacity.items()}) for c in spec.clusters
        )
        tenants = tuple(
            Tenant(TenantId(t.id), t.priority, dict(t.quota), dict(t.borrow_limit), Slo(**t.slo.model_dump()))
            for t in spec.tenants
        )
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    tenant_ids = {t.id for t in tenants}
    deployments = []
    for i, d in enumerate(spec.deployments):
        where = f"{source}: deployments[{i}]"
        if d.tenant not in tenant_ids:
            raise ScenarioError(f"{where}.tenant: unknown tenant {d.tenant!r}")
        profile = PROFILES.get(d.model)
        if profile is None:
            raise ScenarioError(f"{where}.model: unknown model profile {d.model!r} (known: {', '.join(sorted(PROFILES))})")
        try:
            deployments.append(
                Deployment(
                    id=DeploymentId(d.id), tenant=TenantId(d.tenant), engine=Engine(d.engine), model=d.model,
                    pool=PoolId(d.pool), gpus_per_instance=profile.gpus_per_instance, min_replicas=d.min_replicas,
                    max_replicas=d.max_replicas, warm_pool=d.warm_pool, policy=ScalingPolicy(**d.policy.model_dump()),
                )
            )
        except ValidationError as exc:
            raise ScenarioError(f"{where}.{exc.field.removeprefix('deployment.')}: {exc.problem}") from None
    for i, f in enumerate(spec.failures):
        if f.end_s <= f.start_s:
            raise ScenarioError(f"{source}: failures[{i}].end_s: must be after start_s ({f.start_s}), got {f.end_s}")
    return Scenario(spec, base_dir, clusters, tenants, tuple(deployments))


def _unique(source: str, what: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for i, ident in enumerate(ids):
        if ident in seen:
            raise ScenarioError(f"{source}: {what}[{i}].id: duplicate id {ident!r}")
        seen.add(ident)
