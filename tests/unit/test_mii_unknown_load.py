"""Issue 17: a loaded DeepSpeed-MII deployment was taken from 6 replicas to 1 because the driver's
zeros (MII has no metrics endpoint) read as "idle". Replayed at the planner level: samples as
adapters/deepspeed_mii.py reports them, through controlplane.core.signals (aggregate / update /
filtered) into controlplane.core.scaling.decide, one tick every 250 ms for 20 virtual minutes."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.core.scaling import ScaleReason, decide
from controlplane.core.signals import EMPTY_SIGNALS, aggregate, filtered, update
from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.ids import InstanceId
from controlplane.domain.observations import InstanceSample
from controlplane.domain.profiles import PROFILES
from controlplane.domain.records import EMPTY_MEMORY
from controlplane.domain.tenants import Deployment, Engine, Slo, engine_policy

PROFILE = PROFILES["llama3-8b-h100"]
SLO = Slo(ttft_p99_ms=2_000)
TICK_MS = 250
MINUTES_MS = 60_000
START = 6
PROBE_MS = 400.0  # the probe's latency: well under the SLO, as on a loaded MII whose queue is short

NO_METER = tuple(sorted(LOAD_FIELDS))
WITH_METER = ("kv_usage",)


def mii() -> Deployment:
    return Deployment(id="code", tenant="team-a", engine=Engine.DEEPSPEED_MII, model=PROFILE.name, pool="h100",
                      gpus_per_instance=1, min_replicas=1, max_replicas=16, warm_pool=0,
                      policy=engine_policy(Engine.DEEPSPEED_MII))


@dataclass
class Run:
    targets: list[tuple[int, int]]
    reasons: set[ScaleReason]

    def first_below(self, n: int) -> int | None:
        return next((t for t, target in self.targets if target < n), None)


LOADED_UNTIL_MS = 2 * MINUTES_MS
"""The deployment is at 6 because it was loaded: 24 requests per replica (the concurrency target)
for the first two minutes, then ``running`` per replica."""


def replay(unknown: tuple[str, ...], running: int, gen_tps: float, minutes: int = 20) -> Run:
    """Tick the planner with ``current`` instances each reporting their ``unknown`` fields, the probe
    latency as TTFT, 24 requests each until :data:`LOADED_UNTIL_MS`, then ``running`` requests and
    ``gen_tps`` generated tokens/s each; the target is applied at once (the instances follow)."""
    dep = mii()
    policy = dep.policy
    mem, memory, current = EMPTY_SIGNALS, EMPTY_MEMORY, START
    targets, reasons = [], set()
    for now in range(0, minutes * MINUTES_MS + 1, TICK_MS):
        load = 24 if now < LOADED_UNTIL_MS else running
        samples = [InstanceSample(InstanceId(f"i-{i}"), dep.id, now, running=load, waiting=0, kv_usage=0.0,
                                  prompt_tokens_per_s=gen_tps / 4, generation_tokens_per_s=gen_tps,
                                  ttft_p99_ms=PROBE_MS, unknown=unknown)
                   for i in range(current)]
        sig = aggregate(samples, current, 0, now)
        mem = update(mem, sig, policy, now)
        decision = decide(dep, PROFILE, SLO, filtered(mem, sig, policy, now), memory, current, now)
        memory, current = decision.memory, decision.target
        targets.append((now, current))
        reasons.add(decision.reason)
    return Run(targets, reasons)


def test_unknown_load_with_a_probe_under_the_slo_never_scales_mii_down() -> None:
    run = replay(NO_METER, running=0, gen_tps=0.0)
    assert min(target for _, target in run.targets) == START
    assert ScaleReason.UNKNOWN_LOAD in run.reasons


def test_the_same_zeros_read_as_known_load_would_scale_down() -> None:
    """What the old driver reported (zeros, nothing unknown): the run the issue saw, so the test above
    can fail."""
    run = replay((), running=0, gen_tps=0.0)
    assert run.targets[-1][1] == 1


def test_the_meters_known_low_load_scales_down_after_the_stabilization_window() -> None:
    window = mii().policy.scale_down_stabilization_ms
    run = replay(WITH_METER, running=1, gen_tps=20.0)  # 1 request and 20 tokens/s per replica: mostly idle
    assert all(target == START for t, target in run.targets if t < LOADED_UNTIL_MS)
    first = run.first_below(START)
    assert first is not None and first >= LOADED_UNTIL_MS + window - 1_000, "not before the stabilization window"
    assert run.targets[-1][1] < START
    assert ScaleReason.UNKNOWN_LOAD not in run.reasons  # kv_usage unknown alone does not hold it


def test_the_meters_known_high_load_keeps_mii_up() -> None:
    run = replay(WITH_METER, running=40, gen_tps=1_000.0, minutes=5)  # above the concurrency target of 24
    assert min(target for _, target in run.targets) >= START
