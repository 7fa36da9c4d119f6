"""The per-node ConfigMaps that node agents publish (the model cache's, the gpu-agent's), listed
through the Kubernetes API at most once per refresh interval, by the cluster adapter.

One list (``list configmaps`` in one namespace, by label selector, bounded to :data:`MAX_NODES`)
per ``refresh_s``; a failed list is counted and logged once and leaves the caller's last value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

log = structlog.get_logger("adapters.node_maps")

MAX_NODES = 5_000
"""Most ConfigMaps read per list (Kubernetes' own limit of nodes per cluster)."""

NodeMaps = list[tuple[str, Mapping[str, str] | None]]
"""``(ConfigMap name, data)`` of every listed ConfigMap."""


class NodeMapLister:
    """Lists one namespace's ConfigMaps matching ``selector`` when a refresh is due."""

    def __init__(self, core: Any, namespace: str, selector: str, refresh_s: float, clock_ms: Callable[[], int],
                 timeout_s: float, *, what: str) -> None:
        self._core = core
        self._namespace = namespace
        self._selector = selector
        self._refresh_ms = int(refresh_s * 1000)
        self._clock_ms = clock_ms
        self._timeout_s = timeout_s
        self._what = what
        """What the ConfigMaps describe, for messages and the log event (``model_cache``, ``gpu_report``)."""
        self._next_ms = 0
        self.failures = 0

    def due(self) -> tuple[int, NodeMaps] | None:
        """``(now_ms, maps)`` when a refresh was due and the list succeeded; None when not due or when
        the list failed (counted in :attr:`failures`, logged as ``<what>.list_failed``)."""
        now = self._clock_ms()
        if now < self._next_ms:
            return None
        self._next_ms = now + self._refresh_ms
        try:
            maps = self._core.list_namespaced_config_map(self._namespace, label_selector=self._selector,
                                                         limit=MAX_NODES, _request_timeout=self._timeout_s)
            if maps.metadata is not None and maps.metadata._continue:
                raise OSError(f"more than {MAX_NODES} {self._what} nodes: not all of them were read")
            return now, [(m.metadata.name, m.data) for m in maps.items or ()]
        except (ApiException, Urllib3Error, OSError) as exc:
            self.failures += 1
            reason = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            log.warning(f"{self._what}.list_failed", namespace=self._namespace, reason=reason)
            return None


__all__ = ["MAX_NODES", "NodeMapLister", "NodeMaps"]
