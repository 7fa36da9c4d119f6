"""The lease holder's side of the demand history: each acting tick's decisions feed the peak of the
current bucket; the first tick of the next bucket hands the closed bucket over as one
``RecordDemand`` command, committed with that tick's plan (:mod:`controlplane.domain.demand`)."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.core.scaling import ScaleDecision
from controlplane.domain import commands as c
from controlplane.domain.demand import BUCKET_MS, to_deci
from controlplane.domain.ids import DeploymentId


class DemandRecorder:
    def __init__(self) -> None:
        self._end = -1
        """End of the bucket being filled (-1: none yet)."""
        self._peaks: dict[DeploymentId, float] = {}

    def observe(self, decisions: Sequence[tuple[DeploymentId, ScaleDecision]], now_ms: int) -> c.RecordDemand | None:
        """Feed one tick's decisions; returns the bucket that closed before ``now_ms``, if one did.
        Only deployments with a demand in that bucket are named, in id order."""
        end = (now_ms // BUCKET_MS + 1) * BUCKET_MS
        closed = None
        if end != self._end:
            if self._peaks and end > self._end:
                closed = c.RecordDemand(self._end, tuple((did, to_deci(v)) for did, v in sorted(self._peaks.items())))
            self._peaks = {}
            self._end = end
        peaks = self._peaks
        for did, dec in decisions:
            v = dec.demand
            if v is not None and v > peaks.get(did, -1.0):
                peaks[did] = v
        return closed
