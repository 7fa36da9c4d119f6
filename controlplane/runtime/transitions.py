"""Observability of instance transitions: one structlog event and one Prometheus counter increment per
transition, emitted by the shell around the pure core (``apply`` returns the records), and the start
latency of every start by its tier (``controlplane_instance_start_seconds{tier}``: the time from the
start transition, ``Pending -> Warming`` or ``Standby -> Warming``, to ``Ready``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from controlplane.domain.instances import InstanceState, Transitioned

TRANSITIONS_METRIC = "controlplane_instance_transitions"
START_METRIC = "controlplane_instance_start_seconds"
START_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
"""From a level-1 wake (0.1-6 s) to a remote cold start of a 70B model (~270 s)."""


class TransitionRecorder:
    """Records :class:`Transitioned` values. The registry is injected so tests and simulations each
    count in their own registry."""

    def __init__(self, registry: CollectorRegistry, logger: Any | None = None) -> None:
        self._log = logger if logger is not None else structlog.get_logger("controlplane.instances")
        self._counter = Counter(
            TRANSITIONS_METRIC,
            "Instance lifecycle transitions.",
            labelnames=("from_state", "to_state", "init_method"),
            registry=registry,
        )
        self._starts = Histogram(
            START_METRIC,
            "Start latency of instances, start transition to Ready, by start tier.",
            labelnames=("tier",),
            buckets=START_BUCKETS_S,
            registry=registry,
        )
        self.count = 0

    def record(self, records: Iterable[Transitioned]) -> None:
        for rec in records:
            self.count += 1
            self._counter.labels(rec.from_state.value, rec.to_state.value, rec.init_method.value).inc()
            if rec.from_state is InstanceState.WARMING and rec.to_state is InstanceState.READY:
                self._starts.labels(rec.init_method.value).observe(rec.latency_ms / 1000)
            self._log.info(
                "instance_transition",
                instance_id=rec.instance_id,
                **{"from": rec.from_state.value, "to": rec.to_state.value},
                trigger=rec.event.value,
                latency_ms=rec.latency_ms,
                init_method=rec.init_method.value,
                at_ms=rec.at_ms,
            )
