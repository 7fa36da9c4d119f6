from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ObjectMeta(_message.Message):
    __slots__ = ("name", "resource_version", "created_ms", "updated_ms", "labels", "apply_result")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    APPLY_RESULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    resource_version: int
    created_ms: int
    updated_ms: int
    labels: _containers.ScalarMap[str, str]
    apply_result: str
    def __init__(self, name: _Optional[str] = ..., resource_version: _Optional[int] = ..., created_ms: _Optional[int] = ..., updated_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., apply_result: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message", "last_transition_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: str
    reason: str
    message: str
    last_transition_ms: int
    def __init__(self, type: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., last_transition_ms: _Optional[int] = ...) -> None: ...

class ReadOptions(_message.Message):
    __slots__ = ("linearizable",)
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    linearizable: bool
    def __init__(self, linearizable: _Optional[bool] = ...) -> None: ...

class ReadInfo(_message.Message):
    __slots__ = ("applied_index", "served_by", "linearizable", "revision")
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LINEARIZABLE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    served_by: str
    linearizable: bool
    revision: int
    def __init__(self, applied_index: _Optional[int] = ..., served_by: _Optional[str] = ..., linearizable: _Optional[bool] = ..., revision: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("name", "read")
    NAME_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    name: str
    read: ReadOptions
    def __init__(self, name: _Optional[str] = ..., read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("read", "tenant", "label_selector")
    READ_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    read: ReadOptions
    tenant: str
    label_selector: str
    def __init__(self, read: _Optional[_Union[ReadOptions, _Mapping]] = ..., tenant: _Optional[str] = ..., label_selector: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("name", "resource_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    resource_version: int
    def __init__(self, name: _Optional[str] = ..., resource_version: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class Slo(_message.Message):
    __slots__ = ("ttft_p99_ms", "max_queue_ms")
    TTFT_P99_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    ttft_p99_ms: int
    max_queue_ms: int
    def __init__(self, ttft_p99_ms: _Optional[int] = ..., max_queue_ms: _Optional[int] = ...) -> None: ...

class TenantSpec(_message.Message):
    __slots__ = ("priority", "quota", "borrow_limit", "slo")
    class QuotaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BorrowLimitEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    priority: int
    quota: _containers.ScalarMap[str, int]
    borrow_limit: _containers.ScalarMap[str, int]
    slo: Slo
    def __init__(self, priority: _Optional[int] = ..., quota: _Optional[_Mapping[str, int]] = ..., borrow_limit: _Optional[_Mapping[str, int]] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ...) -> None: ...

class TenantStatus(_message.Message):
    __slots__ = ("deployments", "gpus_in_use")
    class GpusInUseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    deployments: int
    gpus_in_use: _containers.ScalarMap[str, int]
    def __init__(self, deployments: _Optional[int] = ..., gpus_in_use: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("metadata", "spec", "status")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: TenantSpec
    status: TenantStatus
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[TenantSpec, _Mapping]] = ..., status: _Optional[_Union[TenantStatus, _Mapping]] = ...) -> None: ...

class TenantList(_message.Message):
    __slots__ = ("items", "read")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Tenant]
    read: ReadInfo
    def __init__(self, items: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., read: _Optional[_Union[ReadInfo, _Mapping]] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ("tenant", "dry_run")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    dry_run: bool
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class UpdateTenantRequest(_message.Message):
    __slots__ = ("tenant", "dry_run")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    dry_run: bool
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ScalingPolicy(_message.Message):
    __slots__ = ("target_concurrency", "target_kv_usage", "target_token_utilization", "tolerance", "stable_window_ms", "ewma_half_life_ms", "panic_window_ms", "panic_threshold", "panic_hold_ms", "scale_down_stabilization_ms", "max_step_up", "max_step_down", "scale_down_cooldown_ms", "ttft_slo_weight", "target_queue_p95_ms")
    TARGET_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    TARGET_KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    STABLE_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    EWMA_HALF_LIFE_MS_FIELD_NUMBER: _ClassVar[int]
    PANIC_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    PANIC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PANIC_HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    SCALE_DOWN_STABILIZATION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_UP_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_DOWN_FIELD_NUMBER: _ClassVar[int]
    SCALE_DOWN_COOLDOWN_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TARGET_QUEUE_P95_MS_FIELD_NUMBER: _ClassVar[int]
    target_concurrency: float
    target_kv_usage: float
    target_token_utilization: float
    tolerance: float
    stable_window_ms: int
    ewma_half_life_ms: int
    panic_window_ms: int
    panic_threshold: float
    panic_hold_ms: int
    scale_down_stabilization_ms: int
    max_step_up: int
    max_step_down: int
    scale_down_cooldown_ms: int
    ttft_slo_weight: float
    target_queue_p95_ms: float
    def __init__(self, target_concurrency: _Optional[float] = ..., target_kv_usage: _Optional[float] = ..., target_token_utilization: _Optional[float] = ..., tolerance: _Optional[float] = ..., stable_window_ms: _Optional[int] = ..., ewma_half_life_ms: _Optional[int] = ..., panic_window_ms: _Optional[int] = ..., panic_threshold: _Optional[float] = ..., panic_hold_ms: _Optional[int] = ..., scale_down_stabilization_ms: _Optional[int] = ..., max_step_up: _Optional[int] = ..., max_step_down: _Optional[int] = ..., scale_down_cooldown_ms: _Optional[int] = ..., ttft_slo_weight: _Optional[float] = ..., target_queue_p95_ms: _Optional[float] = ...) -> None: ...

class DeploymentSpec(_message.Message):
    __slots__ = ("tenant", "engine", "model", "pool", "min_replicas", "max_replicas", "warm_pool", "policy")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    engine: str
    model: str
    pool: str
    min_replicas: int
    max_replicas: int
    warm_pool: int
    policy: ScalingPolicy
    def __init__(self, tenant: _Optional[str] = ..., engine: _Optional[str] = ..., model: _Optional[str] = ..., pool: _Optional[str] = ..., min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., warm_pool: _Optional[int] = ..., policy: _Optional[_Union[ScalingPolicy, _Mapping]] = ...) -> None: ...

class InstanceInfo(_message.Message):
    __slots__ = ("id", "state", "cluster", "zone", "init_method", "since_ms", "preempted")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INIT_METHOD_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    cluster: str
    zone: str
    init_method: str
    since_ms: int
    preempted: bool
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., cluster: _Optional[str] = ..., zone: _Optional[str] = ..., init_method: _Optional[str] = ..., since_ms: _Optional[int] = ..., preempted: _Optional[bool] = ...) -> None: ...

class DeploymentStatus(_message.Message):
    __slots__ = ("desired_replicas", "desired_warm_pool", "generation", "reason", "decided_ms", "replicas_by_state", "replicas_by_zone", "gpus_per_instance", "deleting", "instances", "conditions")
    class ReplicasByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ReplicasByZoneEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_BY_ZONE_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    desired_replicas: int
    desired_warm_pool: int
    generation: int
    reason: str
    decided_ms: int
    replicas_by_state: _containers.ScalarMap[str, int]
    replicas_by_zone: _containers.ScalarMap[str, int]
    gpus_per_instance: int
    deleting: bool
    instances: _containers.RepeatedCompositeFieldContainer[InstanceInfo]
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, desired_replicas: _Optional[int] = ..., desired_warm_pool: _Optional[int] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ..., decided_ms: _Optional[int] = ..., replicas_by_state: _Optional[_Mapping[str, int]] = ..., replicas_by_zone: _Optional[_Mapping[str, int]] = ..., gpus_per_instance: _Optional[int] = ..., deleting: _Optional[bool] = ..., instances: _Optional[_Iterable[_Union[InstanceInfo, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("metadata", "spec", "status")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: DeploymentSpec
    status: DeploymentStatus
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[DeploymentSpec, _Mapping]] = ..., status: _Optional[_Union[DeploymentStatus, _Mapping]] = ...) -> None: ...

class DeploymentList(_message.Message):
    __slots__ = ("items", "read")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Deployment]
    read: ReadInfo
    def __init__(self, items: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ..., read: _Optional[_Union[ReadInfo, _Mapping]] = ...) -> None: ...

class ApplyDeploymentRequest(_message.Message):
    __slots__ = ("deployment", "create_only", "dry_run")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    CREATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    create_only: bool
    dry_run: bool
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ..., create_only: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ClusterSpec(_message.Message):
    __slots__ = ("zone", "region", "capacity", "adapter_address")
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ZONE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    zone: str
    region: str
    capacity: _containers.ScalarMap[str, int]
    adapter_address: str
    def __init__(self, zone: _Optional[str] = ..., region: _Optional[str] = ..., capacity: _Optional[_Mapping[str, int]] = ..., adapter_address: _Optional[str] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("cordoned", "draining", "gpus_in_use", "instances", "schedulable", "conditions")
    class GpusInUseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    cordoned: bool
    draining: bool
    gpus_in_use: _containers.ScalarMap[str, int]
    instances: int
    schedulable: bool
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, cordoned: _Optional[bool] = ..., draining: _Optional[bool] = ..., gpus_in_use: _Optional[_Mapping[str, int]] = ..., instances: _Optional[int] = ..., schedulable: _Optional[bool] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("metadata", "spec", "status")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: ClusterSpec
    status: ClusterStatus
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[ClusterSpec, _Mapping]] = ..., status: _Optional[_Union[ClusterStatus, _Mapping]] = ...) -> None: ...

class ClusterList(_message.Message):
    __slots__ = ("items", "read")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Cluster]
    read: ReadInfo
    def __init__(self, items: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ..., read: _Optional[_Union[ReadInfo, _Mapping]] = ...) -> None: ...

class RegisterClusterRequest(_message.Message):
    __slots__ = ("cluster", "dry_run")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    dry_run: bool
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ZoneSpec(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class ZoneStatus(_message.Message):
    __slots__ = ("cordoned", "draining", "clusters", "capacity", "gpus_in_use", "registered", "conditions")
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class GpusInUseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    cordoned: bool
    draining: bool
    clusters: _containers.RepeatedScalarFieldContainer[str]
    capacity: _containers.ScalarMap[str, int]
    gpus_in_use: _containers.ScalarMap[str, int]
    registered: bool
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, cordoned: _Optional[bool] = ..., draining: _Optional[bool] = ..., clusters: _Optional[_Iterable[str]] = ..., capacity: _Optional[_Mapping[str, int]] = ..., gpus_in_use: _Optional[_Mapping[str, int]] = ..., registered: _Optional[bool] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ...) -> None: ...

class Zone(_message.Message):
    __slots__ = ("metadata", "spec", "status")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: ZoneSpec
    status: ZoneStatus
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[ZoneSpec, _Mapping]] = ..., status: _Optional[_Union[ZoneStatus, _Mapping]] = ...) -> None: ...

class ZoneList(_message.Message):
    __slots__ = ("items", "read")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Zone]
    read: ReadInfo
    def __init__(self, items: _Optional[_Iterable[_Union[Zone, _Mapping]]] = ..., read: _Optional[_Union[ReadInfo, _Mapping]] = ...) -> None: ...

class RegisterZoneRequest(_message.Message):
    __slots__ = ("zone", "dry_run")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    zone: Zone
    dry_run: bool
    def __init__(self, zone: _Optional[_Union[Zone, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("name", "cordoned")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    name: str
    cordoned: bool
    def __init__(self, name: _Optional[str] = ..., cordoned: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("revision", "at_ms", "replicas", "warm_pool", "reason", "message")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    at_ms: int
    replicas: int
    warm_pool: int
    reason: str
    message: str
    def __init__(self, revision: _Optional[int] = ..., at_ms: _Optional[int] = ..., replicas: _Optional[int] = ..., warm_pool: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class LiveDecision(_message.Message):
    __slots__ = ("at_ms", "current", "target", "granted", "reason", "message", "proposals", "panic", "signals", "warm_pool", "target_before_forecast", "forecast", "unknown_signals")
    class ProposalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    PANIC_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    TARGET_BEFORE_FORECAST_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    at_ms: int
    current: int
    target: int
    granted: int
    reason: str
    message: str
    proposals: _containers.ScalarMap[str, int]
    panic: bool
    signals: _containers.ScalarMap[str, float]
    warm_pool: int
    target_before_forecast: int
    forecast: Forecast
    unknown_signals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, at_ms: _Optional[int] = ..., current: _Optional[int] = ..., target: _Optional[int] = ..., granted: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., proposals: _Optional[_Mapping[str, int]] = ..., panic: _Optional[bool] = ..., signals: _Optional[_Mapping[str, float]] = ..., warm_pool: _Optional[int] = ..., target_before_forecast: _Optional[int] = ..., forecast: _Optional[_Union[Forecast, _Mapping]] = ..., unknown_signals: _Optional[_Iterable[str]] = ...) -> None: ...

class Forecast(_message.Message):
    __slots__ = ("usable", "note", "ready", "total", "expected", "wake_ms", "restart_ms", "quantile", "buckets", "bucket_ms", "mape", "at_ms", "wake_fits")
    USABLE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    WAKE_MS_FIELD_NUMBER: _ClassVar[int]
    RESTART_MS_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_MS_FIELD_NUMBER: _ClassVar[int]
    MAPE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    WAKE_FITS_FIELD_NUMBER: _ClassVar[int]
    usable: bool
    note: str
    ready: float
    total: float
    expected: float
    wake_ms: int
    restart_ms: int
    quantile: float
    buckets: int
    bucket_ms: int
    mape: float
    at_ms: int
    wake_fits: bool
    def __init__(self, usable: _Optional[bool] = ..., note: _Optional[str] = ..., ready: _Optional[float] = ..., total: _Optional[float] = ..., expected: _Optional[float] = ..., wake_ms: _Optional[int] = ..., restart_ms: _Optional[int] = ..., quantile: _Optional[float] = ..., buckets: _Optional[int] = ..., bucket_ms: _Optional[int] = ..., mape: _Optional[float] = ..., at_ms: _Optional[int] = ..., wake_fits: _Optional[bool] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("deployment", "limit")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    limit: int
    def __init__(self, deployment: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class Explanation(_message.Message):
    __slots__ = ("deployment", "tenant", "desired_replicas", "desired_warm_pool", "history", "live", "lease_holder", "read")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    tenant: str
    desired_replicas: int
    desired_warm_pool: int
    history: _containers.RepeatedCompositeFieldContainer[Decision]
    live: LiveDecision
    lease_holder: str
    read: ReadInfo
    def __init__(self, deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., desired_replicas: _Optional[int] = ..., desired_warm_pool: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., live: _Optional[_Union[LiveDecision, _Mapping]] = ..., lease_holder: _Optional[str] = ..., read: _Optional[_Union[ReadInfo, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("since_revision", "deployment", "tenant", "kinds", "once", "all", "types")
    SINCE_REVISION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    ONCE_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    since_revision: int
    deployment: str
    tenant: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    once: bool
    all: bool
    types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, since_revision: _Optional[int] = ..., deployment: _Optional[str] = ..., tenant: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., once: _Optional[bool] = ..., all: _Optional[bool] = ..., types: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "at_ms", "type", "kind", "name", "tenant", "deployment", "from_state", "to_state", "event", "cluster", "zone", "replicas", "warm_pool", "reason", "message", "served_by", "significant")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WARM_POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    SIGNIFICANT_FIELD_NUMBER: _ClassVar[int]
    revision: int
    at_ms: int
    type: str
    kind: str
    name: str
    tenant: str
    deployment: str
    from_state: str
    to_state: str
    event: str
    cluster: str
    zone: str
    replicas: int
    warm_pool: int
    reason: str
    message: str
    served_by: str
    significant: bool
    def __init__(self, revision: _Optional[int] = ..., at_ms: _Optional[int] = ..., type: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., tenant: _Optional[str] = ..., deployment: _Optional[str] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., event: _Optional[str] = ..., cluster: _Optional[str] = ..., zone: _Optional[str] = ..., replicas: _Optional[int] = ..., warm_pool: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., served_by: _Optional[str] = ..., significant: _Optional[bool] = ...) -> None: ...

class DryRunRequest(_message.Message):
    __slots__ = ("deployment", "zones", "clusters", "tenants", "deployments")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    zones: _containers.RepeatedCompositeFieldContainer[Zone]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    deployments: _containers.RepeatedCompositeFieldContainer[Deployment]
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ..., zones: _Optional[_Iterable[_Union[Zone, _Mapping]]] = ..., clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., deployments: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ...) -> None: ...

class DryRunObject(_message.Message):
    __slots__ = ("kind", "name", "error_code", "error", "violations", "tenant", "deployment", "cluster", "zone", "scaling")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    error_code: str
    error: str
    violations: _containers.RepeatedCompositeFieldContainer[FieldViolation]
    tenant: Tenant
    deployment: Deployment
    cluster: Cluster
    zone: Zone
    scaling: DryRunResult
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., error_code: _Optional[str] = ..., error: _Optional[str] = ..., violations: _Optional[_Iterable[_Union[FieldViolation, _Mapping]]] = ..., tenant: _Optional[_Union[Tenant, _Mapping]] = ..., deployment: _Optional[_Union[Deployment, _Mapping]] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., zone: _Optional[_Union[Zone, _Mapping]] = ..., scaling: _Optional[_Union[DryRunResult, _Mapping]] = ...) -> None: ...

class FieldViolation(_message.Message):
    __slots__ = ("field", "description")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    field: str
    description: str
    def __init__(self, field: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class FieldChange(_message.Message):
    __slots__ = ("field", "before", "after")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    field: str
    before: str
    after: str
    def __init__(self, field: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...

class DryRunResult(_message.Message):
    __slots__ = ("exists", "changes", "current_replicas", "target_before", "target_after", "warm_pool_after", "reason_after", "message_after", "notes", "live_signals", "objects")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TARGET_AFTER_FIELD_NUMBER: _ClassVar[int]
    WARM_POOL_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_AFTER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_AFTER_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    changes: _containers.RepeatedCompositeFieldContainer[FieldChange]
    current_replicas: int
    target_before: int
    target_after: int
    warm_pool_after: int
    reason_after: str
    message_after: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    live_signals: bool
    objects: _containers.RepeatedCompositeFieldContainer[DryRunObject]
    def __init__(self, exists: _Optional[bool] = ..., changes: _Optional[_Iterable[_Union[FieldChange, _Mapping]]] = ..., current_replicas: _Optional[int] = ..., target_before: _Optional[int] = ..., target_after: _Optional[int] = ..., warm_pool_after: _Optional[int] = ..., reason_after: _Optional[str] = ..., message_after: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., live_signals: _Optional[bool] = ..., objects: _Optional[_Iterable[_Union[DryRunObject, _Mapping]]] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("id", "role", "tenant", "created_ms", "expires_ms", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: str
    tenant: str
    created_ms: int
    expires_ms: int
    description: str
    def __init__(self, id: _Optional[str] = ..., role: _Optional[str] = ..., tenant: _Optional[str] = ..., created_ms: _Optional[int] = ..., expires_ms: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("role", "tenant", "ttl_seconds", "description")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    role: str
    tenant: str
    ttl_seconds: int
    description: str
    def __init__(self, role: _Optional[str] = ..., tenant: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreatedToken(_message.Message):
    __slots__ = ("info", "token")
    INFO_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    info: TokenInfo
    token: str
    def __init__(self, info: _Optional[_Union[TokenInfo, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class TokenList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, items: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Principal(_message.Message):
    __slots__ = ("token_id", "role", "tenant", "expires_ms")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    role: str
    tenant: str
    expires_ms: int
    def __init__(self, token_id: _Optional[str] = ..., role: _Optional[str] = ..., tenant: _Optional[str] = ..., expires_ms: _Optional[int] = ...) -> None: ...
