"""A hand-driven peer of the Raft transport (raft/transport.py) for the hostile-peer tests: raw TCP,
TLS with a chosen certificate, the password handshake with a chosen password, raw frames."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time
from pathlib import Path

from raft import wire
from raft.peer_auth import AUTH_VERSION, NONCE_BYTES, derive_auth_key
from raft.peer_auth import mac as _mac


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def raw_connect(address: str, source_ip: str = "127.0.0.1", timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(host_port(address), timeout=timeout_s, source_address=(source_ip, 0))


def tls_connect(address: str, ca_file: Path, cert: tuple[Path, Path] | None, *, source_ip: str = "127.0.0.1",
                timeout_s: float = 5.0) -> ssl.SSLSocket:
    """A TLS 1.3 client (the server's certificate verified against ``ca_file``, no host name check)
    presenting ``cert`` (cert, key) or no certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx.wrap_socket(raw_connect(address, source_ip, timeout_s))


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def read_frame(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    """The next non-empty frame (keep-alives skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        (n,) = struct.unpack(">I", _exactly(sock, 4))
        if n:
            return _exactly(sock, n)


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the peer")
        out += chunk
    return bytes(out)


def authenticate(sock: socket.socket, claim: str, password: str) -> None:
    """Run the dialer's side of the password handshake claiming the member address ``claim``."""
    nonce = os.urandom(NONCE_BYTES)
    send_frame(sock, wire.encode({"v": AUTH_VERSION, "addr": claim, "nonce": nonce}))
    challenge = wire.decode(read_frame(sock))
    assert isinstance(challenge, dict) and isinstance(challenge.get("nonce"), bytes)
    proof = _mac(derive_auth_key(password.encode()), b"C", nonce, challenge["nonce"], claim)
    send_frame(sock, wire.encode({"mac": proof}))


def closed_within(sock: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the peer closed the connection (reading and discarding what it sends), or None
    if it was still open after ``timeout_s``."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(0.2, deadline - time.monotonic())))
        try:
            if not sock.recv(65536):
                return time.monotonic() - t0
        except (TimeoutError, socket.timeout):
            continue
        except (ssl.SSLError, OSError):
            return time.monotonic() - t0
    return None
