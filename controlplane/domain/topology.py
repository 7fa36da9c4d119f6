"""Regions, availability zones and the clusters in them, each with GPU capacity per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.domain.ids import ClusterId, PoolId, ZoneId
from controlplane.domain.tenants import check_gpu_map, check_id


@dataclass(frozen=True, slots=True)
class Cluster:
    id: ClusterId
    zone: ZoneId
    region: str = "local"
    capacity: Mapping[PoolId, int] = field(default_factory=dict)
    """Schedulable GPUs per pool."""

    def __post_init__(self) -> None:
        check_id("cluster.id", self.id)
        check_id("cluster.zone", self.zone)
        check_id("cluster.region", self.region)
        check_gpu_map("cluster.capacity", self.capacity)
