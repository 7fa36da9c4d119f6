"""What ``controlplane demo`` observes of the group: its view of each coordinator and deployment,
the failover's timeline, the breakers reconstructed from the watch, and the ``Scaling.Watch``
thread (:mod:`controlplane.cli.demo` polls and reads them, :mod:`controlplane.cli.demo_view` shows them)."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controlplane.cli.demo_view import MAX_EVENTS, EventRow

@dataclass
class DeploymentView:
    name: str
    tenant: str
    desired: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    by_zone_state: dict[str, dict[str, int]] = field(default_factory=dict)
    preempted_ids: set[str] = field(default_factory=set)
    peak_serving: int = 0
    peak_desired: int = 0
    decisions: int = 0


@dataclass
class Failover:
    killed: str = ""
    killed_epoch: int = 0
    killed_at_s: float | None = None
    killed_mono: float = 0.0
    new_holder: str = ""
    new_epoch: int = 0
    failover_ms: float | None = None
    new_at_s: float | None = None
    restarted_at_s: float | None = None
    rejoined_at_s: float | None = None


class BreakerMirror:
    """Breaker phases derived from watched instance events, fed exactly as the lease holder feeds
    them (``warmed`` closes, ``warmup_failed`` counts against the deployment on that cluster,
    ``lost`` against the cluster). The API does not expose the replicated breaker records, so this is
    a reconstruction: the phases match, the jittered open periods do not."""

    def __init__(self, clusters: list[str]) -> None:
        from controlplane.domain.records import CLOSED_BREAKER

        self.records: dict[str, Any] = {f"cluster {c}": CLOSED_BREAKER for c in clusters}
        self.failures: dict[str, int] = {k: 0 for k in self.records}
        self._rng = random.Random(0)

    def feed(self, cluster: str, deployment: str, event: str, at_ms: int) -> None:
        from controlplane.core import breaker as br
        from controlplane.domain.records import CLOSED_BREAKER

        ckey, dkey = f"cluster {cluster}", f"{deployment}@{cluster}"
        for key in (ckey, dkey):
            self.records.setdefault(key, CLOSED_BREAKER)
            self.failures.setdefault(key, 0)
        if event == "warmed":
            for key in (ckey, dkey):
                self.records[key] = br.on_success(self.records[key], at_ms)
        elif event in ("warmup_failed", "lost"):
            key = dkey if event == "warmup_failed" else ckey
            self.failures[key] += 1
            self.records[key] = br.on_failure(self.records[key], at_ms, br.DEFAULT_CONFIG, self._rng)

    def phases(self) -> dict[str, str]:
        return {k: r.phase.value for k, r in sorted(self.records.items()) if k.startswith("cluster") or self.failures[k]}


class Watcher(threading.Thread):
    """``Scaling.Watch`` (instances and decisions) on its own client; resumes across the kill."""

    def __init__(self, client_factory, mirror: BreakerMirror, t0: list[float]) -> None:
        super().__init__(name="demo-watch", daemon=True)
        self._factory = client_factory
        self.mirror = mirror
        self.lock = threading.Lock()
        self.recent: deque[EventRow] = deque(maxlen=MAX_EVENTS)
        self.transitions = 0
        self.decisions: list[tuple[float, str, int, str]] = []
        self.notices: list[str] = []
        self.stopping = threading.Event()
        self._t0 = t0

    def _rel(self) -> float:
        return time.monotonic() - self._t0[0] if self._t0[0] else 0.0

    def run(self) -> None:
        from controlplane.api.v1 import api_pb2

        class _Stop(Exception):
            pass

        def backoff(_round: int) -> None:
            if self.stopping.wait(0.3):
                raise _Stop

        client = self._factory()
        try:
            for ev in client.watch(api_pb2.WatchRequest(kinds=["Instance", "Decision"], all=True), max_rounds=10_000,
                                   backoff=backoff):
                if self.stopping.is_set():
                    return
                if not hasattr(ev, "type"):  # a Notice: the stream moved to another node
                    with self.lock:
                        self.notices.append(ev.message)
                        self.recent.append(EventRow(round(self._rel(), 1), "watch", "moved", ev.message))
                    continue
                with self.lock:
                    if ev.type == "TRANSITION":
                        self.transitions += 1
                        self.mirror.feed(ev.cluster, ev.deployment, ev.event, ev.at_ms)
                        if ev.event in ("create", "warmed", "drain", "warmup_failed", "lost"):
                            self.recent.append(EventRow(round(self._rel(), 1), ev.deployment, ev.name,
                                                        f"{ev.event} -> {ev.to_state.lower()} in {ev.zone}"))
                    elif ev.type == "DECIDED":
                        self.decisions.append((self._rel(), ev.deployment, ev.replicas, ev.reason))
                        self.recent.append(EventRow(round(self._rel(), 1), ev.deployment,
                                                    f"decided {ev.replicas}", ev.reason))
        except _Stop:
            return
        except Exception as exc:  # noqa: BLE001 - the watch is a view; the demo goes on without it
            if not self.stopping.is_set():
                with self.lock:
                    self.notices.append(f"watch ended: {exc}")
        finally:
            client.close()
