"""The clusters' node-local model caches as replicated facts.

Each adapter reports which models its cluster's cache holds (``Observations.model_caches``: the
Kubernetes adapter reads the cache DaemonSet's per-node ConfigMaps, the simulator its own cache). The lease
holder turns a report that differs from the replicated :class:`ModelCacheRecord` into a
``PutModelCache`` command among the tick's facts, after the lifecycle transitions, so a
``start_warmup`` reported in the same batch records the tier its start really had (the cache as the
adapter saw it when it created the pod). The start tier (``domain/state.py``) and placement's
preference (``core/placement.py``) then read only the replicated state.
"""

from __future__ import annotations

from controlplane.domain import commands as c
from controlplane.domain.observations import Observations
from controlplane.domain.records import MAX_CACHED_MODELS, ModelCacheRecord
from controlplane.domain.state import ControlState


def facts(state: ControlState, obs: Observations, now_ms: int) -> tuple[c.Command, ...]:
    """``PutModelCache`` for every reported cluster whose models differ from its record (known
    clusters only; models deduplicated, sorted and bounded by ``MAX_CACHED_MODELS``)."""
    out: list[c.Command] = []
    for cluster_id, models in obs.model_caches:
        if cluster_id not in state.clusters:
            continue
        names = tuple(sorted({m for m in models if isinstance(m, str) and m}))[:MAX_CACHED_MODELS]
        old = state.model_caches.get(cluster_id)
        if old is not None and old.models == names:
            continue
        if old is None and not names:
            continue  # no record reads as an empty cache already
        out.append(c.PutModelCache(cluster_id, ModelCacheRecord(names, max(0, now_ms))))
    return tuple(out)


def cached_clusters(state: ControlState, model: str) -> frozenset[str]:
    """The clusters whose model cache holds ``model`` (placement's tie-breaker)."""
    return frozenset(cid for cid, rec in state.model_caches.items() if rec.holds(model))
