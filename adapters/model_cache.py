"""Which models a Kubernetes cluster's node-local model cache holds, read from the cache DaemonSet's
per-node ConfigMaps.

The model-cache DaemonSet (``deploy/base/model-cache/``) runs one pod on every GPU node (those
labelled ``controlplane.io/model-cache=enabled``). Each pod first writes the ConfigMap
``model-cache-<node>`` (label ``controlplane.io/model-cache=node``, owned by the pod, so it goes
when the pod or its node goes) with no models, then downloads the weights of every listed model into
the node's hostPath cache and, as each completes, lists it in the ConfigMap's ``models`` (one name a
line). The adapter lists those ConfigMaps in the engines' namespace and reports a model as cached
only when **every** one of them lists it: an engine pod may land on any cache node, so only then is
its start really ``cached`` (``controlplane/domain/start_tiers.py``). No cache nodes: an empty
cache. ConfigMaps rather than node labels because both reading and writing node labels need
cluster-wide RBAC, which this project grants nobody (``tests/deploy``).

The list is read at most every ``refresh_s`` (the default 30 s; a download takes minutes); an API
failure keeps the last answer (and reports nothing before the first one succeeds), so the
observation pump never fails because of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict, Field

from adapters.node_maps import NodeMapLister

NODE_LABEL = "controlplane.io/model-cache"
"""Label of the per-node ConfigMaps (value ``node``) and of the cache nodes (value ``enabled``)."""
MODELS_KEY = "models"
"""ConfigMap data key: the models complete on the node, one name a line."""
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class ModelCacheConfig(BaseModel):
    """The ``kubernetes.model_cache`` section: where to read the node-local model cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("serving", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                           description="namespace of the cache DaemonSet and its per-node ConfigMaps")
    selector: str = Field(f"{NODE_LABEL}=node", min_length=1, max_length=1000,
                          description="label selector of the per-node ConfigMaps")
    refresh_s: float = Field(30.0, ge=1, le=3600, description="how often the ConfigMaps are read")


def cached_models(node_data: Iterable[Mapping[str, str] | None]) -> tuple[str, ...]:
    """The models every node lists (``data.models``, one name a line), sorted; no nodes: none."""
    held: set[str] | None = None
    for data in node_data:
        lines = ((data or {}).get(MODELS_KEY) or "").splitlines()
        mine = {line.strip() for line in lines if MODEL_NAME.match(line.strip())}
        held = mine if held is None else held & mine
    return tuple(sorted(held or ()))


class NodeCacheReader:
    """Reads the per-node ConfigMaps through the Kubernetes API (``list configmaps`` in one namespace)."""

    def __init__(self, core: k8s.CoreV1Api, config: ModelCacheConfig, clock_ms: Callable[[], int],
                 timeout_s: float) -> None:
        self._lister = NodeMapLister(core, config.namespace, config.selector, config.refresh_s, clock_ms, timeout_s,
                                     what="model_cache")
        self._models: tuple[str, ...] | None = None

    @property
    def failures(self) -> int:
        return self._lister.failures

    def models(self) -> tuple[str, ...] | None:
        """The cached models (refreshed when due); None until a list has succeeded (a failed list
        keeps the last ones)."""
        listed = self._lister.due()
        if listed is not None:
            self._models = cached_models(data for _, data in listed[1])
        return self._models
