"""Per-deployment traffic windows and engine load snapshots for policies that need them.

Some baselines (NVIDIA Dynamo's planner, :mod:`controlplane.sim.dynamo`) scale on the traffic a
frontend measures (requests, mean input/output lengths, TTFT/ITL) and on per-engine forward-pass
load, not on per-pod concurrency. :class:`TrafficMeter` accumulates what the simulated gateway and
engines see between two policy calls; :func:`engine_loads` reads one deployment's serving engines.
Both only observe: they draw no random numbers and change nothing, so a simulation's result is the
same with or without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.domain.ids import DeploymentId, InstanceId


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One serving engine at one instant, in the terms of a forward-pass metrics snapshot."""

    id: InstanceId
    decoding: int
    """Admitted requests past their first token (the decode batch)."""
    decoding_kv_tokens: int
    """KV tokens the decode batch holds now (prompt + tokens generated so far)."""
    waiting_prefill: int
    """Requests whose prefill has not finished: queued in the engine or admitted behind the prefill."""
    waiting_prefill_tokens: int
    """Prompt tokens still to prefill (the queue's prompts + the unfinished part of admitted ones)."""


@dataclass(frozen=True, slots=True)
class TrafficWindow:
    """What one deployment's frontend saw since the previous policy call."""

    duration_ms: int
    arrived: int
    completed: int
    """Requests that got their last token (not dropped) in the window."""
    mean_prompt_tokens: float
    """Mean input length (ISL) of the completed requests; 0 when none completed."""
    mean_output_tokens: float
    """Mean output length (OSL) of the completed requests; 0 when none completed."""
    mean_ttft_ms: float | None
    mean_itl_ms: float | None
    """Mean inter-token latency of completed requests with more than one output token."""
    itl_samples: int
    engines: tuple[EngineLoad, ...] = ()


@dataclass(slots=True)
class _Acc:
    since_ms: int = 0
    arrived: int = 0
    completed: int = 0
    prompt: int = 0
    output: int = 0
    ttft_ms: int = 0
    itl_ms: float = 0.0
    itl_n: int = 0


class TrafficMeter:
    """Accumulates arrivals and completions per deployment; :meth:`take` drains one window."""

    def __init__(self, deployments: Iterable[DeploymentId]) -> None:
        self._acc: dict[DeploymentId, _Acc] = {d: _Acc() for d in deployments}

    def arrival(self, req) -> None:
        self._acc.setdefault(req.deployment, _Acc()).arrived += 1

    def done(self, req, now_ms: int) -> None:
        if req.dropped or req.first_token_ms < 0:
            return
        acc = self._acc.setdefault(req.deployment, _Acc())
        acc.completed += 1
        acc.prompt += req.prompt
        acc.output += req.output
        acc.ttft_ms += req.first_token_ms - req.arrival_ms
        if req.output > 1:
            acc.itl_ms += (now_ms - req.first_token_ms) / (req.output - 1)
            acc.itl_n += 1

    def take(self, deployment: DeploymentId, now_ms: int, engines: tuple[EngineLoad, ...] = ()) -> TrafficWindow:
        acc = self._acc.setdefault(deployment, _Acc())
        n = acc.completed
        window = TrafficWindow(
            duration_ms=max(0, now_ms - acc.since_ms),
            arrived=acc.arrived,
            completed=n,
            mean_prompt_tokens=acc.prompt / n if n else 0.0,
            mean_output_tokens=acc.output / n if n else 0.0,
            mean_ttft_ms=acc.ttft_ms / n if n else None,
            mean_itl_ms=acc.itl_ms / acc.itl_n if acc.itl_n else None,
            itl_samples=acc.itl_n,
            engines=engines,
        )
        self._acc[deployment] = _Acc(since_ms=now_ms)
        return window


def merge_windows(a: TrafficWindow, b: TrafficWindow) -> TrafficWindow:
    """Two consecutive windows as one (means weighted by their sample counts; ``b``'s engines)."""
    n = a.completed + b.completed

    def mean(x: float | None, nx: int, y: float | None, ny: int) -> float | None:
        total = (x or 0.0) * nx + (y or 0.0) * ny
        return total / (nx + ny) if nx + ny else None

    return TrafficWindow(
        duration_ms=a.duration_ms + b.duration_ms,
        arrived=a.arrived + b.arrived,
        completed=n,
        mean_prompt_tokens=mean(a.mean_prompt_tokens, a.completed, b.mean_prompt_tokens, b.completed) or 0.0,
        mean_output_tokens=mean(a.mean_output_tokens, a.completed, b.mean_output_tokens, b.completed) or 0.0,
        mean_ttft_ms=mean(a.mean_ttft_ms, a.completed, b.mean_ttft_ms, b.completed),
        mean_itl_ms=mean(a.mean_itl_ms, a.itl_samples, b.mean_itl_ms, b.itl_samples),
        itl_samples=a.itl_samples + b.itl_samples,
        engines=b.engines,
    )


def engine_loads(instances: Iterable, now_ms: int) -> tuple[EngineLoad, ...]:
    """Snapshots of the serving engines among ``instances`` (:class:`~controlplane.sim.cluster.SimInstance`)."""
    out = []
    for sim in sorted(instances, key=lambda s: s.id):
        if sim.phase != "serving":
            continue
        p = sim.profile
        step = p.step_ms(len(sim.running))
        decoding = kv = prefilling = 0
        for req in sim.running.values():
            if 0 <= req.first_token_ms <= now_ms:
                decoding += 1
                kv += req.prompt + min(req.output, 1 + int((now_ms - req.first_token_ms) / step))
            else:
                prefilling += 1
        backlog_ms = max(0.0, sim.prefill_free_ms - now_ms)
        out.append(EngineLoad(
            id=sim.id,
            decoding=decoding,
            decoding_kv_tokens=kv,
            waiting_prefill=prefilling + len(sim.queue),
            waiting_prefill_tokens=int(backlog_ms * p.prefill_tokens_per_s / 1000.0) + sum(r.prompt for r in sim.queue),
        ))
    return tuple(out)
