"""Coordinator configuration: one YAML file plus ``CONTROLPLANE_<FIELD>`` environment overrides.

:func:`load_config` is the only way production code should build a :class:`CoordinatorConfig`; it
turns every problem into one :class:`ConfigError` whose message names the file and the field::

    /etc/controlplane/node-a.yaml: lease_duration_ms: holder validity ... must not exceed ...

Environment overrides (applied on top of the file, before validation): ``CONTROLPLANE_`` followed
by the upper-cased field name, e.g. ``CONTROLPLANE_NODE_ID=coord-b``,
``CONTROLPLANE_LEASE_DURATION_MS=2000``, ``CONTROLPLANE_PASSWORD=...``,
``CONTROLPLANE_DATA_DIR=/var/lib/cp``. ``CONTROLPLANE_PEERS`` takes a JSON list of peer objects. An
empty value counts as set (and usually fails validation), so unset a variable to drop an override.

One file for every member (a Kubernetes StatefulSet, ``deploy/``): ``peers`` may list this node
itself. The entry whose ``node_id`` is this node's (typically ``CONTROLPLANE_NODE_ID`` set from the
pod name) is removed from ``peers`` and supplies ``zone``, ``raft_address`` and ``api_address`` where
the file and the environment leave them out. An explicit ``zone`` wins (the pod's real zone); an
entry whose address differs from an explicit one is another node under the same id (an error).

Timing rules (cross-field, all in milliseconds; ``V = lease_duration*(1-drift_rho) - lease_margin``
is how long a holder may act after *sending* a successful renewal):

* pysyncobj: ``raft_min_timeout > 3*append_entries_period`` and ``raft_max_timeout > raft_min_timeout``.
* blunt check-quorum: ``append_entries_period < leader_fallback_timeout <= raft_min_timeout``. A
  leader cut off from a majority then steps down before any follower can elect a new leader
  (PYSYNCOBJ.md measured 0 s dual-leader overlap with this).
* ``3*lease_renew <= lease_duration``: at least three renewal attempts per lease period.
* ``V > 2*lease_renew``: renewals are sent every ``lease_renew`` and each attempt is bounded by
  ``lease_renew`` (see ``controlplane/runtime/lease_guard.py``), so a renewal sent one period after a
  successful one completes, or gives up, at most ``2*lease_renew`` after it, while the lease from
  the earlier renewal is still valid. One slow or lost renewal therefore never opens a gap.
* ``V <= step_down_timeout`` and ``leader_fallback_timeout <= step_down_timeout``: the step-down
  timeout is the longest an isolated coordinator may keep acting (as lease holder) or keep
  believing it is the Raft leader.

API security (``docs/api.md``): with ``api_tls`` the gRPC API is served over TLS (mutual TLS when
``api_tls.client_ca_file`` is set). Without it the API is plaintext, which is accepted only when
``api_address`` is a loopback address (127.0.0.1, localhost, ::1) or ``api_insecure: true`` says so
explicitly. ``admin_token_file`` holds an admin bearer token (``cp_<id>_<secret>``, e.g. a mounted
Kubernetes Secret) that the lease holder registers (hashed) if it is not in the replicated state;
``adapter_token_file`` holds the bearer token sent to the adapters. Relative file paths are taken
relative to the configuration file. Token files are read at load time and never logged.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from controlplane.adapter_channel import AdapterTlsConfig, adapter_channel_problems, fence_key_problem
from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.files import file_problem
from controlplane.domain.ids import id_problem
from controlplane.domain.tokens import parse_token
from controlplane.specs import DeploymentBase, TenantSpec, deployment_of, tenant_of

ENV_PREFIX = "CONTROLPLANE_"
MIN_PASSWORD_LEN = 16
PASSWORD_REQUIRED = "required: Raft members prove it to each other inside mutual TLS (a second layer besides raft_tls)"

_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this is refused before it is parsed."""


class ConfigError(PermanentError):
    """The configuration cannot be used. ``file`` and ``field`` locate the problem."""

    def __init__(self, message: str, *, file: str = "", field: str = "") -> None:
        super().__init__(message)
        self.file = file
        self.field = field


def read_yaml_mapping(p: Path) -> dict[str, Any]:
    """The YAML mapping in ``p`` (an empty file is an empty mapping), or :class:`ConfigError`."""
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes: not a configuration", file=str(p))
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration: {exc.strerror or exc}", file=str(p)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})", file=str(p)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(p, exc), file=str(p)) from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid YAML: nested too deeply", file=str(p)) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, got {type(raw).__name__}", file=str(p))
    return raw


def yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """``FILE:LINE: not valid YAML: PROBLEM`` on one line (PyYAML's own message spans several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}" if mark is not None else ""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    return f"{path}{where}: not valid YAML: {problem}"


def address_problem(value: object) -> str | None:
    """Why ``value`` is not a ``host:port`` address, or None."""
    if not isinstance(value, str):
        return f"must be a 'host:port' string, got {type(value).__name__}"
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return f"{value!r} is not 'host:port'"
    if not _HOST_RE.fullmatch(host):
        return f"{value!r}: host {host!r} is not a valid host name or IPv4 address"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{value!r}: port must be an integer between 1 and 65535"
    return None


def check_id(value: str) -> str:
    problem = id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def check_address(value: str) -> str:
    problem = address_problem(value)
    if problem:
        raise ValueError(problem)
    return value


class PeerConfig(BaseModel):
    """Another coordinator of the same cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str
    zone: str
    raft_address: str
    api_address: str

    _id = field_validator("node_id", "zone")(check_id)
    _addr = field_validator("raft_address", "api_address")(check_address)


class ClusterConfig(BaseModel):
    """A cluster this group manages and the address of its adapter. The lease holder upserts these
    into the replicated state once per epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    zone: str
    region: str = "local"
    capacity: dict[str, int] = Field(default_factory=dict)
    """Schedulable GPUs per pool."""
    adapter_address: str | None = None

    _id = field_validator("id", "zone", "region")(check_id)

    @field_validator("adapter_address")
    @classmethod
    def _adapter(cls, value: str | None) -> str | None:
        return value if value is None else check_address(value)

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: dict[str, int]) -> dict[str, int]:
        for pool, n in value.items():
            check_id(pool)
            if n < 0:
                raise ValueError(f"{pool}: must be >= 0, got {n}")
        return value


def is_loopback_address(address: str) -> bool:
    """Whether ``host:port`` (or a bare host) names this machine only: ``localhost``, 127.0.0.0/8 or
    ``::1`` (bracketed or not). ``0.0.0.0`` listens on every interface, so it is not loopback."""
    host = address.rpartition(":")[0] if address.count(":") == 1 or address.startswith("[") else address
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token_file(path: Path, min_len: int = 1) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped). Raises ``ValueError`` saying
    what is wrong with it, never with the file's content."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{str(path)!r} is empty")
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in text):
        raise ValueError(f"the token in {str(path)!r} must be one word of printable ASCII (no spaces)")
    if len(text) < min_len:
        raise ValueError(f"the token in {str(path)!r} must be at least {min_len} characters")
    return text


class ApiTlsConfig(BaseModel):
    """TLS for the coordinator's gRPC API (PEM files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path
    """The server certificate (chain) presented to clients."""
    key_file: Path
    """Its private key."""
    client_ca_file: Path | None = None
    """Mutual TLS: clients must present a certificate signed by this CA (besides their token)."""
    ca_file: Path | None = None
    """CA that signed the other coordinators' API certificates, used when this coordinator calls a
    peer's API (Explain and DryRun ask the lease holder). Default: ``client_ca_file`` if set, else
    the system's trusted roots."""

    @field_validator("cert_file", "key_file", "client_ca_file", "ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        problem = None if value is None else file_problem(value)
        if problem:
            raise ValueError(problem)
        return value


# --- Raft transport: mutual TLS and bounds (raft/transport.py, docs/security.md "Raft transport") -----

RAFT_TLS_REQUIRED = (
    "required: Raft members authenticate each other with mutual TLS; give ca_file, cert_file and key_file "
    "(a member certificate with the URI SAN controlplane://coordinator/<node_id>)"
)
MAX_ENTRY_BYTES = 16 * 1024 * 1024
"""The largest legal log entry: ``raft.codec.MAX_PAYLOAD_BYTES`` (a test keeps the two equal)."""
RAFT_FRAME_OVERHEAD = 1024 * 1024
"""Room above one maximal entry for what wraps it in the largest message (a follower forwarding
it in ``apply_command``: pysyncobj's pickle of the call, a few hundred bytes, plus the wire tags) and
above pysyncobj's 64 KiB append_entries batches, large-entry chunks and snapshot chunks."""
DEFAULT_RAFT_MAX_FRAME = MAX_ENTRY_BYTES + RAFT_FRAME_OVERHEAD


class RaftTlsConfig(BaseModel):
    """This member's Raft TLS material (PEM files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path
    """CA that signs every member's Raft certificate (peers are verified against it, both ways)."""
    cert_file: Path
    """This member's certificate: URI SAN ``controlplane://coordinator/<node_id>``, serverAuth+clientAuth."""
    key_file: Path
    """Its private key."""

    @field_validator("cert_file", "key_file", "ca_file")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        problem = file_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _loads(self) -> RaftTlsConfig:
        problem = raft_tls_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def raft_tls_problem(tls: RaftTlsConfig) -> str | None:
    """Whether the files load as a TLS identity: the key matches the certificate, the CA parses."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (ssl.SSLError, OSError) as exc:
        why = "the key does not match the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else str(exc)
        return f"key_file: cannot use {str(tls.cert_file)!r} with {str(tls.key_file)!r}: {why}"
    try:
        ctx.load_verify_locations(cafile=str(tls.ca_file))
    except (ssl.SSLError, OSError) as exc:
        return f"ca_file: {str(tls.ca_file)!r} is not a PEM CA certificate: {exc}"
    return None


def raft_cert_node_ids(path: Path) -> list[str]:
    """The node ids named by ``controlplane://coordinator/<id>`` URI SANs of the certificate in ``path``."""
    from cryptography import x509

    from controlplane.tls import COORDINATOR_URI_PREFIX

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, OSError, x509.ExtensionNotFound):
        return []
    return [u[len(COORDINATOR_URI_PREFIX):] for u in sans.get_values_for_type(x509.UniformResourceIdentifier)
            if u.startswith(COORDINATOR_URI_PREFIX)]


class CoordinatorConfig(BaseModel):
    """Everything one coordinator process needs. Times are integer milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str
    zone: str
    raft_address: str
    """``host:port`` this node's Raft transport binds to; it is also the node's pysyncobj identity."""
    api_address: str
    """``host:port`` of this node's gRPC API (used by the API server and as the NotLeader hint)."""
    peers: list[PeerConfig] = Field(default_factory=list)
    """The other members (not this node)."""
    data_dir: Path
    """Raft journal, its ``.meta`` and the snapshot file live here. Must be local disk."""
    password: SecretStr | None = None
    """Raft transport encryption key (mandatory, at least 16 characters). Or ``password_file``."""
    password_file: Path | None = None

    raft_min_timeout_ms: int = Field(1000, gt=0)
    raft_max_timeout_ms: int = Field(1500, gt=0)
    """Election timeouts. Above the leader's tick stalls measured on a busy machine (fsync beside a
    disk-heavy writer, CPU starvation: up to ~1.3 s; the followers' own stalls are covered by
    ``raft_read_before_timers``), and a normal election still ends inside the lease wait. Trade-off:
    a split vote now costs one more 1-1.5 s round (failover ~2.4 s, 1 trial in 20). Measurements in
    docs/reliability.md "Leadership under load" (150/450 flapped: 17 changes in 10 min; 700/1100: 7)."""
    append_entries_period_ms: int = Field(40, gt=0)
    leader_fallback_timeout_ms: int = Field(900, gt=0)
    connection_retry_ms: int = Field(200, gt=0)
    lease_duration_ms: int = Field(1200, gt=0)
    lease_renew_ms: int = Field(250, gt=0)
    lease_margin_ms: int = Field(100, ge=0)
    drift_rho: float = Field(0.01, ge=0.0, lt=0.5)
    step_down_timeout_ms: int = Field(2000, gt=0)
    commit_timeout_ms: int = Field(1000, gt=0)
    tick_ms: int = Field(250, gt=0)
    fsync: Literal["none", "entry"] = "entry"
    """``entry``: every journal append and every term/vote change is fsync'ed before pysyncobj acts
    on it (Raft-correct durability, see docs/lease.md "Durability"). ``none``: pysyncobj's own
    behaviour (page cache only: survives kill -9, not power loss)."""
    log_compaction_min_entries: int = Field(5000, ge=2)
    log_compaction_min_time_ms: int = Field(300_000, gt=0)
    raft_queue_size: int = Field(10_000, gt=0)
    """Bound on commands queued inside pysyncobj (QueueFull beyond)."""
    # --- stable leadership on a busy machine (docs/reliability.md "Leadership under load") ---
    raft_read_before_timers: bool = True
    """Read what waits on the Raft sockets before pysyncobj's election / check-quorum timers run, so
    a stall of this member's own tick thread is not taken for a silent leader (raft/node.py
    ``read_before_timers``). Off only to measure the difference."""
    clusters: list[ClusterConfig] = Field(default_factory=list)
    """Clusters and their adapters (the same list on every member)."""
    tenants: list[TenantSpec] = Field(default_factory=list)
    """Tenants the lease holder creates once if they do not exist (the API manages them after)."""
    deployments: list[DeploymentBase] = Field(default_factory=list)
    """Deployments created once like ``tenants``; each must name a tenant listed here."""
    raft_dial_overrides: dict[str, str] = Field(default_factory=dict)
    """Fault injection (tests only): peer raft address -> 127.0.0.1:port to dial instead, e.g. a
    per-link TCP proxy that can stall or drop the link. Empty in production."""
    fault_act_delay_ms: int = Field(0, ge=0, le=10_000)
    """Fault injection (tests only): pause between a tick's lease check and its first adapter call,
    widening the check-to-send gap that a process pause can fall into. 0 in production."""
    api_tls: ApiTlsConfig | None = None
    """Serve the API over TLS (required unless ``api_address`` is loopback or ``api_insecure``)."""
    api_insecure: bool = False
    """Allow a plaintext API on a non-loopback ``api_address`` (tokens then cross the network in clear)."""
    admin_token_file: Path | None = None
    """File holding an admin token (``cp_<id>_<secret>``); the lease holder registers its hash."""
    adapter_token_file: Path | None = None
    """File holding the bearer token sent on every call to the adapters."""
    adapter_tls: AdapterTlsConfig | None = None
    """Mutual TLS to the adapters (``controlplane/adapter_channel.py``); required for non-loopback adapters."""
    fence_key_file: Path | None = None
    """The coordinators' Ed25519 fence key: the lease holder signs its epoch with it (docs/lease.md)."""
    metrics_address: str | None = None
    """``host:port`` of a Prometheus ``/metrics`` endpoint (plain HTTP, no auth: it names tenants and
    deployments, so bind it where only the monitoring system reaches). None: not served."""

    # --- API limits (docs/api.md "Limits"; enforced by controlplane/api/limits.py) ---------------
    api_workers: int = Field(48, ge=4, le=1024)
    """Threads serving API calls; at least ``api_max_watches + api_max_tenant_calls + api_admin_reserve``."""
    api_max_concurrent_rpcs: int = Field(256, ge=8, le=100_000)
    """Calls accepted at once, running or queued for a thread (gRPC answers RESOURCE_EXHAUSTED beyond)."""
    api_max_watches: int = Field(16, ge=2, le=10_000)
    """Watch streams (``once`` ones included) at once on this coordinator, admins' included."""
    api_max_watches_per_tenant: int = Field(4, ge=1, le=10_000)
    """Watch streams (``once`` ones included) one tenant may hold at once on this coordinator."""
    api_max_tenant_calls: int = Field(24, ge=1, le=10_000)
    """Other calls in flight at once for all tenants together (admins' calls are not counted)."""
    api_max_calls_per_tenant: int = Field(8, ge=1, le=10_000)
    """Other calls one tenant may have in flight at once on this coordinator."""
    api_admin_reserve: int = Field(4, ge=1, le=1_000)
    """Watches and worker threads kept for admins whatever the tenants hold."""
    api_heavy_concurrency: int = Field(2, ge=1, le=64)
    """Threads at once turning the event log into messages (once-watches, catch-up pages)."""
    api_max_request_bytes: int = Field(1 << 20, ge=4096, le=64 << 20)
    """Largest request message the API accepts (gRPC's ``max_receive_message_length``)."""
    api_max_string_bytes: int = Field(1024, ge=64, le=1 << 20)
    """Longest string field of a request, in UTF-8 bytes."""
    api_max_map_entries: int = Field(64, ge=1, le=100_000)
    """Most entries of a map or repeated field of a request (quota, borrow_limit, capacity, kinds)."""
    api_max_command_bytes: int = Field(64 << 10, ge=4096, le=4 << 20)
    """Largest replicated command an API call may commit (its encoded size)."""
    api_max_deployments_per_tenant: int = Field(200, ge=1, le=1_000_000)
    """Deployments one tenant may own (enforced in the replicated apply: concurrent creates cannot
    both pass)."""
    api_max_tokens_per_tenant: int = Field(50, ge=1, le=1_000_000)
    """API tokens scoped to one tenant (enforced in the replicated apply)."""

    # --- Raft transport (raft/transport.py; the table in docs/security.md "Raft transport") ----------
    raft_tls: RaftTlsConfig | None = None
    """Mandatory: this member's Raft CA, certificate and key (mutual TLS between members)."""
    raft_max_frame_bytes: int = Field(DEFAULT_RAFT_MAX_FRAME, ge=MAX_ENTRY_BYTES + 64 * 1024, le=1 << 30)
    """Largest frame a peer may announce; a longer one closes that connection at its header."""
    raft_read_budget_bytes: int = Field(256 * 1024, ge=4096)
    """Bytes read from one connection per loop turn (the rest waits for the next turn)."""
    raft_read_budget_frames: int = Field(64, ge=1)
    """Messages handed to pysyncobj from one connection per loop turn."""
    raft_handshake_timeout_ms: int = Field(3000, gt=0)
    """Connect + TLS handshake + password check must finish within this."""
    raft_half_frame_timeout_ms: int = Field(10_000, gt=0)
    """A frame begun must be complete within this (a maximal frame at 2 MB/s takes ~9 s)."""
    raft_idle_timeout_ms: int = Field(10_000, gt=0)
    """An open connection that receives nothing (not even a keep-alive) for this long is closed."""
    raft_keepalive_ms: int = Field(1000, gt=0)
    """A keep-alive (an empty frame) is sent on a connection that sent nothing for this long."""
    raft_max_send_queue_bytes: int = Field(64 * 1024 * 1024, ge=1 << 20)
    """Bytes queued for one peer that does not read; beyond, the connection is dropped."""
    raft_max_connections: int = Field(64, ge=2)
    """Accepted Raft connections (pending and open) in total; more are accepted and closed at once."""
    raft_max_connections_per_ip: int = Field(16, ge=1)
    """Accepted Raft connections (pending and open) from one peer address."""
    raft_accept_backoff_ms: int = Field(50, gt=0)
    """First pause of the listener after accept() fails for lack of descriptors (EMFILE/ENFILE)."""
    raft_accept_backoff_max_ms: int = Field(1000, gt=0)
    """The pause doubles per failure up to this."""

    _id = field_validator("node_id", "zone")(check_id)
    _addr = field_validator("raft_address", "api_address")(check_address)

    @field_validator("metrics_address")
    @classmethod
    def _metrics_address(cls, value: str | None) -> str | None:
        return None if value is None else check_address(value)

    @field_validator("password")
    @classmethod
    def _password_len(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_PASSWORD_LEN:
            raise ValueError(f"must be at least {MIN_PASSWORD_LEN} characters")
        return value

    @field_validator("admin_token_file")
    @classmethod
    def _admin_token(cls, value: Path | None) -> Path | None:
        if value is not None and parse_token(read_token_file(value)) is None:
            raise ValueError(f"{str(value)!r} does not hold a token of the form cp_<12 hex digits>_<43 characters>")
        return value

    @field_validator("adapter_token_file")
    @classmethod
    def _adapter_token(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_token_file(value)
        return value

    @field_validator("fence_key_file")
    @classmethod
    def _fence_key(cls, value: Path | None) -> Path | None:
        problem = None if value is None else fence_key_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("data_dir")
    @classmethod
    def _data_dir_usable(cls, value: Path) -> Path:
        problem = data_dir_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> CoordinatorConfig:
        self._resolve_password()
        self._check_raft_tls()
        for field, problem in cross_field_problems(self):
            raise ValueError(f"{field}: {problem}")
        return self

    def _resolve_password(self) -> None:
        if self.password is not None and self.password_file is not None:
            raise ValueError("password: set either password or password_file, not both")
        if self.password is None and self.password_file is not None:
            try:
                text = self.password_file.read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ValueError(f"password_file: cannot read {str(self.password_file)!r}: {exc.strerror}") from exc
            if len(text) < MIN_PASSWORD_LEN:
                raise ValueError(
                    f"password_file: the password in {str(self.password_file)!r} must be at least "
                    f"{MIN_PASSWORD_LEN} characters"
                )
            object.__setattr__(self, "password", SecretStr(text))
        if self.password is None:
            raise ValueError(f"password: {PASSWORD_REQUIRED}")

    def _check_raft_tls(self) -> None:
        if self.raft_tls is None:
            raise ValueError(f"raft_tls: {RAFT_TLS_REQUIRED}")
        ids = raft_cert_node_ids(self.raft_tls.cert_file)
        if ids != [self.node_id]:
            named = "no coordinator identity" if not ids else f"coordinator identity {', '.join(map(repr, ids))}"
            raise ValueError(
                f"raft_tls.cert_file: {str(self.raft_tls.cert_file)!r} names {named}, but this member is "
                f"node_id {self.node_id!r} (its URI SAN must be controlplane://coordinator/{self.node_id})"
            )
        if self.raft_keepalive_ms * 3 > self.raft_idle_timeout_ms:
            raise ValueError(f"raft_keepalive_ms: 3*{self.raft_keepalive_ms} exceeds raft_idle_timeout_ms = "
                             f"{self.raft_idle_timeout_ms}: a quiet but live link would be closed")
        if self.raft_accept_backoff_max_ms < self.raft_accept_backoff_ms:
            raise ValueError(f"raft_accept_backoff_max_ms: {self.raft_accept_backoff_max_ms} is below "
                             f"raft_accept_backoff_ms = {self.raft_accept_backoff_ms}")

    # --- convenience views ----------------------------------------------------------------------

    @property
    def holder_validity_ms(self) -> int:
        """How long a holder may act after sending a successful renewal (``V``)."""
        return int(self.lease_duration_ms * (1.0 - self.drift_rho)) - self.lease_margin_ms

    def members(self) -> list[PeerConfig]:
        """All configured members, this node first."""
        me = PeerConfig(
            node_id=self.node_id, zone=self.zone, raft_address=self.raft_address, api_address=self.api_address
        )
        return [me, *self.peers]

    def member_by_address(self, raft_address: str) -> PeerConfig | None:
        return next((m for m in self.members() if m.raft_address == raft_address), None)

    def member_by_id(self, node_id: str) -> PeerConfig | None:
        return next((m for m in self.members() if m.node_id == node_id), None)


def data_dir_problem(path: Path) -> str | None:
    """Create ``path`` if needed and prove it is writable; return the problem or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {str(path)!r}: {exc.strerror or exc}"
    if not path.is_dir():
        return f"{str(path)!r} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-", delete=True) as f:
            f.write(b"ok")
            f.flush()
    except OSError as exc:
        return f"{str(path)!r} is not writable: {exc.strerror or exc}"
    return None


def cross_field_problems(cfg: CoordinatorConfig) -> list[tuple[str, str]]:
    """Relations between fields, in a fixed order; each problem names the field to change."""
    out: list[tuple[str, str]] = []
    if cfg.metrics_address is not None and cfg.metrics_address in (cfg.raft_address, cfg.api_address):
        out.append(("metrics_address", f"{cfg.metrics_address} is already this node's Raft or API address"))
    aep, rmin, rmax = cfg.append_entries_period_ms, cfg.raft_min_timeout_ms, cfg.raft_max_timeout_ms
    lft, step = cfg.leader_fallback_timeout_ms, cfg.step_down_timeout_ms
    if rmin <= 3 * aep:
        out.append(("raft_min_timeout_ms", f"{rmin} must exceed 3*append_entries_period_ms = {3 * aep} (pysyncobj)"))
    if rmax <= rmin:
        out.append(("raft_max_timeout_ms", f"{rmax} must exceed raft_min_timeout_ms = {rmin}"))
    if not aep < lft <= rmin:
        out.append((
            "leader_fallback_timeout_ms",
            (f"{lft} must be above append_entries_period_ms = {aep} and at most raft_min_timeout_ms = {rmin}, "
             "so that an isolated leader steps down before a new one can be elected"),
        ))
    if lft > step:
        out.append((
            "leader_fallback_timeout_ms",
            f"{lft} exceeds step_down_timeout_ms = {step}: an isolated leader would stay leader too long",
        ))
    if 3 * cfg.lease_renew_ms > cfg.lease_duration_ms:
        out.append((
            "lease_renew_ms",
            f"3*{cfg.lease_renew_ms} exceeds lease_duration_ms = {cfg.lease_duration_ms}: renew at least 3 times per lease",
        ))
    v = cfg.holder_validity_ms
    if v <= 2 * cfg.lease_renew_ms:
        out.append((
            "lease_duration_ms",
            (f"holder validity lease_duration*(1-drift_rho)-lease_margin = {v} must exceed 2*lease_renew_ms = "
             f"{2 * cfg.lease_renew_ms}, so a renewal can complete before the previous one expires"),
        ))
    if v > step:
        out.append((
            "lease_duration_ms",
            f"lease longer than the step-down timeout allows: holder validity {v} exceeds step_down_timeout_ms = {step}",
        ))
    if cfg.api_tls is None and not cfg.api_insecure and not is_loopback_address(cfg.api_address):
        out.append((
            "api_tls",
            (f"required: api_address {cfg.api_address!r} is not a loopback address, so the API needs TLS "
             "(or api_insecure: true to serve it in plaintext anyway)"),
        ))
    out.extend(_uniqueness_problems(cfg))
    out.extend(_seed_problems(cfg))
    out.extend(api_limit_problems(cfg))
    out.extend(adapter_channel_problems(cfg))
    return out


# --- API limits: relations between the api_* fields ------------------------------------------------


def api_limit_problems(cfg: CoordinatorConfig) -> list[tuple[str, str]]:
    """Streams and tenants can never take every API thread: what they may hold, plus the admin
    reserve, fits in ``api_workers``."""
    out: list[tuple[str, str]] = []
    need = cfg.api_max_watches + cfg.api_max_tenant_calls + cfg.api_admin_reserve
    if need > cfg.api_workers:
        out.append(("api_workers", f"{cfg.api_workers} is below api_max_watches + api_max_tenant_calls + "
                                   f"api_admin_reserve = {need}: streams and tenants could take every thread"))
    if cfg.api_admin_reserve >= cfg.api_max_watches:
        out.append(("api_admin_reserve", f"{cfg.api_admin_reserve} leaves tenants no watch "
                                         f"(api_max_watches = {cfg.api_max_watches})"))
    if cfg.api_max_watches_per_tenant > cfg.api_max_watches - cfg.api_admin_reserve:
        out.append(("api_max_watches_per_tenant", f"{cfg.api_max_watches_per_tenant} exceeds api_max_watches - "
                                                  f"api_admin_reserve = {cfg.api_max_watches - cfg.api_admin_reserve}"))
    if cfg.api_max_calls_per_tenant > cfg.api_max_tenant_calls:
        out.append(("api_max_calls_per_tenant", f"{cfg.api_max_calls_per_tenant} exceeds api_max_tenant_calls = "
                                                f"{cfg.api_max_tenant_calls}"))
    if cfg.api_max_concurrent_rpcs < cfg.api_workers:
        out.append(("api_max_concurrent_rpcs", f"{cfg.api_max_concurrent_rpcs} is below api_workers = {cfg.api_workers}"))
    return out


def _seed_problems(cfg: CoordinatorConfig) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for what, items in (("tenants", cfg.tenants), ("deployments", cfg.deployments), ("clusters", cfg.clusters)):
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item.id in seen:
                out.append((f"{what}[{i}].id", f"duplicate id {item.id!r}"))
            seen.add(item.id)
    for i, t in enumerate(cfg.tenants):
        try:
            tenant_of(t)
        except ValidationError as exc:
            out.append((f"tenants[{i}].{exc.field.removeprefix('tenant.')}", exc.problem))
    tenants = {t.id for t in cfg.tenants}
    for i, d in enumerate(cfg.deployments):
        if d.tenant not in tenants:
            out.append((f"deployments[{i}].tenant", f"unknown tenant {d.tenant!r} (list it under tenants)"))
            continue
        try:
            deployment_of(d, f"deployments[{i}]")
        except ValidationError as exc:
            out.append((exc.field, exc.problem))
    return out


def _uniqueness_problems(cfg: CoordinatorConfig) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen_ids: set[str] = set()
    seen_addrs: set[str] = set()
    for i, m in enumerate(cfg.members()):
        where = "node_id" if i == 0 else f"peers[{i - 1}].node_id"
        if m.node_id in seen_ids:
            out.append((where, f"node id {m.node_id!r} is used twice"))
        seen_ids.add(m.node_id)
        for kind in ("raft_address", "api_address"):
            addr = getattr(m, kind)
            awhere = kind if i == 0 else f"peers[{i - 1}].{kind}"
            if addr in seen_addrs:
                out.append((awhere, f"address {addr!r} is used twice"))
            seen_addrs.add(addr)
    return out


# --- loading ----------------------------------------------------------------------------------------


_JSON_FIELDS = {"peers": "a JSON list", "api_tls": "a JSON object", "adapter_tls": "a JSON object",
                "raft_tls": "a JSON object"}
_FILE_FIELDS = ("password_file", "admin_token_file", "adapter_token_file", "fence_key_file")
_TLS_FILE_FIELDS = ("cert_file", "key_file", "client_ca_file", "ca_file")


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """``CONTROLPLANE_<FIELD>`` values for known fields (peers and api_tls as JSON)."""
    out: dict[str, Any] = {}
    for name in CoordinatorConfig.model_fields:
        key = ENV_PREFIX + name.upper()
        if key not in env:
            continue
        raw = env[key]
        if name in _JSON_FIELDS:
            try:
                out[name] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: {name} must be {_JSON_FIELDS[name]}: {exc.msg}", field=name) from exc
        else:
            out[name] = raw
    return out


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> CoordinatorConfig:
    """Read ``path`` (YAML mapping), apply env overrides, validate. Raises :class:`ConfigError`."""
    p = Path(path)
    env = os.environ if env is None else env
    raw = read_yaml_mapping(p)
    try:
        data = {**raw, **env_overrides(env)}
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}", file=str(p), field=exc.field) from exc
    data = _self_from_peers(data)
    for name in _FILE_FIELDS:
        if name in data:
            data[name] = _relative_to(p, data[name])
    for section in ("api_tls", "adapter_tls", "raft_tls"):
        tls = data.get(section)
        if isinstance(tls, dict):
            data[section] = {k: (_relative_to(p, v) if k in _TLS_FILE_FIELDS else v) for k, v in tls.items()}
    try:
        return CoordinatorConfig.model_validate(data)
    except PydanticValidationError as exc:
        field, problem = first_problem(exc)
        raise ConfigError(f"{p}: {field}: {problem}" if field else f"{p}: {problem}", file=str(p), field=field) from exc


def _self_from_peers(data: dict[str, Any]) -> dict[str, Any]:
    """Drop this node's own entry from ``peers`` and fill its missing identity fields from it (see the
    module docstring). Anything unusual (no such entry, two of them, not a list) is left to validation."""
    peers, me = data.get("peers"), data.get("node_id")
    if not isinstance(peers, list) or not isinstance(me, str):
        return data
    mine = [i for i, entry in enumerate(peers) if isinstance(entry, dict) and entry.get("node_id") == me]
    if len(mine) != 1:
        return data
    entry = peers[mine[0]]
    if any(key in entry and key in data and data[key] != entry[key] for key in ("raft_address", "api_address")):
        return data  # another node under this id: validation reports the id used twice
    out = {**data, "peers": [e for i, e in enumerate(peers) if i != mine[0]]}
    for key in ("zone", "raft_address", "api_address"):
        if key in entry and key not in out:
            out[key] = entry[key]
    return out


def _relative_to(config_path: Path, value: Any) -> Any:
    """A relative file path in the configuration is taken relative to the configuration's folder."""
    if isinstance(value, str) and value and not Path(value).is_absolute():
        return str(config_path.parent / value)
    return value


def first_problem(exc: PydanticValidationError) -> tuple[str, str]:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    loc = ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in first["loc"]).replace(".[", "[")
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = PASSWORD_REQUIRED if loc == "password" else "required"
    if not loc and ": " in msg:  # cross-field rules carry their field in the message
        loc, msg = msg.split(": ", 1)
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return loc, msg
