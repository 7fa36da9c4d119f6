"""Forecasts for every deployment, once per history bucket, from the replicated demand history.

:class:`HistoryForecaster` is what the control loop calls before each plan (``forecasts(state,
now_ms)``): it recomputes only when a new bucket has closed, batching equally shaped histories
into one numpy computation (:mod:`controlplane.forecast.model`), and otherwise returns the values of
the last computation. Because its input is the replicated history and nothing else, a new lease
holder computes the same forecasts as the old one (the MAPE score, a measurement, is this process's
own and restarts with it).

A forecast that cannot be trusted is returned with ``usable=False`` and a ``note``, and the
decision is then reactive (as with no forecast): too little history (less than
``min_history_ms`` or fewer than four restart horizons), a history that stopped (the newest bucket
older than ``stale_ms``: the holder that recorded it stopped), a computation that failed or gave a
non-finite value. Each fallback is counted by reason (``on_fallback``) and logged once per reason
change; none of them raises into the tick.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog

from controlplane.domain.demand import BUCKET_MS, WAKE_REACTION_MS, DemandHistory, Forecast
from controlplane.domain.ids import DeploymentId
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment
from controlplane.forecast import horizons
from controlplane.forecast.model import buckets_for, peaks

log = structlog.get_logger("controlplane.forecast")

MAPE_ALPHA = 1.0 / 60
"""Weight of each new scored bucket in the running MAPE (an exponential mean over ~10 minutes)."""


class Forecaster(Protocol):
    """What the control loop reads before each plan: the current forecast per deployment (a
    deployment absent from the mapping has none: reactive)."""

    def forecasts(self, state: ControlState, now_ms: int) -> Mapping[DeploymentId, Forecast]: ...


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    quantile: float = 0.9
    """Share of past start horizons whose peak the capacity would have covered."""
    min_history_ms: int = 600_000
    """Least history before a forecast drives decisions (and at least four restart horizons)."""
    stale_ms: int = 3 * BUCKET_MS
    """A history whose newest bucket is older than this does not drive decisions."""


def _fallback(at_ms: int, note: str, wake_ms: int, restart_ms: int, q: float, n: int) -> Forecast:
    return Forecast(at_ms, 0.0, 0.0, 0.0, wake_ms, restart_ms, q, n, None, False, note)


class HistoryForecaster:
    def __init__(
        self,
        config: ForecastConfig | None = None,
        *,
        horizon_of: Callable[[Deployment], tuple[int, int]] = horizons.of,
        on_fallback: Callable[[str], None] | None = None,
        on_score: Callable[[float], None] | None = None,
    ) -> None:
        """``horizon_of(d)``: ``(wake_ms, restart_ms)`` of a deployment (wake 0: it cannot sleep).
        ``on_fallback(reason)`` is told of every unusable forecast, ``on_score(ape)`` of every
        scored absolute percentage error (the Prometheus metrics)."""
        self.config = config or ForecastConfig()
        self._horizon_of = horizon_of
        self._on_fallback = on_fallback
        self._on_score = on_score
        self._bucket = -1
        self._last: dict[DeploymentId, Forecast] = {}
        self._pending: dict[DeploymentId, list[tuple[int, float]]] = {}
        """Per deployment, forecasts not yet scored: (history end they were made at, expected)."""
        self._mape: dict[DeploymentId, tuple[float, int]] = {}
        self._noted: str = ""
        self.fallbacks: Counter[str] = Counter()
        """Unusable forecasts by reason (``history``, ``stale``, ``nan``, ``error``), this process."""
        self._score_sum = 0.0
        self._scored = 0
        """Sum and count of every scored absolute percentage error (this process)."""

    def forecasts(self, state: ControlState, now_ms: int) -> Mapping[DeploymentId, Forecast]:
        bucket = now_ms // BUCKET_MS
        if bucket != self._bucket:
            self._bucket = bucket
            try:
                self._last = self._compute(state, now_ms)
            except Exception as exc:  # a library error must never block a tick: reactive instead
                self._note(f"forecast failed: {type(exc).__name__}: {exc}")
                self._last = {}
                self._fell_back("error")
        return self._last

    def mape(self, deployment_id: DeploymentId) -> float | None:
        m = self._mape.get(deployment_id)
        return None if m is None else m[0]

    def _note(self, message: str) -> None:
        if message != self._noted:
            self._noted = message
            log.warning("forecast_fallback", reason=message)

    def _compute(self, state: ControlState, now_ms: int) -> dict[DeploymentId, Forecast]:
        cfg = self.config
        out: dict[DeploymentId, Forecast] = {}
        groups: dict[tuple[int, int, int], list[tuple[DeploymentId, DemandHistory, int, int]]] = {}
        for did, d in state.deployments.items():
            wake_ms, restart_ms = self._horizon_of(d)
            h = state.demand.get(did)
            n = h.buckets if h is not None else 0
            k_r = buckets_for(restart_ms, BUCKET_MS)
            if h is None or n * BUCKET_MS < cfg.min_history_ms or n < 4 * k_r + 1:
                out[did] = _fallback(h.end_ms if h else 0, f"too little history ({n} of {max(cfg.min_history_ms // BUCKET_MS, 4 * k_r + 1)} buckets)",
                                     wake_ms, restart_ms, cfg.quantile, n)
                self._fell_back("history")
                continue
            if now_ms - h.end_ms > cfg.stale_ms:
                out[did] = _fallback(h.end_ms, f"history stopped at t={h.end_ms}ms", wake_ms, restart_ms, cfg.quantile, n)
                self._fell_back("stale")
                continue
            k_w = min(k_r, buckets_for(wake_ms + WAKE_REACTION_MS, BUCKET_MS)) if wake_ms > 0 else 0
            groups.setdefault((n, k_w, k_r), []).append((did, h, wake_ms, restart_ms))
        for (n, k_w, k_r), members in groups.items():
            x = np.frombuffer(b"".join(h.data for _, h, _, _ in members), dtype="<u2").reshape(len(members), n) / 10.0
            self._score(members, x, k_r)
            p = peaks(x, max(1, k_w), k_r, cfg.quantile)
            for row, (did, h, wake_ms, restart_ms) in enumerate(members):
                ready, total, expected = float(p.ready[row]), float(p.total[row]), float(p.expected[row])
                if not (math.isfinite(ready) and math.isfinite(total) and math.isfinite(expected)):
                    out[did] = _fallback(h.end_ms, "forecast is not finite", wake_ms, restart_ms, cfg.quantile, n)
                    self._fell_back("nan")
                    continue
                if k_w == 0:  # cannot sleep: everything the restart horizon needs must serve
                    ready = total
                out[did] = Forecast(h.end_ms, ready, total, expected, wake_ms, restart_ms, cfg.quantile, n, self.mape(did))
                pend = self._pending.setdefault(did, [])
                if not pend or pend[-1][0] != h.end_ms:
                    pend.append((h.end_ms, expected))
        for did in [k for k in self._pending if k not in state.deployments]:
            del self._pending[did]
            self._mape.pop(did, None)
        return out

    def summary(self) -> dict[str, object]:
        """What the simulator's JSON reports: MAPE over every scored forecast and per deployment,
        and the fallbacks by reason."""
        return {
            "mape": round(self._score_sum / self._scored, 4) if self._scored else None,
            "scored": self._scored,
            "fallbacks": dict(sorted(self.fallbacks.items())),
            "deployments": {did: {"mape": round(m, 4), "scored": n} for did, (m, n) in sorted(self._mape.items())},
        }

    def _fell_back(self, reason: str) -> None:
        self.fallbacks[reason] += 1
        if self._on_fallback is not None:
            self._on_fallback(reason)

    def _score(self, members: list[tuple[DeploymentId, DemandHistory, int, int]], x: np.ndarray, k_r: int) -> None:
        """Score each pending forecast whose restart horizon has passed against the peak that came."""
        n = x.shape[1]
        for row, (did, h, _, _) in enumerate(members):
            pend = self._pending.get(did)
            if not pend:
                continue
            keep = []
            for made_ms, expected in pend:
                back = (h.end_ms - made_ms) // BUCKET_MS  # buckets recorded since it was made
                if back < k_r:
                    keep.append((made_ms, expected))
                    continue
                if back >= n:
                    continue  # fell out of the history
                start = n - back
                actual = float(x[row, start:start + k_r].max())
                if actual >= 1.0:
                    ape = abs(expected - actual) / actual
                    old = self._mape.get(did)
                    self._mape[did] = (ape, 1) if old is None else (old[0] + MAPE_ALPHA * (ape - old[0]), old[1] + 1)
                    self._score_sum += ape
                    self._scored += 1
                    if self._on_score is not None:
                        self._on_score(ape)
            self._pending[did] = keep
