"""Domain value constructors validate their invariants and name the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.domain.errors import PermanentError, ValidationError
from controlplane.domain.ids import id_problem
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant
from controlplane.domain.topology import Cluster


def tenant(**kw: Any) -> Tenant:
    args: dict[str, Any] = {"id": "acme", "priority": 10, "quota": {"h100": 8}, "borrow_limit": {"h100": 4}}
    return Tenant(**(args | kw))


def deployment(**kw: Any) -> Deployment:
    args: dict[str, Any] = {
        "id": "chat", "tenant": "acme", "engine": Engine.VLLM, "model": "llama-3-8b", "pool": "h100",
        "gpus_per_instance": 1,
    }
    return Deployment(**(args | kw))


def cluster(**kw: Any) -> Cluster:
    args: dict[str, Any] = {"id": "c1", "zone": "z1", "capacity": {"h100": 16}}
    return Cluster(**(args | kw))


def expect_field(field: str, build: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        build()
    err = info.value
    assert isinstance(err, PermanentError)
    assert err.field == field, f"{err.field!r} != {field!r} ({err})"
    assert err.problem and str(err) == f"{field}: {err.problem}"
    return err


# --- ids ----------------------------------------------------------------------------------------

GOOD_IDS = ["a", "0", "acme", "llama-3-8b", "a1-b2", "x" * 63, "9" * 63]
BAD_IDS = [
    ("", "empty"),
    ("Acme", "lower-case"),
    ("ACME", "lower-case"),
    ("my_tenant", "lower-case"),
    ("a.b", "lower-case"),
    ("a b", "lower-case"),
    ("-acme", "starting and ending"),
    ("acme-", "starting and ending"),
    ("x" * 64, "at most 63"),
    ("é", "lower-case"),
    ("acme\n", "lower-case"),
    (7, "must be a string"),
    (None, "must be a string"),
]


@pytest.mark.parametrize("value", GOOD_IDS)
def test_good_ids(value: str) -> None:
    assert id_problem(value) is None
    assert tenant(id=value).id == value
    assert cluster(id=value, zone=value).zone == value


@pytest.mark.parametrize(("value", "words"), BAD_IDS, ids=repr)
def test_bad_ids(value: object, words: str) -> None:
    problem = id_problem(value)
    assert problem is not None and words in problem
    assert expect_field("tenant.id", lambda: tenant(id=value)).problem == problem
    expect_field("deployment.id", lambda: deployment(id=value))
    expect_field("deployment.tenant", lambda: deployment(tenant=value))
    expect_field("cluster.id", lambda: cluster(id=value))
    expect_field("cluster.zone", lambda: cluster(zone=value))


def test_pool_ids_are_ids() -> None:
    expect_field("deployment.pool", lambda: deployment(pool="H100"))
    expect_field("tenant.quota.H100", lambda: tenant(quota={"H100": 1}))
    expect_field("cluster.capacity.a_100", lambda: cluster(capacity={"a_100": 1}))


# --- tenants ------------------------------------------------------------------------------------


def test_good_tenant() -> None:
    t = tenant()
    assert (t.quota_in("h100"), t.ceiling_in("h100"), t.quota_in("a100"), t.ceiling_in("a100")) == (8, 12, 0, 0)
    assert t.slo == Slo()
    assert Tenant(id="solo", priority=0).quota == {}
    assert tenant(priority=1_000_000).priority == 1_000_000


@pytest.mark.parametrize(("kw", "field"), [
    ({"quota": {"h100": -1}}, "tenant.quota.h100"),
    ({"quota": {"h100": 2, "a100": -3}}, "tenant.quota.a100"),
    ({"quota": {"h100": 1.5}}, "tenant.quota.h100"),
    ({"quota": {"h100": True}}, "tenant.quota.h100"),
    ({"quota": {"h100": "8"}}, "tenant.quota.h100"),
    ({"borrow_limit": {"h100": -1}}, "tenant.borrow_limit.h100"),
    ({"priority": -1}, "tenant.priority"),
    ({"priority": 1_000_001}, "tenant.priority"),
    ({"priority": "high"}, "tenant.priority"),
    ({"priority": True}, "tenant.priority"),
    ({"priority": 1.5}, "tenant.priority"),
    ({"priority": float("nan")}, "tenant.priority"),
])
def test_bad_tenant(kw: dict[str, Any], field: str) -> None:
    expect_field(field, lambda: tenant(**kw))


@pytest.mark.parametrize(("kw", "field"), [
    ({"ttft_p99_ms": 0}, "slo.ttft_p99_ms"),
    ({"ttft_p99_ms": -5}, "slo.ttft_p99_ms"),
    ({"max_queue_ms": 0}, "slo.max_queue_ms"),
    ({"max_queue_ms": float("inf")}, "slo.max_queue_ms"),
    ({"ttft_p99_ms": 1.5}, "slo.ttft_p99_ms"),
])
def test_bad_slo(kw: dict[str, Any], field: str) -> None:
    expect_field(field, lambda: Slo(**kw))


def test_negative_quota_names_the_pool() -> None:
    err = expect_field("tenant.quota.h100", lambda: tenant(quota={"h100": -2}))
    assert "-2" in err.problem


# --- deployments --------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", list(Engine))
def test_good_deployment(engine: Engine) -> None:
    d = deployment(engine=engine, min_replicas=0, max_replicas=1, warm_pool=0, gpus_per_instance=8)
    assert (d.engine, d.min_replicas, d.max_replicas) == (engine, 0, 1)
    assert deployment(min_replicas=5, max_replicas=5).min_replicas == 5
    assert deployment().policy == ScalingPolicy()


@pytest.mark.parametrize(("kw", "field"), [
    ({"engine": "vllm"}, "deployment.engine"),
    ({"engine": "tgi"}, "deployment.engine"),
    ({"engine": None}, "deployment.engine"),
    ({"model": ""}, "deployment.model"),
    ({"gpus_per_instance": 0}, "deployment.gpus_per_instance"),
    ({"gpus_per_instance": 65}, "deployment.gpus_per_instance"),
    ({"gpus_per_instance": 1.5}, "deployment.gpus_per_instance"),
    ({"min_replicas": -1}, "deployment.min_replicas"),
    ({"max_replicas": 0}, "deployment.max_replicas"),
    ({"min_replicas": 5, "max_replicas": 4}, "deployment.min_replicas"),
    ({"min_replicas": 2.5}, "deployment.min_replicas"),
    ({"warm_pool": -1}, "deployment.warm_pool"),
    ({"warm_pool": 1_001}, "deployment.warm_pool"),
])
def test_bad_deployment(kw: dict[str, Any], field: str) -> None:
    expect_field(field, lambda: deployment(**kw))


def test_unknown_engine_message() -> None:
    err = expect_field("deployment.engine", lambda: deployment(engine="tgi"))
    assert "unknown engine" in err.problem and "tgi" in err.problem


def test_min_above_max_message() -> None:
    err = expect_field("deployment.min_replicas", lambda: deployment(min_replicas=9, max_replicas=3))
    assert "max_replicas (3)" in err.problem and "9" in err.problem


# --- scaling policy -----------------------------------------------------------------------------


def test_policy_defaults_are_valid() -> None:
    p = ScalingPolicy()
    assert p.panic_window_ms <= p.stable_window_ms


def test_panic_window_may_equal_stable_window() -> None:
    assert ScalingPolicy(stable_window_ms=6_000, panic_window_ms=6_000).panic_window_ms == 6_000


def test_panic_window_above_stable_window_is_rejected() -> None:
    err = expect_field("policy.panic_window_ms", lambda: ScalingPolicy(stable_window_ms=6_000, panic_window_ms=6_001))
    assert "stable_window_ms (6000)" in err.problem


@pytest.mark.parametrize(("kw", "field"), [
    ({"target_concurrency": 0}, "policy.target_concurrency"),
    ({"target_concurrency": float("nan")}, "policy.target_concurrency"),
    ({"target_concurrency": float("inf")}, "policy.target_concurrency"),
    ({"target_kv_usage": 1.01}, "policy.target_kv_usage"),
    ({"target_kv_usage": 0}, "policy.target_kv_usage"),
    ({"target_kv_usage": float("nan")}, "policy.target_kv_usage"),
    ({"target_token_utilization": 1.5}, "policy.target_token_utilization"),
    ({"tolerance": -0.1}, "policy.tolerance"),
    ({"tolerance": 0.95}, "policy.tolerance"),
    ({"stable_window_ms": 999}, "policy.stable_window_ms"),
    ({"stable_window_ms": 30_000.5}, "policy.stable_window_ms"),
    ({"ewma_half_life_ms": 0}, "policy.ewma_half_life_ms"),
    ({"panic_window_ms": 249}, "policy.panic_window_ms"),
    ({"panic_threshold": 0.9}, "policy.panic_threshold"),
    ({"panic_threshold": float("nan")}, "policy.panic_threshold"),
    ({"panic_hold_ms": -1}, "policy.panic_hold_ms"),
    ({"scale_down_stabilization_ms": -1}, "policy.scale_down_stabilization_ms"),
    ({"max_step_up": 0}, "policy.max_step_up"),
    ({"max_step_down": 0}, "policy.max_step_down"),
    ({"max_step_down": 1.5}, "policy.max_step_down"),
    ({"scale_down_cooldown_ms": -1}, "policy.scale_down_cooldown_ms"),
    ({"ttft_slo_weight": -0.5}, "policy.ttft_slo_weight"),
    ({"ttft_slo_weight": 11}, "policy.ttft_slo_weight"),
    ({"tolerance": "0.1"}, "policy.tolerance"),
    ({"tolerance": None}, "policy.tolerance"),
])
def test_bad_policy(kw: dict[str, Any], field: str) -> None:
    expect_field(field, lambda: ScalingPolicy(**kw))


@pytest.mark.parametrize("kw", [
    {"target_concurrency": 1},
    {"target_kv_usage": 1.0},
    {"tolerance": 0.0},
    {"tolerance": 0.9},
    {"ttft_slo_weight": 0},
    {"panic_threshold": 1.0},
    {"stable_window_ms": 1_000, "panic_window_ms": 250},
    {"max_step_down": 1, "max_step_up": 1},
])
def test_good_policy(kw: dict[str, Any]) -> None:
    p = ScalingPolicy(**kw)
    for k, v in kw.items():
        assert getattr(p, k) == v


# --- clusters -----------------------------------------------------------------------------------


def test_good_cluster() -> None:
    cl = cluster(capacity={"h100": 0, "a100-80g": 8})
    assert cl.capacity["a100-80g"] == 8
    assert cluster(region="eu-west-1").region == "eu-west-1"


@pytest.mark.parametrize(("kw", "field"), [
    ({"capacity": {"h100": -1}}, "cluster.capacity.h100"),
    ({"capacity": {"h100": 2.0}}, "cluster.capacity.h100"),
    ({"region": "EU"}, "cluster.region"),
])
def test_bad_cluster(kw: dict[str, Any], field: str) -> None:
    expect_field(field, lambda: cluster(**kw))


def test_values_are_frozen() -> None:
    t = tenant()
    with pytest.raises(AttributeError):
        t.priority = 5  # type: ignore[misc]
