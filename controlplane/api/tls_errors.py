"""Connection failures said in one short line a person can act on, and gRPC's C-core kept quiet.

gRPC reports a failed connection as one long ``details`` string (``failed to connect to all addresses;
last error: UNKNOWN: ipv4:127.0.0.1:7001: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL:
... CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK``) and its C-core logs the
handshake failure on stderr as well. :func:`reason` turns the string into what went wrong, naming the
setting to change:

* a certificate not signed by the CA in ``ca_file``; a certificate that does not name the host;
* a TLS endpoint reached in plaintext (gRPC says only "Socket closed"), or a plaintext endpoint
  reached with TLS;
* refused, unresolvable, silent (deadline) endpoints, and something that is not a controlplane API.

:func:`quiet_grpc` sets ``GRPC_VERBOSITY`` / ``GRPC_TRACE`` (unless set already) so that the C-core
prints nothing; it must run before ``grpc`` is first imported (the CLI entry points call it first).
No grpc import here.
"""

from __future__ import annotations

import os


def quiet_grpc() -> None:
    """No gRPC C-core log lines on stderr (an explicit ``GRPC_VERBOSITY`` / ``GRPC_TRACE`` wins)."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    os.environ.setdefault("GRPC_TRACE", "")


def reason(details: str, code: str = "", *, tls: bool = False, ca_file: str | None = None,
           server_name: str | None = None, host: str = "") -> str:
    """One line for a failed connection: ``details`` and ``code`` (a status code's name) of the gRPC
    error, ``tls`` whether the channel used TLS (with ``ca_file``). Unknown failures keep gRPC's own
    words, without its ``failed to connect to all addresses; last error:`` preamble."""
    d = details or ""
    low = d.lower()
    ca = f" ({ca_file})" if ca_file else ""
    if "certificate_verify_failed" in low or "unable to get local issuer" in low or "self signed" in low \
            or "self-signed" in low:
        return f"TLS handshake failed: the server's certificate is not signed by the CA in ca_file{ca}"
    if "hostname verification" in low or "peer name" in low:
        name = server_name or host or "the host"
        return (f"TLS handshake failed: the server's certificate does not name {name} (set server_name to a "
                "name it has)")
    if "wrong_version_number" in low or ("tls handshake failed" in low and "packet_length_too_long" in low):
        return "TLS handshake failed: the endpoint does not speak TLS (drop ca_file, or set insecure: true)"
    if "tls handshake failed" in low or "ssl_error" in low or "handshake failed" in low:
        return "TLS handshake failed: " + _short(d)
    if not tls and ("socket closed" in low or "connection reset" in low):
        return "the endpoint speaks TLS; set ca_file (or the endpoint is not a controlplane API)"
    if "connection refused" in low:
        return "unreachable (connection refused)"
    if "domain name not found" in low or "dns resolution failed" in low or "errors resolving" in low \
            or "name or service not known" in low:
        return "unreachable (cannot resolve the host name)"
    if code == "DEADLINE_EXCEEDED" or "deadline exceeded" in low:
        return "unreachable (no answer in time)"
    if "received http2 header with status" in low or "bad content-type" in low:
        return "not a controlplane API (it answered HTTP, not gRPC)"
    if "connection attempt timed out" in low or "timeout occurred" in low:
        return "unreachable (connection timed out)"
    return _short(d) or code.lower() or "unreachable"


def _short(details: str) -> str:
    text = details
    for prefix in ("failed to connect to all addresses; last error: ",):
        if text.startswith(prefix):
            text = text[len(prefix):]
    for status in ("UNKNOWN: ", "UNAVAILABLE: "):
        if text.startswith(status):
            text = text[len(status):]
    if text.startswith(("ipv4:", "ipv6:")):  # "ipv4:127.0.0.1:7001: what" -> "what"
        parts = text.split(": ", 1)
        text = parts[1] if len(parts) == 2 else text
    if text.endswith(": OK"):
        text = text[:-4]
    return text[:200]
