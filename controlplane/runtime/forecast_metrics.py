"""Prometheus metrics of forecasting and warm starts (issue 16), fed by the coordinator:

==========================================================  =======================================================
``controlplane_forecast_fallbacks_total{reason}``           forecasts that could not drive a decision: ``history``
                                                            (too little), ``stale``, ``nan``, ``error``
``controlplane_forecast_abs_pct_error`` (histogram)         |expected - actual| / actual of each scored forecast
                                                            (the restart-horizon peak; actual >= 1 replica): the MAPE
                                                            is ``_sum / _count``
``controlplane_scale_ups_total{start}``                     instances that began to serve: ``warm`` (woken from
                                                            Standby) or ``cold`` (a new pod)
``controlplane_warm_pool_fills_total``                      cold-started instances put to sleep within 1 s of Ready
                                                            (warm-pool refills, not scale-ups)
``controlplane_burst_to_capacity_seconds`` (histogram)      from the first tick whose demand exceeds the serving
                                                            replicas by one, to the first tick serving its peak
==========================================================  =======================================================

Warm-pool hit rate = ``warm / (warm + cold - fills)`` (``scale_ups_total`` and ``warm_pool_fills_total``;
docs/forecasting.md has the recording rule). Start latency by tier is
``controlplane_instance_start_seconds`` (:mod:`controlplane.runtime.transitions`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from controlplane.core.scaling import ScaleDecision
from controlplane.core.signals import FilteredSignals
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.instances import InitMethod, InstanceState, Transitioned

APE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
BURST_BUCKETS_S = (0.5, 1.0, 2.0, 3.7, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
FILL_MS = 1_000
"""A cold start put to sleep this soon after Ready refilled the warm pool."""
MAX_TRACKED = 100_000
"""Bound on instances remembered between Ready and their next transition."""


class ForecastMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._fallbacks = Counter("controlplane_forecast_fallbacks", "Forecasts that could not drive a decision.",
                                  ["reason"], registry=registry)
        self._ape = Histogram("controlplane_forecast_abs_pct_error",
                              "Absolute percentage error of each scored restart-horizon forecast.",
                              buckets=APE_BUCKETS, registry=registry)
        self._ups = Counter("controlplane_scale_ups", "Instances that began to serve, by how they started.",
                            ["start"], registry=registry)
        self._fills = Counter("controlplane_warm_pool_fills", "Cold starts put to sleep at once (pool refills).",
                              registry=registry)
        self._burst = Histogram("controlplane_burst_to_capacity_seconds",
                                "From demand exceeding the serving replicas to serving the burst's peak.",
                                buckets=BURST_BUCKETS_S, registry=registry)
        self._ready_at: dict[InstanceId, int] = {}
        self._bursts: dict[DeploymentId, tuple[int, float]] = {}
        """Open bursts: deployment -> (start ms, peak demand so far)."""

    def on_fallback(self, reason: str) -> None:
        self._fallbacks.labels(reason).inc()

    def on_score(self, ape: float) -> None:
        self._ape.observe(ape)

    def transitions(self, records: Iterable[Transitioned]) -> None:
        """Count scale-ups and pool refills from committed transitions."""
        for rec in records:
            if rec.from_state is InstanceState.WARMING and rec.to_state is InstanceState.READY:
                if rec.init_method is InitMethod.COLD:
                    self._ups.labels("cold").inc()
                    if len(self._ready_at) < MAX_TRACKED:
                        self._ready_at[rec.instance_id] = rec.at_ms
                else:
                    self._ups.labels("warm").inc()
                continue
            since = self._ready_at.pop(rec.instance_id, None)
            if since is not None and rec.to_state is InstanceState.STANDBY and rec.at_ms - since <= FILL_MS:
                self._fills.inc()

    def tick(self, decisions: Sequence[tuple[DeploymentId, ScaleDecision]],
             signals: Mapping[DeploymentId, FilteredSignals | None], now_ms: int) -> None:
        """Advance the burst clocks by one acting tick's decisions."""
        open_ = self._bursts
        for did, dec in decisions:
            demand = dec.demand
            sig = signals.get(did)
            if demand is None or sig is None:
                continue
            serving = sig.serving
            burst = open_.get(did)
            if burst is None:
                if demand >= serving + 1:
                    open_[did] = (now_ms, demand)
                continue
            start, peak = burst
            peak = max(peak, demand)
            if serving >= math.ceil(peak - 1e-9):
                self._burst.observe((now_ms - start) / 1000)
                del open_[did]
            elif demand < serving and now_ms - start > 300_000:
                del open_[did]  # it receded without being met for five minutes: abandoned
            else:
                open_[did] = (start, peak)
        if open_:
            live = {did for did, _ in decisions}
            for did in [k for k in open_ if k not in live]:
                del open_[did]  # deleted deployment
