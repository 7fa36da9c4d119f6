"""The adapter's configuration file (``controlplane adapter --config FILE``).

One YAML mapping: the cluster this adapter serves, where it listens, where it keeps its fencing
epoch, how often it observes, and one backend section::

    cluster_id: eu-west-1a
    listen: 0.0.0.0:7001
    state_dir: /var/lib/controlplane/adapter
    observe_interval_ms: 250
    ring_s: 120
    backend: kubernetes          # kubernetes | simulated | recording
    kubernetes: {...}            # adapters.kubernetes.KubernetesConfig
    simulated: {...}             # adapters.simulated.SimulatedConfig
    recording: {path: ...}       # fault tests: record every accepted command

Errors name the file and the field (``adapter.yaml: simulated.deployments[0].model: unknown model
profile 'x'``), like the coordinator's configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from adapters.backend import Backend
from adapters.simulated import SimulatedConfig
from controlplane.config import ConfigError, check_address, check_id, first_problem, read_yaml_mapping


class RecordingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Path


class AdapterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    cluster_id: Annotated[str, AfterValidator(check_id)]
    listen: Annotated[str, AfterValidator(check_address)]
    state_dir: Path
    """Holds ``<cluster_id>.epoch.json``, the highest fencing epoch accepted (fsync'ed)."""
    observe_interval_ms: int = Field(250, ge=10, le=60_000)
    ring_s: float = Field(120.0, ge=1, le=3_600)
    """How much observation history a new lease holder can read back."""
    nvml: bool = True
    """Read the host's GPUs through NVML at start (one "no NVML" warning without a driver)."""
    backend: Literal["kubernetes", "simulated", "recording"]
    kubernetes: dict[str, Any] | None = None
    """Validated by :class:`adapters.kubernetes.KubernetesConfig` (imported only when used)."""
    simulated: SimulatedConfig | None = None
    recording: RecordingConfig | None = None

    @model_validator(mode="after")
    def _section_present(self) -> AdapterConfig:
        if getattr(self, self.backend) is None:
            raise ValueError(f"{self.backend}: required when backend is {self.backend!r}")
        return self


def load_adapter_config(path: str | os.PathLike[str]) -> AdapterConfig:
    p = Path(path)
    raw = read_yaml_mapping(p)
    if isinstance(raw.get("state_dir"), str) and not Path(raw["state_dir"]).is_absolute():
        raw["state_dir"] = str(p.parent / raw["state_dir"])
    rec = raw.get("recording")
    if isinstance(rec, dict) and isinstance(rec.get("path"), str) and not Path(rec["path"]).is_absolute():
        raw["recording"] = {**rec, "path": str(p.parent / rec["path"])}
    try:
        cfg = AdapterConfig.model_validate(raw)
        if cfg.backend == "kubernetes":
            from adapters.kubernetes import KubernetesConfig

            try:
                KubernetesConfig.model_validate(cfg.kubernetes)
            except PydanticValidationError as exc:
                field, problem = first_problem(exc)
                raise ConfigError(f"{p}: kubernetes.{field}: {problem}", file=str(p), field=f"kubernetes.{field}") from exc
        return cfg
    except PydanticValidationError as exc:
        field, problem = first_problem(exc)
        raise ConfigError(f"{p}: {field}: {problem}" if field else f"{p}: {problem}", file=str(p), field=field) from exc


def build_backend(cfg: AdapterConfig) -> Backend:
    if cfg.backend == "simulated":
        from adapters.simulated import SimulatedBackend

        assert cfg.simulated is not None
        return SimulatedBackend(cfg.cluster_id, cfg.simulated)
    if cfg.backend == "recording":
        from adapters.service import RecordingBackend

        assert cfg.recording is not None
        cfg.recording.path.parent.mkdir(parents=True, exist_ok=True)
        return RecordingBackend(cfg.recording.path)
    from adapters.kubernetes import KubernetesBackend, KubernetesConfig

    return KubernetesBackend.from_config(KubernetesConfig.model_validate(cfg.kubernetes))
