"""The one exception tree of the control plane.

::

    ControlPlaneError
    +-- TemporaryError(delay_ms)        retrying later may succeed
    |   +-- Unavailable                 a dependency (adapter, cluster, peer) cannot be reached
    |   +-- NotLeader(leader_hint)      this node does not hold the lease; retry at the hint
    |   +-- LeadershipLost              leadership ended while a command was in flight: outcome unknown
    |   +-- QueueFull                   a bounded queue is full; back off
    |   +-- CommitTimeout               no answer in time: outcome unknown, never assume failure
    |   +-- CircuitOpen(key, until_ms)  a breaker is open for this target
    +-- PermanentError                  retrying the same input will fail the same way
        +-- ValidationError(field, problem)   bad input, names the field and what is wrong
        +-- IllegalTransition(instance, from, event)  the lifecycle table forbids it
        +-- NotFound(kind, id)
        +-- AlreadyExists(kind, id)
        +-- Conflict(what)              the object's state forbids it (still has deployments / instances)
        +-- VersionMismatch(kind, id, expected, actual)  optimistic concurrency: resource_version moved on
        +-- StaleEpoch(got, highest)    a fenced command carried an epoch below the highest seen
        +-- Forbidden(what)             authenticated, but not allowed (cross-tenant access)
        +-- LimitExceeded(what)         a per-tenant object limit is reached (delete something first)

Library errors are translated into this tree at the boundary with ``raise ... from exc``. Inside the
replicated state machine nothing is raised: ``apply`` returns a rejection value instead (it must be
total), built from these classes' messages.
"""

from __future__ import annotations

from collections.abc import Callable


CLIP_CHARS = 40
"""Most characters of a caller's value that an error message repeats."""


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters (``'abc'...(+N chars)``):
    the one way a value from a client, a file or a peer enters a message (an over-long echo would
    overflow gRPC's 8 KiB metadata limit, or a terminal)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}...(+{len(text) - limit} chars)"


class ControlPlaneError(Exception):
    """Base of every error the control plane raises on purpose."""


class TemporaryError(ControlPlaneError):
    """Retrying later may succeed; ``delay_ms`` is the suggested minimum wait (0 = caller decides)."""

    def __init__(self, message: str, *, delay_ms: int = 0) -> None:
        super().__init__(message)
        self.delay_ms = delay_ms


class Unavailable(TemporaryError):
    """A dependency (adapter, cluster API, peer) could not be reached."""


class NotLeader(TemporaryError):
    """This node does not hold the lease. ``leader_hint`` is where to retry, if known."""

    def __init__(self, message: str = "this node is not the leader", *, leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class LeadershipLost(TemporaryError):
    """Leadership ended while a command was in flight. The outcome is unknown."""


class QueueFull(TemporaryError):
    """A bounded queue is full."""


class CommitTimeout(TemporaryError):
    """No answer within the deadline. The command may or may not have been committed."""


class CircuitOpen(TemporaryError):
    """The circuit breaker for ``key`` is open until ``until_ms``."""

    def __init__(self, key: str, until_ms: int) -> None:
        super().__init__(f"circuit {key} is open until t={until_ms}ms", delay_ms=0)
        self.key = key
        self.until_ms = until_ms


class PermanentError(ControlPlaneError):
    """Retrying the same input fails the same way."""


class ValidationError(PermanentError):
    """Bad input. ``field`` is a dotted path (``tenants[0].quota.h100``), ``problem`` what is wrong.

    ``problems`` holds every ``(field, problem)`` found (a constructor checks all its fields, so a
    file or request with three mistakes hears of all three); ``field`` / ``problem`` are the first."""

    def __init__(self, field: str, problem: str, *, more: tuple[tuple[str, str], ...] = ()) -> None:
        self.problems: tuple[tuple[str, str], ...] = ((field, problem), *more)
        super().__init__("; ".join(f"{f}: {p}" for f, p in self.problems))
        self.field = field
        self.problem = problem


class Problems:
    """Collects :class:`ValidationError` s of several checks; :meth:`raise_any` raises them as one.

    ::

        p = Problems()
        p.check(check_int, "deployment.min_replicas", value, 0)
        p.raise_any()
    """

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def check(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn(*args)``; False (and the problems recorded) when it raised ValidationError."""
        try:
            fn(*args)
        except ValidationError as exc:
            self.items.extend(exc.problems)
            return False
        return True

    def add(self, field: str, problem: str) -> None:
        self.items.append((field, problem))

    def has(self, *fields: str) -> bool:
        """Whether any of ``fields`` has a problem already (cross-field rules then stay silent)."""
        return any(f in fields for f, _ in self.items)

    def raise_any(self) -> None:
        if self.items:
            (field, problem), *more = self.items
            raise ValidationError(field, problem, more=tuple(more))


class IllegalTransition(PermanentError):
    """The instance lifecycle table has no transition for ``(from_state, event)``."""

    def __init__(self, instance_id: str, from_state: str, event: str) -> None:
        super().__init__(f"instance {instance_id}: no transition from {from_state} on {event}")
        self.instance_id = instance_id
        self.from_state = from_state
        self.event = event


class NotFound(PermanentError):
    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} not found")
        self.kind = kind
        self.ident = ident


class AlreadyExists(PermanentError):
    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} already exists")
        self.kind = kind
        self.ident = ident


class Conflict(PermanentError):
    """The current state forbids the change (a tenant that still owns deployments, a cluster with
    instances, a membership change in progress...)."""


class VersionMismatch(PermanentError):
    """An update or delete named a ``resource_version`` that is not the object's current one."""

    def __init__(self, kind: str, ident: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{kind} {ident!r} is at resource_version {actual}, not {expected}: it changed since you read it"
        )
        self.kind = kind
        self.ident = ident
        self.expected = expected
        self.actual = actual


class StaleEpoch(PermanentError):
    """A fenced command carried an epoch lower than the highest one already seen."""

    def __init__(self, got: int, highest: int) -> None:
        super().__init__(f"stale epoch {got}: highest seen is {highest}")
        self.got = got
        self.highest = highest


class Forbidden(PermanentError):
    """Authenticated, but not allowed to touch this object."""


class LimitExceeded(PermanentError):
    """Creating the object would exceed a per-tenant limit carried by the command (the API's
    ``api_max_deployments_per_tenant`` / ``api_max_tokens_per_tenant``)."""
