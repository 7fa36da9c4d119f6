"""Unknown and partly known load never scales a deployment down; the engine queue time scales it up.

The pipeline is driven end to end (``aggregate`` -> ``update`` -> ``filtered`` -> ``decide``) in
virtual time, 250 ms ticks, the way the control loop does.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.wire import observations_of, sample_message, unknown_fields
from controlplane.api.v1 import adapter_pb2
from controlplane.core.scaling import ScaleReason, decide, queue_demand
from controlplane.core.signals import EMPTY_SIGNALS, LOAD_SIGNALS, SignalMemory, aggregate, filtered, update
from controlplane.domain.engines import CAPABILITIES, LOAD_FIELDS, TRITON_QUEUE_P95_TARGET_MS
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.observations import InstanceSample
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import EMPTY_MEMORY, ScaleMemory
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, engine_policy
from controlplane.specs import DeploymentBase, deployment_of

PROFILE = PROFILES["llama3-8b-h100"]
SLO = Slo(ttft_p99_ms=2_000)
DEP = DeploymentId("chat")
TICK = 250


def deployment(engine: Engine, **policy: float) -> Deployment:
    return Deployment(DEP, "t", engine, "llama3-8b-h100", "h100", 1, min_replicas=1, max_replicas=64,
                      warm_pool=0, policy=engine_policy(engine, policy))


def sample(i: int, at_ms: int, *, running: int = 0, waiting: int = 0, kv: float = 0.0, tps: float = 0.0,
           unknown: tuple[str, ...] = (), healthy: bool = True, ttft: float | None = None,
           queue: float | None = None) -> InstanceSample:
    return InstanceSample(InstanceId(f"i{i}"), DEP, at_ms, running, waiting, kv, 0.0, tps, ttft_p99_ms=ttft,
                          healthy=healthy, queue_p95_ms=queue, unknown=unknown)


def run(dep: Deployment, current: int, minutes: float, samples_at, *, unsampled: int = 0):  # type: ignore[no-untyped-def]
    """Tick for ``minutes`` of virtual time; returns (targets seen, reasons seen)."""
    mem: SignalMemory = EMPTY_SIGNALS
    memory: ScaleMemory = EMPTY_MEMORY
    targets, reasons = [], set()
    for now in range(0, int(minutes * 60_000), TICK):
        samples = samples_at(now, current)
        agg = aggregate(samples, len(samples), 0, now, unsampled=unsampled)
        mem = update(mem, agg, dep.policy, now)
        d = decide(dep, PROFILE, SLO, filtered(mem, agg, dep.policy, now), memory, current, now)
        memory, current = d.memory, d.target
        targets.append(current)
        reasons.add(d.reason)
    return targets, reasons


def test_the_mii_six_to_one_case_holds_at_six() -> None:
    """DeepSpeed-MII without a meter: every load field unknown (0), the probe-latency proxy well under
    the SLO. Reading those zeros as idle once took 6 replicas to 1 in 10 s; now nothing comes down."""
    dep = deployment(Engine.DEEPSPEED_MII)
    targets, reasons = run(dep, 6, 20, lambda now, n: [sample(i, now, unknown=LOAD_FIELDS, ttft=180.0) for i in range(n)])
    assert min(targets) == 6
    assert ScaleReason.UNKNOWN_LOAD in reasons


def test_a_load_never_known_holds_and_says_why() -> None:
    dep = deployment(Engine.DEEPSPEED_MII)
    agg = aggregate([sample(0, 0, unknown=LOAD_FIELDS)], 1, 0, 0)
    f = filtered(update(EMPTY_SIGNALS, agg, dep.policy, 0), agg, dep.policy, 0)
    d = decide(dep, PROFILE, SLO, f, EMPTY_MEMORY, 3, 0)
    assert (d.target, d.reason) == (3, ScaleReason.NO_DATA)
    assert d.message.startswith("load unknown (concurrency, generation_tokens_per_s, kv_usage, prompt_tokens_per_s")


def test_the_same_zeros_known_do_scale_down() -> None:
    """The hold is about knowledge, not the engine: the same idle load, known (the meter), goes down to
    the minimum (so the test above can fail)."""
    dep = deployment(Engine.DEEPSPEED_MII)
    targets, _ = run(dep, 6, 20, lambda now, n: [sample(i, now, ttft=180.0, unknown=("kv_usage",)) for i in range(n)])
    assert targets[-1] == 1


def test_unknown_load_still_scales_up_on_ttft() -> None:
    dep = deployment(Engine.DEEPSPEED_MII)
    targets, reasons = run(dep, 2, 1, lambda now, n: [sample(i, now, unknown=LOAD_FIELDS, ttft=6_000.0) for i in range(n)])
    assert max(targets) > 2 and ScaleReason.UNKNOWN_LOAD not in reasons - {ScaleReason.WITHIN_TOLERANCE}


def test_an_engine_that_never_reports_kv_still_scales_down_on_what_it_reports() -> None:
    """Plain Triton: KV use and token rates are never known, concurrency always is: the known signal
    decides, the unknown ones propose nothing (they are not zeros)."""
    dep = deployment(Engine.TRITON)
    unknown = ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")
    targets, reasons = run(dep, 6, 20, lambda now, n: [sample(i, now, running=2, unknown=unknown) for i in range(n)])
    assert targets[-1] == 1 and ScaleReason.UNKNOWN_LOAD not in reasons


@pytest.mark.parametrize("how", ["one_scrape_failed", "one_unhealthy", "one_unsampled"])
def test_a_partly_known_load_holds_a_scale_down(how: str) -> None:
    """Five of six instances report an idle load; the sixth could not (its 0 would be a lower bound)."""
    dep = deployment(Engine.VLLM)

    def samples_at(now: int, n: int) -> list[InstanceSample]:
        out = [sample(i, now, ttft=100.0) for i in range(min(n, 5))]
        if how == "one_scrape_failed":
            out.append(sample(5, now, unknown=LOAD_FIELDS))
        elif how == "one_unhealthy":
            out.append(sample(5, now, healthy=False))
        return out

    targets, reasons = run(dep, 6, 20, samples_at, unsampled=1 if how == "one_unsampled" else 0)
    assert min(targets) == 6 and ScaleReason.UNKNOWN_LOAD in reasons


def test_coverage_of_the_load_signals() -> None:
    known = sample(0, 0, running=3)
    no_kv = sample(1, 0, running=3, unknown=("kv_usage",))
    agg = aggregate([known, no_kv], 2, 0, 0)
    assert agg.partial == {"kv_usage"} and agg.unknown == frozenset()
    agg = aggregate([no_kv], 1, 0, 0)
    assert agg.unknown == {"kv_usage"} and agg.partial == frozenset()
    agg = aggregate([], 0, 7, 0, unsampled=0)
    assert agg.unknown == agg.partial == frozenset() and agg.waiting == 7  # nothing serves: the queue is all
    agg = aggregate([], 0, 0, 0, unsampled=2)
    assert agg.unknown == frozenset(LOAD_SIGNALS)


def test_queue_time_over_its_target_asks_for_replicas() -> None:
    policy = ScalingPolicy(target_queue_p95_ms=120.0)
    assert queue_demand(policy, 100.0, 4) is None
    assert queue_demand(policy, 180.0, 4) == pytest.approx(6.0)
    assert queue_demand(policy, 10_000.0, 4) == 8.0  # at most twice the serving replicas per decision
    assert queue_demand(ScalingPolicy(), 10_000.0, 4) is None  # disabled by default (vLLM, MII)
    dep = deployment(Engine.TRITON)
    unknown = ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")
    targets, _ = run(dep, 4, 0.5, lambda now, n: [sample(i, now, running=2, unknown=unknown, queue=400.0)
                                                 for i in range(n)])
    assert max(targets) > 4  # low concurrency, but requests queue for 400 ms against 120 ms


def test_engine_defaults_and_overrides() -> None:
    assert engine_policy(Engine.TRITON).target_queue_p95_ms == TRITON_QUEUE_P95_TARGET_MS
    assert engine_policy(Engine.VLLM) == ScalingPolicy()
    assert engine_policy(Engine.DEEPSPEED_MII).target_token_utilization == 0.85
    base = {"id": "chat", "tenant": "t", "model": "llama3-8b-h100", "pool": "h100"}
    triton = deployment_of(DeploymentBase(**base, engine="triton"), "f")
    assert triton.policy.target_queue_p95_ms == 120.0
    mine = deployment_of(DeploymentBase(**base, engine="triton", policy={"target_queue_p95_ms": 80.0}), "f")
    assert mine.policy.target_queue_p95_ms == 80.0
    off = deployment_of(DeploymentBase(**base, engine="triton", policy={"target_queue_p95_ms": 0.0}), "f")
    assert off.policy.target_queue_p95_ms == 0.0  # a deployment may turn the engine's default off
    assert not CAPABILITIES[Engine.DEEPSPEED_MII].warm_path and Engine.TRITON.can_sleep


def test_unknown_and_queue_time_cross_the_adapter_wire() -> None:
    s = sample(0, 5, running=1, unknown=("kv_usage", "running"), queue=42.0)
    back = observations_of(adapter_pb2.ObservationBatch(cluster_id="c", samples=[sample_message(s)])).samples[0]
    assert back == s
    plain = observations_of(adapter_pb2.ObservationBatch(cluster_id="c", samples=[sample_message(
        replace(s, unknown=(), queue_p95_ms=None))])).samples[0]
    assert plain.unknown == () and plain.queue_p95_ms is None
    # A newer adapter's unknown field name is dropped, duplicates and order do not matter.
    assert unknown_fields(["running", "gpu_temperature", "kv_usage", "running"]) == ("kv_usage", "running")


# --- property: whatever the samples say, a tick whose load is not wholly known never scales down ------

_one = st.tuples(
    st.integers(0, 200), st.integers(0, 200), st.floats(0, 1), st.floats(0, 20_000),
    st.lists(st.sampled_from(LOAD_FIELDS), max_size=3, unique=True), st.booleans(),
    st.one_of(st.none(), st.floats(0, 10_000)),
)


@settings(max_examples=60, deadline=None)
@given(engine=st.sampled_from(list(Engine)), start=st.integers(1, 12),
       ticks=st.lists(st.tuples(st.lists(_one, min_size=0, max_size=8), st.integers(0, 2)), min_size=1, max_size=60))
def test_no_scale_down_on_a_tick_whose_load_is_not_wholly_known(engine: Engine, start: int, ticks: list) -> None:
    dep = deployment(engine)
    mem, memory, current = EMPTY_SIGNALS, EMPTY_MEMORY, start
    for k, (rows, unsampled) in enumerate(ticks):
        now = k * TICK
        samples = [sample(i, now, running=r, waiting=w, kv=kv, tps=tps, unknown=tuple(sorted(u)), healthy=h, ttft=t)
                   for i, (r, w, kv, tps, u, h, t) in enumerate(rows)]
        agg = aggregate(samples, len(samples), 0, now, unsampled=unsampled)
        mem = update(mem, agg, dep.policy, now)
        f = filtered(mem, agg, dep.policy, now)
        d = decide(dep, PROFILE, SLO, f, memory, current, now)
        wholly_known = not agg.partial and len(agg.unknown) < len(LOAD_SIGNALS)
        if not wholly_known and current >= dep.min_replicas:
            assert d.target >= current, (d.reason, d.message)
        memory, current = d.memory, d.target
