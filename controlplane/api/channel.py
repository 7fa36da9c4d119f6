"""Client-side channels to a coordinator's API: TLS when a CA is given, and the bearer token on every
call (a client interceptor adds ``authorization: Bearer <token>``), so stubs never handle either.

Used by ``controlplane status`` / ``members`` (:mod:`controlplane.api.admin`), by tenantctl's client
(:mod:`controlplane.api.client`) and by a coordinator forwarding Explain/DryRun to the lease holder.

Plaintext is what you get without ``ca_file``: the server accepts it only on loopback addresses
unless it runs with ``api_insecure: true`` (see :class:`controlplane.config.CoordinatorConfig`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path

import grpc

from controlplane.domain.errors import ValidationError

AUTHORIZATION = "authorization"
BEARER = "Bearer "
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest message either side accepts (a fleet-sized list)."""


class _ClientCallDetails(
    collections.namedtuple("_ClientCallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call's metadata (replacing one already there)."""

    def __init__(self, token: str) -> None:
        self._header = (AUTHORIZATION, BEARER + token)

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [(k, v) for k, v in (d.metadata or ()) if k != AUTHORIZATION]
        metadata.append(self._header)
        return _ClientCallDetails(d.method, d.timeout, metadata, d.credentials,
                                  getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def __repr__(self) -> str:  # never show the token
        return "BearerInterceptor(<token>)"


def _read(path: str | Path, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValidationError(field, f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def check_token(token: str) -> str:
    """A token as it may travel in a header (no whitespace/control characters); raises
    :class:`ValidationError` naming ``token`` otherwise. The token itself is never echoed."""
    token = token.strip()
    if not token or any(ch.isspace() or ord(ch) < 0x21 or ord(ch) > 0x7E for ch in token):
        raise ValidationError("token", "must be a non-empty printable string without spaces (cp_<id>_<secret>)")
    return token


def channel_options(server_name: str | None = None) -> Sequence[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
        options.append(("grpc.default_authority", server_name))
    return options


def open_channel(
    endpoint: str,
    *,
    ca_file: str | Path | None = None,
    token: str | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    server_name: str | None = None,
) -> grpc.Channel:
    """A channel to ``endpoint`` (``host:port``). With ``ca_file`` it is TLS, verified against that CA
    (``server_name`` overrides the name checked in the server certificate); ``cert_file`` and
    ``key_file`` (both or neither) present a client certificate for mutual TLS. With ``token`` every
    call carries ``authorization: Bearer <token>``. Raises :class:`ValidationError` (field ``ca_file``,
    ``cert_file``, ``key_file`` or ``token``) for unreadable files or a malformed token. Close the
    channel when done (it is a context manager)."""
    if (cert_file is None) != (key_file is None):
        raise ValidationError("cert_file" if cert_file is None else "key_file",
                              "a client certificate needs both cert_file and key_file")
    if cert_file is not None and ca_file is None:
        raise ValidationError("ca_file", "a client certificate (mutual TLS) needs ca_file as well")
    options = channel_options(server_name)
    if ca_file is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file, "ca_file"),
            private_key=None if key_file is None else _read(key_file, "key_file"),
            certificate_chain=None if cert_file is None else _read(cert_file, "cert_file"),
        )
        channel = grpc.secure_channel(endpoint, creds, options=options)
    else:
        channel = grpc.insecure_channel(endpoint, options=options)
    if token is not None:
        channel = grpc.intercept_channel(channel, BearerInterceptor(check_token(token)))
    return channel
