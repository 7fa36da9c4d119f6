"""Per-tenant limits of the API (docs/api.md "Limits"): what one tenant token may hold at once, how
large a request may be, and how much of a client's input an error may echo back.

* :class:`Gate` counts the watches (``once`` ones included) and the other calls each tenant has in
  flight on this coordinator, and in total. A tenant beyond its share, or all tenants together beyond
  theirs, is answered RESOURCE_EXHAUSTED naming the limit and its value; ``api_admin_reserve``
  watches and worker threads stay for admins whatever the tenants do, so an admin can always call
  ``Admin.Status`` or open a watch. The worker pool is sized from the same numbers
  (``api_workers >= api_max_watches + api_max_tenant_calls + api_admin_reserve``, a configuration
  rule), so streams can never take every thread from unary calls.
* ``heavy``: a semaphore bounding how many threads at once turn the event log into messages for a
  ``once`` watch or a catch-up page (the CPU-bound part). The others wait (not holding the GIL), so
  a flood of once-watches cannot starve the Raft tick thread of the interpreter lock.
* :func:`shape_problems`: every request is checked for oversized strings and for maps and repeated
  fields with too many entries before a servicer runs (INVALID_ARGUMENT naming the field); gRPC
  itself refuses a message over ``api_max_request_bytes`` (RESOURCE_EXHAUSTED).
* :func:`clip` is the one way a client's value enters an error message: a short prefix, quoted,
  with the length of what was cut. :func:`abort` bounds every error's message and field violations
  (``grpc-message`` and ``grpc-status-details-bin`` are trailing metadata, and gRPC clients refuse
  metadata over 8 KiB: an over-long echo would turn a clear error into an opaque INTERNAL).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.rpc import error_details_pb2, status_pb2

from controlplane.api.auth import Authenticator, CatchingUp, Principal, Unauthenticated, bearer_of
from controlplane.config import CoordinatorConfig
from controlplane.domain.errors import CLIP_CHARS, clip

__all__ = ["CLIP_CHARS", "clip", "clip_path", "cut", "abort", "shape_problems", "Gate", "LimitsInterceptor"]

MAX_MESSAGE_BYTES = 512
"""Most UTF-8 bytes of an error's message (``grpc-message``; percent-encoding at most triples it)."""
MAX_FIELD_CHARS = 120
MAX_PROBLEM_CHARS = 240
MAX_DETAILS_BYTES = 2048
"""Most bytes of the serialized ``google.rpc.Status`` details (base64 in the trailer: 4/3 of it)."""
LIMIT_KEY = "cp-limit"
"""Trailing metadata of a RESOURCE_EXHAUSTED answer: the configuration field of the limit hit."""
WATCH_METHOD = "/controlplane.api.v1.Scaling/Watch"
ADMIN_ONLY_PREFIXES = (
    "/controlplane.api.v1.Tenants/CreateTenant", "/controlplane.api.v1.Tenants/UpdateTenant",
    "/controlplane.api.v1.Tenants/DeleteTenant", "/controlplane.api.v1.Clusters/",
    "/controlplane.api.v1.Tokens/CreateToken", "/controlplane.api.v1.Tokens/ListTokens",
    "/controlplane.api.v1.Tokens/RevokeToken", "/controlplane.api.v1.Admin/AddMember",
    "/controlplane.api.v1.Admin/RemoveMember",
)
"""Methods a tenant principal is refused (PERMISSION_DENIED by the servicer, whatever the request
says): their requests are not shape-checked for tenants, so the refusal is the same for any body."""
OUTPUT_ONLY = frozenset({"status"})
"""Message fields the server never reads from a request (an object's ``status``): not checked."""
_WRAPPERS = ("tenant", "deployment", "cluster", "zone")


# --- echoing client values -----------------------------------------------------------------------------------


def clip_path(field: str, limit: int = CLIP_CHARS) -> str:
    """A field path whose over-long segments (map keys a client chose) are clipped."""
    return ".".join(seg if len(seg) <= limit else f"{seg[:limit]}...(+{len(seg) - limit} chars)"
                    for seg in field.split("."))


def cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes (on a character boundary, ``...`` marking a cut)."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return text
    return raw[: max(0, max_bytes - 3)].decode("utf-8", "ignore") + "..."


def bounded_violations(violations: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Field violations cut to size: each field and problem clipped, and as many as fit in
    :data:`MAX_DETAILS_BYTES` (the rest counted in a last entry)."""
    out: list[tuple[str, str]] = []
    used, items = 0, list(violations)
    for i, (f, p) in enumerate(items):
        f, p = cut(f, MAX_FIELD_CHARS), cut(p, MAX_PROBLEM_CHARS)
        size = len(f.encode()) + len(p.encode()) + 16
        if used + size > MAX_DETAILS_BYTES - 64:
            out.append(("", f"... and {len(items) - i} more problems"))
            break
        out.append((f, p))
        used += size
    return out


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str,
          trailing: Iterable[tuple[str, str]] = (), violations: Iterable[tuple[str, str]] = ()) -> NoReturn:
    """End the call with ``code``: the message and field violations (``google.rpc.BadRequest``) cut
    to the sizes above, so the trailers stay far below gRPC's 8 KiB metadata limit."""
    message = cut(message, MAX_MESSAGE_BYTES)
    meta: list[tuple[str, str | bytes]] = [(k, cut(v, 256)) for k, v in trailing]
    bounded = bounded_violations(violations)
    if bounded:
        status = status_pb2.Status(code=code.value[0], message=message)
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=f, description=p) for f, p in bounded]))
        meta.append(("grpc-status-details-bin", status.SerializeToString()))
    context.set_trailing_metadata(tuple(meta))
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover


# --- request shape ------------------------------------------------------------------------------------------


def _is_repeated(fd: FieldDescriptor) -> bool:
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == FieldDescriptor.LABEL_REPEATED


def _path(prefix: str, name: str) -> str:
    path = f"{prefix}.{name}" if prefix else name
    head, dot, rest = path.partition(".")
    # Object fields are named as the rest of the API names them: ``spec.quota``, ``metadata.name``.
    return rest if dot and head in _WRAPPERS and rest.partition(".")[0] in ("spec", "metadata") else path


def shape_problems(msg: Any, max_entries: int, max_string_bytes: int, prefix: str = "") -> list[tuple[str, str]]:
    """Strings over ``max_string_bytes`` and maps / repeated fields over ``max_entries`` in ``msg``
    (recursively), as ``(field, problem)`` pairs. Map keys appear in the path clipped."""
    out: list[tuple[str, str]] = []

    def text(path: str, value: object) -> None:
        n = len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8", "replace"))
        if n > max_string_bytes:
            out.append((path, f"must be at most {max_string_bytes} bytes, got {n} (api_max_string_bytes)"))

    def one(path: str, fd: FieldDescriptor, value: Any) -> None:
        if fd.message_type is not None:
            out.extend(shape_problems(value, max_entries, max_string_bytes, path))
        elif fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            text(path, value)

    for fd, value in msg.ListFields():
        if fd.name in OUTPUT_ONLY and fd.message_type is not None:
            continue
        path = _path(prefix, fd.name)
        if _is_repeated(fd):
            n = len(value)
            if n > max_entries:
                out.append((path, f"must have at most {max_entries} entries, got {n} (api_max_map_entries)"))
                continue
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                vfd = fd.message_type.fields_by_name["value"]
                for key in sorted(value):
                    text(f"{path}.{clip(key, 20)}", key)
                    if vfd.message_type is not None or vfd.type == FieldDescriptor.TYPE_STRING:
                        one(f"{path}.{clip(key, 20)}", vfd, value[key])
            else:
                for i, item in enumerate(value):
                    one(f"{path}[{i}]", fd, item)
        else:
            one(path, fd, value)
        if len(out) > 20:
            break
    return out


# --- in-flight calls per tenant -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLimits:
    workers: int = 48
    watches: int = 16
    watches_per_tenant: int = 4
    tenant_calls: int = 24
    calls_per_tenant: int = 8
    admin_reserve: int = 4
    heavy: int = 2

    @classmethod
    def of(cls, cfg: CoordinatorConfig) -> CallLimits:
        return cls(cfg.api_workers, cfg.api_max_watches, cfg.api_max_watches_per_tenant, cfg.api_max_tenant_calls,
                   cfg.api_max_calls_per_tenant, cfg.api_admin_reserve, cfg.api_heavy_concurrency)


@dataclass(frozen=True)
class Refusal:
    message: str
    limit: str
    """The configuration field that set the limit."""


class Gate:
    """Counts in-flight watches and calls per tenant and in total (thread-safe)."""

    def __init__(self, limits: CallLimits, node_id: str = "this coordinator") -> None:
        self.limits = limits
        self.node_id = node_id
        self._lock = threading.Lock()
        self._per_tenant: dict[tuple[str, str], int] = {}
        self._total = {"watch": 0, "call": 0}
        self._admin = {"watch": 0, "call": 0}
        self.heavy = threading.BoundedSemaphore(limits.heavy)

    def in_flight(self, kind: str, tenant: str | None = None) -> int:
        with self._lock:
            if tenant is None:
                return self._total[kind] + self._admin[kind]
            return self._per_tenant.get((kind, tenant), 0)

    def enter(self, p: Principal, kind: str) -> Refusal | None:
        """Admit one ``kind`` ("watch" or "call") for ``p``; a :class:`Refusal` when a limit is reached."""
        lim = self.limits
        with self._lock:
            if p.is_admin:
                if kind == "watch" and self._total["watch"] + self._admin["watch"] >= lim.watches:
                    return Refusal(f"too many watches on {self.node_id}: at most {lim.watches} at once "
                                   "(api_max_watches); try another coordinator", "api_max_watches")
                self._admin[kind] += 1
                return None
            key = (kind, p.tenant)
            mine = self._per_tenant.get(key, 0)
            if kind == "watch":
                share = lim.watches - lim.admin_reserve
                if mine >= lim.watches_per_tenant:
                    return Refusal(f"too many watches for tenant {p.tenant!r} on {self.node_id}: at most "
                                   f"{lim.watches_per_tenant} at once, once-watches included "
                                   "(api_max_watches_per_tenant); close one first", "api_max_watches_per_tenant")
                if self._total["watch"] + max(0, self._admin["watch"] - lim.admin_reserve) >= share:
                    return Refusal(f"too many watches on {self.node_id}: tenants may hold {share} at once "
                                   f"(api_max_watches {lim.watches} minus api_admin_reserve {lim.admin_reserve}); "
                                   "try another coordinator or later", "api_max_watches")
            else:
                if mine >= lim.calls_per_tenant:
                    return Refusal(f"too many calls in flight for tenant {p.tenant!r} on {self.node_id}: at most "
                                   f"{lim.calls_per_tenant} at once (api_max_calls_per_tenant); wait for "
                                   "the answers before sending more", "api_max_calls_per_tenant")
                if self._total["call"] >= lim.tenant_calls:
                    return Refusal(f"too many tenant calls in flight on {self.node_id}: at most "
                                   f"{lim.tenant_calls} at once for all tenants together (api_max_tenant_calls); "
                                   "retry shortly or call another coordinator", "api_max_tenant_calls")
            self._per_tenant[key] = mine + 1
            self._total[kind] += 1
            return None

    def leave(self, p: Principal, kind: str) -> None:
        with self._lock:
            if p.is_admin:
                self._admin[kind] -= 1
                return
            key = (kind, p.tenant)
            left = self._per_tenant.get(key, 0) - 1
            if left > 0:
                self._per_tenant[key] = left
            else:
                self._per_tenant.pop(key, None)
            self._total[kind] -= 1


class LimitsInterceptor(grpc.ServerInterceptor):
    """Applies the :class:`Gate` and :func:`shape_problems` to every authenticated call (health and
    reflection, which carry no principal, pass). Innermost interceptor: the authentication
    interceptor's refusal comes first, and the request it sees is decoded."""

    def __init__(self, auth: Authenticator, gate: Gate, max_entries: int, max_string_bytes: int) -> None:
        self._auth = auth
        self._gate = gate
        self._max_entries = max_entries
        self._max_string = max_string_bytes

    def _principal(self, context: grpc.ServicerContext) -> Principal | None:
        try:
            return self._auth.of_token(bearer_of(context.invocation_metadata()))
        except (Unauthenticated, CatchingUp):
            return None  # the authentication interceptor answers these

    def _check(self, request: Any, context: grpc.ServicerContext, p: Principal, method: str) -> None:
        if not p.is_admin and method.startswith(ADMIN_ONLY_PREFIXES):
            return
        if hasattr(request, "ListFields"):
            problems = shape_problems(request, self._max_entries, self._max_string)
            if problems:
                abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                      "; ".join(f"{f}: {p}" for f, p in problems[:3]), violations=problems)

    def _refuse(self, context: grpc.ServicerContext, refusal: Refusal) -> NoReturn:
        abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.message, ((LIMIT_KEY, refusal.limit),))

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or handler.request_streaming or method.startswith("/grpc."):
            return handler
        de, ser = handler.request_deserializer, handler.response_serializer
        if handler.response_streaming:
            stream = handler.unary_stream
            kind = "watch" if method == WATCH_METHOD else "call"

            def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                p = self._principal(context)
                if p is None:
                    yield from stream(request, context)
                    return
                self._check(request, context, p, method)
                refusal = self._gate.enter(p, kind)
                if refusal is not None:
                    self._refuse(context, refusal)
                try:
                    yield from stream(request, context)
                finally:
                    self._gate.leave(p, kind)

            return grpc.unary_stream_rpc_method_handler(streaming, de, ser)
        unary = handler.unary_unary

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            p = self._principal(context)
            if p is None:
                return unary(request, context)
            self._check(request, context, p, method)
            refusal = self._gate.enter(p, "call")
            if refusal is not None:
                self._refuse(context, refusal)
            try:
                return unary(request, context)
            finally:
                self._gate.leave(p, "call")

        return grpc.unary_unary_rpc_method_handler(call, de, ser)
