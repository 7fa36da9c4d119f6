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
    auth_token_file: /run/secrets/adapter-token   # bearer token coordinators must present
    tls:                                          # mutual TLS: only coordinators may call
      cert_file: server.pem
      key_file: server-key.pem
      client_ca_file: coordinators-ca.pem         # CA of the coordinators' client certificates
      allowed_coordinators: [coord-a, coord-b, coord-c]   # optional: only these node ids
    fence_public_key_files: [fence.pub.pem]       # coordinators' fence keys (a list: rotation)

``auth_token_file``, ``tls`` with ``client_ca_file`` (mutual TLS, ``adapters/identity.py``) and
``fence_public_key_files`` (signed fencing tokens, ``controlplane/fencing.py``) may be left out only
when ``listen`` is a loopback address: that is the development mode of tests and single-machine
experiments, and the adapter then logs one warning per missing layer. ``controlplane up``, the
chaos harness, the demo and every manifest in ``deploy/`` configure all three. Relative paths
resolve against the file's folder. The token is read once at start; it is never logged.

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
from controlplane.config import (
    ConfigError,
    check_address,
    check_id,
    first_problem,
    is_loopback_address,
    read_token_file,
    read_yaml_mapping,
)


class RecordingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Path


MIN_TOKEN_LEN = 16


class TlsConfig(BaseModel):
    """The adapter's server certificate (PEM; chain allowed) and its private key (PEM); with
    ``client_ca_file`` mutual TLS, where only coordinator certificates may call."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    """The CA that signed the coordinators' client certificates (URI SAN
    ``controlplane://coordinator/<node_id>``)."""
    allowed_coordinators: list[Annotated[str, AfterValidator(check_id)]] | None = None
    """Only these coordinator node ids (default: any coordinator certificate from that CA)."""


def read_tls_pair(tls: TlsConfig) -> tuple[bytes, bytes]:
    """(certificate chain PEM, private key PEM), checked to parse; ValueError ``FIELD: problem``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    out: list[bytes] = []
    for field in ("cert_file", "key_file"):
        path: Path = getattr(tls, field)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"tls.{field}: cannot read {str(path)!r}: {exc.strerror or exc}") from None
        try:
            if field == "cert_file":
                x509.load_pem_x509_certificates(data)
            else:
                serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            what = "a PEM certificate" if field == "cert_file" else "an unencrypted PEM private key"
            raise ValueError(f"tls.{field}: {str(path)!r} is not {what}") from None
        out.append(data)
    return out[0], out[1]


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
    auth_token_file: Path | None = None
    """A file holding the bearer token coordinators must present (their ``adapter_token_file``);
    required unless ``listen`` is a loopback address."""
    tls: TlsConfig | None = None
    """Serve TLS only, with this certificate and key; mutual TLS with ``tls.client_ca_file``."""
    fence_public_key_files: list[Path] = Field(default_factory=list)
    """The coordinators' fence public keys (Ed25519, PEM): every fencing epoch must be signed by one
    of them. A list so that a key can be rotated (add the new one, switch the coordinators, drop the old)."""

    @model_validator(mode="after")
    def _section_present(self) -> AdapterConfig:
        if getattr(self, self.backend) is None:
            raise ValueError(f"{self.backend}: required when backend is {self.backend!r}")
        if self.auth_token_file is None and not is_loopback_address(self.listen):
            raise ValueError(f"auth_token_file: required because listen {self.listen} is not a loopback address "
                             "(anyone who reaches it could command the cluster)")
        if not is_loopback_address(self.listen):
            if self.tls is None:
                raise ValueError(f"tls: required because listen {self.listen} is not a loopback address "
                                 "(adapter channels are mutual TLS: cert_file, key_file, client_ca_file)")
            if self.tls.client_ca_file is None:
                raise ValueError(f"tls.client_ca_file: required because listen {self.listen} is not a loopback "
                                 "address (only coordinator certificates may command the cluster)")
            if not self.fence_public_key_files:
                raise ValueError(f"fence_public_key_files: required because listen {self.listen} is not a loopback "
                                 "address (every epoch must be signed by a coordinator's fence key)")
        return self

    def client_ca(self) -> bytes | None:
        """The coordinators' CA (PEM) for mutual TLS, or None; :class:`ConfigError` naming the field."""
        if self.tls is None or self.tls.client_ca_file is None:
            return None
        path = self.tls.client_ca_file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"tls.client_ca_file: cannot read {str(path)!r}: {exc.strerror or exc}",
                              field="tls.client_ca_file") from None
        from cryptography import x509

        try:
            x509.load_pem_x509_certificates(data)
        except ValueError:
            raise ConfigError(f"tls.client_ca_file: {str(path)!r} is not a PEM certificate",
                              field="tls.client_ca_file") from None
        return data

    def fence_verifier(self):
        """The fence public keys as a :class:`controlplane.fencing.FenceVerifier`, or None."""
        if not self.fence_public_key_files:
            return None
        from controlplane.fencing import FenceKeyError, FenceVerifier

        for i, path in enumerate(self.fence_public_key_files):
            try:
                FenceVerifier.from_files([path])
            except FenceKeyError as exc:
                raise ConfigError(f"fence_public_key_files[{i}]: {exc}", field=f"fence_public_key_files[{i}]") from None
        return FenceVerifier.from_files(self.fence_public_key_files)

    def auth_token(self) -> str | None:
        """The token in ``auth_token_file`` (None without one); :class:`ConfigError` naming the field."""
        if self.auth_token_file is None:
            return None
        try:
            return read_token_file(self.auth_token_file, MIN_TOKEN_LEN)
        except ValueError as exc:
            raise ConfigError(f"auth_token_file: {exc}", field="auth_token_file") from None

    def tls_pair(self) -> tuple[bytes, bytes] | None:
        """(certificate chain PEM, private key PEM), or None without ``tls``; :class:`ConfigError`."""
        if self.tls is None:
            return None
        try:
            return read_tls_pair(self.tls)
        except ValueError as exc:
            field = str(exc).split(":", 1)[0]
            raise ConfigError(str(exc), field=field) from None


def load_adapter_config(path: str | os.PathLike[str]) -> AdapterConfig:
    p = Path(path)
    raw = read_yaml_mapping(p)
    if isinstance(raw.get("state_dir"), str) and not Path(raw["state_dir"]).is_absolute():
        raw["state_dir"] = str(p.parent / raw["state_dir"])
    rec = raw.get("recording")
    if isinstance(rec, dict) and isinstance(rec.get("path"), str) and not Path(rec["path"]).is_absolute():
        raw["recording"] = {**rec, "path": str(p.parent / rec["path"])}
    if isinstance(raw.get("auth_token_file"), str) and not Path(raw["auth_token_file"]).is_absolute():
        raw["auth_token_file"] = str(p.parent / raw["auth_token_file"])
    tls = raw.get("tls")
    if isinstance(tls, dict):
        raw["tls"] = {k: str(p.parent / v) if k in ("cert_file", "key_file", "client_ca_file") and isinstance(v, str)
                      and not Path(v).is_absolute() else v for k, v in tls.items()}
    keys = raw.get("fence_public_key_files")
    if isinstance(keys, list):
        raw["fence_public_key_files"] = [str(p.parent / k) if isinstance(k, str) and not Path(k).is_absolute() else k
                                         for k in keys]
    try:
        cfg = AdapterConfig.model_validate(raw)
        try:
            cfg.auth_token()
            cfg.tls_pair()
            cfg.client_ca()
            cfg.fence_verifier()
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}", file=str(p), field=exc.field) from None
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

    return KubernetesBackend.from_config(KubernetesConfig.model_validate(cfg.kubernetes), cluster_id=cfg.cluster_id)
