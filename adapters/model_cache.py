"""Which models a Kubernetes cluster's node-local model cache holds, read from node labels.

The model-cache DaemonSet (``deploy/base/model-cache/``) runs on every node labelled
``model-cache.controlplane.io/enabled=true`` (the GPU nodes the engines run on), downloads the weights
of each listed model into a hostPath volume and then labels its node
``model-cache.controlplane.io/<model>=ready``. The adapter lists those nodes and reports a model as
cached only when **every** one of them carries its label: the engine pod may land on any of them, so
only then is its start really ``cached`` (``controlplane/domain/start_tiers.py``). No cache nodes: an
empty cache. A model name must be a valid label name (at most 63 characters of ``[A-Za-z0-9._-]``,
alphanumeric at both ends), as the profile names are.

The node list is read at most every ``refresh_s`` (the default 30 s; a DaemonSet download takes
minutes); an API failure keeps the last answer (and reports nothing before the first one succeeds),
so the observation pump never waits on or fails because of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field
from urllib3.exceptions import HTTPError as Urllib3Error

log = structlog.get_logger("adapters.model_cache")

LABEL_PREFIX = "model-cache.controlplane.io/"
"""Prefix of the per-model node labels; ``<prefix>enabled=true`` selects the cache nodes."""
READY = "ready"
"""Value of ``<prefix><model>`` once the model's weights are complete on the node."""
MODEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
"""A model name usable as a label name (the part after the prefix)."""
MAX_NODES = 5_000
"""Most nodes read per list (Kubernetes' own scalability limit per cluster)."""


class ModelCacheConfig(BaseModel):
    """The ``kubernetes.model_cache`` section: where to read the node-local model cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_selector: str = Field(f"{LABEL_PREFIX}enabled=true", min_length=1, max_length=1000,
                               description="label selector of the nodes the cache DaemonSet runs on")
    refresh_s: float = Field(30.0, ge=1, le=3600, description="how often the node labels are read")


def cached_models(node_labels: Iterable[Mapping[str, str] | None]) -> tuple[str, ...]:
    """The models every node holds (``<prefix><model>: ready`` on each), sorted; no nodes: none."""
    held: set[str] | None = None
    for labels in node_labels:
        mine = {k.removeprefix(LABEL_PREFIX) for k, v in (labels or {}).items()
                if k.startswith(LABEL_PREFIX) and v == READY and MODEL_NAME.match(k.removeprefix(LABEL_PREFIX))}
        held = mine if held is None else held & mine
    return tuple(sorted(held or ()))


class NodeCacheReader:
    """Reads the cluster's cache nodes through the Kubernetes API (``list nodes``: a ClusterRole)."""

    def __init__(self, core: k8s.CoreV1Api, config: ModelCacheConfig, clock_ms: Callable[[], int],
                 timeout_s: float) -> None:
        self._core = core
        self._cfg = config
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self._models: tuple[str, ...] | None = None
        self._next_ms = 0
        self.failures = 0

    def models(self) -> tuple[str, ...] | None:
        """The cached models (refreshed when due); None until a list has succeeded."""
        now = self._clock_ms()
        if now >= self._next_ms:
            self._next_ms = now + int(self._cfg.refresh_s * 1000)
            try:
                nodes = self._core.list_node(label_selector=self._cfg.node_selector, limit=MAX_NODES,
                                             _request_timeout=self._timeout_s)
                if nodes.metadata is not None and nodes.metadata._continue:
                    raise OSError(f"more than {MAX_NODES} cache nodes: not all of them were read")
                self._models = cached_models(n.metadata.labels for n in nodes.items or ())
            except (ApiException, Urllib3Error, OSError) as exc:
                self.failures += 1
                reason = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
                log.warning("model_cache.list_failed", selector=self._cfg.node_selector, reason=reason,
                            keeping=self._models)
        return self._models
