"""Authentication and authorization of API calls: bearer token -> :class:`Principal`.

Every call except grpc.health.v1 and server reflection carries ``authorization: Bearer
cp_<id>_<secret>``. :class:`Authenticator` looks the id up in this coordinator's local replica
(tokens are replicated like everything else, stored as SHA-256 of the secret), compares the hash in
constant time and checks the expiry against the wall clock. Any failure is the same
UNAUTHENTICATED answer (which of the checks failed is not told: it would help guessing), and no
token or secret is ever logged or echoed. One exception: a well-formed token whose id this replica
does not know while the replica is behind the group (no leader known, or committed entries not yet
applied: just restarted, or cut off) is answered UNAVAILABLE (retry, or another coordinator), since
the token may simply not have reached this replica yet.

:class:`AuthInterceptor` enforces authentication for every method of every service before the
servicer runs (so a method added later cannot forget it); the servicers call
:meth:`Authenticator.principal` again to get the principal and apply the tenant rules (proto header:
another tenant's objects are NOT_FOUND, cluster/zone/token methods need an admin).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from controlplane.domain.tokens import Role, TokenRecord, parse_token
from controlplane.tokens import matches

PUBLIC_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                   "grpc.reflection.v1.ServerReflection")
"""Services reachable without a token."""
AUTH_FAILED = "missing, malformed, unknown, revoked or expired bearer token (authorization: Bearer cp_<id>_<secret>)"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call acts as."""

    token_id: str
    role: Role
    tenant: str = ""
    """The tenant a tenant principal is scoped to ("" for admins)."""
    expires_ms: int = 0

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def sees_tenant(self, tenant: str) -> bool:
        """Whether objects of ``tenant`` exist for this principal."""
        return self.is_admin or tenant == self.tenant

    def __str__(self) -> str:  # for logs: the public id only
        return f"{self.role.value}:{self.token_id}" + (f"@{self.tenant}" if self.tenant else "")


class Unauthenticated(Exception):
    """No valid token: answered UNAUTHENTICATED."""


class CatchingUp(Exception):
    """A well-formed token this replica does not know (yet) while the replica is behind the group
    (no leader known, or entries committed but not applied: a restarted or cut-off coordinator).
    Answered UNAVAILABLE, so a client retries or calls another coordinator instead of taking a
    valid token for revoked."""


class Forbidden(Exception):
    """A valid token whose principal may not call this method: answered PERMISSION_DENIED."""


def bearer_of(metadata: object) -> str | None:
    """The token in ``authorization: Bearer <token>`` metadata, or None."""
    for key, value in metadata or ():  # type: ignore[union-attr]
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


CATCHING_UP = "this coordinator is catching up with the group and does not know the token yet: retry, or call another coordinator"


def authenticate(token: str | None, tokens: Mapping[str, TokenRecord], now_ms: int,
                 caught_up: Callable[[], bool] | None = None) -> Principal:
    """The principal ``token`` stands for, or :class:`Unauthenticated` (:class:`CatchingUp` for an
    unknown id while ``caught_up()`` is False)."""
    parsed = parse_token(token) if token else None
    if parsed is None:
        raise Unauthenticated(AUTH_FAILED)
    token_id, secret = parsed
    record = tokens.get(token_id)
    if record is None and caught_up is not None and not caught_up():
        raise CatchingUp(CATCHING_UP)
    if record is None or not matches(record, secret) or record.expired(now_ms):
        raise Unauthenticated(AUTH_FAILED)
    return Principal(record.id, record.role, record.tenant, record.expires_ms)


class Authenticator:
    """Authenticates calls against ``tokens()`` (the local replica's token table) at ``now_ms()``."""

    def __init__(self, tokens: Callable[[], Mapping[str, TokenRecord]], now_ms: Callable[[], int],
                 caught_up: Callable[[], bool] | None = None,
                 settle: Callable[[Callable[[], bool]], bool] | None = None) -> None:
        self._tokens = tokens
        self._now_ms = now_ms
        self._caught_up = caught_up
        self._settle = settle
        """``settle(known)``: wait (bounded) for entries already committed elsewhere until ``known()``
        is true; True if it became true (:class:`controlplane.api.token_settle.TokenSettle`)."""

    def of_token(self, token: str | None) -> Principal:
        """The principal ``token`` stands for; raises :class:`Unauthenticated` or :class:`CatchingUp`.
        A well-formed token whose id this replica does not know yet is given ``settle`` (a token created
        a moment ago on another coordinator may not have been applied here); the refusal stands if it
        is still unknown after that."""
        try:
            return authenticate(token, self._tokens(), self._now_ms(), self._caught_up)
        except (Unauthenticated, CatchingUp):
            parsed = parse_token(token) if token else None
            if self._settle is None or parsed is None or parsed[0] in self._tokens():
                raise
            token_id = parsed[0]
            if not self._settle(lambda: token_id in self._tokens()):
                raise
            return authenticate(token, self._tokens(), self._now_ms(), self._caught_up)

    def principal(self, context: grpc.ServicerContext) -> Principal:
        """The caller's principal; raises :class:`Unauthenticated`."""
        return self.of_token(bearer_of(context.invocation_metadata()))

    def admin(self, context: grpc.ServicerContext) -> Principal:
        """The caller's principal if it is an admin; raises :class:`Unauthenticated` or :class:`Forbidden`."""
        p = self.principal(context)
        if not p.is_admin:
            raise Forbidden("this method needs an admin token")
        return p


def _abort_unauthenticated(request: object, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, AUTH_FAILED)


def _abort_unauthenticated_stream(request: object, context: grpc.ServicerContext):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, AUTH_FAILED)
    yield  # pragma: no cover  (a generator, like the handler it replaces)


def _abort_catching_up(request: object, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.UNAVAILABLE, CATCHING_UP)


def _abort_catching_up_stream(request: object, context: grpc.ServicerContext):
    context.abort(grpc.StatusCode.UNAVAILABLE, CATCHING_UP)
    yield  # pragma: no cover  (a generator, like the handler it replaces)


def _refusing_handler(handler: grpc.RpcMethodHandler, catching_up: bool = False) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that answers UNAUTHENTICATED (UNAVAILABLE while
    the replica is catching up)."""
    unary, stream = ((_abort_catching_up, _abort_catching_up_stream) if catching_up
                     else (_abort_unauthenticated, _abort_unauthenticated_stream))
    return same_shape_handler(handler, unary, stream)


def same_shape_handler(handler: grpc.RpcMethodHandler, unary: Any, stream: Any) -> grpc.RpcMethodHandler:
    """``unary`` / ``stream`` (behaviours that answer without a response message) wrapped in a handler
    of ``handler``'s streaming shape, with its (de)serializers."""
    de, ser = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, de, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, de, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, de, ser)
    return grpc.unary_unary_rpc_method_handler(unary, de, ser)


class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses every call without a valid token before it reaches a servicer (public services
    excepted). The servicers still resolve the principal themselves for the tenant rules."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        service = method.lstrip("/").partition("/")[0]
        if service in PUBLIC_SERVICES:
            return continuation(handler_call_details)
        try:
            self._auth.of_token(bearer_of(handler_call_details.invocation_metadata))
        except (Unauthenticated, CatchingUp) as exc:
            handler = continuation(handler_call_details)
            if handler is None:
                return None  # UNIMPLEMENTED as usual
            return _refusing_handler(handler, catching_up=isinstance(exc, CatchingUp))
        return continuation(handler_call_details)
