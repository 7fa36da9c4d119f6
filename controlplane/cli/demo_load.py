"""What ``controlplane demo`` runs (:mod:`controlplane.cli.demo` drives it):

* **three tenants, one engine each**: ``gold`` (priority 200, quota 9 GPUs, TTFT SLO 1 s) with
  deployment ``chat`` on vLLM, ``silver`` (priority 100, quota 3, may borrow 3, SLO 2 s) with ``embed``
  on Triton (TensorRT-LLM in-flight batching), and ``bronze`` (priority 50, quota 3 GPUs, may borrow
  9, TTFT SLO 3 s) with ``batch`` on DeepSpeed-MII behind its request meter; each is served by its
  engine's service model (``controlplane.sim.service_models``) and reports what that engine can. The
  clusters hold 6 GPUs each (18 in all), so when ``chat`` bursts it takes back the GPUs ``bronze``
  borrowed: preemptions;
* **a bursty workload**, a step-Poisson load per deployment and zone: ``batch`` rises early and
  borrows the idle GPUs, ``chat`` bursts from 40 % to 75 % of the run. With ``--trace`` the arrival
  shape of an Azure LLM inference trace replaces ``chat``'s schedule: the whole trace is compressed
  into the run (one step per second of demo time) and scaled so its busiest second offers the
  built-in burst rate;
* **the simulated clusters** serving it, one per zone, each with the TTFT score of every finished
  request (and the wait of every dropped one).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.simulated import SimulatedBackend, SimulatedConfig
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.ids import local_name, qualified_id

ZONE_COUNT = 3
GPUS_PER_CLUSTER = 6
POOL = "h100"
MODEL = "llama3-8b-h100"
COLD_START_MS, WARM_START_MS = 3_000, 500
POLICY = {
    "target_concurrency": 4.0, "stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000,
    "panic_hold_ms": 3_000, "scale_down_stabilization_ms": 4_000, "scale_down_cooldown_ms": 1_000, "max_step_down": 4,
}
"""Fast reactions for a short demo (the product defaults assume minutes, not seconds)."""


@dataclass(frozen=True)
class TenantPlan:
    tenant: str
    priority: int
    quota: int
    borrow: int
    slo_ms: int
    deployment: str
    min_replicas: int
    max_replicas: int
    engine: str = "vllm"
    simulated: tuple[tuple[str, Any], ...] = ()
    """Extra fields of the deployment's simulated engines (``adapters.simulated.SimDeploymentConfig``)."""


TENANTS = (
    TenantPlan("gold", 200, 9, 0, 1_000, "chat", ZONE_COUNT, 4 * ZONE_COUNT),
    TenantPlan("silver", 100, 3, 3, 2_000, "embed", ZONE_COUNT, 2 * ZONE_COUNT, "triton",
               (("triton", {"batching": "inflight"}),)),
    TenantPlan("bronze", 50, 3, 9, 3_000, "batch", ZONE_COUNT, 4 * ZONE_COUNT, "deepspeed-mii"),
)
"""One deployment per engine: ``chat`` on vLLM, ``embed`` on Triton (TensorRT-LLM in-flight batching,
the backend Triton serves LLMs with), ``batch`` on DeepSpeed-MII behind its request meter. 18 GPUs:
the quotas take 15, so bronze's borrowing is what gold's burst takes back (preemption)."""
CALM_RPS, BURST_RPS = 1.5, 10.0
"""``chat`` per zone: calm and burst (about 3 replicas per zone at ``target_concurrency`` 4)."""
BATCH_LOW_RPS, BATCH_RPS = 2.0, 9.0
"""``batch`` per zone: it wants about 3 replicas per zone, more than its quota: it borrows."""
EMBED_LOW_RPS, EMBED_RPS = 1.5, 6.0
"""``embed`` per zone: one replica per zone, about two while its own burst lasts."""
EMBED_FROM, EMBED_TO = 0.15, 0.55
BURST_FROM, BURST_TO, BATCH_FROM, BATCH_TO = 0.40, 0.75, 0.08, 0.85
LOAD_OFFSET_S = 100_000.0
"""The backends' schedules are shifted this far into the future (no load while the group starts);
:meth:`DemoBackend.start_load` moves them back to the moment the workload starts."""
DEFAULT_TRACE_ZONE_PEAK = BURST_RPS


# ---------------------------------------------------------------------------------------------
# workload


@dataclass(frozen=True)
class Workload:
    name: str
    schedules: dict[str, list[tuple[float, float]]]
    """Per deployment: ``(at_s, requests/s per zone)`` steps, seconds since the workload started."""

    def rate(self, deployment: str, t_s: float) -> float:
        rate = 0.0
        for at, rps in self.schedules[deployment]:
            if at <= t_s:
                rate = rps
            else:
                break
        return rate


def builtin_workload(duration_s: float) -> Workload:
    d = duration_s
    return Workload("built-in bursty", {
        "chat": [(0.0, CALM_RPS), (BURST_FROM * d, BURST_RPS), (BURST_TO * d, CALM_RPS)],
        "batch": [(0.0, BATCH_LOW_RPS), (BATCH_FROM * d, BATCH_RPS), (BATCH_TO * d, BATCH_LOW_RPS)],
        "embed": [(0.0, EMBED_LOW_RPS), (EMBED_FROM * d, EMBED_RPS), (EMBED_TO * d, EMBED_LOW_RPS)],
    })


def trace_workload(path: str, duration_s: float, zone_peak_rps: float = DEFAULT_TRACE_ZONE_PEAK) -> Workload:
    """``chat`` follows the arrival shape of an Azure trace: the whole trace compressed into
    ``duration_s`` (accelerated by ``trace length / duration``), one step per demo second, scaled so
    the busiest second offers ``zone_peak_rps`` per zone; ``batch`` keeps its built-in schedule."""
    from controlplane.sim.workload import TraceError, read_azure_trace

    try:
        requests = read_azure_trace(path)
    except TraceError as exc:
        raise ControlPlaneError(f"--trace: {exc}") from None
    if len(requests) < 2:
        raise ControlPlaneError(f"--trace: {path}: needs at least two requests")
    span_ms = max(1, requests[-1].arrival_ms - requests[0].arrival_ms)
    bins = max(1, int(duration_s))
    counts = [0] * bins
    for r in requests:
        counts[min(bins - 1, (r.arrival_ms - requests[0].arrival_ms) * bins // (span_ms + 1))] += 1
    peak = max(counts)
    steps = [(float(i), round(max(0.2, c / peak * zone_peak_rps), 3)) for i, c in enumerate(counts)]
    merged = [s for k, s in enumerate(steps) if k == 0 or s[1] != steps[k - 1][1]]
    builtin = builtin_workload(duration_s)
    acceleration = span_ms / 1000 / duration_s
    return Workload(f"trace {Path(path).name} ({len(requests)} requests, {acceleration:.0f}x faster)",
                    {"chat": merged, "batch": builtin.schedules["batch"], "embed": builtin.schedules["embed"]})


# ---------------------------------------------------------------------------------------------
# the simulated clusters (in this process)


class TtftScore:
    """Every finished request's time to first token against its deployment's SLO: the simulated
    backend's ``on_request_done`` callback (called with the backend's lock held)."""

    def __init__(self, slo_ms: dict[str, int]) -> None:
        self.slo_ms = slo_ms
        self._lock = threading.Lock()
        self._met: dict[str, int] = {d: 0 for d in slo_ms}
        self._ttfts: dict[str, list[int]] = {d: [] for d in slo_ms}
        self._recent: dict[str, list[int]] = {d: [] for d in slo_ms}
        """Since the last :meth:`take_recent`: each finished request's TTFT, each drop's wait."""

    def __call__(self, req: Any, now_ms: int) -> None:
        dep = local_name(req.deployment)  # the backend knows the id, "<tenant>/<name>"
        if req.dropped:
            with self._lock:
                self._recent[dep].append(now_ms - req.arrival_ms)  # at least this long without a first token
            return
        ttft = req.first_token_ms - req.arrival_ms
        with self._lock:
            self._ttfts[dep].append(ttft)
            self._recent[dep].append(ttft)
            if ttft <= self.slo_ms[dep]:
                self._met[dep] += 1

    def met(self, deployment: str) -> int:
        with self._lock:
            return self._met.get(deployment, 0)

    def count(self, deployment: str) -> int:
        with self._lock:
            return len(self._ttfts.get(deployment, ()))

    def ttft_lists(self) -> dict[str, list[int]]:
        with self._lock:
            return {d: list(xs) for d, xs in self._ttfts.items()}

    def take_recent(self) -> dict[str, list[int]]:
        with self._lock:
            recent, self._recent = self._recent, {d: [] for d in self.slo_ms}
        return recent


@dataclass
class DemoCluster:
    """One zone's simulated cluster (served in this process) and its TTFT score."""

    backend: SimulatedBackend
    score: TtftScore

    def start_load(self, at_ms: int) -> None:
        """Start the schedule at ``at_ms`` (it was configured ``LOAD_OFFSET_S`` late)."""
        self.backend.restart_load(int(at_ms - LOAD_OFFSET_S * 1000))

    def ttft_lists(self) -> dict[str, list[int]]:
        return self.score.ttft_lists()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {local_name(dep): {"arrived": st["arrived"], "completed": st["completed"], "dropped": st["dropped"],
                                  "met": self.score.met(local_name(dep)), "gpu_ms": st["gpu_ms"],
                                  "ttfts": self.score.count(local_name(dep))}
                for dep, st in self.backend.statistics().items()}


def backend_config(index: int, workload: Workload) -> SimulatedConfig:
    return SimulatedConfig.model_validate({
        "seed": index + 1,
        "deployments": [{
            "deployment": qualified_id(t.tenant, t.deployment), "model": MODEL, "cold_start_ms": COLD_START_MS, "warm_start_ms": WARM_START_MS,
            "max_queue_ms": 10_000, "engine": t.engine, **dict(t.simulated),
            "load": [{"at_s": 0, "rps": 0}] + [{"at_s": LOAD_OFFSET_S + at, "rps": rps}
                                               for at, rps in workload.schedules[t.deployment]],
        } for t in TENANTS],
    })
