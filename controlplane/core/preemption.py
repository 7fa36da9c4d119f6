"""Tenant allocation and priority preemption.

CONTRACT (implemented by a helper; signatures are fixed):

    @dataclass(frozen=True, slots=True)
    class Demand:
        deployment: Deployment
        want: int        # replicas the scaling decision asks for (>= deployment.min_replicas)
        have: int        # replicas holding GPUs now (non-terminal, not Draining)
        load: float      # mean utilisation 0..1 of its serving replicas (victim ordering)

    @dataclass(frozen=True, slots=True)
    class Grant:
        deployment_id: DeploymentId
        replicas: int            # what it may hold
        preempted: int           # replicas it must give up for others (0 if none)
        reason: str

    @dataclass(frozen=True, slots=True)
    class Allocation:
        grants: Mapping[DeploymentId, Grant]
        preemptions: tuple[tuple[DeploymentId, DeploymentId, int], ...]  # (beneficiary, victim, replicas)

    def allocate(tenants: Mapping[TenantId, Tenant], demands: Sequence[Demand],
                 capacity: Mapping[PoolId, int], now_ms: int) -> Allocation

    @dataclass(frozen=True, slots=True)
    class Victim:
        instance_id: InstanceId
        deployment_id: DeploymentId
        drain_deadline_ms: int
        reason: str

    def choose_victims(allocation, instances: Sequence[Instance], tenants, loads: Mapping[InstanceId, float],
                       now_ms: int, grace_ms: int) -> tuple[Victim, ...]
"""
