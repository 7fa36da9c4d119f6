"""The Triton and DeepSpeed-MII service models of the simulator (controlplane.sim.service_models),
driven through SimFleet on a seeded event heap in virtual time (no sleeps)."""

from __future__ import annotations

import dataclasses
import heapq
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.domain.engines import LOAD_FIELDS
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Engine
from controlplane.sim import runner
from controlplane.sim.cluster import BATCH_DUE, COMPLETE, SimFleet, SimRequest
from controlplane.sim.scenario import MiiSpec, ScenarioError, TritonSpec, scenario_from_data
from controlplane.sim.service_models import p95

DEP = DeploymentId("d")
PROFILE = dataclasses.replace(PROFILES["llama3-8b-h100"], max_num_seqs=4)


@dataclasses.dataclass(frozen=True)
class _Inst:
    id: InstanceId
    deployment: DeploymentId
    cluster: ClusterId
    gpus: int = 1


class Harness:
    """A SimFleet with one serving instance of ``DEP`` and its own heap."""

    def __init__(self, engine: Engine, options=None, profile=PROFILE) -> None:
        self.heap: list = []
        self.seq = 0
        self.done: list[tuple[int, int, bool]] = []
        self.fleet = SimFleet({DEP: profile}, self.schedule, random.Random("t"), lambda *a: 0.0,
                              lambda r, now: self.done.append((r.rid, now, r.dropped)),
                              engines={DEP: engine}, service_options={DEP: options} if options else None)
        self.iid = InstanceId("d-0")
        self.fleet.preprovision(_Inst(self.iid, DEP, ClusterId("c")), 0)
        self.rid = 0

    def schedule(self, at: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, payload))

    def send(self, now: int, prompt: int = 100, output: int = 10) -> SimRequest:
        req = SimRequest(self.rid, DEP, now, prompt, output)
        self.rid += 1
        self.fleet.arrive(req, now)
        return req

    def run_until(self, t: int) -> None:
        while self.heap and self.heap[0][0] <= t:
            at, _, kind, payload = heapq.heappop(self.heap)
            {COMPLETE: self.fleet.on_complete, BATCH_DUE: self.fleet.on_batch_due}[kind](payload, int(at))

    def sample(self, now: int, interval: int = 250):
        (s,) = self.fleet.gather(now, interval).samples
        return s

    @property
    def sim(self):
        return self.fleet.instances[self.iid]


# --- Triton: dynamic batcher ----------------------------------------------------------------------

def test_triton_batch_runs_to_its_end_and_later_requests_wait_in_the_queue() -> None:
    h = Harness(Engine.TRITON, TritonSpec(max_batch_size=4))
    first = h.send(0, output=100)  # a free instance takes it at once (max_queue_delay 0): a batch of 1
    later = [h.send(10) for _ in range(3)]
    assert len(h.sim.running) == 1 and len(h.sim.queue) == 3  # no joining a running batch
    s = h.sample(250)
    assert (s.running, s.waiting) == (1, 3)
    assert s.unknown == ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")
    assert s.kv_usage == 0.0 and s.prompt_tokens_per_s == 0.0 and s.generation_tokens_per_s == 0.0
    assert s.queue_p95_ms == 0.0  # the first left the queue at once
    h.run_until(10_000)
    done = {rid: t for rid, t, _ in h.done}
    step1 = PROFILE.step_ms(1)
    assert done[first.rid] == int(100 * 1000 / PROFILE.prefill_tokens_per_s + step1 + 99 * step1)
    # The three others started together when the first batch ended, as one batch of 3.
    assert all(done[r.rid] > done[first.rid] for r in later)
    assert len({done[r.rid] for r in later}) == 1
    s = h.sample(10_250)
    assert s.queue_p95_ms == pytest.approx(done[first.rid] - 10, abs=1)
    assert s.running == 0 and s.waiting == 0 and h.sim.kv_used == 0


def test_triton_queue_delay_waits_for_a_fuller_batch_then_dispatches() -> None:
    h = Harness(Engine.TRITON, TritonSpec(max_batch_size=3, max_queue_delay_ms=40))
    h.send(0)
    assert len(h.sim.running) == 0 and len(h.sim.queue) == 1  # waiting for more, at most 40 ms
    h.send(5)
    h.run_until(39)
    assert len(h.sim.running) == 0
    h.run_until(40)  # the oldest request's delay passed: the batch of 2 goes
    assert len(h.sim.running) == 2 and not h.sim.queue
    h.run_until(100_000)
    # A full batch goes at once, without waiting for the delay.
    for t in (200_000, 200_001, 200_002):
        h.send(t)
    assert len(h.sim.running) == 3


def test_triton_batch_respects_the_kv_cache() -> None:
    small = dataclasses.replace(PROFILE, kv_capacity_tokens=250)
    h = Harness(Engine.TRITON, TritonSpec(max_batch_size=4, max_queue_delay_ms=10), profile=small)
    for t in range(3):
        h.send(t, prompt=100, output=10)  # 110 tokens each: two fit
    h.run_until(20)
    assert len(h.sim.running) == 2 and len(h.sim.queue) == 1


def test_triton_ttft_only_with_the_first_response_histogram() -> None:
    for histogram in (True, False):
        h = Harness(Engine.TRITON, TritonSpec(first_response_histogram=histogram))
        h.send(0)
        h.run_until(5_000)
        ttft = h.sample(5_000).ttft_p99_ms
        assert (ttft is not None) is histogram


def test_triton_drain_aborts_the_running_batch_and_requeues_the_queue() -> None:
    h = Harness(Engine.TRITON, TritonSpec(max_batch_size=1))
    h.send(0, output=1000)
    h.send(1)
    h.fleet.execute("drain", _Inst(h.iid, DEP, ClusterId("c")), 2, 1)
    assert h.fleet.gateway[DEP]  # the queued one went back through the gateway (nothing else serves)
    while h.heap:  # the drain deadline
        at, _, kind, payload = heapq.heappop(h.heap)
        if kind == 3:
            h.fleet.on_drain_deadline(payload, int(at))
    assert h.iid not in h.fleet.instances
    assert [dropped for _, _, dropped in h.done] == [True]


def test_triton_inflight_is_continuous_batching_with_kv_known_tokens_unknown() -> None:
    h = Harness(Engine.TRITON, TritonSpec(batching="inflight"))
    h.send(0, output=100)
    h.send(10)  # joins the running batch
    assert len(h.sim.running) == 2
    s = h.sample(250)
    # KV use known (kv_cache_block_metrics); no token counters on TensorRT-LLM (adapters/triton.py)
    assert s.unknown == ("generation_tokens_per_s", "prompt_tokens_per_s") and s.kv_usage > 0 and s.queue_p95_ms == 0.0


# --- DeepSpeed-MII --------------------------------------------------------------------------------

def test_mii_with_meter_counts_in_flight_and_reply_tokens_kv_unknown() -> None:
    h = Harness(Engine.DEEPSPEED_MII, MiiSpec(meter=True))
    for t in range(6):  # 4 run (max_num_seqs), 2 queue inside MII
        h.send(t, prompt=200, output=5)
    s = h.sample(250)
    assert (s.running, s.waiting) == (6, 0)  # the meter cannot tell MII's batch from its queue
    assert s.unknown == ("generation_tokens_per_s", "kv_usage", "prompt_tokens_per_s")  # first scrape: no rate yet
    assert s.ttft_p99_ms is not None and s.ttft_p99_ms > 200  # the probe waits behind the queue
    assert s.gpu_mem_total_bytes == 0 and s.queue_p95_ms is None
    h.run_until(10_000)
    s = h.sample(10_000, interval=1000)
    assert s.unknown == ("kv_usage",)
    assert s.prompt_tokens_per_s == pytest.approx(6 * 200) and s.generation_tokens_per_s == pytest.approx(6 * 5)
    assert s.running == 0 and s.kv_usage == 0.0
    idle = h.sample(10_250)
    assert idle.ttft_p99_ms == pytest.approx(1000 / PROFILE.prefill_tokens_per_s + PROFILE.step_ms(1))


def test_mii_without_meter_knows_no_load() -> None:
    h = Harness(Engine.DEEPSPEED_MII, MiiSpec(meter=False))
    h.send(0)
    s = h.sample(250)
    assert s.unknown == tuple(sorted(LOAD_FIELDS))
    assert (s.running, s.waiting, s.prompt_tokens_per_s) == (0, 0, 0.0)
    assert s.ttft_p99_ms is not None  # the probe still answers


def test_mii_serves_like_vllm_continuous_batching() -> None:
    """FastGen's continuous batching: the same completion times as the vLLM path."""
    times = {}
    for engine in (Engine.VLLM, Engine.DEEPSPEED_MII):
        h = Harness(engine)
        for t in range(0, 60, 7):
            h.send(t, prompt=300, output=20)
        h.run_until(100_000)
        times[engine] = sorted(h.done)
    assert times[Engine.VLLM] == times[Engine.DEEPSPEED_MII]


def test_p95_is_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([float(v) for v in range(1, 101)]) == 95.0
    assert p95([3.0]) == 3.0


# --- scenarios and the simulate command -----------------------------------------------------------

def _scenario(engine: str, **extra) -> dict:
    return {
        "seed": 3, "clusters": [{"id": "c1", "zone": "az-a", "capacity": {"h100": 8}}],
        "tenants": [{"id": "t1", "priority": 10, "quota": {"h100": 8}, "slo": {"ttft_p99_ms": 2000}}],
        "deployments": [{"id": "d1", "tenant": "t1", "engine": engine, "model": "llama3-8b-h100", "pool": "h100",
                         "min_replicas": 1, "max_replicas": 6, "warm_pool": 0,
                         "workload": {"generator": {"duration_s": 120, "base_rps": 8, "burst_every_s": 60,
                                                    "burst_duration_s": 20, "burst_factor": 4}}, **extra}],
    }


@pytest.mark.parametrize("engine, extra", [
    ("vllm", {}), ("triton", {}), ("triton", {"triton": {"batching": "inflight"}}),
    ("deepspeed-mii", {}), ("deepspeed-mii", {"mii": {"meter": False}}),
])
def test_a_simulation_per_engine_serves_and_never_scales_down_on_unknown_load(engine, extra) -> None:
    sc = scenario_from_data(_scenario(engine, **extra), source="t", base_dir=Path("."))
    a = runner.run(sc, 3).summary
    assert runner.to_json(runner.run(sc, 3)) == json.dumps(a, sort_keys=True, indent=2)  # seeded
    dep = a["deployments"]["d1"]
    assert dep["engine"] == engine and dep["completed"] > 0
    assert dep["scale_downs"]["load_not_known"] == 0
    if extra.get("mii") == {"meter": False}:
        assert dep["scale_downs"]["taken"] == 0 and dep["scale_downs"]["held_unknown_load"] > 0


def test_engine_options_must_match_the_engine() -> None:
    with pytest.raises(ScenarioError, match="triton: only for engine triton"):
        scenario_from_data(_scenario("vllm", triton={"max_batch_size": 8}), source="t", base_dir=Path("."))
    with pytest.raises(ScenarioError, match="max_queue_delay_ms"):
        scenario_from_data(_scenario("triton", triton={"max_queue_delay_ms": -1}), source="t", base_dir=Path("."))


def test_the_builtin_demo_uses_all_three_engines() -> None:
    demo = runner.builtin_scenario("demo")
    assert {d.engine for d in demo.deployments} == set(Engine)
    summary = runner.run(demo, demo.spec.seed).summary
    assert {v["engine"] for v in summary["deployments"].values()} == {e.value for e in Engine}
    for dep in summary["deployments"].values():
        assert dep["completed"] > 0 and dep["scale_downs"]["load_not_known"] == 0
    assert summary["tenants"]["batch"]["preemptions"] >= 1


def test_simulate_trace_per_engine_cli(traces_dir: Path) -> None:
    path = str(traces_dir / "AzureLLMInferenceTrace_conv.csv")
    for engine in ("triton", "deepspeed-mii"):
        res = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "simulate", "--trace", path, "--json",
                              "--no-progress", "--engine", engine, "--rate-scale", "8"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        (dep,) = json.loads(res.stdout)["deployments"].values()
        assert dep["engine"] == engine and dep["scale_downs"]["load_not_known"] == 0
