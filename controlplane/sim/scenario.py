"""Scenario (fleet) files: YAML validated with pydantic (unknown fields rejected), turned into domain values.

A fleet file is a scenario file: every scenario runs as a fleet, and the optional ``fleet:`` section
holds what only fleet benchmarks read (``docs/simulator.md``, "Fleet files").

Errors: every problem of a file is collected (schema, references, duplicate ids, domain invariants,
missing trace files) and raised as one :class:`ScenarioError` whose message has one line per problem,
``FILE:LINE: field.path: message`` (``controlplane/sim/scenario_checks.py``); the CLI prints them and
exits non-zero.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import Field

from controlplane.config import yaml_problem
from controlplane.domain.errors import PermanentError
from controlplane.domain.ids import ClusterId, DeploymentId, PoolId
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
from controlplane.sim.yamllines import line_of, parse_with_lines

MAX_SCENARIO_BYTES = 4 * 1024 * 1024


class ScenarioError(PermanentError):
    """A scenario could not be loaded. The message has one ``FILE:LINE: field: problem`` line per
    problem; ``problems`` holds the same lines."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


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
    burst_group: Annotated[str, Field(max_length=200)] = ""
    """Generators of the same group burst together (same burst_every_s/burst_duration_s/duration_s
    give the same windows)."""

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
    model_cache: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(None, max_length=1000)
    """The model profiles whose weights this cluster's node-local model cache holds at the start
    (none given: the scenario's ``model_cache`` default)."""


class TraceWorkload(Finite):
    """An Azure-format trace. ``skip_s`` starts it that many seconds (trace time) into the file,
    ``rate_scale`` compresses what follows K-fold, ``limit_s`` keeps that many simulated seconds of it,
    ``offset_s`` delays its first request that long into the run."""

    trace: str
    rate_scale: float = Field(1.0, gt=0, le=1000)
    skip_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)
    offset_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)
    limit_s: float | None = Field(None, gt=0)


class RateSeriesWorkload(Finite):
    """A ServeGen rate series (``window_start_s,total_rate_rps``) turned into seeded Poisson arrivals
    (``controlplane/sim/rates.py``): trace second ``t`` plays at ``offset_s + (t - from_s) /
    time_compression``, at ``rate_scale`` x the file's rate."""

    rates: str
    time_compression: float = Field(1.0, gt=0, le=1_000_000)
    rate_scale: float = Field(1.0, gt=0, le=1000)
    from_s: float = Field(0.0, ge=0)
    """First trace second used (window range start)."""
    to_s: float | None = Field(None, gt=0)
    """Trace second where use ends (default: the end of the series)."""
    interpolation: Literal["step", "linear"] = "step"
    lengths_from: str | None = None
    """An Azure-format trace whose (prompt, output) pairs are drawn; none: the built-in log-normals."""
    prompt_mean: float | None = Field(None, gt=0, le=1_000_000)
    """Built-in lengths only (default 1200)."""
    output_mean: float | None = Field(None, gt=0, le=1_000_000)
    """Built-in lengths only (default 200)."""
    offset_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> RateSeriesWorkload:
        if self.to_s is not None and self.to_s <= self.from_s:
            raise ValueError(f"to_s ({self.to_s:g}) must be after from_s ({self.from_s:g})")
        if self.lengths_from is not None and (self.prompt_mean is not None or self.output_mean is not None):
            raise ValueError("prompt_mean/output_mean are for the built-in lengths; drop them or lengths_from")
        return self


class GeneratedWorkload(Finite):
    generator: GeneratorModel
    offset_s: float = Field(0.0, ge=0, le=MAX_OFFSET_S)


WORKLOAD_TAGS = ("TraceWorkload", "RateSeriesWorkload", "GeneratedWorkload")


def _workload_kind(value: Any) -> str:
    if isinstance(value, dict) and "trace" in value:
        return "TraceWorkload"
    if isinstance(value, dict) and "rates" in value:
        return "RateSeriesWorkload"
    return "GeneratedWorkload"


Workload = Annotated[
    Annotated[TraceWorkload, pydantic.Tag("TraceWorkload")]
    | Annotated[RateSeriesWorkload, pydantic.Tag("RateSeriesWorkload")]
    | Annotated[GeneratedWorkload, pydantic.Tag("GeneratedWorkload")],
    pydantic.Discriminator(_workload_kind),
]


class TritonSpec(Finite):
    """How a simulated Triton deployment serves (``controlplane.sim.service_models``; docs/simulator.md)."""

    batching: Literal["dynamic", "inflight"] = "dynamic"
    """``dynamic``: Triton's dynamic batcher in front of a backend that executes each batch to its end
    (the model instance is busy until the batch's longest request finishes); ``inflight``: the
    TensorRT-LLM backend's in-flight batching (continuous, and its KV use and tokens are exported)."""
    max_batch_size: int | None = Field(None, ge=1, le=4096)
    """``max_batch_size`` of the model configuration (None: the profile's ``max_num_seqs``)."""
    max_queue_delay_ms: float = Field(0.0, ge=0, le=60_000)
    """``dynamic_batching.max_queue_delay_microseconds`` / 1000 (Triton's default 0: a free model
    instance takes what is queued at once)."""
    instance_count: int = Field(1, ge=1, le=64)
    """``instance_group.count``: batches that execute at once."""
    first_response_histogram: bool = True
    """``--metrics-config histogram_latencies=true`` (TTFT known); false: no TTFT in the samples."""


class MiiSpec(Finite):
    """How a simulated DeepSpeed-MII deployment is observed."""

    meter: bool = True
    """The request meter (``adapters/mii_meter.py``) in front of every pod; false: no load is known."""


class DeploymentSpec(DeploymentBase):
    workload: Workload
    """A trace, a rate series or a generator: errors name the fields of the one given, not of all."""
    triton: TritonSpec | None = None
    """Triton's batching (only with ``engine: triton``)."""
    mii: MiiSpec | None = None
    """DeepSpeed-MII's meter (only with ``engine: deepspeed-mii``)."""

    @pydantic.model_validator(mode="after")
    def _options_match_engine(self) -> DeploymentSpec:
        if self.triton is not None and self.engine != "triton":
            raise ValueError(f"triton: only for engine triton, not {self.engine}")
        if self.mii is not None and self.engine != "deepspeed-mii":
            raise ValueError(f"mii: only for engine deepspeed-mii, not {self.engine}")
        return self


class FailureSpec(Finite):
    kind: Literal["warmup_failures", "cluster_outage"]
    cluster: Ident
    deployment: Ident | None = None
    probability: float = Field(1.0, ge=0, le=1)
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)


class FleetSpec(Finite):
    """What a fleet benchmark reads beyond a scenario; every field has a default, so every scenario
    file is a fleet file."""

    description: str = Field("", max_length=4000)
    termination_grace_s: float = Field(30.0, ge=0, le=3600)
    """Kubernetes ``terminationGracePeriodSeconds`` of the pods, for the Kubernetes baselines (the
    Kubernetes default, 30 s): a deleted pod's running requests may finish this long."""


class ScenarioSpec(Strict):
    name: str = "scenario"
    seed: int = 0
    tick_ms: int = Field(250, ge=10, le=60_000)
    sample_interval_ms: int = Field(250, ge=10, le=60_000)
    duration_s: float | None = Field(None, gt=0, le=30 * 86_400)
    preemption_grace_ms: int = Field(30_000, ge=0)
    start: Literal["warm", "cold"] = "warm"
    """warm: each deployment starts with min_replicas instances serving; cold: with none."""
    fleet: FleetSpec = FleetSpec()
    model_cache: Literal["prefetched", "empty"] = "prefetched"
    """The node-local model cache of a cluster that lists none: ``prefetched``, every deployment's
    model on every cluster (what a pre-fetch DaemonSet gives; every start of a new pod is
    ``cached``, today's cold-start figures); ``empty``, nothing until a ``cold`` start fetched it."""
    clusters: list[ClusterSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(min_length=1)
    deployments: list[DeploymentSpec] = Field(min_length=1)
    failures: list[FailureSpec] = []


SHARED_TRACES = "SHARED_TRACES"
"""The one variable a workload path may name, ``${SHARED_TRACES}/file.csv``."""
_VAR = re.compile(r"\$\{([^}]*)\}")


def shared_traces_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$SHARED_TRACES`` if set, else ``../shared/traces`` next to the repository (where
    ``bench policies`` finds the traces too)."""
    value = (os.environ if env is None else env).get(SHARED_TRACES)
    return Path(value) if value else Path(__file__).resolve().parents[3] / "shared" / "traces"


def resolve_path(text: str, base_dir: Path) -> Path:
    """A workload file path: ``${SHARED_TRACES}`` expanded, relative paths against ``base_dir`` (the
    scenario file's folder). Raises ``ValueError`` for any other ``${...}``."""
    def expand(m: re.Match[str]) -> str:
        if m.group(1) != SHARED_TRACES:
            raise ValueError(f"unknown variable ${{{m.group(1)}}} (only ${{{SHARED_TRACES}}} is expanded)")
        return str(shared_traces_dir())

    path = Path(_VAR.sub(expand, text))
    return path if path.is_absolute() else base_dir / path


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A validated scenario as domain values."""

    spec: ScenarioSpec
    base_dir: Path
    clusters: tuple[Cluster, ...]
    tenants: tuple[Tenant, ...]
    deployments: tuple[Deployment, ...]
    source: str = "scenario"
    lines: Mapping[tuple[str | int, ...], int] = dataclasses.field(default_factory=dict)
    """Field path -> line in ``source`` (empty for scenarios not read from a file)."""

    @property
    def fleet(self) -> FleetSpec:
        return self.spec.fleet

    def path(self, text: str) -> Path:
        return resolve_path(text, self.base_dir)

    def model_caches(self) -> dict[ClusterId, tuple[str, ...]]:
        """What each cluster's model cache holds at the start (see ``ScenarioSpec.model_cache``)."""
        every = tuple(sorted({d.model for d in self.deployments}))
        default = every if self.spec.model_cache == "prefetched" else ()
        return {ClusterId(c.id): tuple(sorted(set(c.model_cache))) if c.model_cache is not None else default
                for c in self.spec.clusters}

    def service_options(self) -> dict[DeploymentId, TritonSpec | MiiSpec]:
        """Each Triton / DeepSpeed-MII deployment's service options (their defaults where not given)."""
        out: dict[DeploymentId, TritonSpec | MiiSpec] = {}
        for d in self.spec.deployments:
            if d.engine == "triton":
                out[DeploymentId(d.id)] = d.triton or TritonSpec()
            elif d.engine == "deepspeed-mii":
                out[DeploymentId(d.id)] = d.mii or MiiSpec()
        return out

    def where(self, *loc: str | int) -> str:
        """``FILE:LINE`` of a field (``where("deployments", 2, "workload", "rates")``), for errors
        found after loading (a too large rate series)."""
        line = line_of(self.lines, loc)
        return f"{self.source}:{line}" if line is not None else self.source


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SCENARIO_BYTES:
            raise ScenarioError(f"{path}: larger than {MAX_SCENARIO_BYTES} bytes")
        raw, lines = parse_with_lines(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(yaml_problem(path, exc)) from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None
    return scenario_from_data(raw, source=str(path), base_dir=path.parent, lines=lines)


def scenario_from_data(raw: object, *, source: str, base_dir: Path,
                       lines: Mapping[tuple[str | int, ...], int] | None = None) -> Scenario:
    """Validate ``raw``; raises one :class:`ScenarioError` listing every problem."""
    from controlplane.sim.scenario_checks import problems_of, raise_problems

    lines = dict(lines or {})
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: the top level must be a mapping of scenario fields")
    spec, problems = problems_of(raw, base_dir)
    if problems or spec is None:
        raise_problems(problems, source, lines)
    assert spec is not None
    clusters = tuple(
        Cluster(ClusterId(c.id), c.zone, c.region, {PoolId(k): v for k, v in c.capacity.items()}) for c in spec.clusters
    )
    tenants = tuple(tenant_of(t) for t in spec.tenants)
    deployments = tuple(deployment_of(d, f"deployments[{i}]") for i, d in enumerate(spec.deployments))
    return Scenario(spec, base_dir, clusters, tenants, deployments, source, lines)
