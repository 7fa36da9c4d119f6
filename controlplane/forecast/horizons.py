"""The two start horizons of a deployment's forecast: how long a Standby instance takes to serve
(its wake), and how long a new one does (its restart), from the model profile and the engine's
start tiers (:mod:`controlplane.domain.start_tiers`): the wake of the engine's sleep (vLLM level 1,
Triton's explicit model load), and a restart on node-cached weights (the ``cached`` tier: placement
prefers clusters whose cache holds the model; a ``cold`` start would take longer)."""

from __future__ import annotations

from controlplane.domain.profiles import PROFILES
from controlplane.domain.start_tiers import restart_ms, wake_ms
from controlplane.domain.tenants import Deployment

UNKNOWN_RESTART_MS = 60_000
"""Restart horizon of a model without a profile."""


def of(d: Deployment) -> tuple[int, int]:
    """``(wake_ms, restart_ms)``; wake 0 when the engine cannot sleep."""
    profile = PROFILES.get(d.model)
    if profile is None:
        return (0, UNKNOWN_RESTART_MS)
    return (wake_ms(profile, d.engine) or 0, restart_ms(profile, cached=True))
