"""The two start horizons of a deployment's forecast: how long a Standby instance takes to serve
(its wake), and how long a new one does (its restart), from the model profile and the engine."""

from __future__ import annotations

from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment

UNKNOWN_RESTART_MS = 60_000
"""Restart horizon of a model without a profile."""


def of(d: Deployment) -> tuple[int, int]:
    """``(wake_ms, restart_ms)``; wake 0 when the engine cannot sleep."""
    profile = PROFILES.get(d.model)
    if profile is None:
        return (0, UNKNOWN_RESTART_MS)
    wake = profile.warm_start_ms if d.engine.can_sleep else 0
    return (wake, profile.cold_start_ms)
