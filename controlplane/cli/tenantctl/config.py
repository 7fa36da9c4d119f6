"""tenantctl's configuration file: contexts (one per region) like a kubeconfig.

::

    apiVersion: controlplane.io/v1
    kind: Config
    current-context: local
    contexts:
    - name: local
      region: local
      endpoints: [127.0.0.1:7001, 127.0.0.1:7002]
      ca_file: ca.pem          # TLS: verify the coordinators against this CA (relative to this file)
      token: cp_...            # or token_file: admin.token
      # cert_file/key_file: client certificate (mutual TLS); server_name: name checked in the
      # server certificate; insecure: true = plaintext (loopback only, instead of ca_file)

Found at ``--config``, ``$TENANTCTL_CONFIG`` or ``~/.config/controlplane/tenantctl.yaml``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from controlplane.api.manifests import API_VERSION
from controlplane.config import (
    ConfigError,
    address_problem,
    first_problem,
    read_yaml_mapping,
)
from controlplane.domain.ids import id_problem

ENV_CONFIG = "TENANTCTL_CONFIG"
ENV_TOKEN = "TENANTCTL_TOKEN"
ENV_CONTEXT = "TENANTCTL_CONTEXT"
DEFAULT_PATH = Path("~/.config/controlplane/tenantctl.yaml")


class ContextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    region: str = "local"
    endpoints: list[str]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False

    @field_validator("name", "region")
    @classmethod
    def _id(cls, value: str) -> str:
        problem = id_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one host:port")
        for i, ep in enumerate(value):
            problem = address_problem(ep)
            if problem:
                raise ValueError(f"[{i}]: {problem}")
        return value

    @model_validator(mode="after")
    def _cross(self) -> ContextConfig:
        if self.token is not None and self.token_file is not None:
            raise ValueError("token: set token or token_file, not both")
        if self.insecure and (self.ca_file or self.cert_file):
            raise ValueError("insecure: plaintext cannot be combined with ca_file/cert_file")
        if not self.insecure and not self.ca_file:
            raise ValueError("ca_file: required for TLS (or insecure: true for plaintext on loopback)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file: a client certificate needs both cert_file and key_file")
        return self


class FileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = "Config"
    current_context: str | None = Field(None, alias="current-context")
    contexts: list[ContextConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> FileConfig:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion: must be {API_VERSION!r}")
        if self.kind != "Config":
            raise ValueError("kind: must be 'Config'")
        names = [c.name for c in self.contexts]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"contexts: the name {dup!r} is used twice")
        if self.current_context is not None and self.current_context not in names:
            raise ValueError(f"current-context: no context named {self.current_context!r}")
        return self


@dataclass(frozen=True)
class Context:
    """A resolved context: what a client needs to reach one region's coordinators."""

    name: str
    region: str
    endpoints: list[str]
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    server_name: str | None
    token: str | None
    token_source: str
    """Where the token came from (``--token``, ``TENANTCTL_TOKEN``, ``token``, ``token_file``, ``none``)."""


def config_path(flag: str | None) -> Path:
    raw = flag or os.environ.get(ENV_CONFIG) or str(DEFAULT_PATH)
    return Path(raw).expanduser()


def load(path: Path) -> FileConfig:
    """The file's configuration; raises :class:`ConfigError` naming the file and field."""
    raw = read_yaml_mapping(path)
    try:
        return FileConfig.model_validate(raw)
    except PydanticValidationError as exc:
        field, problem = first_problem(exc)
        field = field.replace("current_context", "current-context").replace(".[", "[")
        raise ConfigError(f"{path}: {field + ': ' if field else ''}{problem}", file=str(path), field=field) from None


def _resolve_path(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base.parent / p)


def resolve(ctx: ContextConfig, path: Path, token_flag: str | None) -> Context:
    token, source = token_flag, "--token"
    if token is None and os.environ.get(ENV_TOKEN):
        token, source = os.environ[ENV_TOKEN], ENV_TOKEN
    if token is None and ctx.token is not None:
        token, source = ctx.token, "token"
    if token is None and ctx.token_file is not None:
        file = _resolve_path(path, ctx.token_file)
        assert file is not None
        try:
            token = Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{path}: contexts[{ctx.name}].token_file: cannot read {file!r}: "
                              f"{exc.strerror or exc}", file=str(path), field="token_file") from None
        source = "token_file"
    if token is None:
        source = "none"
    return Context(ctx.name, ctx.region, list(ctx.endpoints), _resolve_path(path, ctx.ca_file),
                   _resolve_path(path, ctx.cert_file), _resolve_path(path, ctx.key_file), ctx.server_name,
                   token, source)


def adhoc(endpoints: list[str], token_flag: str | None, ca_file: str | None) -> Context:
    """A context from the command line alone (``--endpoint``), when no configuration file exists."""
    token, source = token_flag, "--token"
    if token is None and os.environ.get(ENV_TOKEN):
        token, source = os.environ[ENV_TOKEN], ENV_TOKEN
    return Context("cli", "local", endpoints, ca_file, None, None, None, token, source if token else "none")


def use_context(path: Path, name: str) -> None:
    """Make ``name`` the current context (rewrites the file, keeping its permissions)."""
    cfg = load(path)
    if name not in [c.name for c in cfg.contexts]:
        known = ", ".join(c.name for c in cfg.contexts) or "none"
        raise ConfigError(f"{path}: no context named {name!r} (known: {known})", file=str(path), field="contexts")
    raw = read_yaml_mapping(path)
    raw["current-context"] = name
    write_raw(path, raw)


def write_raw(path: Path, raw: dict[str, Any]) -> None:
    text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=False)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tenantctl-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def redacted(raw: dict[str, Any]) -> dict[str, Any]:
    """The file's mapping with tokens replaced (``config view`` without ``--raw``)."""
    out = dict(raw)
    contexts = []
    for c in raw.get("contexts") or []:
        if isinstance(c, dict) and c.get("token"):
            c = {**c, "token": "REDACTED"}
        contexts.append(c)
    if "contexts" in raw:
        out["contexts"] = contexts
    return out
