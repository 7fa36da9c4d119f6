"""Versioned encoding of replicated commands (never pickle).

Public API:

    CODEC_VERSION = 2
    class CodecError(PermanentError)             # message names the field and the problem
    def encode(cmd: Command | LeaseCommand) -> bytes
    def decode(data: bytes) -> Command | LeaseCommand
    def encode_state(state: ControlState, lease: LeaseRecord) -> bytes    # snapshots
    def decode_state(data: bytes) -> tuple[ControlState, LeaseRecord]

Wire format: compact UTF-8 JSON, keys sorted, no whitespace, so equal values give equal bytes::

    {"f":{...fields...},"k":"set_desired","v":1}

* ``v`` is :data:`CODEC_VERSION`; any other version is refused. Version 2 (optimistic concurrency,
  zones, tokens, object meta) has no reader for version 1: a cluster upgrades from empty data dirs.
* ``k`` is the command's ``kind`` (``COMMAND_TYPES``) or a lease kind (``acquire_lease``,
  ``renew_lease``, ``release_lease``); a snapshot uses ``k = "snapshot"``.
* ``f`` holds every field of the dataclass, defaults included; nested domain values are objects with
  their own fields, enums (``Role`` included) travel by value, ``ScaleMemory.recs`` as a list of ``[bucket_ms, replicas]``
  pairs, ``PutScaleMemories.memories`` as a list of ``[deployment_id, {memory fields}]`` pairs, a
  ``Batch`` as ``{"commands": [{"k": ..., "f": ...}, ...]}``.
* Decoding is strict: an unknown version or kind, a missing or unknown field, a wrong type, an integer
  outside 64 bits, a non-finite number, invalid JSON or UTF-8, or a payload over
  :data:`MAX_PAYLOAD_BYTES` raises :class:`CodecError` whose message starts with the field path
  (``put_tenant.tenant.priority: expected an integer, got a string``). Domain constructors run while
  rebuilding, and their ``ValidationError`` becomes a ``CodecError`` with the same path scheme.
* Encoding checks the same things (and runs the domain validation of ``Tenant``, ``Deployment``...),
  so whatever :func:`encode` accepts, :func:`decode` rebuilds as an equal value.

Fields added after version 2 shipped (``labels`` of tenants, deployments, clusters and zones;
``ScalingPolicy.target_queue_p95_ms``; ``max_per_tenant``) are left out while they hold their zero
(``{}``, 0) and read back as it when absent, so older journals and snapshots decode and every
value without them encodes to the same bytes as before.

Maps inside values (quotas, capacities) are written with sorted keys, so they come back in sorted
order (dict equality ignores order). The state tables of a snapshot are lists, so their insertion
order survives. Float fields are written as floats (``24`` becomes ``24.0``, ``-0.0`` becomes
``0.0``): values that compare equal encode to the same bytes.

The per-type tables below are explicit and checked against ``dataclasses.fields`` at import time: a
command that gains a field without a codec update fails loudly instead of losing data.
"""

from __future__ import annotations

import dataclasses
import json
import json.encoder
import math
import re
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from controlplane.domain import commands as c
from controlplane.domain.demand import DemandHistory
from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.instances import InitMethod, Instance, InstanceEvent, InstanceState
from controlplane.domain.records import BreakerPhase, BreakerRecord, ModelCacheRecord, ObjectMeta, ScaleMemory
from controlplane.domain.state import ControlState, Desired
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.domain.topology import Cluster, Zone
from raft.lease import AcquireLease, LeaseCommand, LeaseRecord, ReleaseLease, RenewLease

__all__ = [
    "CODEC_VERSION",
    "MAX_BATCH_DEPTH",
    "MAX_PAYLOAD_BYTES",
    "SNAPSHOT_KIND",
    "CodecError",
    "decode",
    "decode_state",
    "encode",
    "encode_state",
]

CODEC_VERSION = 2
"""Version of the wire format. Bump it on any incompatible change (and keep a reader for the old one
once a release has data to upgrade)."""
WRITTEN_FOR_COMMAND_VERSION = 6
"""The ``COMMAND_VERSION`` the tables below describe; import fails if the commands moved on."""
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
"""Largest payload :func:`decode` reads and :func:`encode` writes (commands and snapshots alike)."""
MAX_BATCH_DEPTH = 8
"""Most levels of ``Batch`` inside ``Batch`` (``apply`` rejects nested batches; the codec carries
them so every replica rejects them the same way, but not without bound)."""
SNAPSHOT_KIND = "snapshot"
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Integers travel as signed 64-bit values, so any JSON reader can hold them exactly."""


class CodecError(PermanentError):
    """A value cannot be encoded, or bytes cannot be decoded. ``path`` is where (``batch.commands[2]
    .set_desired.replicas``; ``payload`` for the bytes as a whole), ``problem`` what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class _Bad(Exception):
    """Internal: a problem found while walking a value. Callers add path segments on the way out, so
    the happy path never builds a path string."""

    def __init__(self, problem: str, *segments: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments = list(segments)  # innermost first

    def at(self, segment: str) -> _Bad:
        self.segments.append(segment)
        return self

    def error(self, root: str) -> CodecError:
        path = ""
        for seg in reversed(self.segments):
            path = seg if not path else path + seg if seg.startswith("[") else f"{path}.{seg}"
        return CodecError(path or root, self.problem)


_KIND_NAMES = {
    str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
    dict: "an object", type(None): "null", tuple: "a tuple",
}


def _kind(value: object) -> str:
    """``value``'s type as messages name it: JSON types in words, other classes by name."""
    return _KIND_NAMES.get(type(value)) or type(value).__name__


def _a(name: str) -> str:
    return f"an {name}" if name[:1] in "AEIOU" else f"a {name}"


# --- leaf codecs: the same check-and-normalise function serves both directions --------------------

Codec = Callable[[Any], Any]


def _int(v: Any) -> int:
    if type(v) is not int:
        raise _Bad(f"expected an integer, got {_kind(v)}")
    if not INT_MIN <= v <= INT_MAX:
        raise _Bad(f"expected a 64-bit integer, got {v}")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise _Bad(f"expected a boolean, got {_kind(v)}")
    return v


def _float(v: Any) -> float:
    t = type(v)
    if t is not float and t is not int:
        raise _Bad(f"expected a number, got {_kind(v)}")
    if t is int and not INT_MIN <= v <= INT_MAX:
        raise _Bad(f"expected a number, got {v}")
    f = float(v) + 0.0  # one spelling per value: 24 -> 24.0, -0.0 -> 0.0
    if not math.isfinite(f):
        raise _Bad(f"expected a finite number, got {f}")
    return f


def _str(v: Any) -> str:
    if type(v) is not str:
        raise _Bad(f"expected a string, got {_kind(v)}")
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise _Bad("contains a lone surrogate: not encodable as UTF-8") from None
    return v


def _gpu_map(v: Any) -> dict[str, int]:
    """``Mapping[PoolId, int]`` in either direction; written with sorted keys by the JSON layer."""
    if type(v) is not dict and not isinstance(v, Mapping):
        raise _Bad(f"expected an object, got {_kind(v)}")
    out = {}
    for k, n in v.items():
        try:
            out[_str(k)] = _int(n)
        except _Bad as exc:
            raise exc.at(k if type(k) is str else repr(k)) from None
    return out


def _enum_codecs(cls: type[Any]) -> tuple[Codec, Codec]:
    by_value = {m.value: m for m in cls}
    name = cls.__name__

    def enc(v: Any) -> str:
        if type(v) is not cls:
            raise _Bad(f"expected {_a(name)}, got {_kind(v)}")
        return v.value  # type: ignore[no-any-return]

    def dec(v: Any) -> Any:
        member = by_value.get(v) if type(v) is str else None
        if member is None:
            if type(v) is not str:
                raise _Bad(f"expected {_a(name)} value (a string), got {_kind(v)}")
            raise _Bad(f"unknown {name} value {v!r}; expected one of {sorted(by_value)}")
        return member

    return enc, dec


def _enc_pairs(v: Any) -> list[list[int]]:
    if type(v) is not tuple:
        raise _Bad(f"expected a tuple, got {_kind(v)}")
    out = []
    for i, pair in enumerate(v):
        if type(pair) is not tuple or len(pair) != 2:
            got = f"{len(pair)} items" if type(pair) is tuple else _kind(pair)
            raise _Bad(f"expected a pair of integers, got {got}", f"[{i}]")
        out.append([_pair_item(pair, i, 0), _pair_item(pair, i, 1)])
    return out


def _pair_item(pair: Any, i: int, j: int) -> int:
    try:
        return _int(pair[j])
    except _Bad as exc:
        raise exc.at(f"[{j}]").at(f"[{i}]") from None


def _enc_strs(v: Any) -> list[str]:
    if type(v) is not tuple:
        raise _Bad(f"expected a tuple, got {_kind(v)}")
    return [_str_at(x, i) for i, x in enumerate(v)]


def _dec_strs(v: Any) -> tuple[str, ...]:
    if type(v) is not list:
        raise _Bad(f"expected a list, got {_kind(v)}")
    return tuple(_str_at(x, i) for i, x in enumerate(v))


def _str_at(v: Any, i: int) -> str:
    try:
        return _str(v)
    except _Bad as exc:
        raise exc.at(f"[{i}]") from None


def _dec_pairs(v: Any) -> tuple[tuple[int, int], ...]:
    if type(v) is not list:
        raise _Bad(f"expected a list, got {_kind(v)}")
    out = []
    for i, pair in enumerate(v):
        if type(pair) is not list or len(pair) != 2:
            got = f"{len(pair)} items" if type(pair) is list else _kind(pair)
            raise _Bad(f"expected a pair of integers, got {got}", f"[{i}]")
        out.append((_pair_item(pair, i, 0), _pair_item(pair, i, 1)))
    return tuple(out)


# --- structs: one table per dataclass ----------------------------------------------------------


def _from_validation(exc: ValidationError) -> _Bad:
    """A domain ``ValidationError('tenant.quota.h100', ...)`` raised while building the value at some
    path: its first segment names the value itself, the rest is the path inside it."""
    _, dot, rest = exc.field.partition(".")
    return _Bad(exc.problem, rest) if dot else _Bad(exc.problem, exc.field)


class _Struct:
    """Encoder and decoder of one frozen dataclass from an explicit ``(field, enc, dec)`` table."""

    def __init__(self, cls: type[Any], *table: tuple[str, Codec, Codec], omit_zero: tuple[str, ...] = ()) -> None:
        names = tuple(name for name, _, _ in table)
        expected = tuple(f.name for f in dataclasses.fields(cls))
        if names != expected:
            raise TypeError(f"raft/codec.py is out of date for {cls.__name__}: table {names}, fields {expected}")
        self.cls = cls
        self.name = cls.__name__
        self.names = frozenset(names)
        self.omit_zero = frozenset(omit_zero)
        """Fields added later: left out when they hold their zero (0 for a number, ``{}`` for a
        map: the bytes of every older command stay the same) and read back as that zero when absent
        (older journals stay readable)."""
        defaults = {f.name: f for f in dataclasses.fields(cls)}
        self.zeros = {name: _zero_of(defaults[name]) for name in omit_zero}
        self.encoders = tuple((name, enc) for name, enc, _ in table)
        self.decoders = tuple((name, dec) for name, _, dec in table)
        getter = attrgetter(*names)
        self.values: Callable[[Any], tuple[Any, ...]] = getter if len(names) > 1 else (lambda v: (getter(v),))
        self.validate = getattr(cls, "__post_init__", None)

    def enc(self, v: Any) -> dict[str, Any]:
        if type(v) is not self.cls:
            raise _Bad(f"expected {_a(self.name)}, got {_kind(v)}")
        out = {}
        for (name, enc), value in zip(self.encoders, self.values(v)):
            try:
                out[name] = enc(value)
            except _Bad as exc:
                raise exc.at(name) from None
            if name in self.omit_zero and out[name] == self.zeros[name]:
                del out[name]
        if self.validate is not None:  # refuse what decode would refuse: no undecodable log entries
            try:
                self.validate(v)
            except ValidationError as exc:
                raise _from_validation(exc) from None
        return out

    def dec(self, raw: Any) -> Any:
        if type(raw) is not dict:
            raise _Bad(f"expected an object, got {_kind(raw)}")
        if raw.keys() != self.names and not (raw.keys() <= self.names and self.names - raw.keys() <= self.omit_zero):
            raise _key_problem(raw, self.names, self.omit_zero)
        args = []
        for name, dec in self.decoders:
            try:
                args.append(dec(raw[name]) if name in raw else self.zeros[name])
            except _Bad as exc:
                raise exc.at(name) from None
        try:
            return self.cls(*args)
        except ValidationError as exc:
            raise _from_validation(exc) from None


def _zero_of(f: dataclasses.Field[Any]) -> Any:
    """The zero an omitted field stands for: its default (0 or ``{}``; one shared empty dict is
    safe, the values it goes into are frozen and never change their maps)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"raft/codec.py: omit_zero field {f.name!r} needs a default")


def _key_problem(raw: dict[str, Any], names: frozenset[str] | tuple[str, ...],
                 optional: frozenset[str] = frozenset()) -> _Bad:
    missing = sorted(set(names) - raw.keys() - optional)
    if missing:
        return _Bad("missing", missing[0])
    extra = sorted(raw.keys() - set(names))
    return _Bad("unknown field", extra[0])


def _nested(struct: _Struct) -> tuple[Codec, Codec]:
    return struct.enc, struct.dec


def _str_map(v: Any) -> dict[str, str]:
    """``Mapping[str, str]`` (labels) in either direction; sorted keys by the JSON layer."""
    if type(v) is not dict and not isinstance(v, Mapping):
        raise _Bad(f"expected an object, got {_kind(v)}")
    out = {}
    for k, s in v.items():
        try:
            out[_str(k)] = _str(s)
        except _Bad as exc:
            raise exc.at(k if type(k) is str else repr(k)) from None
    return out


_INT, _BOOL, _FLOAT, _STR, _MAP = (_int, _int), (_bool, _bool), (_float, _float), (_str, _str), (_gpu_map, _gpu_map)
_LABELS = (_str_map, _str_map)
_ENGINE = _enum_codecs(Engine)
_EVENT = _enum_codecs(InstanceEvent)
_PHASE = _enum_codecs(BreakerPhase)
_ISTATE = _enum_codecs(InstanceState)
_INIT = _enum_codecs(InitMethod)
_ROLE = _enum_codecs(Role)


def _t(name: str, codecs: tuple[Codec, Codec]) -> tuple[str, Codec, Codec]:
    return (name, codecs[0], codecs[1])


SLO = _Struct(Slo, _t("ttft_p99_ms", _INT), _t("max_queue_ms", _INT))
TENANT = _Struct(
    Tenant, _t("id", _STR), _t("priority", _INT), _t("quota", _MAP), _t("borrow_limit", _MAP),
    _t("slo", _nested(SLO)), _t("labels", _LABELS),
    omit_zero=("labels",),  # labels came after COMMAND_VERSION 6: unlabelled objects keep their bytes
)
POLICY = _Struct(
    ScalingPolicy,
    _t("target_concurrency", _FLOAT), _t("target_kv_usage", _FLOAT), _t("target_token_utilization", _FLOAT),
    _t("tolerance", _FLOAT), _t("stable_window_ms", _INT), _t("ewma_half_life_ms", _INT),
    _t("panic_window_ms", _INT), _t("panic_threshold", _FLOAT), _t("panic_hold_ms", _INT),
    _t("scale_down_stabilization_ms", _INT), _t("max_step_up", _INT), _t("max_step_down", _INT),
    _t("scale_down_cooldown_ms", _INT), _t("ttft_slo_weight", _FLOAT), _t("target_queue_p95_ms", _FLOAT),
    omit_zero=("target_queue_p95_ms",),  # added after COMMAND_VERSION 6 shipped: older bytes stay the same
)
DEPLOYMENT = _Struct(
    Deployment, _t("id", _STR), _t("tenant", _STR), _t("engine", _ENGINE), _t("model", _STR), _t("pool", _STR),
    _t("gpus_per_instance", _INT), _t("min_replicas", _INT), _t("max_replicas", _INT), _t("warm_pool", _INT),
    _t("policy", _nested(POLICY)), _t("created_ms", _INT), _t("deleting", _BOOL), _t("labels", _LABELS),
    omit_zero=("labels",),
)
CLUSTER = _Struct(
    Cluster, _t("id", _STR), _t("zone", _STR), _t("region", _STR), _t("capacity", _MAP), _t("adapter_address", _STR),
    _t("cordoned", _BOOL), _t("draining", _BOOL), _t("labels", _LABELS), omit_zero=("labels",),
)
ZONE = _Struct(Zone, _t("id", _STR), _t("region", _STR), _t("cordoned", _BOOL), _t("draining", _BOOL),
               _t("labels", _LABELS), omit_zero=("labels",))
TOKEN = _Struct(
    TokenRecord, _t("id", _STR), _t("sha256", _STR), _t("role", _ROLE), _t("tenant", _STR), _t("created_ms", _INT),
    _t("expires_ms", _INT), _t("description", _STR),
)
META = _Struct(ObjectMeta, _t("resource_version", _INT), _t("created_ms", _INT), _t("updated_ms", _INT))
BREAKER = _Struct(
    BreakerRecord, _t("phase", _PHASE), _t("failures", _INT), _t("trips", _INT), _t("open_until_ms", _INT),
    _t("probe_in_flight", _BOOL), _t("changed_ms", _INT),
)
MODEL_CACHE = _Struct(ModelCacheRecord, ("models", _enc_strs, _dec_strs), _t("at_ms", _INT))
MEMORY = _Struct(
    ScaleMemory, ("recs", _enc_pairs, _dec_pairs), _t("panic_until_ms", _INT), _t("panic_peak", _INT),
    _t("last_scale_up_ms", _INT), _t("last_scale_down_ms", _INT),
)


def _enc_memories(v: Any) -> list[list[Any]]:
    """``PutScaleMemories.memories``: a list of ``[deployment_id, {memory fields}]`` pairs."""
    if type(v) is not tuple:
        raise _Bad(f"expected a tuple, got {_kind(v)}")
    out = []
    for i, entry in enumerate(v):
        if type(entry) is not tuple or len(entry) != 2:
            got = f"{len(entry)} items" if type(entry) is tuple else _kind(entry)
            raise _Bad(f"expected a (deployment id, memory) pair, got {got}", f"[{i}]")
        out.append(_memory_entry(entry, i, MEMORY.enc))
    return out


def _dec_memories(v: Any) -> tuple[tuple[str, ScaleMemory], ...]:
    if type(v) is not list:
        raise _Bad(f"expected a list, got {_kind(v)}")
    out = []
    for i, entry in enumerate(v):
        if type(entry) is not list or len(entry) != 2:
            got = f"{len(entry)} items" if type(entry) is list else _kind(entry)
            raise _Bad(f"expected a [deployment id, memory] pair, got {got}", f"[{i}]")
        out.append(tuple(_memory_entry(entry, i, MEMORY.dec)))
    return tuple(out)  # type: ignore[arg-type]


def _memory_entry(entry: Any, i: int, memory: Codec) -> list[Any]:
    try:
        did = _str(entry[0])
    except _Bad as exc:
        raise exc.at("[0]").at(f"[{i}]") from None
    try:
        return [did, memory(entry[1])]
    except _Bad as exc:
        raise exc.at("[1]").at(f"[{i}]") from None


_HEX = re.compile("[0-9a-f]*")


def _enc_hex(v: Any) -> str:
    """``bytes`` as lowercase hex (``DemandHistory.data``)."""
    if type(v) is not bytes:
        raise _Bad(f"expected bytes, got {_kind(v)}")
    return v.hex()


def _dec_hex(v: Any) -> bytes:
    if type(v) is not str:
        raise _Bad(f"expected a hex string, got {_kind(v)}")
    if len(v) % 2 or _HEX.fullmatch(v) is None:
        raise _Bad("expected an even number of lowercase hex digits")
    return bytes.fromhex(v)


DEMAND = _Struct(DemandHistory, _t("end_ms", _INT), ("data", _enc_hex, _dec_hex))


def _enc_demand_entries(v: Any) -> list[list[Any]]:
    """``RecordDemand.entries``: a list of ``[deployment_id, deci-replicas]`` pairs."""
    if type(v) is not tuple:
        raise _Bad(f"expected a tuple, got {_kind(v)}")
    return [_demand_entry(e, i, tuple) for i, e in enumerate(v)]


def _dec_demand_entries(v: Any) -> tuple[tuple[str, int], ...]:
    if type(v) is not list:
        raise _Bad(f"expected a list, got {_kind(v)}")
    return tuple(tuple(_demand_entry(e, i, list)) for i, e in enumerate(v))  # type: ignore[misc]


def _demand_entry(entry: Any, i: int, kind: type) -> list[Any]:
    if type(entry) is not kind or len(entry) != 2:
        raise _Bad(f"expected a (deployment id, deci-replicas) pair, got {_kind(entry)}", f"[{i}]")
    return _memory_entry(entry, i, _int)


INSTANCE = _Struct(
    Instance, _t("id", _STR), _t("deployment", _STR), _t("tenant", _STR), _t("cluster", _STR), _t("zone", _STR),
    _t("pool", _STR), _t("gpus", _INT), _t("state", _ISTATE), _t("init_method", _INIT), _t("created_ms", _INT),
    _t("state_since_ms", _INT), _t("drain_deadline_ms", _INT), _t("preempted", _BOOL),
)
DESIRED = _Struct(
    Desired, _t("replicas", _INT), _t("warm_pool", _INT), _t("generation", _INT), _t("reason", _STR),
    _t("at_ms", _INT),
)
LEASE_RECORD = _Struct(
    LeaseRecord, _t("holder", _STR), _t("epoch", _INT), _t("version", _INT), _t("duration_ms", _INT)
)

COMMAND_TABLES: dict[type[Any], _Struct | None] = {
    c.PutTenant: _Struct(c.PutTenant, _t("tenant", _nested(TENANT)), _t("expect_version", _INT), _t("at_ms", _INT)),
    c.RemoveTenant: _Struct(c.RemoveTenant, _t("tenant_id", _STR), _t("expect_version", _INT)),
    c.PutDeployment: _Struct(
        c.PutDeployment, _t("deployment", _nested(DEPLOYMENT)), _t("expect_version", _INT), _t("at_ms", _INT),
        _t("max_per_tenant", _INT), omit_zero=("max_per_tenant",),
    ),
    c.RemoveDeployment: _Struct(c.RemoveDeployment, _t("deployment_id", _STR), _t("expect_version", _INT)),
    c.PutCluster: _Struct(c.PutCluster, _t("cluster", _nested(CLUSTER)), _t("expect_version", _INT), _t("at_ms", _INT)),
    c.RemoveCluster: _Struct(c.RemoveCluster, _t("cluster_id", _STR), _t("expect_version", _INT)),
    c.PutZone: _Struct(c.PutZone, _t("zone", _nested(ZONE)), _t("expect_version", _INT), _t("at_ms", _INT)),
    c.RemoveZone: _Struct(c.RemoveZone, _t("zone_id", _STR), _t("expect_version", _INT)),
    c.PutToken: _Struct(c.PutToken, _t("token", _nested(TOKEN)), _t("max_per_tenant", _INT), omit_zero=("max_per_tenant",)),
    c.RemoveToken: _Struct(c.RemoveToken, _t("token_id", _STR)),
    c.SetDesired: _Struct(
        c.SetDesired, _t("deployment_id", _STR), _t("replicas", _INT), _t("warm_pool", _INT), _t("reason", _STR),
        _t("at_ms", _INT), _t("message", _STR),
    ),
    c.PutScaleMemory: _Struct(c.PutScaleMemory, _t("deployment_id", _STR), _t("memory", _nested(MEMORY))),
    c.PutScaleMemories: _Struct(c.PutScaleMemories, ("memories", _enc_memories, _dec_memories)),
    c.RecordDemand: _Struct(c.RecordDemand, _t("end_ms", _INT), ("entries", _enc_demand_entries, _dec_demand_entries)),
    c.CreateInstance: _Struct(
        c.CreateInstance, _t("instance_id", _STR), _t("deployment_id", _STR), _t("cluster_id", _STR),
        _t("at_ms", _INT),
    ),
    c.TransitionInstance: _Struct(
        c.TransitionInstance, _t("instance_id", _STR), _t("event", _EVENT), _t("at_ms", _INT),
        _t("drain_deadline_ms", _INT), _t("preempted", _BOOL),
    ),
    c.PutBreaker: _Struct(c.PutBreaker, _t("key", _STR), _t("record", _nested(BREAKER))),
    c.PutModelCache: _Struct(c.PutModelCache, _t("cluster_id", _STR), _t("record", _nested(MODEL_CACHE))),
    c.Batch: None,  # members are commands: handled by _enc_batch / _dec_batch (depth-limited)
}
LEASE_TABLES: dict[str, _Struct] = {
    "acquire_lease": _Struct(AcquireLease, _t("node", _STR), _t("expected_version", _INT), _t("duration_ms", _INT)),
    "renew_lease": _Struct(RenewLease, _t("node", _STR), _t("epoch", _INT)),
    "release_lease": _Struct(ReleaseLease, _t("node", _STR), _t("epoch", _INT)),
}


def _check_tables() -> None:
    if c.COMMAND_VERSION != WRITTEN_FOR_COMMAND_VERSION:
        raise TypeError(
            f"raft/codec.py describes COMMAND_VERSION {WRITTEN_FOR_COMMAND_VERSION}, commands are at "
            f"{c.COMMAND_VERSION}: update the tables and bump CODEC_VERSION"
        )
    if set(COMMAND_TABLES) != set(c.COMMAND_TYPES.values()):
        raise TypeError(f"raft/codec.py is out of date: it knows {sorted(t.kind for t in COMMAND_TABLES)}, "
                        f"COMMAND_TYPES has {sorted(c.COMMAND_TYPES)}")
    if set(LEASE_TABLES) & set(c.COMMAND_TYPES) or SNAPSHOT_KIND in set(LEASE_TABLES) | set(c.COMMAND_TYPES):
        raise TypeError("raft/codec.py: command kinds collide")


_check_tables()

_BY_TYPE: dict[type[Any], tuple[str, _Struct | None]] = {
    **{cls: (cls.kind, table) for cls, table in COMMAND_TABLES.items()},
    **{table.cls: (kind, table) for kind, table in LEASE_TABLES.items()},
}
_DOMAIN_BY_KIND: dict[str, tuple[type[Any], _Struct | None]] = {cls.kind: (cls, t) for cls, t in COMMAND_TABLES.items()}
_MEMBER_KEYS = frozenset({"k", "f"})
_ENVELOPE_KEYS = frozenset({"v", "k", "f"})


# --- commands -----------------------------------------------------------------------------------


def _enc_command(cmd: Any, depth: int) -> tuple[str, dict[str, Any]]:
    entry = _BY_TYPE.get(type(cmd))
    if entry is None:
        raise _Bad(f"unknown command type {type(cmd).__name__}")
    kind, table = entry
    try:
        return kind, (_enc_batch(cmd, depth) if table is None else table.enc(cmd))
    except _Bad as exc:
        raise exc.at(kind) from None


def _enc_batch(batch: c.Batch, depth: int) -> dict[str, Any]:
    if depth >= MAX_BATCH_DEPTH:
        raise _Bad(f"batches nested more than {MAX_BATCH_DEPTH} deep", "commands")
    members = batch.commands
    if type(members) is not tuple:
        raise _Bad(f"expected a tuple, got {_kind(members)}", "commands")
    out = []
    for i, cmd in enumerate(members):
        try:
            if type(cmd) not in COMMAND_TABLES:
                raise _Bad(f"expected a domain command, got {type(cmd).__name__}")
            kind, fields = _enc_command(cmd, depth + 1)
        except _Bad as exc:
            raise exc.at(f"[{i}]").at("commands") from None
        out.append({"k": kind, "f": fields})
    return {"commands": out}


def _dec_fields(kind: str, table: _Struct | None, fields: Any, depth: int) -> Any:
    try:
        return _dec_batch(fields, depth) if table is None else table.dec(fields)
    except _Bad as exc:
        raise exc.at(kind) from None


def _dec_batch(fields: Any, depth: int) -> c.Batch:
    if depth >= MAX_BATCH_DEPTH:
        raise _Bad(f"batches nested more than {MAX_BATCH_DEPTH} deep", "commands")
    if type(fields) is not dict:
        raise _Bad(f"expected an object, got {_kind(fields)}")
    if fields.keys() != {"commands"}:
        raise _key_problem(fields, ("commands",))
    members = fields["commands"]
    if type(members) is not list:
        raise _Bad(f"expected a list, got {_kind(members)}", "commands")
    out = []
    for i, raw in enumerate(members):
        try:
            out.append(_dec_member(raw, depth + 1))
        except _Bad as exc:
            raise exc.at(f"[{i}]").at("commands") from None
    return c.Batch(tuple(out))


def _dec_member(raw: Any, depth: int) -> c.Command:
    if type(raw) is not dict:
        raise _Bad(f"expected an object, got {_kind(raw)}")
    if raw.keys() != _MEMBER_KEYS:
        raise _key_problem(raw, _MEMBER_KEYS)
    kind = raw["k"]
    entry = _DOMAIN_BY_KIND.get(kind) if type(kind) is str else None
    if entry is None:
        if type(kind) is not str:
            raise _Bad(f"expected a string, got {_kind(kind)}", "k")
        why = "lease commands are not batched" if kind in LEASE_TABLES else "unknown command kind"
        raise _Bad(f"{why}: {kind!r}", "k")
    return _dec_fields(kind, entry[1], raw["f"], depth)  # type: ignore[no-any-return]


def encode(cmd: c.Command | LeaseCommand) -> bytes:
    """The bytes of one replicated command. Raises :class:`CodecError` for a value it cannot carry
    faithfully (wrong field types, a list where a tuple belongs, a domain value that fails its own
    validation, an unknown command type)."""
    try:
        kind, fields = _enc_command(cmd, 0)
    except _Bad as exc:
        raise exc.error("command") from None
    return _dump({"v": CODEC_VERSION, "k": kind, "f": fields})


def decode(data: bytes) -> c.Command | LeaseCommand:
    """Rebuild a command from :func:`encode`'s bytes; raises :class:`CodecError` naming the field."""
    kind, fields = _open(_load(data))
    if type(kind) is str:
        entry = _DOMAIN_BY_KIND.get(kind)
        if entry is not None:
            table = entry[1]
        else:
            table = LEASE_TABLES.get(kind)
            if table is None:
                raise CodecError("k", f"unknown command kind {kind!r}")
        try:
            return _dec_fields(kind, table, fields, 0)  # type: ignore[no-any-return]
        except _Bad as exc:
            raise exc.error(kind) from None
    raise CodecError("k", f"expected a string, got {_kind(kind)}")


# --- bytes and envelope -------------------------------------------------------------------------

def _no_default(value: object) -> object:
    raise TypeError(f"raft/codec.py bug: {type(value).__name__} reached the JSON layer")


_JSON_OUT = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"), check_circular=False,
    default=_no_default,
)
_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)
if _C_MAKE_ENCODER is not None:
    # JSONEncoder.encode builds this C encoder on every call; build it once (same output, about 1 us
    # less per command). Arguments as JSONEncoder.iterencode passes them.
    _C_ENCODE = _C_MAKE_ENCODER(None, _no_default, json.encoder.encode_basestring, None, ":", ",", True, False, False)

    def _to_json(obj: object) -> str:
        return "".join(_C_ENCODE(obj, 0))
else:  # pragma: no cover - CPython always has _json
    _to_json = _JSON_OUT.encode
_JSON_IN = json.JSONDecoder()


def _dump(obj: dict[str, Any]) -> bytes:
    data = _to_json(obj).encode("utf-8")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise CodecError("payload", f"{len(data)} bytes exceed the limit of {MAX_PAYLOAD_BYTES} bytes")
    return data


def _load(data: Any) -> Any:
    if isinstance(data, memoryview):
        data = data.tobytes()
    if not isinstance(data, (bytes, bytearray)):
        raise CodecError("payload", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise CodecError("payload", f"{len(data)} bytes exceed the limit of {MAX_PAYLOAD_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError("payload", f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        obj, end = _JSON_IN.raw_decode(text)  # no whitespace skipping: encode never writes any
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
        return obj
    except json.JSONDecodeError as exc:
        raise CodecError("payload", f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    except RecursionError as exc:
        raise CodecError("payload", "not valid JSON (nested too deeply)") from exc
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise CodecError("payload", f"not valid JSON ({exc})") from exc


def _open(obj: Any) -> tuple[Any, Any]:
    """Check the envelope ``{"v", "k", "f"}``; return ``(kind, fields)`` unchecked."""
    if type(obj) is not dict:
        raise CodecError("payload", f"expected an object, got {_kind(obj)}")
    if "v" not in obj:
        raise CodecError("v", "missing")
    version = obj["v"]
    if type(version) is not int:
        raise CodecError("v", f"expected an integer, got {_kind(version)}")
    if version != CODEC_VERSION:
        raise CodecError("v", f"unsupported codec version {version}; this build reads version {CODEC_VERSION}")
    if obj.keys() != _ENVELOPE_KEYS:
        raise _key_problem(obj, _ENVELOPE_KEYS).error("payload")
    return obj["k"], obj["f"]


# --- snapshots ----------------------------------------------------------------------------------

_ID_TABLES: tuple[tuple[str, _Struct], ...] = (
    ("tenants", TENANT), ("deployments", DEPLOYMENT), ("clusters", CLUSTER), ("instances", INSTANCE),
    ("zones", ZONE), ("tokens", TOKEN),
)
_KEYED_TABLES: tuple[tuple[str, _Struct], ...] = (
    ("desired", DESIRED), ("memory", MEMORY), ("breakers", BREAKER), ("meta", META), ("demand", DEMAND),
    ("model_caches", MODEL_CACHE),
)
_OPTIONAL_STATE_KEYS = frozenset(["demand", "model_caches"])
"""Tables a snapshot written before they existed lacks (COMMAND_VERSION 5 had no ``demand`` and no
``model_caches``): read as empty."""
_STATE_KEYS = frozenset(
    [name for name, _ in _ID_TABLES] + [name for name, _ in _KEYED_TABLES] + ["applied", "gpus_used_keys", "lease"]
)



def _enc_id_table(table: Any, struct: _Struct) -> list[dict[str, Any]]:
    """A table keyed by its values' ``id``, as the list of values in insertion order."""
    out = []
    for i, (key, value) in enumerate(table.items()):
        try:
            fields = struct.enc(value)
            if key != fields["id"]:
                raise _Bad(f"table key {key!r} differs from the id {fields['id']!r}", "id")
        except _Bad as exc:
            raise exc.at(f"[{i}]") from None
        out.append(fields)
    return out


def _enc_keyed_table(table: Any, struct: _Struct) -> list[list[Any]]:
    """A table keyed by a string, as ``[key, value]`` pairs in insertion order."""
    out = []
    for i, (key, value) in enumerate(table.items()):
        try:
            out.append([_str(key), struct.enc(value)])
        except _Bad as exc:
            raise exc.at(f"[{i}]") from None
    return out


def _enc_gpu_keys(gpus_used: Any) -> list[list[str]]:
    out = []
    for i, key in enumerate(gpus_used):
        if type(key) is not tuple or len(key) != 2:
            raise _Bad(f"expected a (cluster, pool) pair, got {_kind(key)}", f"[{i}]")
        out.append([_str_item(key, i, 0), _str_item(key, i, 1)])
    return out


def _str_item(pair: Any, i: int, j: int) -> str:
    try:
        return _str(pair[j])
    except _Bad as exc:
        raise exc.at(f"[{j}]").at(f"[{i}]") from None


def encode_state(state: ControlState, lease: LeaseRecord) -> bytes:
    """A snapshot of the replicated state and the lease record.

    Every table is a list in insertion order. The derived indexes are not stored: :func:`decode_state`
    rebuilds them from the instances, except the key order of ``gpus_used`` (apply keeps a key at 0
    once its last instance is gone), which is stored as ``gpus_used_keys``.
    """
    if type(state) is not ControlState:
        raise CodecError("state", f"expected a ControlState, got {_kind(state)}")
    fields: dict[str, Any] = {}
    try:
        for name, struct in _ID_TABLES:
            fields[name] = _wrap(name, _enc_id_table, getattr(state, name), struct)
        for name, struct in _KEYED_TABLES:
            fields[name] = _wrap(name, _enc_keyed_table, getattr(state, name), struct)
        fields["applied"] = _wrap("applied", _int, state.applied)
        fields["gpus_used_keys"] = _wrap("gpus_used_keys", _enc_gpu_keys, state.gpus_used)
        fields["lease"] = _wrap("lease", LEASE_RECORD.enc, lease)
    except _Bad as exc:
        raise exc.at("state").error("state") from None
    return _dump({"v": CODEC_VERSION, "k": SNAPSHOT_KIND, "f": fields})


def _wrap(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except _Bad as exc:
        raise exc.at(name) from None


def _dec_list(raw: Any) -> list[Any]:
    if type(raw) is not list:
        raise _Bad(f"expected a list, got {_kind(raw)}")
    return raw


def _dec_id_table(raw: Any, struct: _Struct) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, item in enumerate(_dec_list(raw)):
        try:
            value = struct.dec(item)
            if value.id in out:
                raise _Bad(f"duplicate id {value.id!r}", "id")
        except _Bad as exc:
            raise exc.at(f"[{i}]") from None
        out[value.id] = value
    return out


def _dec_keyed_table(raw: Any, struct: _Struct) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, item in enumerate(_dec_list(raw)):
        try:
            if type(item) is not list or len(item) != 2:
                raise _Bad(f"expected a [key, value] pair, got {_kind(item)}")
            key = _str(item[0])
            if key in out:
                raise _Bad(f"duplicate key {key!r}", "[0]")
            out[key] = struct.dec(item[1])
        except _Bad as exc:
            raise exc.at(f"[{i}]") from None
    return out


def _dec_gpu_keys(raw: Any) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for i, item in enumerate(_dec_list(raw)):
        if type(item) is not list or len(item) != 2:
            raise _Bad(f"expected a [cluster, pool] pair, got {_kind(item)}", f"[{i}]")
        key = (_str_item(item, i, 0), _str_item(item, i, 1))
        if key in out:
            raise _Bad(f"duplicate key {list(key)}", f"[{i}]")
        out[key] = 0
    return out


def _rebuild_indexes(state: ControlState, gpus_used: dict[tuple[str, str], int]) -> None:
    """``by_deployment`` and ``gpus_used`` exactly as ``apply`` leaves them: one (possibly empty)
    entry per deployment in deployment order, instances in insertion order; GPUs of non-terminal
    instances summed per ``(cluster, pool)`` in the recorded key order."""
    by_deployment: dict[Any, dict[Any, None]] = {d: {} for d in state.deployments}
    for i, (iid, inst) in enumerate(state.instances.items()):
        bucket = by_deployment.get(inst.deployment)
        if bucket is None:
            raise _Bad(f"unknown deployment {inst.deployment!r}", "deployment", f"[{i}]", "instances")
        bucket[iid] = None
        if not inst.state.terminal:
            key = (inst.cluster, inst.pool)
            if key not in gpus_used:
                raise _Bad(f"lacks {list(key)}, used by instance {iid!r}", "gpus_used_keys")
            gpus_used[key] += inst.gpus
    state.by_deployment = by_deployment
    state.gpus_used = gpus_used  # type: ignore[assignment]


def decode_state(data: bytes) -> tuple[ControlState, LeaseRecord]:
    """Rebuild a snapshot from :func:`encode_state`'s bytes, derived indexes included."""
    kind, fields = _open(_load(data))
    if kind != SNAPSHOT_KIND:
        raise CodecError("k", f"expected {SNAPSHOT_KIND!r}, got {kind!r}")
    try:
        if type(fields) is not dict:
            raise _Bad(f"expected an object, got {_kind(fields)}")
        if fields.keys() != _STATE_KEYS and fields.keys() | _OPTIONAL_STATE_KEYS != _STATE_KEYS:
            raise _key_problem(fields, _STATE_KEYS)
        state = ControlState()
        for name, struct in _ID_TABLES:
            setattr(state, name, _wrap(name, _dec_id_table, fields[name], struct))
        for name, struct in _KEYED_TABLES:
            setattr(state, name, _wrap(name, _dec_keyed_table, fields.get(name, []), struct))
        state.applied = _wrap("applied", _int, fields["applied"])
        gpus_used = _wrap("gpus_used_keys", _dec_gpu_keys, fields["gpus_used_keys"])
        lease = _wrap("lease", LEASE_RECORD.dec, fields["lease"])
        _rebuild_indexes(state, gpus_used)
    except _Bad as exc:
        raise exc.at("state").error("state") from None
    return state, lease
