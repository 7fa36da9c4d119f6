from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FenceToken(_message.Message):
    __slots__ = ("epoch", "seq", "holder", "signature", "key_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    holder: str
    signature: bytes
    key_id: str
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., holder: _Optional[str] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("cluster_id", "fence")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    fence: FenceToken
    def __init__(self, cluster_id: _Optional[str] = ..., fence: _Optional[_Union[FenceToken, _Mapping]] = ...) -> None: ...

class FenceReply(_message.Message):
    __slots__ = ("highest_epoch", "highest_holder")
    HIGHEST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_HOLDER_FIELD_NUMBER: _ClassVar[int]
    highest_epoch: int
    highest_holder: str
    def __init__(self, highest_epoch: _Optional[int] = ..., highest_holder: _Optional[str] = ...) -> None: ...

class InstanceRef(_message.Message):
    __slots__ = ("instance_id", "deployment_id", "tenant_id", "zone", "pool", "gpus")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment_id: str
    tenant_id: str
    zone: str
    pool: str
    gpus: int
    def __init__(self, instance_id: _Optional[str] = ..., deployment_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., zone: _Optional[str] = ..., pool: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("cluster_id", "fence", "request_id", "action", "instance", "drain_timeout_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    fence: FenceToken
    request_id: str
    action: str
    instance: InstanceRef
    drain_timeout_ms: int
    def __init__(self, cluster_id: _Optional[str] = ..., fence: _Optional[_Union[FenceToken, _Mapping]] = ..., request_id: _Optional[str] = ..., action: _Optional[str] = ..., instance: _Optional[_Union[InstanceRef, _Mapping]] = ..., drain_timeout_ms: _Optional[int] = ...) -> None: ...

class ApplyReply(_message.Message):
    __slots__ = ("applied", "highest_epoch")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    highest_epoch: int
    def __init__(self, applied: _Optional[bool] = ..., highest_epoch: _Optional[int] = ...) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("cluster_id", "fence", "request_id", "deployment_id", "replicas", "victims")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    fence: FenceToken
    request_id: str
    deployment_id: str
    replicas: int
    victims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster_id: _Optional[str] = ..., fence: _Optional[_Union[FenceToken, _Mapping]] = ..., request_id: _Optional[str] = ..., deployment_id: _Optional[str] = ..., replicas: _Optional[int] = ..., victims: _Optional[_Iterable[str]] = ...) -> None: ...

class InstanceSample(_message.Message):
    __slots__ = ("instance_id", "deployment_id", "at_ms", "running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p99_ms", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "healthy", "queue_p95_ms", "unknown")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_P95_MS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment_id: str
    at_ms: int
    running: int
    waiting: int
    kv_usage: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    ttft_p99_ms: float
    gpu_mem_used_bytes: int
    gpu_mem_total_bytes: int
    healthy: bool
    queue_p95_ms: float
    unknown: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, instance_id: _Optional[str] = ..., deployment_id: _Optional[str] = ..., at_ms: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., prompt_tokens_per_s: _Optional[float] = ..., generation_tokens_per_s: _Optional[float] = ..., ttft_p99_ms: _Optional[float] = ..., gpu_mem_used_bytes: _Optional[int] = ..., gpu_mem_total_bytes: _Optional[int] = ..., healthy: _Optional[bool] = ..., queue_p95_ms: _Optional[float] = ..., unknown: _Optional[_Iterable[str]] = ...) -> None: ...

class InstanceReport(_message.Message):
    __slots__ = ("instance_id", "event", "at_ms", "detail")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    event: str
    at_ms: int
    detail: str
    def __init__(self, instance_id: _Optional[str] = ..., event: _Optional[str] = ..., at_ms: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class GatewayQueue(_message.Message):
    __slots__ = ("deployment_id", "waiting")
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    deployment_id: str
    waiting: int
    def __init__(self, deployment_id: _Optional[str] = ..., waiting: _Optional[int] = ...) -> None: ...

class ObservationBatch(_message.Message):
    __slots__ = ("cluster_id", "seq", "at_ms", "samples", "reports", "gateway", "stream_id", "observe_failed", "model_cache", "gpu_memory")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_FAILED_FIELD_NUMBER: _ClassVar[int]
    MODEL_CACHE_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    seq: int
    at_ms: int
    samples: _containers.RepeatedCompositeFieldContainer[InstanceSample]
    reports: _containers.RepeatedCompositeFieldContainer[InstanceReport]
    gateway: _containers.RepeatedCompositeFieldContainer[GatewayQueue]
    stream_id: str
    observe_failed: bool
    model_cache: ModelCache
    gpu_memory: GpuMemoryReport
    def __init__(self, cluster_id: _Optional[str] = ..., seq: _Optional[int] = ..., at_ms: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[InstanceSample, _Mapping]]] = ..., reports: _Optional[_Iterable[_Union[InstanceReport, _Mapping]]] = ..., gateway: _Optional[_Iterable[_Union[GatewayQueue, _Mapping]]] = ..., stream_id: _Optional[str] = ..., observe_failed: _Optional[bool] = ..., model_cache: _Optional[_Union[ModelCache, _Mapping]] = ..., gpu_memory: _Optional[_Union[GpuMemoryReport, _Mapping]] = ...) -> None: ...

class GpuMemoryReport(_message.Message):
    __slots__ = ("at_ms", "units")
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    at_ms: int
    units: _containers.RepeatedCompositeFieldContainer[GpuUnit]
    def __init__(self, at_ms: _Optional[int] = ..., units: _Optional[_Iterable[_Union[GpuUnit, _Mapping]]] = ...) -> None: ...

class GpuUnit(_message.Message):
    __slots__ = ("node", "unit", "free_bytes", "total_bytes", "pool", "problem")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    node: str
    unit: str
    free_bytes: int
    total_bytes: int
    pool: str
    problem: str
    def __init__(self, node: _Optional[str] = ..., unit: _Optional[str] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., pool: _Optional[str] = ..., problem: _Optional[str] = ...) -> None: ...

class ModelCache(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, models: _Optional[_Iterable[str]] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("cluster_id", "after_seq", "stream_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    after_seq: int
    stream_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., stream_id: _Optional[str] = ...) -> None: ...

class RecentRequest(_message.Message):
    __slots__ = ("cluster_id", "max_age_ms")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    max_age_ms: int
    def __init__(self, cluster_id: _Optional[str] = ..., max_age_ms: _Optional[int] = ...) -> None: ...

class RecentReply(_message.Message):
    __slots__ = ("now_ms", "batches")
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    now_ms: int
    batches: _containers.RepeatedCompositeFieldContainer[ObservationBatch]
    def __init__(self, now_ms: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[ObservationBatch, _Mapping]]] = ...) -> None: ...
