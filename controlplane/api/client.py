"""A client of the control plane's API over several coordinator endpoints (one region's group).

* Calls go to the endpoint that answered last (the first one at start). A connection failure moves on
  to the next endpoint; ``UNAVAILABLE`` with a ``leader-hint`` trailing metadata retries once at that
  address, then moves on.
* ``UNAUTHENTICATED`` is checked with one other endpoint before it is believed (a token created a
  moment ago may not have been applied by a lagging coordinator yet; the call did not run there).
* A write whose outcome is unknown (``cp-outcome: unknown``) is retried elsewhere only when it is
  idempotent (upserts, deletes, reads); a create is not retried: :class:`ApiError` says so.
* :meth:`ApiClient.watch` resumes a broken ``Scaling.Watch`` stream on another endpoint with
  ``since_revision``, without losing or repeating events (revisions are identical on every node).
* :class:`ApiError` is an answer of a coordinator (status, message, BadRequest field violations);
  :class:`Unreachable` means no endpoint answered at all.

TLS and the bearer token come from :func:`controlplane.api.channel.open_channel`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import grpc

from controlplane.api import tls_errors
from controlplane.api.channel import open_channel
from controlplane.api.v1 import admin_pb2_grpc, api_pb2, api_pb2_grpc

DEFAULT_TIMEOUT_S = 10.0
LEADER_HINT = "leader-hint"
OUTCOME = "cp-outcome"
CP_ERROR = "cp-error"

STUBS: dict[str, Callable[[grpc.Channel], Any]] = {
    "Tenants": api_pb2_grpc.TenantsStub,
    "Deployments": api_pb2_grpc.DeploymentsStub,
    "Clusters": api_pb2_grpc.ClustersStub,
    "Scaling": api_pb2_grpc.ScalingStub,
    "Tokens": api_pb2_grpc.TokensStub,
    "Admin": admin_pb2_grpc.AdminStub,
}

_TRANSPORT_HINTS = (
    "failed to connect", "connection refused", "socket closed", "connection reset", "dns resolution failed",
    "empty address list", "connection attempt timed out", "broken pipe", "handshake", "ssl", "tls",
    "endpoint is closing", "goaway", "stream removed", "unreachable",
)


@dataclass
class ApiError(Exception):
    """A coordinator's answer that is not success."""

    endpoint: str
    code: grpc.StatusCode
    message: str
    violations: list[tuple[str, str]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def outcome_unknown(self) -> bool:
        return self.metadata.get(OUTCOME) == "unknown"

    def __str__(self) -> str:
        text = f"{self.endpoint}: {self.code.name}: {self.message}"
        if self.outcome_unknown:
            text += " (the write may or may not have happened: read before retrying)"
        return text


@dataclass
class Unreachable(Exception):
    """No endpoint answered: ``failures`` is ``(endpoint, why)`` for each one tried."""

    failures: list[tuple[str, str]]

    def __str__(self) -> str:
        return "no endpoint answered: " + "; ".join(f"{ep}: {why}" for ep, why in self.failures)


def _metadata(exc: grpc.RpcError) -> dict[str, str]:
    out: dict[str, str] = {}
    for source in ("trailing_metadata", "initial_metadata"):
        try:
            items = getattr(exc, source)() or ()
        except Exception:  # noqa: BLE001 - a failed call may not have metadata at all
            items = ()
        for key, value in items:
            if isinstance(value, str):
                out.setdefault(key, value)
    return out


def _violations(exc: grpc.RpcError) -> list[tuple[str, str]]:
    """google.rpc.BadRequest field violations carried by an INVALID_ARGUMENT, if any."""
    try:
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - malformed details: fall back to the message
        return []
    if status is None:
        return []
    out: list[tuple[str, str]] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out.extend((v.field, v.description) for v in bad.field_violations)
    return out


def _code(exc: grpc.RpcError) -> grpc.StatusCode:
    try:
        return exc.code()  # type: ignore[attr-defined, no-any-return]
    except Exception:  # noqa: BLE001
        return grpc.StatusCode.UNKNOWN


def _details(exc: grpc.RpcError) -> str:
    try:
        return str(exc.details() or "")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return ""


def is_transport_failure(exc: grpc.RpcError) -> bool:
    """The call never reached a coordinator (refused, reset, TLS failure, no answer in time)."""
    code = _code(exc)
    meta = _metadata(exc)
    if LEADER_HINT in meta or OUTCOME in meta:
        return False
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    if code is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = _details(exc).lower()
    return any(h in details for h in _TRANSPORT_HINTS)


class ApiClient:
    """Calls on one group of coordinators. Not thread-safe; close it (or use it as a context manager)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        server_name: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        channel_factory: Callable[[str], grpc.Channel] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("endpoints: give at least one host:port")
        self.endpoints = list(dict.fromkeys(endpoints))
        self.timeout_s = timeout_s
        self.tls = bool(ca_file) or channel_factory is not None
        self.ca_file = ca_file
        self.server_name = server_name
        self._factory = channel_factory or (lambda ep: open_channel(
            ep, ca_file=ca_file, token=token, cert_file=cert_file, key_file=key_file, server_name=server_name))
        self._channels: dict[str, grpc.Channel] = {}
        self._preferred = 0
        self.last_endpoint = self.endpoints[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _stub(self, service: str, endpoint: str) -> Any:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = self._channels[endpoint] = self._factory(endpoint)
        return STUBS[service](channel)

    def _order(self) -> list[str]:
        n = len(self.endpoints)
        return [self.endpoints[(self._preferred + i) % n] for i in range(n)]

    def _prefer(self, endpoint: str) -> None:
        self.last_endpoint = endpoint
        if endpoint in self.endpoints:
            self._preferred = self.endpoints.index(endpoint)

    def why(self, endpoint: str, exc: grpc.RpcError) -> str:
        """A transport failure in one line (:func:`controlplane.api.tls_errors.reason`)."""
        return tls_errors.reason(_details(exc), _code(exc).name, tls=self.tls, ca_file=self.ca_file,
                                 server_name=self.server_name, host=endpoint.rsplit(":", 1)[0])

    def _error(self, endpoint: str, exc: grpc.RpcError) -> ApiError:
        return ApiError(endpoint, _code(exc), _details(exc) or _code(exc).name.lower(), _violations(exc), _metadata(exc))

    # -- unary calls -------------------------------------------------------------------------------

    def call(self, service: str, method: str, request: Any, *, idempotent: bool = True,
             timeout_s: float | None = None, endpoint: str | None = None) -> Any:
        """``service.method(request)`` on the first endpoint that answers (or only ``endpoint``)."""
        pending = [endpoint] if endpoint else self._order()
        tried: set[str] = set()
        hinted = auth_retried = False
        failures: list[tuple[str, str]] = []
        answered: ApiError | None = None
        while pending:
            ep = pending.pop(0)
            if ep in tried:
                continue
            tried.add(ep)
            try:
                reply = getattr(self._stub(service, ep), method)(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as exc:
                if is_transport_failure(exc):
                    failures.append((ep, self.why(ep, exc)))
                    continue
                err = self._error(ep, exc)
                if err.code is grpc.StatusCode.UNAUTHENTICATED and endpoint is None and not auth_retried \
                        and len(self.endpoints) > 1:
                    # A token created a moment ago may not have reached this coordinator yet: the call
                    # did not run here, so one other endpoint is asked before believing the refusal.
                    auth_retried = True
                    answered = err
                    continue
                if err.code is not grpc.StatusCode.UNAVAILABLE:
                    raise err from None
                if err.outcome_unknown and not idempotent:
                    raise err from None
                answered = err
                hint = err.metadata.get(LEADER_HINT)
                if hint and not hinted and hint not in tried and endpoint is None:
                    hinted = True
                    pending.insert(0, hint)
                continue
            self._prefer(ep)
            return reply
        if answered is not None:
            raise answered
        raise Unreachable(failures)

    def each_endpoint(self, service: str, method: str, request: Any,
                      timeout_s: float | None = None) -> list[tuple[str, Any]]:
        """The reply (or :class:`ApiError` / :class:`Unreachable`) of every endpoint, in order."""
        out: list[tuple[str, Any]] = []
        for ep in self.endpoints:
            try:
                out.append((ep, self.call(service, method, request, timeout_s=timeout_s, endpoint=ep)))
            except (ApiError, Unreachable) as exc:
                out.append((ep, exc))
        return out

    # -- watch -------------------------------------------------------------------------------------

    def watch(self, request: api_pb2.WatchRequest, *, max_rounds: int = 5,
              backoff: Callable[[int], None] | None = None) -> Iterator[api_pb2.Event | Notice]:
        """Events of ``Scaling.Watch`` (bookmarks included) and :class:`Notice` items when the stream
        moves to another endpoint. Ends when the server ends the stream (``once``); raises
        :class:`Unreachable` / :class:`ApiError` after ``max_rounds`` rounds over every endpoint
        without a stream. ``backoff(round)`` runs between rounds (tenantctl sleeps there)."""
        cursor = WatchCursor(request.since_revision if request.HasField("since_revision") else None)
        rounds = 0
        while True:
            progressed = False
            failures: list[tuple[str, str]] = []
            last_error: ApiError | None = None
            for ep in self._order():
                req = api_pb2.WatchRequest()
                req.CopyFrom(request)
                since = cursor.resume_from()
                if since is not None:
                    req.since_revision = since
                elif req.HasField("since_revision"):
                    req.ClearField("since_revision")
                cursor.on_reconnect(req.HasField("since_revision"))
                try:
                    stream = self._stub("Scaling", ep).Watch(req)
                    for event in stream:
                        if not progressed:
                            progressed = True
                            self._prefer(ep)
                        if cursor.accept(event):
                            yield event
                    return  # the server ended the stream (a `once` watch)
                except grpc.RpcError as exc:
                    if is_transport_failure(exc) and _code(exc) is not grpc.StatusCode.DEADLINE_EXCEEDED:
                        failures.append((ep, self.why(ep, exc)))
                    else:
                        err = self._error(ep, exc)
                        if err.code is grpc.StatusCode.OUT_OF_RANGE and cursor.resumed:
                            yield Notice(ep, f"events after revision {cursor.resume_from()} are no longer "
                                             "retained; continuing from now (some changes were missed)")
                            cursor.restart()
                            progressed = True
                            continue
                        if err.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                            grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL,
                                            grpc.StatusCode.UNKNOWN):
                            raise err from None
                        last_error = err
                        why = f"{err.code.name}: {err.message}"
                        failures.append((ep, why))
                    if progressed or cursor.seen_any:
                        yield Notice(ep, f"stream broke ({failures[-1][1] if failures else 'error'}); "
                                         f"resuming after revision {cursor.resume_from()}")
                    progressed = False
            rounds += 1
            if rounds >= max_rounds:
                if last_error is not None:
                    raise last_error
                raise Unreachable(failures)
            if backoff is not None:
                backoff(rounds)


@dataclass(frozen=True)
class Notice:
    """Not an event: the watch moved on (``endpoint`` failed, ``message`` says what happens next)."""

    endpoint: str
    message: str


class WatchCursor:
    """Where a watch stands, so that it resumes exactly: one Raft revision may carry several events
    (a batch), so a stream that broke in the middle of a revision resumes at the revision before
    it and skips the events of that revision already delivered (every node derives them in the same
    order)."""

    def __init__(self, since: int | None) -> None:
        self.complete: int | None = since
        """Every event with a revision <= this one has been delivered."""
        self.partial_revision = 0
        self.partial_count = 0
        self._skip = 0
        self.seen_any = False
        self.resumed = since is not None
        self._backlog_pending = False

    def resume_from(self) -> int | None:
        if self.partial_count:
            return self.partial_revision - 1
        return self.complete

    def restart(self) -> None:
        self.complete, self.partial_revision, self.partial_count, self._skip = None, 0, 0, 0
        self.resumed = False

    def accept(self, event: api_pb2.Event) -> bool:
        """Record ``event``; False when it repeats one already delivered."""
        self.seen_any = True
        if event.type == "BOOKMARK":
            if self._backlog_pending:
                # A resumed stream opens with a bookmark of the head revision, then sends the backlog:
                # that first bookmark does not mean "everything up to it was delivered".
                self._backlog_pending = False
                return True
            if self.partial_count and event.revision >= self.partial_revision:
                self.partial_count = 0
            if self.complete is None or event.revision > self.complete:
                self.complete = event.revision
            self._skip = 0
            self.resumed = True
            return True
        self._backlog_pending = False
        rev = event.revision
        if self._skip and rev == self.partial_revision:
            self._skip -= 1
            return False
        self._skip = 0
        if self.complete is not None and rev <= self.complete:
            return False
        if rev == self.partial_revision:
            self.partial_count += 1
        else:
            if self.partial_count:
                self.complete = self.partial_revision
            self.partial_revision, self.partial_count = rev, 1
        self.resumed = True
        return True

    def on_reconnect(self, with_since: bool) -> None:
        """A new stream starts after ``resume_from()``: skip what this revision already delivered."""
        self._skip = self.partial_count
        self._backlog_pending = with_since
