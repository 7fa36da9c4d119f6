"""NVIDIA Dynamo's planner (PyPI ``ai-dynamo==1.6.1``) as a baseline policy of the simulator.

:class:`DynamoPolicy` drives Dynamo's own planner code, not a port of it, through Dynamo's own
offline adapter, ``dynamo.planner.offline.replay_adapter.ReplayPlannerAdapter`` (the scaling
policy Dynamo's trace replay plugs into its mocker): every planner tick the simulator's state goes
in as the snapshot that replay hands it (worker counts, per-engine forward-pass metrics, the
frontend's traffic window) and the replica target comes back. Dynamo's tick scheduling, its
builtin PREDICT (the ARIMA load predictor) and PROPOSE plugins, the throughput and load scaling
math, the GPU-budget guard and the engine-query layer that turns a forward-pass model into TTFT,
ITL and per-engine capacity are all Dynamo's. What this module supplies is the forward-pass
model, the "pre-deployment profile", derived from the simulator's own
:class:`~controlplane.domain.profiles.ModelProfile` (:mod:`controlplane.sim.dynamo_profile`),
because Dynamo's source of it (AISimulate) is not installable. ``docs/baselines-dynamo.md`` says
which configuration is used and why.

* ``dynamo-throughput``: SLA mode (``optimization_target="sla"``), aggregated (``mode="agg"``),
  throughput-based scaling every 180 s with the ARIMA predictor, load-based scaling off (Dynamo's
  defaults ``enable_throughput_scaling=True``, ``enable_load_scaling=False``).
* ``dynamo-load``: SLA mode, aggregated, load-based scaling every 5 s (sensitivity 80 %, 5
  observations minimum), throughput-based scaling off.

In both: ``ttft_ms`` = the tenant's TTFT SLO, ``itl_ms`` = Dynamo's default 50 ms (our tenants set
no ITL objective), ``max_gpu_budget`` = the caller's GPU budget for the deployment (at most
``max_replicas x gpus_per_instance``, so every target is reachable), ``min_endpoint`` =
``max(1, min_replicas)`` (Dynamo's default is 1 and it never scales an aggregated deployment to
zero), Dynamo's wall-clock deadlines lifted (:data:`WALL_DEADLINE_S`), every other setting
Dynamo's default.

Dynamo is a bench-only dependency (``make bench-deps`` installs it into ``.venv-bench``);
:func:`dynamo_available` says whether it can be imported here and, when not, why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.domain.ids import DeploymentId
from controlplane.domain.instances import InstanceState
from controlplane.domain.profiles import PROFILES, ModelProfile
from controlplane.domain.tenants import Deployment
from controlplane.sim.baselines import PolicyView
from controlplane.sim.dynamo_profile import MAX_NUM_BATCHED_TOKENS, forward_pass_ms, install_sdk_stand_in
from controlplane.sim.traffic import EngineLoad, TrafficWindow, merge_windows

DYNAMO_VERSION = "1.6.1"
MODES = ("throughput", "load")
DEFAULT_ITL_MS = 50.0
"""Dynamo's default ITL target (``SLAPlannerDefaults.itl_ms``): our tenants have no ITL objective."""
WALL_DEADLINE_S = 86_400.0
"""Dynamo's orchestrator bounds each plugin call (5 s) and each tick (30 s) in wall-clock time; in
a simulation the planner's thinking time is not the simulated fleet's time, and a deadline that a
busy machine misses (an ARIMA fit in the PREDICT plugin) would change decisions from run to run.
Both are lifted to a day so that results depend only on the seed."""
CONTEXT_LENGTH = 32_768
"""The engines' advertised context length (a capability Dynamo reads; only its easy mode uses it)."""
_NON_DRAINING = (InstanceState.PENDING, InstanceState.WARMING, InstanceState.READY, InstanceState.BUSY)
"""Pods that will serve (what Dynamo's replay calls non-draining workers)."""


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    """Dynamo's modules call ``configure_dynamo_logging()`` on import, which replaces the root
    logger's handlers with its Rust bridge; keep ours, and keep Dynamo's per-tick INFO logs quiet."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("dynamo").setLevel(logging.ERROR)


def _dynamo() -> Any:
    """Import the pieces of Dynamo this adapter drives (raises ImportError when not installed)."""
    install_sdk_stand_in()
    with _root_logging_kept():
        from dynamo.planner.config.planner_config import PlannerConfig
        from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities
        from dynamo.planner.offline import replay_adapter
    return PlannerConfig, EngineCapabilities, WorkerCapabilities, replay_adapter


def dynamo_available() -> str | None:
    """None when Dynamo's planner can be driven here, else the reason (for a skip message)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("ai-dynamo")
        except PackageNotFoundError:
            return (f"ai-dynamo=={DYNAMO_VERSION} is not installed in this environment "
                    "(`make bench-deps` installs it into .venv-bench; docs/baselines-dynamo.md)")
        if found != DYNAMO_VERSION:
            return f"ai-dynamo {found} is installed; this adapter drives {DYNAMO_VERSION}"
        _dynamo()
    except ImportError as exc:
        return f"ai-dynamo=={DYNAMO_VERSION} cannot be imported: {exc}"
    return None


def planner_settings(mode: str, d: Deployment, *, gpu_budget: int, ttft_ms: float,
                     itl_ms: float = DEFAULT_ITL_MS) -> dict[str, Any]:
    """The ``PlannerConfig`` fields this adapter sets for one deployment (the rest are Dynamo's defaults)."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if gpu_budget < d.gpus_per_instance:
        raise ValueError(f"gpu budget of {d.id}: {gpu_budget} GPUs is less than one instance "
                         f"({d.gpus_per_instance} GPUs)")
    if ttft_ms <= 0:
        raise ValueError(f"ttft_ms of {d.id}: must be > 0, got {ttft_ms}")
    return {
        "mode": "agg",
        "optimization_target": "sla",
        "environment": "virtual",
        "backend": "vllm",
        "model_name": d.model,
        "ttft_ms": float(ttft_ms),
        "itl_ms": float(itl_ms),
        "max_gpu_budget": min(gpu_budget, d.max_replicas * d.gpus_per_instance),
        "min_endpoint": max(1, d.min_replicas),
        "decode_engine_num_gpu": d.gpus_per_instance,
        "enable_throughput_scaling": mode == "throughput",
        "enable_load_scaling": mode == "load",
        "scheduling": {"tick_max_duration_seconds": WALL_DEADLINE_S},
        "plugin_registration": {"transport": {"request_timeout_seconds": WALL_DEADLINE_S}},
    }


def engine_capabilities(profile: ModelProfile) -> dict[str, int]:
    """What a vLLM worker of ``profile`` publishes to the planner (``EngineCapabilities`` fields)."""
    return {
        "num_gpu": profile.gpus_per_instance,
        "gpu_cost_per_replica": profile.gpus_per_instance,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_num_seqs": profile.max_num_seqs,
        "max_kv_tokens": profile.kv_capacity_tokens,
        "context_length": CONTEXT_LENGTH,
    }


def fpm_snapshot(profile: ModelProfile, e: EngineLoad) -> dict[str, Any]:
    """One engine's forward-pass metrics, in the dict form Dynamo's replay passes its adapter."""
    return {
        "worker_id": str(e.id), "dp_rank": 0,
        "wall_time": forward_pass_ms(profile, 0, e.decoding) / 1000.0,
        "num_prefill_requests": 0, "sum_prefill_tokens": 0, "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": 0,
        "num_decode_requests": e.decoding, "sum_decode_kv_tokens": e.decoding_kv_tokens,
        "var_decode_kv_tokens": 0.0,
        "num_queued_prefill": e.waiting_prefill, "sum_queued_prefill_tokens": e.waiting_prefill_tokens,
        "var_queued_prefill_length": 0.0,
        "num_queued_decode": 0, "sum_queued_decode_kv_tokens": 0, "var_queued_decode_kv_tokens": 0.0,
    }


def traffic_stats(w: TrafficWindow) -> dict[str, Any]:
    """A traffic window in the form of the replay's per-tick ``TrafficStats``."""
    return {
        "duration_s": w.duration_ms / 1000.0, "num_req": float(w.arrived),
        "shape_count": float(w.completed), "avg_isl": w.mean_prompt_tokens, "avg_osl": w.mean_output_tokens,
        "ttft_count": float(w.completed), "avg_ttft_ms": w.mean_ttft_ms or 0.0,
        "itl_count": float(w.itl_samples), "avg_itl_ms": w.mean_itl_ms or 0.0,
        "hit_rate_count": 0.0, "avg_kv_hit_rate": 0.0, "accept_length_forward_count": 0.0,
        "avg_accept_length": None,
    }


@dataclass(frozen=True, slots=True)
class Decision:
    at_ms: int
    current: int
    target: int | None


class _DeploymentPlanner:
    """One Dynamo planner (one ReplayPlannerAdapter) for one deployment."""

    def __init__(self, settings: dict[str, Any], profile: ModelProfile) -> None:
        planner_config, engine_caps, worker_caps, replay = _dynamo()
        self.profile = profile
        with _root_logging_kept():
            try:
                config = planner_config(**settings)
            except ValueError as exc:  # pydantic's ValidationError names the field
                raise ValueError(f"Dynamo PlannerConfig for model {profile.name}: {exc}") from None
            caps = worker_caps(decode=engine_caps(**engine_capabilities(profile)))
            self._adapter = replay.create_replay_planner_adapter(config, caps, capture_details=False)
            self.next_tick_ms: int | None = int(self._adapter.initial_tick_ms())
        self._ordinal = 0
        self._pending: TrafficWindow | None = None

    def observe(self, window: TrafficWindow | None) -> None:
        if window is not None:
            self._pending = window if self._pending is None else merge_windows(self._pending, window)

    def tick(self, view: PolicyView, engines: tuple[EngineLoad, ...], now_ms: int) -> int | None:
        serving = list(engines)
        non_draining = sum(1 for p in view.pods if p.state in _NON_DRAINING)
        result = {
            "tick_ordinal": self._ordinal,
            "active_prefill_count": 0, "active_prefill_ids": [],
            "active_decode_count": len(serving), "non_draining_decode_count": non_draining,
            "active_decode_ids": [str(e.id) for e in serving],
            "decode_fpm_snapshots": [fpm_snapshot(self.profile, e) for e in serving],
            "traffic": None if self._pending is None else traffic_stats(self._pending),
        }
        self._ordinal += 1
        self._pending = None
        decision = self._adapter.on_tick(result)
        nxt = decision["next_tick_ms"]
        self.next_tick_ms = None if nxt is None else int(nxt)
        return decision["target_decode"]

    def close(self) -> None:
        self._adapter.close()


class DynamoPolicy:
    """NVIDIA Dynamo's planner, aggregated mode, as a :class:`~controlplane.sim.baselines.ReplicaPolicy`.

    ``gpu_budgets``: each deployment's ``max_gpu_budget`` (for the fleet, its tenant's quota in the
    deployment's pool); ``ttft_ms``: each deployment's TTFT target (its tenant's TTFT SLO);
    ``settings``: other ``PlannerConfig`` fields to set (none by default: Dynamo's defaults), e.g.
    ``{"load_scaling_down_sensitivity": 100}``. Call :meth:`close` when done (each planner owns an
    asyncio event loop).
    """

    wants_traffic = True
    """Asks the simulator to fill :attr:`PolicyView.traffic`."""

    def __init__(self, mode: Literal["throughput", "load"], gpu_budgets: Mapping[DeploymentId, int],
                 ttft_ms: Mapping[DeploymentId, float], *, itl_ms: float = DEFAULT_ITL_MS,
                 initial: Mapping[DeploymentId, int] | None = None,
                 settings: Mapping[str, Any] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        reason = dynamo_available()
        if reason is not None:
            raise RuntimeError(reason)
        self.mode = mode
        self.name = f"dynamo-{mode}"
        self._budgets = dict(gpu_budgets)
        self._ttft = dict(ttft_ms)
        self._itl_ms = itl_ms
        self._initial = dict(initial or {})
        self._settings = dict(settings or {})
        self._planners: dict[DeploymentId, _DeploymentPlanner] = {}
        self.decisions: dict[DeploymentId, list[Decision]] = {}

    def initial_replicas(self, d: Deployment) -> int:
        return self._initial.get(d.id, max(1, d.min_replicas))

    def _planner(self, d: Deployment) -> _DeploymentPlanner:
        planner = self._planners.get(d.id)
        if planner is None:
            for name, table in (("gpu_budgets", self._budgets), ("ttft_ms", self._ttft)):
                if d.id not in table:
                    raise ValueError(f"{name}: no entry for deployment {d.id}")
            settings = planner_settings(self.mode, d, gpu_budget=self._budgets[d.id], ttft_ms=self._ttft[d.id],
                                        itl_ms=self._itl_ms) | self._settings
            planner = self._planners[d.id] = _DeploymentPlanner(settings, PROFILES[d.model])
        return planner

    def target(self, d: Deployment, view: PolicyView, now_ms: int) -> int:
        planner = self._planner(d)
        planner.observe(view.traffic)
        if planner.next_tick_ms is None or now_ms < planner.next_tick_ms:
            return view.current
        engines = view.traffic.engines if view.traffic is not None else ()
        with _root_logging_kept():
            want = planner.tick(view, engines, now_ms)
        self.decisions.setdefault(d.id, []).append(Decision(now_ms, view.current, want))
        return view.current if want is None else want

    def close(self) -> None:
        for planner in self._planners.values():
            planner.close()
        self._planners.clear()


def policy_for(mode: Literal["throughput", "load"], scenario, gpu_budgets: Mapping[DeploymentId, int],
               **kwargs: Any) -> DynamoPolicy:
    """A :class:`DynamoPolicy` whose TTFT targets are the scenario's tenants' TTFT SLOs."""
    slo = {t.id: t.slo.ttft_p99_ms for t in scenario.tenants}
    return DynamoPolicy(mode, gpu_budgets, {d.id: float(slo[d.tenant]) for d in scenario.deployments}, **kwargs)
