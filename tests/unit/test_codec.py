"""The command codec: every replicated command and the state snapshot round-trip exactly, encode to
canonical bytes, and anything malformed is refused with a ``CodecError`` that names the field path."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain import commands as c
from controlplane.domain.errors import PermanentError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import TRANSITIONS, InitMethod, InstanceEvent, InstanceState
from controlplane.domain.records import BreakerPhase, BreakerRecord, ModelCacheRecord, ObjectMeta, ScaleMemory
from controlplane.domain.state import ControlState, Desired, apply, snapshot
from controlplane.domain.tenants import HOUR_MS, MAX_PRIORITY, Deployment, Engine, ScalingPolicy, Slo, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.domain.topology import Cluster, Zone
from raft import codec
from raft.codec import (
    CODEC_VERSION,
    MAX_BATCH_DEPTH,
    MAX_PAYLOAD_BYTES,
    CodecError,
    decode,
    decode_state,
    encode,
    encode_state,
)
from raft.lease import AcquireLease, LeaseRecord, ReleaseLease, RenewLease

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
E, S = InstanceEvent, InstanceState


def unchecked(value: Any, **changes: Any) -> Any:
    """A copy of a frozen value with fields changed without running its validation (a buggy proposer)."""
    copy = dataclasses.replace(value)
    for name, v in changes.items():
        object.__setattr__(copy, name, v)
    return copy


def roundtrip(value: Any) -> Any:
    data = encode(value)
    back = decode(data)
    assert back == value and type(back) is type(value)
    assert encode(back) == data, "re-encoding a decoded command changed its bytes"
    return back


def loads(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# --- strategies: valid domain values ------------------------------------------------------------

ids = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
int64 = st.integers(INT_MIN, INT_MAX)
naturals = st.integers(0, INT_MAX)
texts = st.text(max_size=30)  # any Unicode except surrogates: JSON escapes, non-ASCII, quotes
gpu_maps = st.dictionaries(ids, naturals, max_size=3)
label_names = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True)
label_maps = st.one_of(st.just({}), st.dictionaries(
    st.one_of(label_names, st.builds(lambda p, n: f"{p}.io/{n}", ids, label_names)),
    st.one_of(st.just(""), label_names), max_size=3))
"""Empty half the time: the encoding leaves an empty map out."""


def floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Finite floats in [lo, hi], and sometimes an int in range (the domain accepts both)."""
    fl = st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    ints = st.integers(int(lo) + (lo != int(lo)), int(hi))
    return st.one_of(fl, ints) if int(lo) + (lo != int(lo)) <= int(hi) else fl


slos = st.builds(Slo, st.integers(1, HOUR_MS), st.integers(1, HOUR_MS))
tenants = st.builds(Tenant, ids, st.integers(0, MAX_PRIORITY), gpu_maps, gpu_maps, slos, label_maps)


@st.composite
def policies(draw: st.DrawFn) -> ScalingPolicy:
    stable = draw(st.integers(1_000, HOUR_MS))
    return ScalingPolicy(
        target_concurrency=draw(floats(0.01, 1e5)),
        target_kv_usage=draw(floats(0.01, 1.0)),
        target_token_utilization=draw(floats(0.01, 1.0)),
        tolerance=draw(floats(0.0, 0.9)),
        stable_window_ms=stable,
        ewma_half_life_ms=draw(st.integers(1, HOUR_MS)),
        panic_window_ms=draw(st.integers(250, stable)),
        panic_threshold=draw(floats(1.0, 100.0)),
        panic_hold_ms=draw(st.integers(0, HOUR_MS)),
        scale_down_stabilization_ms=draw(st.integers(0, HOUR_MS)),
        max_step_up=draw(st.integers(1, 100_000)),
        max_step_down=draw(st.integers(1, 100_000)),
        scale_down_cooldown_ms=draw(st.integers(0, HOUR_MS)),
        ttft_slo_weight=draw(floats(0.0, 10.0)),
    )


@st.composite
def deployments(draw: st.DrawFn) -> Deployment:
    mx = draw(st.integers(1, 100_000))
    return Deployment(
        id=draw(ids), tenant=draw(ids), engine=draw(st.sampled_from(Engine)),
        model=draw(st.text(min_size=1, max_size=30)),
        pool=draw(ids), gpus_per_instance=draw(st.integers(1, 64)), min_replicas=draw(st.integers(0, mx)),
        max_replicas=mx, warm_pool=draw(st.integers(0, 1_000)), policy=draw(policies()), created_ms=draw(int64),
        deleting=draw(st.booleans()), labels=draw(label_maps),
    )


@st.composite
def token_records(draw: st.DrawFn) -> TokenRecord:
    role = draw(st.sampled_from(Role))
    return TokenRecord(
        id=draw(st.from_regex(r"[0-9a-f]{12}", fullmatch=True)),
        sha256=draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
        role=role,
        tenant=draw(ids) if role is Role.TENANT else "",
        created_ms=draw(naturals),
        expires_ms=draw(naturals),
        description=draw(st.text(max_size=30)),
    )


clusters = st.builds(Cluster, ids, ids, ids, gpu_maps, texts, st.booleans(), st.booleans(), label_maps)
zones = st.builds(Zone, ids, ids, st.booleans(), st.booleans(), label_maps)
metas = st.builds(ObjectMeta, int64, int64, int64)
breakers = st.builds(BreakerRecord, st.sampled_from(BreakerPhase), int64, int64, int64, st.booleans(), int64)
model_caches = st.builds(
    ModelCacheRecord, st.lists(st.text(min_size=1, max_size=20), unique=True, max_size=5).map(lambda m: tuple(sorted(m))),
    naturals,
)
memories = st.builds(ScaleMemory, st.lists(st.tuples(int64, int64), max_size=5).map(tuple), int64, int64, int64, int64)

SINGLE: dict[str, st.SearchStrategy[Any]] = {
    "put_tenant": st.builds(c.PutTenant, tenants, int64, int64),
    "remove_tenant": st.builds(c.RemoveTenant, texts, int64),
    "put_deployment": st.builds(c.PutDeployment, deployments(), int64, int64),
    "remove_deployment": st.builds(c.RemoveDeployment, texts, int64),
    "put_cluster": st.builds(c.PutCluster, clusters, int64, int64),
    "remove_cluster": st.builds(c.RemoveCluster, texts, int64),
    "put_zone": st.builds(c.PutZone, zones, int64, int64),
    "remove_zone": st.builds(c.RemoveZone, texts, int64),
    "put_token": st.builds(c.PutToken, token_records()),
    "remove_token": st.builds(c.RemoveToken, texts),
    "set_desired": st.builds(c.SetDesired, texts, int64, int64, texts, int64, texts),
    "put_scale_memory": st.builds(c.PutScaleMemory, texts, memories),
    "put_scale_memories": st.builds(
        c.PutScaleMemories, st.lists(st.tuples(texts, memories), max_size=4).map(tuple)
    ),
    "record_demand": st.builds(
        c.RecordDemand, int64, st.lists(st.tuples(texts, int64), max_size=4).map(tuple)
    ),
    "create_instance": st.builds(c.CreateInstance, texts, texts, texts, int64),
    "transition_instance": st.builds(
        c.TransitionInstance, texts, st.sampled_from(InstanceEvent), int64, int64, st.booleans()
    ),
    "put_breaker": st.builds(c.PutBreaker, texts, breakers),
    "put_model_cache": st.builds(c.PutModelCache, texts, model_caches),
}
DOMAIN_COMMANDS = st.one_of(*SINGLE.values())
batches = st.recursive(
    st.lists(DOMAIN_COMMANDS, max_size=6).map(lambda cmds: c.Batch(tuple(cmds))),
    lambda inner: st.lists(st.one_of(DOMAIN_COMMANDS, inner), max_size=3).map(lambda cmds: c.Batch(tuple(cmds))),
    max_leaves=12,
)
LEASE: dict[str, st.SearchStrategy[Any]] = {
    "acquire_lease": st.builds(AcquireLease, texts, int64, int64),
    "renew_lease": st.builds(RenewLease, texts, int64),
    "release_lease": st.builds(ReleaseLease, texts, int64),
}
STRATEGIES = {**SINGLE, "batch": batches, **LEASE}
ANY_COMMAND = st.one_of(*STRATEGIES.values())


def test_strategies_cover_every_command_kind() -> None:
    assert set(STRATEGIES) == set(c.COMMAND_TYPES) | set(codec.LEASE_TABLES)
    assert set(codec.LEASE_TABLES) == {"acquire_lease", "renew_lease", "release_lease"}


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
@settings(max_examples=40)
@given(data=st.data())
def test_every_command_kind_round_trips(kind: str, data: st.DataObject) -> None:
    cmd = data.draw(STRATEGIES[kind])
    raw = loads(encode(cmd))
    assert raw["v"] == CODEC_VERSION and raw["k"] == kind and set(raw) == {"v", "k", "f"}
    roundtrip(cmd)


@settings(max_examples=60)
@given(batches)
def test_batches_round_trip_with_tuples_and_enums(batch: c.Batch) -> None:
    back = roundtrip(batch)

    def check(orig: c.Batch, got: c.Batch) -> None:
        assert type(got.commands) is tuple and len(got.commands) == len(orig.commands)
        for a, b in zip(orig.commands, got.commands):
            assert type(a) is type(b)
            if isinstance(a, c.Batch):
                check(a, b)
            if isinstance(a, c.PutScaleMemory):
                assert type(b.memory.recs) is tuple and all(type(p) is tuple for p in b.memory.recs)
            if isinstance(a, c.TransitionInstance):
                assert isinstance(b.event, InstanceEvent)
            if isinstance(a, c.PutBreaker):
                assert isinstance(b.record.phase, BreakerPhase)

    check(batch, back)


def test_nested_values_are_rebuilt_with_their_types() -> None:
    d = Deployment(DeploymentId("chat"), TenantId("acme"), Engine.DEEPSPEED_MII, "llama-3-8b", PoolId("h100"), 2)
    back = roundtrip(c.PutDeployment(d)).deployment
    assert back.engine is Engine.DEEPSPEED_MII and type(back.policy) is ScalingPolicy
    assert type(back.policy.target_concurrency) is float
    t = roundtrip(c.PutTenant(Tenant(TenantId("acme"), 3, {"h100": 2}, {"a100": 1}, Slo(100, 200)))).tenant
    assert (type(t.quota), type(t.slo), t.slo) == (dict, Slo, Slo(100, 200))
    m = roundtrip(c.PutScaleMemory(DeploymentId("chat"), ScaleMemory(((1_000, 5), (2_000, 3)), 7, 5, 1, -1))).memory
    assert m.recs == ((1_000, 5), (2_000, 3)) and type(m.recs[0]) is tuple


def test_the_wire_format_is_pinned() -> None:
    """Changing these bytes is a wire-format change: bump CODEC_VERSION."""
    assert encode(c.SetDesired(DeploymentId("chat"), 3, 1, "load ↑", 1_234, "demand 2.6")) == (
        '{"f":{"at_ms":1234,"deployment_id":"chat","message":"demand 2.6","reason":"load ↑","replicas":3,'
        '"warm_pool":1},"k":"set_desired","v":2}'
    ).encode("utf-8")
    assert encode(c.Batch((c.TransitionInstance(InstanceId("i1"), E.DRAIN, 5, 9, True),))) == (
        b'{"f":{"commands":[{"f":{"at_ms":5,"drain_deadline_ms":9,"event":"drain","instance_id":"i1",'
        b'"preempted":true},"k":"transition_instance"}]},"k":"batch","v":2}'
    )
    assert encode(c.PutScaleMemory(DeploymentId("d"), ScaleMemory(((1, 2),), 0, 0, -1, -1))) == (
        b'{"f":{"deployment_id":"d","memory":{"last_scale_down_ms":-1,"last_scale_up_ms":-1,"panic_peak":0,'
        b'"panic_until_ms":0,"recs":[[1,2]]}},"k":"put_scale_memory","v":2}'
    )
    assert encode(c.PutScaleMemories(((DeploymentId("d"), ScaleMemory(((1, 2),), 0, 0, -1, -1)),))) == (
        b'{"f":{"memories":[["d",{"last_scale_down_ms":-1,"last_scale_up_ms":-1,"panic_peak":0,'
        b'"panic_until_ms":0,"recs":[[1,2]]}]]},"k":"put_scale_memories","v":2}'
    )
    assert encode(AcquireLease("n1", 4, 3_000)) == (
        b'{"f":{"duration_ms":3000,"expected_version":4,"node":"n1"},"k":"acquire_lease","v":2}'
    )
    assert encode(c.PutZone(Zone(ZoneId("z1"), cordoned=True), 7, 99)) == (
        b'{"f":{"at_ms":99,"expect_version":7,"zone":{"cordoned":true,"draining":false,"id":"z1",'
        b'"region":"local"}},"k":"put_zone","v":2}'
    )
    token = TokenRecord("0123456789ab", "f" * 64, Role.TENANT, TenantId("acme"), 5, 0, "ci")
    assert encode(c.PutToken(token)) == (
        b'{"f":{"token":{"created_ms":5,"description":"ci","expires_ms":0,"id":"0123456789ab","role":"tenant",'
        b'"sha256":"' + b"f" * 64 + b'","tenant":"acme"}},"k":"put_token","v":2}'
    )


# --- determinism --------------------------------------------------------------------------------


@settings(max_examples=60)
@given(ANY_COMMAND)
def test_encoding_is_deterministic_and_canonical(cmd: Any) -> None:
    data = encode(cmd)
    assert encode(cmd) == data
    assert encode(decode(data)) == data
    # Sorted keys, no whitespace: the canonical form of the same JSON document.
    canonical = json.dumps(loads(data), ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    assert data == canonical


def test_equal_commands_encode_to_equal_bytes() -> None:
    a = Tenant(TenantId("acme"), 1, quota={"h100": 2, "a100": 1}, borrow_limit={"b": 1, "a": 2})
    b = Tenant(TenantId("acme"), 1, quota={"a100": 1, "h100": 2}, borrow_limit={"a": 2, "b": 1})
    assert a == b and list(a.quota) != list(b.quota)
    assert encode(c.PutTenant(a)) == encode(c.PutTenant(b))
    base = Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)
    p_int = dataclasses.replace(base, policy=ScalingPolicy(target_concurrency=24, tolerance=0.0))
    p_float = dataclasses.replace(base, policy=ScalingPolicy(target_concurrency=24.0, tolerance=-0.0))
    assert p_int == p_float
    assert encode(c.PutDeployment(p_int)) == encode(c.PutDeployment(p_float))
    assert b'"target_concurrency":24.0' in encode(c.PutDeployment(p_int))
    assert b'"tolerance":0.0' in encode(c.PutDeployment(p_float))


def test_float_fields_come_back_as_floats() -> None:
    base = Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)
    d = dataclasses.replace(base, policy=ScalingPolicy(target_concurrency=24, ttft_slo_weight=1))
    back = roundtrip(c.PutDeployment(d)).deployment.policy
    assert type(back.target_concurrency) is float and type(back.ttft_slo_weight) is float


# --- encode refuses what it cannot carry --------------------------------------------------------

TENANT = Tenant(TenantId("acme"), 10, {"h100": 4})
DEPLOYMENT = Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "llama", PoolId("h100"), 2)


@pytest.mark.parametrize(("cmd", "path", "problem"), [
    (c.SetDesired(DeploymentId("chat"), "3", 0, "r", 0), "set_desired.replicas", "expected an integer, got a string"),
    (c.SetDesired(DeploymentId("chat"), True, 0, "r", 0), "set_desired.replicas", "expected an integer, got a boolean"),
    (c.SetDesired(DeploymentId("chat"), 2**63, 0, "r", 0), "set_desired.replicas", "expected a 64-bit integer"),
    (c.SetDesired(DeploymentId("chat"), 1, 0, None, 0), "set_desired.reason", "expected a string, got null"),
    (c.SetDesired(DeploymentId("chat"), 1, 0, "bad \ud800", 0), "set_desired.reason", "lone surrogate"),
    (c.SetDesired(["chat"], 1, 0, "r", 0), "set_desired.deployment_id", "expected a string, got a list"),
    (c.TransitionInstance(InstanceId("i1"), "warmed", 0), "transition_instance.event",
     "expected an InstanceEvent, got a string"),
    (c.TransitionInstance(InstanceId("i1"), E.DRAIN, 0, 0, 1), "transition_instance.preempted",
     "expected a boolean, got an integer"),
    (c.PutTenant(unchecked(TENANT, priority=-1)), "put_tenant.tenant.priority", "must be between 0 and 1000000"),
    (c.PutTenant(unchecked(TENANT, quota=None)), "put_tenant.tenant.quota", "expected an object, got null"),
    (c.PutTenant(unchecked(TENANT, quota={1: 2})), "put_tenant.tenant.quota.1", "expected a string, got an integer"),
    (c.PutTenant(unchecked(TENANT, quota={"H100": 2})), "put_tenant.tenant.quota.H100", "is not a valid id"),
    (c.PutTenant(unchecked(TENANT, slo=unchecked(Slo(), ttft_p99_ms=0))), "put_tenant.tenant.slo.ttft_p99_ms",
     "must be between 1 and 3600000"),
    (c.PutTenant("acme"), "put_tenant.tenant", "expected a Tenant, got a string"),
    (c.PutDeployment(unchecked(DEPLOYMENT, engine="vllm")), "put_deployment.deployment.engine",
     "expected an Engine, got a string"),
    (c.PutDeployment(unchecked(DEPLOYMENT, gpus_per_instance=0)), "put_deployment.deployment.gpus_per_instance",
     "must be between 1 and 64"),
    (c.PutDeployment(unchecked(DEPLOYMENT, policy=unchecked(ScalingPolicy(), tolerance=float("nan")))),
     "put_deployment.deployment.policy.tolerance", "expected a finite number, got nan"),
    (c.PutDeployment(unchecked(DEPLOYMENT, policy=unchecked(ScalingPolicy(), panic_window_ms=10**6))),
     "put_deployment.deployment.policy.panic_window_ms", "must not exceed stable_window_ms"),
    (c.PutCluster(unchecked(Cluster(ClusterId("c1"), ZoneId("z1")), capacity={"h100": -4})),
     "put_cluster.cluster.capacity.h100", "must be >= 0"),
    (c.PutScaleMemory(DeploymentId("d"), ScaleMemory([(1, 2)])), "put_scale_memory.memory.recs",
     "expected a tuple, got a list"),
    (c.PutScaleMemory(DeploymentId("d"), ScaleMemory(((1, 2), (3,)))), "put_scale_memory.memory.recs[1]",
     "expected a pair of integers, got 1 items"),
    (c.PutScaleMemory(DeploymentId("d"), ScaleMemory(((1, 2), (3, "4")))), "put_scale_memory.memory.recs[1][1]",
     "expected an integer, got a string"),
    (c.PutScaleMemories([(DeploymentId("d"), ScaleMemory())]), "put_scale_memories.memories",
     "expected a tuple, got a list"),
    (c.PutScaleMemories(((DeploymentId("d"), ScaleMemory()), (DeploymentId("e"),))), "put_scale_memories.memories[1]",
     "expected a (deployment id, memory) pair, got 1 items"),
    (c.PutScaleMemories(((7, ScaleMemory()),)), "put_scale_memories.memories[0][0]",
     "expected a string, got an integer"),
    (c.PutScaleMemories(((DeploymentId("d"), ScaleMemory(((1, "2"),))),)),
     "put_scale_memories.memories[0][1].recs[0][1]", "expected an integer, got a string"),
    (c.RecordDemand(10_000, [("d", 1)]), "record_demand.entries", "expected a tuple, got a list"),
    (c.RecordDemand(10_000, (("d", 1), ("e",))), "record_demand.entries[1]",
     "expected a (deployment id, deci-replicas) pair, got a tuple"),
    (c.RecordDemand(10_000, ((7, 1),)), "record_demand.entries[0][0]", "expected a string, got an integer"),
    (c.RecordDemand(10_000, (("d", "1"),)), "record_demand.entries[0][1]", "expected an integer, got a string"),
    (c.PutBreaker("k", None), "put_breaker.record", "expected a BreakerRecord, got null"),
    (c.PutBreaker("k", BreakerRecord(phase="open")), "put_breaker.record.phase", "expected a BreakerPhase"),
    (c.Batch([c.RemoveTenant(TenantId("a"))]), "batch.commands", "expected a tuple, got a list"),
    (c.Batch(None), "batch.commands", "expected a tuple, got null"),
    (c.Batch((c.RemoveTenant(TenantId("a")), c.SetDesired(DeploymentId("d"), "1", 0, "", 0))),
     "batch.commands[1].set_desired.replicas", "expected an integer, got a string"),
    (c.Batch((RenewLease("n1", 3),)), "batch.commands[0]", "expected a domain command, got RenewLease"),
    (c.Batch((c.Command(),)), "batch.commands[0]", "expected a domain command, got Command"),
    (AcquireLease("n1", "4", 3_000), "acquire_lease.expected_version", "expected an integer, got a string"),
    (ReleaseLease(None, 4), "release_lease.node", "expected a string, got null"),
    (c.Command(), "command", "unknown command type Command"),
    (None, "command", "unknown command type NoneType"),
    ("put_tenant", "command", "unknown command type str"),
])  # fmt: skip
def test_encode_rejects(cmd: Any, path: str, problem: str) -> None:
    with pytest.raises(CodecError) as info:
        encode(cmd)
    assert info.value.path == path, str(info.value)
    assert problem in info.value.problem, str(info.value)
    assert str(info.value) == f"{path}: {info.value.problem}"


def test_codec_error_is_a_permanent_error() -> None:
    assert issubclass(CodecError, PermanentError)
    err = CodecError("put_tenant.tenant.priority", "expected an integer")
    assert str(err) == "put_tenant.tenant.priority: expected an integer"


def nested(depth: int) -> c.Batch:
    batch = c.Batch((c.RemoveTenant(TenantId("a")),))
    for _ in range(depth - 1):
        batch = c.Batch((batch,))
    return batch


def test_batch_nesting_is_bounded() -> None:
    roundtrip(nested(MAX_BATCH_DEPTH))
    too_deep = "batch" + ".commands[0].batch" * MAX_BATCH_DEPTH
    with pytest.raises(CodecError) as info:
        encode(nested(MAX_BATCH_DEPTH + 1))
    assert info.value.path == too_deep + ".commands"
    assert f"nested more than {MAX_BATCH_DEPTH} deep" in info.value.problem
    # Decoding a hand-made payload one level deeper fails the same way.
    inner: dict[str, Any] = {"k": "remove_tenant", "f": {"tenant_id": "a", "expect_version": -1}}
    for _ in range(MAX_BATCH_DEPTH + 1):
        inner = {"k": "batch", "f": {"commands": [inner]}}
    with pytest.raises(CodecError) as info:
        decode(dumps({"v": CODEC_VERSION, **inner}))
    assert info.value.path == too_deep + ".commands"


def test_oversized_command_is_refused_on_both_sides() -> None:
    big = c.SetDesired(DeploymentId("d"), 1, 0, "x" * MAX_PAYLOAD_BYTES, 0)
    with pytest.raises(CodecError, match=r"^payload: \d+ bytes exceed the limit of 16777216 bytes$"):
        encode(big)
    just_fits = c.SetDesired(DeploymentId("d"), 1, 0, "", 0)
    room = MAX_PAYLOAD_BYTES - len(encode(just_fits))
    fits = dataclasses.replace(just_fits, reason="x" * room)
    assert len(encode(fits)) == MAX_PAYLOAD_BYTES
    assert decode(encode(fits)) == fits
    over = encode(dataclasses.replace(fits, reason="x" * (room - 1)))[:-1] + b'x"}'
    with pytest.raises(CodecError, match=r"^payload: 16777217 bytes exceed the limit of 16777216 bytes$"):
        decode(b" " * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(CodecError, match="exceed the limit"):
        decode(over + b" ")


# --- decode refuses malformed payloads ----------------------------------------------------------

PUT_TENANT = json.loads(encode(c.PutTenant(Tenant(TenantId("acme"), 10, {"h100": 4}, {}, Slo()))))
PUT_DEPLOYMENT = json.loads(encode(c.PutDeployment(DEPLOYMENT)))
BATCH = json.loads(encode(c.Batch((
    c.RemoveTenant(TenantId("old")),
    c.SetDesired(DeploymentId("chat"), 2, 1, "r", 5),
    c.PutScaleMemory(DeploymentId("chat"), ScaleMemory(((1, 2),))),
))))
OTHERS = {
    "transition_instance": json.loads(encode(c.TransitionInstance(InstanceId("i1"), E.WARMED, 5))),
    "put_breaker": json.loads(encode(c.PutBreaker("cluster/c1", BreakerRecord()))),
    "acquire_lease": json.loads(encode(AcquireLease("n1", 0, 3_000))),
    "set_desired": json.loads(encode(c.SetDesired(DeploymentId("chat"), 2, 1, "r", 5))),
}


def edit(doc: dict[str, Any], path: str, value: Any = ..., *, delete: bool = False) -> bytes:
    """A copy of ``doc`` with the value at the ``/``-separated ``path`` replaced (or deleted), as bytes."""
    doc = json.loads(json.dumps(doc))
    *parents, last = path.split("/")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key: Any = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]
    else:
        node[key] = value
    return dumps(doc)


@pytest.mark.parametrize(("payload", "path", "problem"), [
    # envelope
    (edit(PUT_TENANT, "v", 1), "v", "unsupported codec version 1; this build reads version 2"),
    (edit(PUT_TENANT, "v", 3), "v", "unsupported codec version 3; this build reads version 2"),
    (edit(PUT_TENANT, "v", 0), "v", "unsupported codec version 0"),
    (edit(PUT_TENANT, "v", "1"), "v", "expected an integer, got a string"),
    (edit(PUT_TENANT, "v", True), "v", "expected an integer, got a boolean"),
    (edit(PUT_TENANT, "v", delete=True), "v", "missing"),
    (edit(PUT_TENANT, "k", "frobnicate"), "k", "unknown command kind 'frobnicate'"),
    (edit(PUT_TENANT, "k", "snapshot"), "k", "unknown command kind 'snapshot'"),
    (edit(PUT_TENANT, "k", "command"), "k", "unknown command kind 'command'"),
    (edit(PUT_TENANT, "k", 5), "k", "expected a string, got an integer"),
    (edit(PUT_TENANT, "k", delete=True), "k", "missing"),
    (edit(PUT_TENANT, "f", delete=True), "f", "missing"),
    (edit(PUT_TENANT, "extra", 1), "extra", "unknown field"),
    (edit(PUT_TENANT, "f", []), "put_tenant", "expected an object, got a list"),
    (b"[1]", "payload", "expected an object, got a list"),
    (b"null", "payload", "expected an object, got null"),
    # missing, extra and mistyped fields
    (edit(PUT_TENANT, "f/tenant/priority", delete=True), "put_tenant.tenant.priority", "missing"),
    (edit(PUT_TENANT, "f/tenant/colour", "red"), "put_tenant.tenant.colour", "unknown field"),
    (edit(PUT_TENANT, "f/extra", 1), "put_tenant.extra", "unknown field"),
    (edit(PUT_TENANT, "f/tenant/slo/max_queue_ms", delete=True), "put_tenant.tenant.slo.max_queue_ms", "missing"),
    (edit(PUT_TENANT, "f/tenant/priority", "10"), "put_tenant.tenant.priority", "expected an integer, got a string"),
    (edit(PUT_TENANT, "f/tenant/priority", 10.0), "put_tenant.tenant.priority", "expected an integer, got a number"),
    (edit(PUT_TENANT, "f/tenant/priority", None), "put_tenant.tenant.priority", "expected an integer, got null"),
    (edit(PUT_TENANT, "f/tenant/priority", False), "put_tenant.tenant.priority", "expected an integer, got a boolean"),
    (edit(PUT_TENANT, "f/tenant/priority", 2**63), "put_tenant.tenant.priority", "expected a 64-bit integer"),
    (edit(PUT_TENANT, "f/tenant/id", 7), "put_tenant.tenant.id", "expected a string, got an integer"),
    (edit(PUT_TENANT, "f/tenant", "acme"), "put_tenant.tenant", "expected an object, got a string"),
    (edit(PUT_TENANT, "f/tenant/quota", [["h100", 4]]), "put_tenant.tenant.quota", "expected an object, got a list"),
    (edit(PUT_TENANT, "f/tenant/quota/h100", "4"), "put_tenant.tenant.quota.h100", "expected an integer, got a string"),
    (edit(PUT_TENANT, "f/tenant/slo", None), "put_tenant.tenant.slo", "expected an object, got null"),
    # domain validation, translated to the field path
    (edit(PUT_TENANT, "f/tenant/priority", -1), "put_tenant.tenant.priority", "must be between 0 and 1000000, got -1"),
    (edit(PUT_TENANT, "f/tenant/id", "Acme"), "put_tenant.tenant.id", "is not a valid id"),
    (edit(PUT_TENANT, "f/tenant/quota/H.100", 1), "put_tenant.tenant.quota.H.100", "is not a valid id"),
    (edit(PUT_TENANT, "f/tenant/borrow_limit/a100", -1), "put_tenant.tenant.borrow_limit.a100", "must be >= 0"),
    (edit(PUT_TENANT, "f/tenant/slo/ttft_p99_ms", 0), "put_tenant.tenant.slo.ttft_p99_ms", "must be between 1 and 3600000, got 0"),
    (edit(PUT_DEPLOYMENT, "f/deployment/engine", "tgi"), "put_deployment.deployment.engine",
     "unknown Engine value 'tgi'"),
    (edit(PUT_DEPLOYMENT, "f/deployment/engine", 1), "put_deployment.deployment.engine",
     "expected an Engine value (a string), got an integer"),
    (edit(PUT_DEPLOYMENT, "f/deployment/model", ""), "put_deployment.deployment.model", "must not be empty"),
    (edit(PUT_DEPLOYMENT, "f/deployment/min_replicas", 100), "put_deployment.deployment.min_replicas",
     "must not exceed max_replicas (64), got 100"),
    (edit(PUT_DEPLOYMENT, "f/deployment/policy/panic_window_ms", 40_000),
     "put_deployment.deployment.policy.panic_window_ms", "must not exceed stable_window_ms (30000)"),
    (edit(PUT_DEPLOYMENT, "f/deployment/policy/tolerance", "0.1"), "put_deployment.deployment.policy.tolerance",
     "expected a number, got a string"),
    (edit(PUT_DEPLOYMENT, "f/deployment/policy/tolerance", 0.95), "put_deployment.deployment.policy.tolerance",
     "must be between 0.0 and 0.9, got 0.95"),
    (dumps(PUT_DEPLOYMENT).replace(b'"tolerance":0.1', b'"tolerance":NaN'),
     "put_deployment.deployment.policy.tolerance", "expected a finite number, got nan"),
    (dumps(PUT_DEPLOYMENT).replace(b'"tolerance":0.1', b'"tolerance":1e400'),
     "put_deployment.deployment.policy.tolerance", "expected a finite number, got inf"),
    (dumps(PUT_DEPLOYMENT).replace(b'"tolerance":0.1', b'"tolerance":-Infinity'),
     "put_deployment.deployment.policy.tolerance", "expected a finite number, got -inf"),
    # enums, booleans, pairs, lease commands
    (edit(OTHERS["transition_instance"], "f/event", "explode"), "transition_instance.event",
     "unknown InstanceEvent value 'explode'"),
    (edit(OTHERS["transition_instance"], "f/event", "WARMED"), "transition_instance.event",
     "unknown InstanceEvent value 'WARMED'"),
    (edit(OTHERS["transition_instance"], "f/preempted", 0), "transition_instance.preempted",
     "expected a boolean, got an integer"),
    (edit(OTHERS["put_breaker"], "f/record/phase", "ajar"), "put_breaker.record.phase",
     "unknown BreakerPhase value 'ajar'"),
    (edit(OTHERS["put_breaker"], "f/record/probe_in_flight", "yes"), "put_breaker.record.probe_in_flight",
     "expected a boolean, got a string"),
    (edit(OTHERS["acquire_lease"], "f/duration_ms", 1.5), "acquire_lease.duration_ms",
     "expected an integer, got a number"),
    (edit(OTHERS["acquire_lease"], "f/epoch", 1), "acquire_lease.epoch", "unknown field"),
    (dumps(OTHERS["set_desired"]).replace(b'"reason":"r"', b'"reason":"\\ud800"'), "set_desired.reason",
     "lone surrogate"),
    # batches
    (edit(BATCH, "f/commands", {}), "batch.commands", "expected a list, got an object"),
    (edit(BATCH, "f/commands", delete=True), "batch.commands", "missing"),
    (edit(BATCH, "f/members", []), "batch.members", "unknown field"),
    (edit(BATCH, "f/commands/1", "set_desired"), "batch.commands[1]", "expected an object, got a string"),
    (edit(BATCH, "f/commands/1/f/replicas", "2"), "batch.commands[1].set_desired.replicas",
     "expected an integer, got a string"),
    (edit(BATCH, "f/commands/1/k", "nope"), "batch.commands[1].k", "unknown command kind: 'nope'"),
    (edit(BATCH, "f/commands/1/k", 3), "batch.commands[1].k", "expected a string, got an integer"),
    (edit(BATCH, "f/commands/1/k", "renew_lease"), "batch.commands[1].k", "lease commands are not batched"),
    (edit(BATCH, "f/commands/1/f", delete=True), "batch.commands[1].f", "missing"),
    (edit(BATCH, "f/commands/1/v", 1), "batch.commands[1].v", "unknown field"),
    (edit(BATCH, "f/commands/2/f/memory/recs/0", [1, 2, 3]), "batch.commands[2].put_scale_memory.memory.recs[0]",
     "expected a pair of integers, got 3 items"),
    (edit(BATCH, "f/commands/2/f/memory/recs/0", {"a": 1}), "batch.commands[2].put_scale_memory.memory.recs[0]",
     "expected a pair of integers, got an object"),
    (edit(BATCH, "f/commands/2/f/memory/recs/0/1", True), "batch.commands[2].put_scale_memory.memory.recs[0][1]",
     "expected an integer, got a boolean"),
    (edit(BATCH, "f/commands/2/f/memory/recs", 5), "batch.commands[2].put_scale_memory.memory.recs",
     "expected a list, got an integer"),
    # bytes
    (b"", "payload", "not valid JSON (Expecting value at line 1 column 1)"),
    (b"{", "payload", "not valid JSON"),
    (b'{"v":2,"k":"remove_tenant","f":{"tenant_id":"a"}}x', "payload", "not valid JSON (Extra data"),
    (b'{"v":2,"k":"remove_tenant","f":{"tenant_id":"a"}} ', "payload", "not valid JSON (Extra data"),
    (b'{"v":1,"k":"remove_tenant","f":{"tenant_id":"a",}}', "payload", "not valid JSON"),
    (b"[" * 100_000, "payload", "not valid JSON (nested too deeply)"),
    (b'{"v":1' + b"1" * 5_000 + b"}", "payload", "not valid JSON (Exceeds the limit"),
    (b'{"v":1,"k":"remove_tenant","f":{"tenant_id":"\xff"}}', "payload",
     "not valid UTF-8 (invalid start byte at byte 45)"),
    (b'{"v":1,"k":"remove_tenant","f":{"tenant_id":"\xc3"}}', "payload", "not valid UTF-8"),
    (b'{"v":1,"k":"remove_tenant","f":{"tenant_id":"\xed\xa0\x80"}}', "payload", "not valid UTF-8"),
    (b"\xef\xbb\xbf" + dumps(OTHERS["set_desired"]), "payload", "not valid JSON"),
    (dumps(OTHERS["set_desired"]).decode().encode("utf-16"), "payload", "not valid UTF-8"),
    (b" " * (MAX_PAYLOAD_BYTES + 1), "payload", "16777217 bytes exceed the limit of 16777216 bytes"),
    ("{}", "payload", "expected bytes, got str"),
    (None, "payload", "expected bytes, got NoneType"),
])  # fmt: skip
def test_decode_rejects(payload: Any, path: str, problem: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(payload)
    assert info.value.path == path, str(info.value)
    assert problem in info.value.problem, str(info.value)


def test_the_edited_payloads_start_out_valid() -> None:
    """The rejection table edits valid documents: without the edit each one decodes."""
    for doc in (PUT_TENANT, PUT_DEPLOYMENT, BATCH, *OTHERS.values()):
        assert encode(decode(dumps(doc))) == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def test_a_payload_from_a_newer_codec_fails_clearly() -> None:
    """A node running this build must refuse version 3 entries, never guess at their meaning, even when
    the rest of the payload would read fine as version 2."""
    v2 = encode(c.SetDesired(DeploymentId("chat"), 2, 1, "r", 5))
    v3 = v2.replace(b'"v":2', b'"v":3')
    assert v3 != v2 and decode(v2)
    with pytest.raises(CodecError) as info:
        decode(v3)
    assert str(info.value) == "v: unsupported codec version 3; this build reads version 2"
    with pytest.raises(CodecError, match="^v: unsupported codec version 3"):
        decode(b'{"v":3,"k":"set_desired_v2","f":{"shape":"new"}}')
    state_v3 = encode_state(ControlState(), LeaseRecord()).replace(b'"v":2', b'"v":3')
    with pytest.raises(CodecError, match="^v: unsupported codec version 3"):
        decode_state(state_v3)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = encode(c.RemoveTenant(TenantId("acme")))
    assert decode(bytearray(data)) == decode(memoryview(data)) == c.RemoveTenant(TenantId("acme"))


def test_decode_accepts_whole_numbers_for_float_fields() -> None:
    """Another writer may spell 24.0 as 24; it reads as the same float."""
    doc = json.loads(json.dumps(PUT_DEPLOYMENT))
    doc["f"]["deployment"]["policy"]["target_concurrency"] = 24
    back = decode(dumps(doc))
    assert type(back.deployment.policy.target_concurrency) is float and back == c.PutDeployment(DEPLOYMENT)


# --- robustness properties ----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [prefix] + [p for k, v in node.items() for p in leaf_paths(v, (*prefix, k))]
    if isinstance(node, list):
        return [prefix] + [p for i, v in enumerate(node) for p in leaf_paths(v, (*prefix, i))]
    return [prefix]


@settings(max_examples=150)
@given(cmd=ANY_COMMAND, data=st.data())
def test_a_mutated_payload_decodes_or_raises_codec_error(cmd: Any, data: st.DataObject) -> None:
    doc = loads(encode(cmd))
    path = data.draw(st.sampled_from(leaf_paths(doc)[1:]))
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = data.draw(json_values)
    try:
        back = decode(dumps(doc))
    except CodecError as exc:
        assert exc.path and exc.problem
        return
    # Accepted: then it is a well-formed command that survives its own round trip.
    assert decode(encode(back)) == back


@settings(max_examples=100)
@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_codec_error(data: bytes) -> None:
    for fn in (decode, decode_state):
        try:
            fn(data)
        except CodecError:
            pass


anything = st.one_of(st.none(), st.booleans(), int64, st.integers(), st.floats(), st.text(max_size=5),
                     st.lists(st.integers(), max_size=2), st.sampled_from([*Engine, *InstanceEvent, (1, 2)]))


@settings(max_examples=150)
@given(cmd=st.one_of(*SINGLE.values(), *LEASE.values()), data=st.data())
def test_whatever_encode_accepts_decode_rebuilds(cmd: Any, data: st.DataObject) -> None:
    """Corrupt one field of a command or of the value inside it (bypassing validation): encode either
    refuses it with a CodecError, or the bytes decode to an equal command."""
    target = cmd
    inner = [f.name for f in dataclasses.fields(cmd) if dataclasses.is_dataclass(getattr(cmd, f.name))]
    if inner and data.draw(st.booleans()):
        target = getattr(cmd, data.draw(st.sampled_from(inner)))
    name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(target)]))
    bad = unchecked(target, **{name: data.draw(anything)})
    if target is not cmd:
        bad = unchecked(cmd, **{next(n for n in inner if getattr(cmd, n) is target): bad})
    try:
        payload = encode(bad)
    except CodecError:
        return
    assert decode(payload) == bad


# --- the tables are complete --------------------------------------------------------------------


def test_tables_cover_every_command_and_every_field() -> None:
    assert set(codec.COMMAND_TABLES) == set(c.COMMAND_TYPES.values())
    for cls, table in codec.COMMAND_TABLES.items():
        if table is not None:
            assert table.cls is cls and table.names == {f.name for f in dataclasses.fields(cls)}
    assert {t.cls for t in codec.LEASE_TABLES.values()} == {AcquireLease, RenewLease, ReleaseLease}
    assert codec.COMMAND_TABLES[c.Batch] is None  # handled by the depth-limited batch walker


def test_a_stale_table_fails_at_import_time() -> None:
    with pytest.raises(TypeError, match="out of date for Slo"):
        codec._Struct(Slo, ("ttft_p99_ms", codec._int, codec._int))
    with pytest.raises(TypeError, match="out of date for Slo"):
        codec._Struct(Slo, ("max_queue_ms", codec._int, codec._int), ("ttft_p99_ms", codec._int, codec._int))


# --- state snapshots ----------------------------------------------------------------------------

TIDS, DIDS, CIDS = ["acme", "beta"], ["chat", "embed", "code"], ["c1", "c2"]
IIDS = ["i0", "i1"]
times = st.integers(0, 10**9)


_pools = st.sampled_from(["h100", "a100"])
FRESH = InstanceId("fresh")
"""Placeholder for an instance id not yet in the state (filled in by :func:`state_command`)."""
STATE_COMMANDS = st.one_of(  # creates first: Hypothesis leans towards the first alternatives
    *[st.builds(c.CreateInstance, st.just(FRESH), st.sampled_from(DIDS), st.sampled_from(CIDS), times)] * 3,
    st.builds(c.CreateInstance, st.sampled_from(IIDS), st.sampled_from(DIDS), st.sampled_from(CIDS), times),
    st.builds(lambda t, p, q: c.PutTenant(Tenant(t, p, q)), st.sampled_from(TIDS), st.integers(0, 9),
              st.dictionaries(_pools, st.integers(0, 8), max_size=2)),
    st.builds(lambda d, t, p, g: c.PutDeployment(Deployment(d, t, Engine.VLLM, "m", p, g, 0, 6)),
              st.sampled_from(DIDS), st.sampled_from(TIDS), _pools, st.sampled_from([1, 2])),
    st.builds(lambda cid, z: c.PutCluster(Cluster(cid, z, capacity={"h100": 16, "a100": 8})),
              st.sampled_from(CIDS), st.sampled_from(["z1", "z2"])),
    st.builds(c.SetDesired, st.sampled_from(DIDS), st.integers(0, 6), st.integers(0, 2), texts, times),
    st.builds(c.PutScaleMemory, st.sampled_from(DIDS), memories),
    st.builds(lambda b, e: c.RecordDemand(b * 10_000, tuple(e)), st.integers(0, 400),
              st.lists(st.tuples(st.sampled_from(DIDS), st.integers(0, 65_535)), max_size=3)),
    st.builds(c.PutBreaker, st.sampled_from(["cluster/c1", "adapter/c2", "x"]), breakers),
    st.builds(lambda cid, m, t: c.PutModelCache(cid, ModelCacheRecord(m, t)), st.sampled_from(CIDS),
              st.sampled_from([(), ("m",), ("a", "m")]), times),
    st.builds(c.RemoveDeployment, st.sampled_from(DIDS)),
    st.builds(c.RemoveTenant, st.sampled_from(TIDS)),
    st.builds(lambda z, r, co: c.PutZone(Zone(z, r, co), at_ms=7), st.sampled_from(["z1", "z2", "z3"]),
              st.sampled_from(["eu", "us"]), st.booleans()),
    st.builds(c.RemoveZone, st.sampled_from(["z1", "z2", "z3"])),
    st.builds(c.RemoveCluster, st.sampled_from(CIDS)),
    st.builds(lambda i, t: c.PutToken(TokenRecord(i, "0" * 64, Role.TENANT, t)),
              st.sampled_from(["00000000000a", "00000000000b"]), st.sampled_from(TIDS)),
    st.builds(c.RemoveToken, st.sampled_from(["00000000000a", "00000000000b"])),
)
STATE_SETUP = (
    c.PutTenant(Tenant(TenantId("acme"), 1)),
    c.PutCluster(Cluster(ClusterId("c2"), ZoneId("z2"), capacity={"h100": 16, "a100": 8})),
    c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={"h100": 16, "a100": 8})),
    c.PutDeployment(Deployment(DeploymentId("code"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1, 0, 6)),
    c.PutDeployment(Deployment(DeploymentId("embed"), TenantId("acme"), Engine.VLLM, "m", PoolId("a100"), 1, 0, 6)),
    c.PutDeployment(Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 2, 0, 6)),
)
"""A head start for the random logs, so instances get created early."""

def legal_events(state: InstanceState, *, to_terminal: bool) -> st.SearchStrategy[InstanceEvent]:
    events = sorted((e for (s, e) in TRANSITIONS if s is state), key=lambda e: e.value)
    live = [e for e in events if not TRANSITIONS[(state, e)].terminal]
    return st.sampled_from(events if to_terminal or not live else live)


LEGAL_EVENTS = {
    (state, to_terminal): legal_events(state, to_terminal=to_terminal)
    for state in InstanceState if not state.terminal for to_terminal in (False, True)
}
"""Transitions to a terminal state (which remove the instance) are drawn a quarter of the time."""


def state_command(data: st.DataObject, state: ControlState) -> c.Command:
    """One command for a small fleet, steered so most of them apply."""
    if state.instances and data.draw(st.integers(0, 3)) == 0:
        iid = data.draw(st.sampled_from(sorted(state.instances)))
        to_terminal = data.draw(st.integers(0, 3)) == 0
        event = data.draw(LEGAL_EVENTS[(state.instances[iid].state, to_terminal)])
        return c.TransitionInstance(iid, event, data.draw(times), data.draw(times), data.draw(st.booleans()))
    cmd = data.draw(STATE_COMMANDS)
    if isinstance(cmd, c.CreateInstance) and cmd.instance_id == FRESH:
        cmd = dataclasses.replace(cmd, instance_id=InstanceId(f"n{state.applied}"))
    return cmd


def ordered_view(state: ControlState) -> tuple[Any, ...]:
    """Everything in the state, derived indexes and the order of every table included."""
    return (
        snapshot(state),
        [list(t.items()) for t in (state.tenants, state.deployments, state.clusters, state.instances,
                                   state.desired, state.memory, state.demand, state.breakers, state.zones,
                                   state.tokens, state.meta)],
        [(d, list(ids)) for d, ids in state.by_deployment.items()],
        list(state.gpus_used.items()),
        state.applied,
    )


def check_restored(state: ControlState, lease: LeaseRecord) -> tuple[ControlState, LeaseRecord]:
    data = encode_state(state, lease)
    assert encode_state(state, lease) == data
    restored, back_lease = decode_state(data)
    assert back_lease == lease
    assert snapshot(restored) == snapshot(state)
    assert ordered_view(restored) == ordered_view(state)
    assert type(restored.gpus_used) is dict and all(type(k) is tuple for k in restored.gpus_used)
    assert encode_state(restored, back_lease) == data
    return restored, back_lease


@settings(max_examples=40)
@given(st.data())
def test_state_round_trips_after_a_random_log(data: st.DataObject) -> None:
    state = ControlState()
    log: list[c.Command] = list(STATE_SETUP)
    for cmd in STATE_SETUP:
        assert apply(state, cmd).ok
    for _ in range(data.draw(st.integers(5, 30), label="length")):
        cmd = state_command(data, state)
        apply(state, cmd)
        log.append(cmd)
    lease = data.draw(st.builds(LeaseRecord, texts, naturals, naturals, st.integers(1, 10**6)))
    restored, _ = check_restored(state, lease)
    # The restored replica carries on exactly like the original: same results, same state.
    tail = [state_command(data, state) for _ in range(5)]
    assert [apply(restored, cmd) for cmd in tail] == [apply(state, cmd) for cmd in tail]
    assert ordered_view(restored) == ordered_view(state)
    # And a replica that replays the encoded log reaches the same state as well.
    replica = ControlState()
    for cmd in [*log, *tail]:
        apply(replica, decode(encode(cmd)))
    assert ordered_view(replica) == ordered_view(state)


def built_state() -> ControlState:
    """A state whose indexes carry history: a zero gpus_used entry, a re-added deployment, an empty
    deployment, instances of several deployments interleaved."""
    state = ControlState()
    log = [
        c.PutTenant(Tenant(TenantId("acme"), 5)),
        c.PutCluster(Cluster(ClusterId("c2"), ZoneId("z2"), capacity={"a100": 8, "h100": 8})),
        c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={"h100": 8})),
        c.PutDeployment(Deployment(DeploymentId("zeta"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)),
        c.PutDeployment(Deployment(DeploymentId("alpha"), TenantId("acme"), Engine.TRITON, "m", PoolId("a100"), 2)),
        c.PutDeployment(Deployment(DeploymentId("empty"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)),
        c.CreateInstance(InstanceId("old"), DeploymentId("zeta"), ClusterId("c1"), 1),
        c.TransitionInstance(InstanceId("old"), E.CANCEL, 2),  # leaves gpus_used[(c1, h100)] == 0
        c.CreateInstance(InstanceId("z9"), DeploymentId("alpha"), ClusterId("c2"), 3),
        c.CreateInstance(InstanceId("a1"), DeploymentId("zeta"), ClusterId("c2"), 4),
        c.CreateInstance(InstanceId("m5"), DeploymentId("alpha"), ClusterId("c2"), 5),
        c.TransitionInstance(InstanceId("z9"), E.START_WARMUP, 6),
        c.TransitionInstance(InstanceId("z9"), E.WARMED, 7),
        c.TransitionInstance(InstanceId("m5"), E.START_WARMUP, 8),
        c.TransitionInstance(InstanceId("m5"), E.WARMUP_FAILED, 9),
        c.PutDeployment(Deployment(DeploymentId("beta"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)),
        c.RemoveDeployment(DeploymentId("empty")),
        c.PutDeployment(Deployment(DeploymentId("empty"), TenantId("acme"), Engine.VLLM, "m", PoolId("h100"), 1)),
        c.SetDesired(DeploymentId("zeta"), 1, 0, "r", 10),
        c.SetDesired(DeploymentId("alpha"), 2, 1, "r", 11),
        c.PutScaleMemory(DeploymentId("alpha"), ScaleMemory(((1_000, 3),), 0, 3, 5, -1)),
        c.RecordDemand(20_000, ((DeploymentId("zeta"), 12), (DeploymentId("alpha"), 65_535))),
        c.RecordDemand(50_000, ((DeploymentId("zeta"), 3),)),  # two empty buckets in between
        c.PutBreaker("z", BreakerRecord(BreakerPhase.OPEN, 3, 1, 9_000)),
        c.PutBreaker("a", BreakerRecord()),
        c.PutModelCache(ClusterId("c2"), ModelCacheRecord(("m", "n"), 11)),
        c.PutZone(Zone(ZoneId("z2"), "eu", draining=True), at_ms=12),
        c.PutZone(Zone(ZoneId("z1")), at_ms=13),
        c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={"h100": 8}, cordoned=True), at_ms=14),
        c.PutToken(TokenRecord("00000000000b", "b" * 64, Role.ADMIN, "", 15, 0, "ops")),
        c.PutToken(TokenRecord("00000000000a", "a" * 64, Role.TENANT, TenantId("acme"), 16, 99, "")),
    ]
    for cmd in log:
        assert apply(state, cmd).ok, cmd
    return state


def test_model_caches_round_trip_and_a_snapshot_without_them_decodes() -> None:
    state = built_state()
    restored, _ = check_restored(state, LeaseRecord("n1", 7, 3, 3_000))
    assert restored.model_caches == {"c2": ModelCacheRecord(("m", "n"), 11)}
    # A snapshot written before the caches existed (COMMAND_VERSION 5) has no such key: empty caches.
    doc = json.loads(encode_state(state, LeaseRecord()))
    del doc["f"]["model_caches"]
    assert decode_state(dumps(doc))[0].model_caches == {}


def test_state_snapshot_keeps_history_in_the_indexes() -> None:
    state = built_state()
    assert list(state.gpus_used.items()) == [(("c1", "h100"), 0), (("c2", "a100"), 2), (("c2", "h100"), 1)]
    assert [(d, list(i)) for d, i in state.by_deployment.items()] == [
        ("zeta", ["a1"]), ("alpha", ["z9"]), ("beta", []), ("empty", [])]
    restored, _ = check_restored(state, LeaseRecord("n1", 7, 3, 3_000))
    assert list(restored.gpus_used.items()) == list(state.gpus_used.items())
    assert restored.instances["z9"].state is S.READY and restored.instances["z9"].init_method is InitMethod.COLD
    assert list(restored.breakers) == ["z", "a"] and list(restored.clusters) == ["c2", "c1"]
    assert list(restored.zones) == ["z2", "z1"] and list(restored.tokens) == ["00000000000b", "00000000000a"]
    assert restored.tokens["00000000000a"].role is Role.TENANT and restored.clusters["c1"].cordoned
    assert restored.meta["cluster/c1"] == ObjectMeta(restored.applied - 2, 0, 14)
    assert restored.free_gpus(ClusterId("c2"), PoolId("a100")) == state.free_gpus(ClusterId("c2"), PoolId("a100")) == 6


def test_empty_state_round_trips() -> None:
    check_restored(ControlState(), LeaseRecord())


def state_doc() -> dict[str, Any]:
    return loads(encode_state(built_state(), LeaseRecord("n1", 7, 3, 3_000)))


def edit_state(path: str, value: Any = ..., *, delete: bool = False) -> bytes:
    return edit(state_doc(), path, value, delete=delete)


@pytest.mark.parametrize(("payload", "path", "problem"), [
    (lambda: encode(c.RemoveTenant(TenantId("a"))), "k", "expected 'snapshot', got 'remove_tenant'"),
    (lambda: edit_state("v", 1), "v", "unsupported codec version 1"),
    (lambda: edit_state("f", []), "state", "expected an object, got a list"),
    (lambda: edit_state("f/breakers", delete=True), "state.breakers", "missing"),
    (lambda: edit_state("f/by_deployment", {}), "state.by_deployment", "unknown field"),
    (lambda: edit_state("f/tenants", {}), "state.tenants", "expected a list, got an object"),
    (lambda: edit_state("f/tenants/0/priority", "5"), "state.tenants[0].priority", "expected an integer, got a string"),
    (lambda: edit_state("f/tenants/0/priority", -5), "state.tenants[0].priority", "must be between 0 and 1000000"),
    (lambda: edit_state("f/tenants", state_doc()["f"]["tenants"] * 2), "state.tenants[1].id", "duplicate id 'acme'"),
    (lambda: edit_state("f/deployments/1/engine", "x"), "state.deployments[1].engine", "unknown Engine value 'x'"),
    (lambda: edit_state("f/instances/1/state", "Zombie"), "state.instances[1].state", "unknown InstanceState value"),
    (lambda: edit_state("f/instances/0/init_method", "hot"), "state.instances[0].init_method",
     "unknown InitMethod value 'hot'"),
    (lambda: edit_state("f/instances/0/gpus", None), "state.instances[0].gpus", "expected an integer, got null"),
    (lambda: edit_state("f/instances/1/deployment", "ghost"), "state.instances[1].deployment",
     "unknown deployment 'ghost'"),
    (lambda: edit_state("f/instances/1/pool", "tpu"), "state.gpus_used_keys",
     "lacks ['c2', 'tpu'], used by instance 'a1'"),
    (lambda: edit_state("f/gpus_used_keys/1", ["c1", "h100"]), "state.gpus_used_keys[1]",
     "duplicate key ['c1', 'h100']"),
    (lambda: edit_state("f/gpus_used_keys/1", ["c1"]), "state.gpus_used_keys[1]", "expected a [cluster, pool] pair"),
    (lambda: edit_state("f/gpus_used_keys/1/0", 1), "state.gpus_used_keys[1][0]", "expected a string, got an integer"),
    (lambda: edit_state("f/desired/0", ["zeta"]), "state.desired[0]", "expected a [key, value] pair, got a list"),
    (lambda: edit_state("f/desired/1/0", "zeta"), "state.desired[1][0]", "duplicate key 'zeta'"),
    (lambda: edit_state("f/desired/0/0", 5), "state.desired[0]", "expected a string, got an integer"),
    (lambda: edit_state("f/desired/0/1/generation", "1"), "state.desired[0].generation", "expected an integer"),
    (lambda: edit_state("f/memory/0/1/recs", [[1]]), "state.memory[0].recs[0]", "expected a pair of integers"),
    (lambda: edit_state("f/breakers/0/1/phase", "ajar"), "state.breakers[0].phase", "unknown BreakerPhase value"),
    (lambda: edit_state("f/demand/0/1/data", "0G"), "state.demand[0].data", "expected an even number of lowercase hex"),
    (lambda: edit_state("f/demand/0/1/data", "ABCD"), "state.demand[0].data", "expected an even number of lowercase hex"),
    (lambda: edit_state("f/demand/0/1/data", "00" * 721), "state.demand[0].data", "at most 360 little-endian uint16"),
    (lambda: edit_state("f/demand/0/1/end_ms", 12_345), "state.demand[0].end_ms", "integer multiple of 10000"),
    (lambda: edit_state("f/applied", "3"), "state.applied", "expected an integer, got a string"),
    (lambda: edit_state("f/lease/holder", 1), "state.lease.holder", "expected a string, got an integer"),
    (lambda: edit_state("f/lease/term", 1), "state.lease.term", "unknown field"),
    (lambda: edit_state("f/zones", delete=True), "state.zones", "missing"),
    (lambda: edit_state("f/zones/0/draining", "yes"), "state.zones[0].draining", "expected a boolean, got a string"),
    (lambda: edit_state("f/tokens/0/role", "root"), "state.tokens[0].role", "unknown Role value 'root'"),
    (lambda: edit_state("f/tokens/1/tenant", ""), "state.tokens[1].tenant", "must not be empty"),
    (lambda: edit_state("f/tokens/0/sha256", "x"), "state.tokens[0].sha256", "must be 64 lower-case hex digits"),
    (lambda: edit_state("f/meta/0/1/resource_version", "3"), "state.meta[0].resource_version",
     "expected an integer, got a string"),
    (lambda: edit_state("f/meta/0/1/etag", 1), "state.meta[0].etag", "unknown field"),
    (lambda: b"\xff", "payload", "not valid UTF-8"),
])  # fmt: skip
def test_decode_state_rejects(payload: Any, path: str, problem: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_state(payload())
    assert info.value.path == path, str(info.value)
    assert problem in info.value.problem, str(info.value)


def test_the_state_document_is_as_described() -> None:
    doc = state_doc()
    assert (doc["v"], doc["k"]) == (CODEC_VERSION, "snapshot")
    assert set(doc["f"]) == {"tenants", "deployments", "clusters", "instances", "desired", "memory", "demand", "breakers",
                             "zones", "tokens", "meta", "applied", "gpus_used_keys", "lease", "model_caches"}
    assert doc["f"]["model_caches"] == [["c2", {"models": ["m", "n"], "at_ms": 11}]]
    assert [t["id"] for t in doc["f"]["clusters"]] == ["c2", "c1"]  # insertion order, not sorted
    assert decode_state(dumps(doc))[0].applied == built_state().applied
    with pytest.raises(CodecError, match="^k: unknown command kind 'snapshot'$"):
        decode(dumps(doc))


@pytest.mark.parametrize(("mutate", "path", "problem"), [
    (lambda s, lease: (s, None), "state.lease", "expected a LeaseRecord, got null"),
    (lambda s, lease: (None, lease), "state", "expected a ControlState, got null"),
    (lambda s, lease: (setattr(s, "tenants", {"other": s.tenants["acme"]}), (s, lease))[1], "state.tenants[0].id",
     "table key 'other' differs from the id 'acme'"),
    (lambda s, lease: (s.instances.__setitem__("a1", unchecked(s.instances["a1"], state="Ready")), (s, lease))[1],
     "state.instances[1].state", "expected an InstanceState, got a string"),
    (lambda s, lease: (s.breakers.__setitem__(5, BreakerRecord()), (s, lease))[1], "state.breakers[2]",
     "expected a string, got an integer"),
    (lambda s, lease: (s.desired.__setitem__("zeta", Desired(1, 0, "1", "r", 0)), (s, lease))[1],
     "state.desired[0].generation", "expected an integer, got a string"),
    (lambda s, lease: (s.gpus_used.__setitem__("c1", 0), (s, lease))[1], "state.gpus_used_keys[3]",
     "expected a (cluster, pool) pair, got a string"),
    (lambda s, lease: (setattr(s, "applied", None), (s, lease))[1], "state.applied", "expected an integer, got null"),
    (lambda s, lease: (s, unchecked(lease, epoch="7")), "state.lease.epoch", "expected an integer, got a string"),
])  # fmt: skip
def test_encode_state_rejects(mutate: Any, path: str, problem: str) -> None:
    state, lease = mutate(built_state(), LeaseRecord("n1", 7, 3, 3_000))
    with pytest.raises(CodecError) as info:
        encode_state(state, lease)
    assert info.value.path == path, str(info.value)
    assert problem in info.value.problem, str(info.value)


def test_decoded_state_shares_nothing_with_the_bytes_reader() -> None:
    """Two decodes of one snapshot give independent states: mutating one leaves the other alone."""
    data = encode_state(built_state(), LeaseRecord())
    a, _ = decode_state(data)
    b, _ = decode_state(data)
    apply(a, c.CreateInstance(InstanceId("new"), DeploymentId("beta"), ClusterId("c1"), 50))
    assert "new" in a.instances and "new" not in b.instances
    assert a.gpus_used[("c1", "h100")] == 1 and b.gpus_used[("c1", "h100")] == 0
    assert list(a.by_deployment["beta"]) == ["new"] and list(b.by_deployment["beta"]) == []


def test_terminal_instances_in_a_snapshot_hold_no_gpus() -> None:
    """``apply`` drops terminal instances, but should a snapshot carry one, it is indexed under its
    deployment and holds no GPUs (as ``apply`` counts them)."""
    doc = state_doc()
    assert doc["f"]["instances"][1]["id"] == "a1"
    doc["f"]["instances"][1]["state"] = "Terminated"
    state, _ = decode_state(dumps(doc))
    assert state.instances["a1"].state is S.TERMINATED
    assert list(state.by_deployment["zeta"]) == ["a1"]
    assert state.gpus_used == {("c1", "h100"): 0, ("c2", "a100"): 2, ("c2", "h100"): 0}


def test_snapshot_written_before_the_demand_table_reads_as_empty_history() -> None:
    """COMMAND_VERSION 5 snapshots had no ``demand`` table: they still decode, with no history."""
    doc = json.loads(encode_state(built_state(), LeaseRecord()))
    assert doc["f"]["demand"]  # built_state records some
    del doc["f"]["demand"]
    old = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    restored, _ = decode_state(old)
    assert restored.demand == {}
    assert snapshot(restored) == {**snapshot(built_state()), "demand": {}}


# --- labels (added after COMMAND_VERSION 6): omitted when empty ------------------------------------


def test_objects_without_labels_keep_their_bytes_and_labels_are_written_sorted() -> None:
    plain = Zone(ZoneId("z1"), cordoned=True)
    assert encode(c.PutZone(plain, 7, 99)) == (  # the bytes pinned before labels existed
        b'{"f":{"at_ms":99,"expect_version":7,"zone":{"cordoned":true,"draining":false,"id":"z1",'
        b'"region":"local"}},"k":"put_zone","v":2}'
    )
    labelled = Zone(ZoneId("z1"), cordoned=True, labels={"tier": "gold", "example.com/team": ""})
    assert encode(c.PutZone(labelled, 7, 99)) == (
        b'{"f":{"at_ms":99,"expect_version":7,"zone":{"cordoned":true,"draining":false,"id":"z1",'
        b'"labels":{"example.com/team":"","tier":"gold"},"region":"local"}},"k":"put_zone","v":2}'
    )
    assert roundtrip(c.PutZone(labelled, 7, 99)).zone.labels == {"tier": "gold", "example.com/team": ""}
    tenant = Tenant(TenantId("acme"), 10, {"h100": 4}, {}, Slo())
    assert b"labels" not in encode(c.PutTenant(tenant))
    assert roundtrip(c.PutTenant(dataclasses.replace(tenant, labels={"team": "search"}))).tenant.labels == {
        "team": "search"}
    cl = Cluster(ClusterId("c1"), ZoneId("z1"), labels={"gpu": "h100"})
    assert roundtrip(c.PutCluster(cl)).cluster.labels == {"gpu": "h100"}


def test_an_older_payload_without_labels_reads_as_no_labels() -> None:
    payload = dict(PUT_TENANT)
    assert "labels" not in payload["f"]["tenant"]
    back = decode(dumps(payload))
    assert back.tenant.labels == {}
    assert encode(back) == dumps(payload)


@pytest.mark.parametrize(("labels", "path", "problem"), [
    ({"team": 5}, "put_tenant.tenant.labels.team", "expected a string, got an integer"),
    ([], "put_tenant.tenant.labels", "expected an object, got a list"),
    ({"-bad": "x"}, "put_tenant.tenant.labels.-bad", "is not valid"),
    ({"team": "a b"}, "put_tenant.tenant.labels.team", "a label value 'a b' is not valid"),
])
def test_decode_rejects_bad_labels(labels: Any, path: str, problem: str) -> None:
    payload = json.loads(json.dumps(PUT_TENANT))
    payload["f"]["tenant"]["labels"] = labels
    with pytest.raises(CodecError) as info:
        decode(dumps(payload))
    assert info.value.path == path and problem in info.value.problem
