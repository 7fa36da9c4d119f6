"""Start tiers: the figures per profile, which engine offers which tier, and how the replicated state
records the tier of every start (from its cluster's model cache and the deployment's engine)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from controlplane.core import model_cache
from controlplane.domain import commands as c
from controlplane.domain import start_tiers as st
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import InitMethod, Instance, InstanceEvent, InstanceState, Transitioned, transition
from controlplane.domain.observations import Observations
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import MAX_CACHED_MODELS, ModelCacheRecord
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster
from controlplane.runtime.transitions import START_METRIC, TransitionRecorder

E, S, M = InstanceEvent, InstanceState, InitMethod

# The documented figures (domain/start_tiers.py), in ms: cold, cached, warm, sleep_l2, reload.
DOCUMENTED = {
    "llama3-8b-h100": (86_060, 30_000, 1_000, 2_106, 20_000),
    "llama3-70b-h100x4": (271_200, 90_000, 4_000, 14_620, 75_000),
    "llama3-8b-a100": (86_060, 30_000, 1_500, 2_106, 20_000),
    "llama3-70b-a100x4": (271_200, 90_000, 6_000, 14_620, 75_000),
}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_has_its_documented_figures(name: str) -> None:
    t = st.times_of(PROFILES[name])
    assert (t.cold_ms, t.cached_ms, t.warm_ms, t.sleep_l2_ms, t.reload_ms) == DOCUMENTED[name]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_figures_that_existed_before_the_tiers_are_kept(name: str) -> None:
    p = PROFILES[name]
    assert st.start_ms(p, M.CACHED) == p.cold_start_ms
    assert st.start_ms(p, M.WARM) == p.warm_start_ms


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_tiers_are_ordered_by_what_they_keep(name: str) -> None:
    p = PROFILES[name]
    warm, l2, reload, cached, cold = (st.start_ms(p, m) for m in (M.WARM, M.SLEEP_L2, M.RELOAD, M.CACHED, M.COLD))
    assert warm < l2 < reload < cached < cold


def test_cold_adds_the_image_pull_and_the_download_of_the_weights() -> None:
    p = PROFILES["llama3-70b-h100x4"]
    assert st.start_ms(p, M.COLD) - st.start_ms(p, M.CACHED) == st.IMAGE_PULL_MS + 141_200


@pytest.mark.parametrize(("engine", "level", "tier"), [
    (Engine.VLLM, 1, M.WARM), (Engine.VLLM, 2, M.SLEEP_L2), (Engine.TRITON, 1, M.RELOAD),
    (Engine.DEEPSPEED_MII, 1, None),
])  # fmt: skip
def test_wake_tier_per_engine(engine: Engine, level: int, tier: InitMethod | None) -> None:
    assert st.wake_tier(engine, level) is tier
    assert engine.can_sleep is (tier is not None)
    p = PROFILES["llama3-8b-h100"]
    assert st.wake_ms(p, engine, level) == (None if tier is None else st.start_ms(p, tier))


def test_default_vllm_sleep_level_is_one() -> None:
    assert st.VLLM_SLEEP_LEVEL == 1
    assert st.wake_ms(PROFILES["llama3-8b-h100"], Engine.VLLM) == 1_000


def test_restart_is_a_new_pod() -> None:
    p = PROFILES["llama3-8b-a100"]
    assert st.restart_ms(p, cached=True) == 30_000
    assert st.restart_ms(p, cached=False) == 86_060


# --- transition(init=...) ------------------------------------------------------------------------

def _inst(state: InstanceState, init: InitMethod = M.COLD) -> Instance:
    return Instance(InstanceId("i1"), DeploymentId("d1"), TenantId("t1"), ClusterId("c1"), ZoneId("z1"),
                    PoolId("h100"), 1, state, init, 0, 0)


@pytest.mark.parametrize(("state", "event", "init", "recorded"), [
    (S.PENDING, E.START_WARMUP, M.CACHED, M.CACHED),
    (S.PENDING, E.START_WARMUP, M.COLD, M.COLD),
    (S.PENDING, E.START_WARMUP, M.WARM, M.COLD),  # a wake tier for a new pod: the table's default
    (S.STANDBY, E.WAKE, M.RELOAD, M.RELOAD),
    (S.STANDBY, E.WAKE, M.SLEEP_L2, M.SLEEP_L2),
    (S.STANDBY, E.WAKE, M.CACHED, M.WARM),  # a new-pod tier for a wake: the table's default
    (S.READY, E.SLEEP, M.RELOAD, M.CACHED),  # not a warm-up: the instance keeps its own
])  # fmt: skip
def test_transition_records_the_named_tier_of_the_right_kind(
    state: InstanceState, event: InstanceEvent, init: InitMethod, recorded: InitMethod
) -> None:
    new, rec = transition(_inst(state, M.CACHED), event, 5, init=init)
    assert new.init_method is recorded and rec.init_method is recorded


# --- the replicated state ------------------------------------------------------------------------

def _state(engine: Engine = Engine.VLLM) -> ControlState:
    state = ControlState()
    for cmd in (
        c.PutTenant(Tenant(TenantId("t1"), 1)),
        c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={PoolId("h100"): 8})),
        c.PutCluster(Cluster(ClusterId("c2"), ZoneId("z1"), capacity={PoolId("h100"): 8})),
        c.PutDeployment(Deployment(DeploymentId("d1"), TenantId("t1"), engine, "llama3-8b-h100", PoolId("h100"), 1)),
    ):
        assert apply(state, cmd).ok, cmd
    return state


def _start(state: ControlState, iid: str, cluster: str) -> InitMethod:
    assert apply(state, c.CreateInstance(InstanceId(iid), DeploymentId("d1"), ClusterId(cluster), 10)).ok
    assert apply(state, c.TransitionInstance(InstanceId(iid), E.START_WARMUP, 11)).ok
    return state.instances[InstanceId(iid)].init_method


def test_a_new_pod_is_cached_where_the_cluster_cache_holds_the_model_else_cold() -> None:
    state = _state()
    assert apply(state, c.PutModelCache(ClusterId("c1"), ModelCacheRecord(("llama3-8b-h100",), 5))).ok
    assert apply(state, c.PutModelCache(ClusterId("c2"), ModelCacheRecord(("llama3-70b-h100x4",), 5))).ok
    assert _start(state, "a", "c1") is M.CACHED
    assert _start(state, "b", "c2") is M.COLD


@pytest.mark.parametrize(("engine", "tier"), [(Engine.VLLM, M.WARM), (Engine.TRITON, M.RELOAD)])
def test_a_wake_records_the_engine_wake_tier(engine: Engine, tier: InitMethod) -> None:
    state = _state(engine)
    _start(state, "a", "c1")
    for event in (E.WARMED, E.SLEEP, E.WAKE):
        result = apply(state, c.TransitionInstance(InstanceId("a"), event, 20))
        assert result.ok, result.error
    assert state.instances[InstanceId("a")].init_method is tier
    assert result.transitions[0].init_method is tier


def test_apply_refuses_to_put_deepspeed_mii_to_sleep() -> None:
    state = _state(Engine.DEEPSPEED_MII)
    _start(state, "a", "c1")
    assert apply(state, c.TransitionInstance(InstanceId("a"), E.WARMED, 20)).ok
    before = state.applied
    result = apply(state, c.TransitionInstance(InstanceId("a"), E.SLEEP, 30))
    assert not result.ok and result.code == "conflict"
    assert "deepspeed-mii" in result.error and "no sleep mode" in result.error
    assert state.instances[InstanceId("a")].state is S.READY and state.applied == before


@pytest.mark.parametrize(("cmd", "code", "needle"), [
    (c.PutModelCache(ClusterId("nope"), ModelCacheRecord(("m",), 1)), "not_found", "nope"),
    (c.PutModelCache(ClusterId("c1"), ModelCacheRecord.__new__(ModelCacheRecord)), "malformed", ""),
])  # fmt: skip
def test_put_model_cache_rejects(cmd: c.Command, code: str, needle: str) -> None:
    state = _state()
    result = apply(state, cmd)
    assert not result.ok and result.code == code and needle in result.error
    assert state.model_caches == {}


@pytest.mark.parametrize(("models", "problem"), [
    (("b", "a"), "sorted"), (("a", "a"), "duplicates"), (("",), "non-empty"), (["a"], "tuple"),
    (tuple(f"m{i:04d}" for i in range(MAX_CACHED_MODELS + 1)), "exceed"),
])  # fmt: skip
def test_model_cache_record_validates(models: object, problem: str) -> None:
    with pytest.raises(Exception, match=problem):
        ModelCacheRecord(models, 0)  # type: ignore[arg-type]


def test_removing_a_cluster_removes_its_cache_record() -> None:
    state = _state()
    assert apply(state, c.PutModelCache(ClusterId("c2"), ModelCacheRecord(("m",), 1))).ok
    assert apply(state, c.RemoveCluster(ClusterId("c2"))).ok
    assert state.model_caches == {}


# --- the facts from the observations --------------------------------------------------------------

def test_cache_facts_only_for_changes_of_known_clusters() -> None:
    state = _state()
    obs = Observations(100, model_caches=((ClusterId("c1"), ("b", "a", "a")), (ClusterId("c2"), ()),
                                          (ClusterId("gone"), ("a",))))
    facts = model_cache.facts(state, obs, 100)
    assert facts == (c.PutModelCache(ClusterId("c1"), ModelCacheRecord(("a", "b"), 100)),)  # c2: empty, no record
    for f in facts:
        assert apply(state, f).ok
    assert model_cache.facts(state, obs, 200) == ()  # unchanged
    emptied = Observations(300, model_caches=((ClusterId("c1"), ()),))
    assert model_cache.facts(state, emptied, 300) == (c.PutModelCache(ClusterId("c1"), ModelCacheRecord((), 300)),)
    assert model_cache.cached_clusters(state, "a") == frozenset({"c1"})


# --- the start-latency histogram -----------------------------------------------------------------

def test_start_latency_histogram_by_tier() -> None:
    registry = CollectorRegistry()
    rec = TransitionRecorder(registry)
    rec.record([
        Transitioned(InstanceId("a"), S.WARMING, S.READY, E.WARMED, 31_000, M.CACHED, 50_000),
        Transitioned(InstanceId("b"), S.WARMING, S.READY, E.WARMED, 900, M.WARM, 50_000),
        Transitioned(InstanceId("c"), S.PENDING, S.WARMING, E.START_WARMUP, 5, M.COLD, 50_000),  # not a start's end
    ])

    def value(name: str, tier: str, **extra: str) -> float | None:
        return registry.get_sample_value(f"{START_METRIC}_{name}", {"tier": tier, **extra})

    assert value("count", "cached") == 1 and value("sum", "cached") == 31.0
    assert value("count", "warm") == 1 and value("bucket", "warm", le="1.0") == 1
    assert value("bucket", "cached", le="30.0") == 0 and value("bucket", "cached", le="45.0") == 1
    assert value("count", "cold") is None


def test_facts_put_the_cache_after_the_lifecycle_reports_so_a_start_keeps_its_tier() -> None:
    """A pod created while its cluster's cache lacked the model is reported starting in the same batch
    that first reports the cache holding it (a cold start of another instance completed meanwhile):
    the start stays ``cold``, the next one is ``cached``."""
    import random

    from controlplane.core import reconcile
    from controlplane.domain.observations import InstanceReport

    state = _state()
    assert apply(state, c.CreateInstance(InstanceId("a"), DeploymentId("d1"), ClusterId("c1"), 10)).ok
    obs = Observations(100, reports=(InstanceReport(InstanceId("a"), "start_warmup", 50),),
                       model_caches=((ClusterId("c1"), ("llama3-8b-h100",)),))
    facts = reconcile.facts(state, obs, [], 100, reconcile.ReconcileConfig(), random.Random(0))
    assert [type(f) for f in facts] == [c.TransitionInstance, c.PutModelCache]
    assert apply(state, c.Batch(facts)).ok
    assert state.instances[InstanceId("a")].init_method is M.COLD
    assert _start(state, "b", "c1") is M.CACHED


@pytest.mark.parametrize(("engine", "warm"), [(Engine.VLLM, 2), (Engine.TRITON, 2), (Engine.DEEPSPEED_MII, 0)])
def test_the_scaling_decision_keeps_no_warm_pool_for_an_engine_that_cannot_sleep(engine: Engine, warm: int) -> None:
    from controlplane.core import scaling
    from controlplane.domain.records import EMPTY_MEMORY
    from controlplane.domain.tenants import Slo

    d = Deployment(DeploymentId("d1"), TenantId("t1"), engine, "llama3-8b-h100", PoolId("h100"), 1, warm_pool=2)
    decision = scaling.decide(d, PROFILES["llama3-8b-h100"], Slo(), None, EMPTY_MEMORY, 1, 1_000)
    assert decision.warm_pool == warm
