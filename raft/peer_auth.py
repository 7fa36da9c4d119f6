"""The Raft transport's authentication pieces: TLS contexts, the coordinator identity in a peer
certificate, the password key and challenge MACs, and certificate rotation (see raft/transport.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import ssl
from typing import Any

from controlplane.tls import COORDINATOR_URI_PREFIX

log = logging.getLogger("raft.transport")

AUTH_VERSION = 1
NONCE_BYTES = 32
PBKDF2_ITERATIONS = 100_000
AUTH_SALT = b"controlplane-raft-transport-auth-v1"
CERT_CHECK_S = 10.0
"""How often the certificate files are checked for rotation."""


def derive_auth_key(password: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password, AUTH_SALT, PBKDF2_ITERATIONS)


def coordinator_identity(cert: dict[str, Any]) -> str | None:
    """The node id of the single coordinator URI SAN in a peer certificate (None: none or several)."""
    ids = [value[len(COORDINATOR_URI_PREFIX):] for kind, value in cert.get("subjectAltName", ())
           if kind == "URI" and isinstance(value, str) and value.startswith(COORDINATOR_URI_PREFIX)]
    return ids[0] if len(ids) == 1 and ids[0] else None


def make_contexts(ca_file: str, cert_file: str, key_file: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts: TLS 1.3 only, certificate required on both sides, no host name check."""
    out = []
    for proto in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(proto)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(cert_file, key_file)
        ctx.load_verify_locations(cafile=ca_file)
        if proto == ssl.PROTOCOL_TLS_SERVER:
            ctx.num_tickets = 0  # no session resumption: every connection presents its certificate
        out.append(ctx)
    return out[0], out[1]


def mac(key: bytes, role: bytes, nonce_c: bytes, nonce_s: bytes, addr: str) -> bytes:
    msg = b"|".join((AUTH_SALT, role, nonce_c, nonce_s, addr.encode("utf-8")))
    return hmac.new(key, msg, hashlib.sha256).digest()


class CertWatcher:
    """The current (server, client) contexts; rebuilt when a certificate file changes (rotation:
    new connections use the new files, open ones keep theirs)."""

    def __init__(self, ca_file: str, cert_file: str, key_file: str, now_s: float) -> None:
        self._files = (ca_file, cert_file, key_file)
        self.server, self.client = make_contexts(*self._files)
        self._stamp = self._mtimes()
        self._next = now_s + CERT_CHECK_S

    def _mtimes(self) -> tuple[float, ...]:
        out = []
        for path in self._files:
            try:
                out.append(os.stat(path).st_mtime)
            except OSError:
                out.append(-1.0)
        return tuple(out)

    def maybe_reload(self, now_s: float) -> None:
        if now_s < self._next:
            return
        self._next = now_s + CERT_CHECK_S
        stamp = self._mtimes()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.server, self.client = make_contexts(*self._files)
        except (OSError, ssl.SSLError) as exc:
            log.error("raft transport: the rotated certificate files do not load (%s); keeping the old ones", exc)
            return
        log.warning("raft transport: certificate files changed; new connections use them")
