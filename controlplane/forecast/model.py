"""The forecast model: peak demand within a start horizon, as an empirical quantile (numpy).

For one deployment, ``x`` is its demand history (:mod:`controlplane.domain.demand`: the peak demand
of each 10 s bucket, oldest first). For a horizon of ``k`` buckets, ``F_k[i] = max(x[i+1 .. i+k])``
is the peak that followed bucket ``i`` within the horizon. The forecast of the peak within the next
``k`` buckets is::

    peak_k = max(Q_p(F_k), x[-1]) + max(0, slope) * k       (replicas)

* ``Q_p(F_k)``: the ``p`` quantile of the horizon peaks over the history (the last hour). It learns
  the burst statistics: how large the peak within one horizon is, how often. A series that bursts
  every few minutes keeps what a burst needs; one that has been quiet for an hour keeps nothing.
* ``x[-1]``: never less than what the newest bucket needed.
* ``slope``: least-squares trend of the newest :data:`TREND_BUCKETS` buckets (replicas per bucket),
  only upwards: a rising load is met one horizon ahead; a falling one is left to the scale-down rules.

Two horizons per deployment: the *wake* horizon (a Standby instance's wake plus one reaction) gives
``Forecast.ready``, the *restart* horizon (a new instance's start) gives ``Forecast.total``; the
median (``p = 0.5``) over the restart horizon is ``Forecast.expected``, the point forecast MAPE
scores.

Why not ARIMA, Holt-Winters or Prophet (what Dynamo's planner uses, through pmdarima, filterpy and
prophet): those forecast the conditional *mean* of the next interval. Capacity must cover the *peak*
within a start horizon, and on bursty LLM traffic (the Azure code trace: 10-60 s bursts at random
minutes) the mean forecast smooths every burst away (Dynamo's ARIMA planner reaches 57 % SLO
attainment on the fleet benchmark). An empirical quantile of horizon peaks is distribution-free,
needs no fit that can fail to converge, and is a few vectorised numpy operations for 10,000
deployments at once (sliding-window maxima, ``numpy.quantile``, a closed-form least-squares slope).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

TREND_BUCKETS = 30
"""Buckets (5 min at 10 s) the trend is fitted on."""


@dataclass(frozen=True, slots=True)
class Peaks:
    """Per row of a batch: the forecast peaks over the wake and restart horizons, and the median."""

    ready: np.ndarray
    total: np.ndarray
    expected: np.ndarray


def horizon_peaks(x: np.ndarray, k: int) -> np.ndarray:
    """``F_k`` for each row of ``x`` (shape ``(n, L)``): shape ``(n, L - k)``, ``F_k[:, i] =
    max(x[:, i+1 : i+k+1])``. Requires ``L > k >= 1``."""
    return sliding_window_view(x[:, 1:], k, axis=1).max(axis=2)


def slopes(x: np.ndarray, n: int = TREND_BUCKETS) -> np.ndarray:
    """Least-squares slope (replicas per bucket) of each row's newest ``n`` buckets (all when fewer)."""
    tail = x[:, -n:]
    m = tail.shape[1]
    if m < 2:
        return np.zeros(x.shape[0])
    t = np.arange(m, dtype=np.float64) - (m - 1) / 2.0
    return (tail @ t) / float(t @ t)  # type: ignore[no-any-return]


def peaks(x: np.ndarray, k_wake: int, k_restart: int, quantile: float) -> Peaks:
    """The forecast peaks of a batch of equally long histories (module doc). ``x``: shape
    ``(n, L)`` in replicas with ``L > k_restart >= k_wake >= 1``."""
    now = x[:, -1]
    rise = np.maximum(slopes(x), 0.0)
    f_wake = horizon_peaks(x, k_wake)
    f_restart = horizon_peaks(x, k_restart)
    ready = np.maximum(np.quantile(f_wake, quantile, axis=1), now) + rise * k_wake
    q_total, q_median = np.quantile(f_restart, [quantile, 0.5], axis=1)
    total = np.maximum(q_total, now) + rise * k_restart
    expected = np.maximum(q_median, now) + rise * k_restart
    return Peaks(ready, np.maximum(total, ready), expected)


def buckets_for(ms: int, bucket_ms: int) -> int:
    """Whole buckets that cover ``ms`` (at least 1)."""
    return max(1, math.ceil(ms / bucket_ms))
