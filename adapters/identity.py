"""Who may command an adapter: coordinators, proven by their TLS client certificate.

With ``tls.client_ca_file`` the adapter serves mutual TLS (``require_client_auth``): the TLS
handshake already refuses a client without a certificate signed by that CA. On top of that,
:class:`CoordinatorIdentity` accepts a ``ClusterAdapter`` call only when the client certificate
names a coordinator: a URI SAN ``controlplane://coordinator/<node_id>`` (the identity scheme the
Raft transport's member certificates use too, :func:`controlplane.tls.issue_coordinator_cert`),
and, when ``tls.allowed_coordinators`` lists node ids, one of those. Anything else (an API client
certificate from the same CA, a tenant's certificate, no certificate on a server-TLS-only listener)
is refused with PERMISSION_DENIED before the request bytes are parsed. Health and reflection stay
open, as with the bearer token, which stays as a second layer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

import grpc
import structlog
from cryptography import x509

from controlplane.tls import COORDINATOR_URI_PREFIX

log = structlog.get_logger("adapters.identity")

_CACHE = 32


def coordinator_ids(pem: bytes) -> list[str]:
    """The node ids a certificate names as ``controlplane://coordinator/<node_id>`` URI SANs."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    return [uri[len(COORDINATOR_URI_PREFIX):] for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
            if uri.startswith(COORDINATOR_URI_PREFIX) and len(uri) > len(COORDINATOR_URI_PREFIX)]


class CoordinatorIdentity(grpc.ServerInterceptor):
    """Refuses ``/<service>/`` calls whose peer certificate is not a coordinator's (PERMISSION_DENIED)."""

    def __init__(self, service: str, allowed: Collection[str] | None = None) -> None:
        self._prefix = f"/{service}/"
        self._allowed = frozenset(allowed) if allowed else None
        self._lock = threading.Lock()
        self._ids: OrderedDict[bytes, list[str]] = OrderedDict()
        self.refused = 0

    def problem(self, auth_context: dict) -> str | None:
        pems = auth_context.get("x509_pem_cert") or []
        if not pems:
            return "no client certificate: this adapter accepts commands only from coordinators (mutual TLS)"
        pem = pems[0]
        with self._lock:
            ids = self._ids.get(pem)
        if ids is None:
            ids = coordinator_ids(pem)
            with self._lock:
                self._ids[pem] = ids
                if len(self._ids) > _CACHE:
                    self._ids.popitem(last=False)
        if not ids:
            return f"the client certificate names no coordinator (a URI SAN {COORDINATOR_URI_PREFIX}<node_id>)"
        if self._allowed is not None and not any(i in self._allowed for i in ids):
            return f"coordinator {ids[0][:64]!r} is not in this adapter's tls.allowed_coordinators"
        return None

    def _refuse(self, context: grpc.ServicerContext, method: str) -> None:
        problem = self.problem(context.auth_context())
        if problem is None:
            return
        with self._lock:
            self.refused += 1
            count = self.refused
        if count & (count - 1) == 0:  # 1st, 2nd, 4th ... refusal: visible, never a flood
            log.warning("call_not_from_coordinator", method=method, problem=problem, refused=count)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(raw, context):
                self._refuse(context, method)  # before the request bytes are parsed
                return inner(deserialize(raw) if deserialize else raw, context)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(raw, context):
                self._refuse(context, method)
                yield from inner_stream(deserialize(raw) if deserialize else raw, context)

            return grpc.unary_stream_rpc_method_handler(stream, response_serializer=serialize)

        def deny(request, context):  # no streaming-request methods in ClusterAdapter: refuse them all
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not served")

        return grpc.stream_unary_rpc_method_handler(deny, response_serializer=serialize)
