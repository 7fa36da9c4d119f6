"""Regions, availability zones and the clusters in them, each with GPU capacity per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, PoolId, ZoneId
from controlplane.domain.labels import check_labels
from controlplane.domain.tenants import check_gpu_map, check_id


@dataclass(frozen=True, slots=True)
class Cluster:
    id: ClusterId
    zone: ZoneId
    region: str = "local"
    capacity: Mapping[PoolId, int] = field(default_factory=dict)
    """Schedulable GPUs per pool."""
    adapter_address: str = ""
    """``host:port`` of the cluster's adapter ("" = taken from the coordinators' configuration)."""
    cordoned: bool = False
    """No new instances are placed here (existing ones keep serving)."""
    draining: bool = False
    """Cordoned, and its instances are replaced elsewhere, then drained (see ``core/reconcile``)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """``metadata.labels`` (:mod:`controlplane.domain.labels`)."""

    def __post_init__(self) -> None:
        check_id("cluster.id", self.id)
        check_id("cluster.zone", self.zone)
        check_id("cluster.region", self.region)
        check_gpu_map("cluster.capacity", self.capacity)
        if not isinstance(self.adapter_address, str):
            raise ValidationError("cluster.adapter_address", f"must be a string, got {type(self.adapter_address).__name__}")
        for name in ("cordoned", "draining"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(f"cluster.{name}", "must be true or false")
        check_labels("cluster.labels", self.labels)

    @property
    def schedulable(self) -> bool:
        return not (self.cordoned or self.draining)


@dataclass(frozen=True, slots=True)
class Zone:
    """An availability zone. Clusters name their zone; a zone needs no record until it is registered
    or cordoned. Cordoning or draining a zone applies to every cluster in it."""

    id: ZoneId
    region: str = "local"
    cordoned: bool = False
    draining: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    """``metadata.labels`` (:mod:`controlplane.domain.labels`)."""

    def __post_init__(self) -> None:
        check_id("zone.id", self.id)
        check_id("zone.region", self.region)
        for name in ("cordoned", "draining"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(f"zone.{name}", "must be true or false")
        check_labels("zone.labels", self.labels)

    @property
    def schedulable(self) -> bool:
        return not (self.cordoned or self.draining)
