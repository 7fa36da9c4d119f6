"""The inference engines and what each can do: the one table the planner and the adapter both read.

:class:`Engine` names an engine; :data:`CAPABILITIES` says, per engine, which warm path it offers,
which load signals its own metrics supply, and which scaling targets it defaults to
(``shared/design/CONTRACTS.md``):

=================  ===========================  ===============================  =======================
engine             warm path                    load its metrics report          default targets
=================  ===========================  ===============================  =======================
vLLM               sleep level 1 and 2          running, waiting, KV use, token  the policy defaults
                   (``/sleep``, ``/wake_up``)   rates, TTFT and queue-time
                                                histograms
Triton             explicit model unload/load   pending (waiting), running by    queue p95 120 ms
                                                Little's law, queue time; KV and
                                                tokens only from TensorRT-LLM
DeepSpeed-MII      none (restart from the       nothing: no metrics endpoint.    token utilisation 0.85
                   node cache)                  Its load is measured where the
                                                requests pass (the meter,
                                                ``adapters/mii_meter.py``)
=================  ===========================  ===============================  =======================

A load field a sample cannot supply is named in ``InstanceSample.unknown``; an unknown signal never
drives a scale-down (``controlplane.core.scaling``). Adding an engine is one entry here, one driver
module and its registry entry in ``adapters/engines.py``, its fake and its contract tests.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Engine(enum.Enum):
    VLLM = "vllm"
    TRITON = "triton"
    DEEPSPEED_MII = "deepspeed-mii"

    @property
    def capabilities(self) -> EngineCapabilities:
        return CAPABILITIES[self]

    @property
    def can_sleep(self) -> bool:
        """vLLM sleeps (``/sleep``) and Triton unloads its model (explicit model control); DeepSpeed-MII
        has neither (CONTRACTS.md), so it gets no Standby instances: its warm path is a restart."""
        return CAPABILITIES[self].warm_path


LOAD_FIELDS = ("running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s")
"""The :class:`~controlplane.domain.observations.InstanceSample` load fields an engine may be unable
to report (named in ``InstanceSample.unknown``)."""


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    sleep_levels: tuple[int, ...]
    """vLLM sleep levels the engine offers (empty: no sleep mode)."""
    model_unload: bool
    """The engine unloads and reloads its model in a live server (Triton explicit model control)."""
    metrics_endpoint: bool
    """The engine serves Prometheus metrics of its own."""
    reports: frozenset[str]
    """The :data:`LOAD_FIELDS` the engine's own metrics always supply."""
    queue_time: bool
    """Its metrics separate time queued from time computing."""
    policy_defaults: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """``ScalingPolicy`` fields this engine defaults to differently from the product defaults; a
    deployment's own setting overrides them (``controlplane.specs.deployment_of``)."""

    @property
    def warm_path(self) -> bool:
        """A sleeping (Standby) instance of this engine can be woken without a new pod."""
        return bool(self.sleep_levels) or self.model_unload


TRITON_QUEUE_P95_TARGET_MS = 120.0
"""Triton's default queue-time target: the p95 of time requests wait in Triton's scheduler queue
that one replica should stay under (the seeds' figure); above it, queueing asks for replicas."""
MII_TOKEN_UTILIZATION = 0.85
"""DeepSpeed-MII's default token-utilisation target: a replica should run at no more than 85 % of
the profile's token throughput (the seeds' "tokens/s >= 85 % of the SLO throughput"). Lower than
the 0.9 default because MII's load is metered outside the engine (no queue or KV signal backs it)."""

CAPABILITIES: Mapping[Engine, EngineCapabilities] = MappingProxyType({
    Engine.VLLM: EngineCapabilities(sleep_levels=(1, 2), model_unload=False, metrics_endpoint=True,
                                    reports=frozenset(LOAD_FIELDS), queue_time=True),
    Engine.TRITON: EngineCapabilities(
        sleep_levels=(), model_unload=True, metrics_endpoint=True, reports=frozenset({"running", "waiting"}),
        queue_time=True, policy_defaults=MappingProxyType({"target_queue_p95_ms": TRITON_QUEUE_P95_TARGET_MS})),
    Engine.DEEPSPEED_MII: EngineCapabilities(
        sleep_levels=(), model_unload=False, metrics_endpoint=False, reports=frozenset(), queue_time=False,
        policy_defaults=MappingProxyType({"target_token_utilization": MII_TOKEN_UTILIZATION})),
})

__all__ = ["CAPABILITIES", "LOAD_FIELDS", "MII_TOKEN_UTILIZATION", "TRITON_QUEUE_P95_TARGET_MS", "Engine",
           "EngineCapabilities"]
