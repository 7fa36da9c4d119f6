"""The "pre-deployment profile" Dynamo's planner needs, derived from our :class:`ModelProfile`.

Dynamo's SLA planner sizes engines through a forward-pass performance model: given one forward
pass's batch (scheduled prefill tokens, decode requests, decode KV tokens) it returns the pass's
wall time, and Dynamo's own engine-query layer
(``dynamo/planner/core/perf_model/engine_query.py``) derives from it the queued-prefill drain time,
TTFT, ITL and the sustainable requests/s of one engine under the SLA. In ai-dynamo 1.6.1 that
forward-pass model comes from the AISimulate SDK (``aisimulate_core.sdk``), fitted to profiling
runs or to live forward-pass metrics. AISimulate is not installable from PyPI (the ``aisimulate``
package is a stub that fetches its real wheel from another index), so this module supplies the
forward-pass model from the same service model the simulator runs (``docs/simulator.md``):

* a pass that prefills ``P`` prompt tokens takes ``P / prefill_tokens_per_s``;
* a pass that decodes ``B`` sequences takes ``ModelProfile.step_ms(B)``; a mixed pass both;
* engine limits: ``max_num_seqs`` and the KV capacity of the profile, and vLLM's chunked-prefill
  token budget of 8,192 per pass (Dynamo's own default when an engine does not publish it).

It is exact for our simulator, as a profile measured on the real engine would be for that engine;
so the model reports itself ready from the first tick (Dynamo's bootstrap-from-profile case) and
ignores online tuning. :func:`install_sdk_stand_in` registers the two names Dynamo imports from
``aisimulate_core.sdk`` (``ForwardPassPerfModelConfig`` and ``RustForwardPassPerfModel``), backed by
this model; everything above the forward-pass time is Dynamo's code.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

from controlplane.domain.profiles import PROFILES, ModelProfile

MAX_NUM_BATCHED_TOKENS = 8192
"""vLLM's chunked-prefill budget per forward pass (Dynamo's DEFAULT_MAX_NUM_BATCHED_TOKENS)."""
PROFILE_SYSTEM = "controlplane-sim"
"""The ``system`` name Dynamo's config carries; the stand-in resolves ``model`` to a ModelProfile."""


def forward_pass_ms(profile: ModelProfile, prefill_tokens: int, decode_requests: int) -> float:
    """Wall time of one forward pass on one engine of ``profile`` (the simulator's service model)."""
    t = 0.0
    if prefill_tokens > 0:
        t += prefill_tokens * 1000.0 / profile.prefill_tokens_per_s
    if decode_requests > 0:
        t += profile.step_ms(decode_requests)
    return t


class ProfileForwardPassModel:
    """The forward-pass model object Dynamo's ``AISCoreEnginePerfModel`` calls."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        self.tuned_iterations = 0

    def estimate_forward_pass_time_ms(self, metrics_by_rank: list[dict[str, Any]]) -> float:
        # One attention-DP rank per engine here; a pass takes as long as its slowest rank.
        times = [
            forward_pass_ms(
                self.profile,
                int(m["scheduled_requests"]["sum_prefill_tokens"]),
                int(m["scheduled_requests"]["num_decode_requests"]),
            )
            for m in metrics_by_rank
        ]
        return max(times, default=0.0)

    def tune_with_fpms(self, iterations: list[list[dict[str, Any]]]) -> None:
        self.tuned_iterations += len(iterations)  # the profile is exact: nothing to correct

    def diagnostics(self) -> dict[str, Any]:
        return {"readiness": "ready", "source": "controlplane-profile",
                "retained_observations": self.tuned_iterations}


@dataclass
class ForwardPassPerfModelConfig:
    """The fields of AISimulate's config that Dynamo's planner reads or writes."""

    model: str
    system: str
    backend: str
    worker_type: str
    estimation_mode: str = "profile"
    tp: int = 1
    pp: int = 1
    estimator_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_legacy_engine_config(cls, engine: dict[str, Any], worker_type: str, options: dict[str, Any]):
        return cls(model=engine["model_name"], system=engine["system_name"], backend=engine["backend"],
                   worker_type=worker_type)


class RustForwardPassPerfModel:
    @staticmethod
    def best_available(config: dict[str, Any]) -> ProfileForwardPassModel:
        profile = PROFILES.get(config["model"])
        if profile is None:
            raise RuntimeError(f"model {config['model']!r}: no controlplane ModelProfile of that name")
        return ProfileForwardPassModel(profile)


def install_sdk_stand_in() -> None:
    """Make ``aisimulate_core.sdk`` resolve to this module's stand-ins (idempotent)."""
    if getattr(sys.modules.get("aisimulate_core.sdk"), "CONTROLPLANE_STAND_IN", False):
        return
    pkg = types.ModuleType("aisimulate_core")
    sdk = types.ModuleType("aisimulate_core.sdk")
    sdk.ForwardPassPerfModelConfig = ForwardPassPerfModelConfig
    sdk.RustForwardPassPerfModel = RustForwardPassPerfModel
    sdk.CONTROLPLANE_STAND_IN = True
    pkg.sdk = sdk
    sys.modules["aisimulate_core"] = pkg
    sys.modules["aisimulate_core.sdk"] = sdk
