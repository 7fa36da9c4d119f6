"""Placement across zones and clusters, and the order in which instances are removed.

CONTRACT (implemented by a helper; signatures are fixed):

    @dataclass(frozen=True, slots=True)
    class Placement:
        clusters: tuple[ClusterId, ...]   # one entry per placed instance, in order
        unplaced: int
        reason: str

    def place(deployment, count, clusters: Sequence[Cluster], free_gpus: Mapping[ClusterId, int],
              existing: Sequence[Instance], blocked: Collection[ClusterId]) -> Placement

    def pick_removals(instances: Sequence[Instance], count: int, loads: Mapping[InstanceId, float])
        -> tuple[InstanceId, ...]
"""
