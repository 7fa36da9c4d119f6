"""Scenario files: YAML validated with pydantic (unknown fields rejected), turned into domain values.

Every error names the file and the field path (``tenants[1].quota.h100: ...``) and is raised as a
:class:`ScenarioError`; the CLI prints it as one line and exits non-zero.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import Field

from controlplane.config import yaml_problem
from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.ids import ClusterId, PoolId
from controlplane.domain.tenants import Deployment, Tenant
from controlplane.domain.topology import Cluster
from controlplane.specs import (
    DeploymentBase,
    GpuMap,
    Ident,
    Strict,
    TenantSpec,
    deployment_of,
    tenant_of,
)
from controlplane.sim.workload import GeneratorSpec

MAX_SCENARIO_BYTES = 4 * 1024 * 1024


class ScenarioError(PermanentError):
    """A scenario could not be loaded; the message names the file and the field."""



MAX_GENERATED_REQUESTS = 50_000_000
"""Per deployment: a generator whose peak rate x duration allows more is refused (it would not finish)."""
MAX_OFFSET_S = 30 * 86_400


class Finite(Strict):
    """Scenario fields: every float finite (NaN or infinity would hang or crash the workload)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GeneratorModel(Finite):
    """:class:`GeneratorSpec`'s fields and defaults with bounds (checked against it at import)."""

    duration_s: float = Field(600.0, gt=0, le=30 * 86_400)
    base_rps: float = Field(4.0, ge=0, le=100_000)
    diurnal_period_s: float = Field(600.0, gt=0)
    diurnal_amplitude: float = Field(0.5, ge=0, le=1)
    burst_every_s: float = Field(120.0, ge=0)
    """0: no bursts."""
    burst_duration_s: float = Field(20.0, ge=0)
    burst_factor: float = Field(6.0, ge=0, le=1_000)
    prompt_mean: float = Field(1200.0, gt=0, le=1_000_000)
    output_mean: float = Field(200.0, gt=0, le=1_000_000)

    @pydantic.model_validator(mode="after")
    def _bounded_total(self) -> GeneratorModel:
        if 0 < self.burst_every_s < 1:
            raise ValueError(f"burst_every_s: 0 (no bursts) or at least 1 s, got {self.burst_every_s}")
        peak = self.base_rps * (1 + self.diurnal_amplitude) * max(1.0, self.burst_factor)
        if peak * self.duration_s > MAX_GENERATED_REQUESTS:
            raise ValueError(f"base_rps x (1 + diurnal_amplitude) x burst_factor x duration_s allows "
                             f"{peak * self.duration_s:.3g} requests, more than {MAX_GENERATED_REQUESTS}")
        return self


_GEN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GeneratorSpec)}
if {k: v.default for k, v in GeneratorModel.model_fields.items()} != _GEN_DEFAULTS:
    raise RuntimeError("GeneratorModel drifted from GeneratorSpec: update controlplane/sim/scenario.py")


class ClusterSpec(Strict):
    id: Ident
    zone: Ident
    region: Ident = "local"
    capacity: GpuMap


class TraceWorkload(Finite):
    trace: str
    rate_scale: float = Field(1.0, gt=0, le=1000)
    offset_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)
    limit_s: float | None = Field(None, gt=0)


class GeneratedWorkload(Finite):
    generator: GeneratorModel
    offset_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)


def _workload_kind(value: Any) -> str:
    return "TraceWorkload" if isinstance(value, dict) and "trace" in value else "GeneratedWorkload"


class DeploymentSpec(DeploymentBase):
    workload: Annotated[Annotated[TraceWorkload, pydantic.Tag("TraceWorkload")] | Annotated[GeneratedWorkload, pydantic.Tag("GeneratedWorkload")],
                        pydantic.Discriminator(_workload_kind)]
    """A trace or a generator: errors name the fields of the one given, not of both."""


class FailureSpec(Finite):
    kind: Literal["warmup_failures", "cluster_outage"]
    cluster: Ident
    deployment: Ident | None = None
    probability: float = Field(1.0, ge=0, le=1)
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)


class ScenarioSpec(Strict):
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
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(yaml_problem(path, exc)) from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None
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
        tenants = tuple(tenant_of(t) for t in spec.tenants)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    tenant_ids = {t.id for t in tenants}
    deployments = []
    for i, d in enumerate(spec.deployments):
        if d.tenant not in tenant_ids:
            raise ScenarioError(f"{source}: deployments[{i}].tenant: unknown tenant {d.tenant!r}")
        try:
            deployments.append(deployment_of(d, f"deployments[{i}]"))
        except ValidationError as exc:
            raise ScenarioError(f"{source}: {exc}") from None
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
