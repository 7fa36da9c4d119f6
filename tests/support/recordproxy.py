"""A recording TCP proxy on 127.0.0.1: a packet capture without root. Everything that crosses it, in
each direction, is kept in memory (bounded) for a test to inspect; the bytes are relayed unchanged.

Used by tests/security to look at what the Raft transport puts on the wire: a Raft link is routed
through it with the coordinator's ``raft_dial_overrides`` (the dialing side connects to the proxy,
which connects to the real peer).

pysyncobj frames every message as a 4-byte little-endian signed length and the payload
(``zlib(pickle(message))``, Fernet-encrypted when a password is set): :func:`frames` splits a
recorded stream into payloads and :func:`plaintexts` gives what each one decompresses to when it is
not encrypted (nothing is ever unpickled here).
"""

from __future__ import annotations

import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Self

MAX_RECORDED = 64 << 20
"""Bytes kept per direction; beyond it the proxy still relays but stops recording."""


class RecordingProxy:
    """Listens on ``127.0.0.1:<port>`` and relays every connection to ``target`` (``host:port``)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._lock = threading.Lock()
        self._sent = bytearray()  # dialer -> target
        self._received = bytearray()  # target -> dialer
        self._socks: list[socket.socket] = []
        self._stopped = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, name="recordproxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def recorded(self) -> tuple[bytes, bytes]:
        """(bytes from the dialing side, bytes from the target) so far."""
        with self._lock:
            return bytes(self._sent), bytes(self._received)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
                self.connections += 1
            for src, dst, buf in ((client, upstream, self._sent), (upstream, client, self._received)):
                threading.Thread(target=self._pump, args=(src, dst, buf), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, buf: bytearray) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    if len(buf) < MAX_RECORDED:
                        buf += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def frames(stream: bytes) -> Iterator[bytes]:
    """pysyncobj's messages in a recorded stream (a trailing partial frame is left out)."""
    at = 0
    while at + 4 <= len(stream):
        (n,) = struct.unpack("<i", stream[at:at + 4])
        if n < 0 or at + 4 + n > len(stream):
            return
        yield stream[at + 4:at + 4 + n]
        at += 4 + n


def plaintexts(stream: bytes) -> list[bytes]:
    """Every frame of ``stream`` that zlib-decompresses (an unencrypted message's pickle)."""
    out = []
    for frame in frames(stream):
        try:
            out.append(zlib.decompress(frame))
        except zlib.error:
            continue
    return out
