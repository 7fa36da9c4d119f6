"""The backend interface: what the adapter service (``adapters/service.py``) asks of whatever runs the
instances of one cluster: Kubernetes (``adapters/kubernetes.py``), the real-time simulator
(``adapters/simulated.py``) or the recording backend the fault tests use.

The service owns fencing (the persisted highest epoch), idempotency by request id, the observation
stream and its ring buffer; a backend only carries out commands and reports what it sees. Each
command carries the fencing token anyway, because a backend with a shared store of its own
(Kubernetes) must also refuse a stale write *there*: two adapter processes for one cluster each
pass their local guard, and only a precondition on the shared object decides between them.

Errors a backend raises (the service maps them onto gRPC status codes):

* :class:`~controlplane.domain.errors.StaleEpoch` -> ``FAILED_PRECONDITION`` (a newer epoch was seen in
  the backend's own store);
* :class:`~controlplane.domain.errors.NotFound` -> ``NOT_FOUND`` (unknown deployment or instance);
* :class:`~controlplane.domain.errors.ValidationError` -> ``INVALID_ARGUMENT``;
* :class:`~controlplane.domain.errors.TemporaryError` (``Unavailable``...) -> ``UNAVAILABLE``
  (the coordinator retries with the same request id, which the service has not marked applied).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from controlplane.domain.observations import Observations

INSTANCE_ACTIONS = ("create", "wake", "sleep", "drain", "cancel", "terminate")
"""``create``: start a new instance (cold start); ``wake``: wake a sleeping one (warm start);
``sleep``: stop routing, let in-flight requests finish, release GPU memory (the warm pool);
``drain``: stop routing, finish or abort (at ``deadline_ms``) in-flight requests, then remove;
``cancel``: remove an instance that never served; ``terminate``: remove now, aborting requests."""
MAX_REPLICAS = 10_000
"""Most instances of one deployment a scale command may ask of one cluster. A larger number comes
from a broken or hostile sender; the service and the backends refuse it before changing anything."""
MAX_GPUS_PER_INSTANCE = 64
"""Most GPUs one instance may ask for (a node has at most 8 today; 64 leaves room for multi-node)."""


@dataclass(frozen=True, slots=True)
class FenceToken:
    epoch: int
    seq: int
    holder: str
    signature: bytes = b""
    """Ed25519 signature of (epoch, holder) by a coordinators' fence key (``controlplane.fencing``)."""
    key_id: str = ""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """The instance a command is about, as the coordinators' replicated state knows it."""

    instance_id: str
    deployment_id: str
    tenant_id: str = ""
    zone: str = ""
    pool: str = ""
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class InstanceCommand:
    request_id: str
    action: str
    """One of :data:`INSTANCE_ACTIONS`."""
    instance: InstanceSpec
    fence: FenceToken
    deadline_ms: int = 0
    """For ``drain``: when running requests are aborted, on the adapter's clock (wall-clock ms since
    the Unix epoch; the wire carries a relative ``drain_timeout_ms``)."""


@dataclass(frozen=True, slots=True)
class ScaleCommand:
    """Scale a deployment to ``replicas`` instances, removing ``victims`` (instance ids) first."""

    request_id: str
    deployment_id: str
    replicas: int
    victims: tuple[str, ...]
    fence: FenceToken


class Backend(Protocol):
    def apply(self, command: InstanceCommand, now_ms: int) -> None:
        """Carry out one instance command (idempotent: the service may repeat a command whose first
        attempt raised)."""
        ...

    def scale(self, command: ScaleCommand, now_ms: int) -> None: ...

    def observe(self, now_ms: int) -> Observations:
        """Samples of the instances now, and lifecycle reports and gateway queues since the last
        call. Called by one thread (the service's observation pump) every interval."""
        ...

    def close(self) -> None: ...
