"""Scale-downs measured against what the control loop knew of the load when it took them.

Every tick, for every deployment, the decision's target is compared with the replicas it started
from (``reconcile.current_replicas`` before the tick) and with the filtered signals it read
(``ControlLoop.signals_of``). Per deployment the simulation's JSON summary then says
(``deployments.<id>.scale_downs``):

* ``taken``: decisions that lowered the target;
* ``load_not_known``: of those, the ones taken while no load signal was known or one was known for
  only some serving instances (``FilteredSignals.known_load`` empty or ``partial`` set): what
  ``core.scaling`` holds (``ScaleReason.UNKNOWN_LOAD``), so 0 is the measured claim "no scale-down
  caused by unknown or missing metrics";
* ``with_unknown_signals``: of those, the ones taken while some load signal was unknown for every
  instance but the others were known (plain Triton's KV use and token rates: the decision then
  rests on the known ones, concurrency for Triton);
* ``held_unknown_load``: decisions whose reason is ``UNKNOWN_LOAD`` (scale-downs the hold stopped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.core import scaling
from controlplane.core.reconcile import current_replicas
from controlplane.domain.ids import DeploymentId
from controlplane.domain.state import ControlState
from controlplane.domain.tenants import Deployment
from controlplane.runtime.loop import ControlLoop, TickReport


class ScaleDownAudit:
    def __init__(self, deployments: Sequence[Deployment]) -> None:
        self._deps = {d.id: d for d in deployments}
        self._counts = {d.id: {"taken": 0, "load_not_known": 0, "with_unknown_signals": 0, "held_unknown_load": 0}
                        for d in deployments}
        self._before: dict[DeploymentId, int] = {}

    def before(self, state: ControlState) -> None:
        """Call before the tick: the replicas each decision starts from."""
        self._before = {did: current_replicas(state, state.deployments.get(did, d)) for did, d in self._deps.items()}

    def after(self, report: TickReport, loop: ControlLoop) -> None:
        if report.plan is None:
            return
        for did, dec in report.plan.decisions:
            counts = self._counts.get(did)
            if counts is None:
                continue
            if dec.reason is scaling.ScaleReason.UNKNOWN_LOAD:
                counts["held_unknown_load"] += 1
            if dec.target >= self._before.get(did, dec.target):
                continue
            counts["taken"] += 1
            sig = loop.signals_of(did)
            if sig is None or not sig.known_load or sig.partial:
                counts["load_not_known"] += 1
            elif sig.unknown:
                counts["with_unknown_signals"] += 1

    def summary(self) -> dict[str, dict[str, Any]]:
        return {str(did): dict(c) for did, c in sorted(self._counts.items())}
