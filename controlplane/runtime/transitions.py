"""Observability of instance transitions: one structlog event and one Prometheus counter increment per
transition, emitted by the shell around the pure core (``apply`` returns the records)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from controlplane.domain.instances import Transitioned

TRANSITIONS_METRIC = "controlplane_instance_transitions"


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
        self.count = 0

    def record(self, records: Iterable[Transitioned]) -> None:
        for rec in records:
            self.count += 1
            self._counter.labels(rec.from_state.value, rec.to_state.value, rec.init_method.value).inc()
            self._log.info(
                "instance_transition",
                instance_id=rec.instance_id,
                **{"from": rec.from_state.value, "to": rec.to_state.value},
                trigger=rec.event.value,
                latency_ms=rec.latency_ms,
                init_method=rec.init_method.value,
                at_ms=rec.at_ms,
            )
