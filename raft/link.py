"""One TLS connection of the Raft transport, driven by pysyncobj's poller in the tick thread.

A :class:`Link` is a small state machine: ``connecting`` (outbound TCP connect in progress) ->
``tls`` (non-blocking TLS 1.3 handshake) -> ``auth`` (the transport's password challenge, tiny frames
only) -> ``open`` (pysyncobj messages) -> ``closed``. Everything it reads is bounded:

* per poller event it reads at most ``read_budget_bytes`` and hands over at most
  ``read_budget_frames`` frames, so one fast or hostile sender cannot hold the tick thread; what is
  left (in the kernel, in OpenSSL's buffer or in ours) is served on the next loop turn (the
  transport's wake-up pipe makes that turn come at once);
* a frame longer than ``max_frame`` closes the link as soon as its 4-byte header arrives (nothing
  of it is buffered); before ``open`` the limit is :data:`AUTH_MAX_FRAME`;
* the read buffer is one ``bytearray`` with a read offset (amortised linear, never ``bytes +=``);
* deadlines: handshake (connect + TLS + auth), idle (nothing read), half frame (a frame begun and
  not finished); a keep-alive ping (an empty frame) is sent when nothing was sent for ``keepalive_s``;
* the send queue is bounded by ``max_send_queue_bytes`` (a peer that stops reading is dropped and
  catches up after reconnecting, instead of growing our memory).
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Literal, Protocol

from pysyncobj.poller import POLL_EVENT_TYPE, Poller

from raft.wire import HEADER, HEADER_BYTES, PING

log = logging.getLogger(__name__)

State = Literal["connecting", "tls", "auth", "open", "closed"]
AUTH_MAX_FRAME = 512
"""Largest frame accepted before the peer has proven the password (the auth frames are ~100 bytes)."""
RECV_CHUNK = 65536
SEND_CHUNK = 65536
_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
_READ_WRITE = _READ | POLL_EVENT_TYPE.WRITE


@dataclass(frozen=True, slots=True)
class LinkLimits:
    max_frame: int
    read_budget_bytes: int
    read_budget_frames: int
    handshake_timeout_s: float
    idle_timeout_s: float
    half_frame_timeout_s: float
    keepalive_s: float
    max_send_queue_bytes: int


class LinkOwner(Protocol):
    """What a link reports to the transport (all calls in the tick thread)."""

    def on_tls_ready(self, link: Link) -> None: ...
    def on_frame(self, link: Link, payload: bytes) -> None: ...
    def on_closed(self, link: Link, reason: str, counter: str | None) -> None: ...
    def request_wakeup(self, link: Link) -> None: ...


class Link:
    def __init__(self, poller: Poller, raw: socket.socket, ctx: ssl.SSLContext, limits: LinkLimits, owner: LinkOwner,
                 *, server_side: bool, now_s: float, peer_ip: str, connecting: bool) -> None:
        self.limits = limits
        self.server_side = server_side
        self.peer_ip = peer_ip
        self.state: State = "connecting" if connecting else "tls"
        self.node: object | None = None
        """The pysyncobj node this link belongs to (set by the transport)."""
        self.auth: dict[str, bytes] = {}
        """The transport's handshake scratch (nonces)."""
        self.peer_identity: str | None = None
        self.opened = False
        """True once :meth:`open` was called (pysyncobj was told the node connected)."""
        self.counted = False
        """True while this (accepted) link counts against the per-address and total caps."""
        self.chunks: list[bytes] = []
        """Chunks of a large entry being received (checked by the transport at ``finish``)."""
        self._poller = poller
        self._ctx = ctx
        self._owner = owner
        self._raw: socket.socket | None = raw
        self._sock: ssl.SSLSocket | None = None
        self._fd = raw.fileno()
        self._created = now_s
        self._last_read = now_s
        self._last_sent = now_s
        self._frame_started: float | None = None
        self._rbuf = bytearray()
        self._rpos = 0
        self._wq: collections.deque[memoryview] = collections.deque()
        self._wq_bytes = 0
        self._inflight: memoryview | None = None
        self.max_frame = AUTH_MAX_FRAME
        self._frames_left = limits.read_budget_frames
        self._subscribed = 0
        if not connecting:
            self._wrap()
        self._subscribe(_READ_WRITE)

    # --- transport-facing ---------------------------------------------------------------------------

    @property
    def fileno(self) -> int:
        return self._fd

    def send_frame(self, framed: bytes) -> bool:
        """Queue one framed message (header included) and try to write it; False if closed."""
        if self.state == "closed":
            return False
        if self._wq_bytes + len(framed) > self.limits.max_send_queue_bytes:
            self.close(f"send queue over {self.limits.max_send_queue_bytes} bytes (peer not reading)", "send_queue")
            return False
        self._wq.append(memoryview(framed))
        self._wq_bytes += len(framed)
        if self.state in ("auth", "open"):
            self._flush()
        return self.state != "closed"

    def open(self) -> None:
        """The transport authenticated the peer: full-size frames from now on."""
        self.state = "open"
        self.opened = True
        self.max_frame = self.limits.max_frame

    def tick(self, now_s: float) -> None:
        """Deadlines and keep-alive (called every loop turn)."""
        lim = self.limits
        if self.state in ("connecting", "tls", "auth"):
            if now_s - self._created > lim.handshake_timeout_s:
                self.close(f"handshake not finished within {lim.handshake_timeout_s:g}s", "handshake_timeout")
            return
        if self.state != "open":
            return
        if now_s - self._last_read > lim.idle_timeout_s:
            self.close(f"nothing received for {lim.idle_timeout_s:g}s", "idle_timeout")
        elif self._frame_started is not None and now_s - self._frame_started > lim.half_frame_timeout_s:
            self.close(f"a frame was not completed within {lim.half_frame_timeout_s:g}s", "half_frame_timeout")
        elif now_s - self._last_sent >= lim.keepalive_s and not self._wq:
            self.send_frame(PING)

    def service(self, now_s: float) -> None:
        """Serve data left over from an earlier turn (OpenSSL's buffer, whole frames in ours)."""
        if self.state in ("auth", "open"):
            self._frames_left = self.limits.read_budget_frames
            if not self._parse(now_s):  # whole frames first (a new turn: a new frame budget)
                if self.state != "closed":
                    self._owner.request_wakeup(self)
                return
            self._read(now_s, new_turn=False)

    def close(self, reason: str, counter: str | None = None) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        if self._subscribed:
            self._poller.unsubscribe(self._fd)
            self._subscribed = 0
        for s in (self._sock, self._raw):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self._sock = self._raw = None
        self._rbuf = bytearray()
        self.chunks = []
        self._wq.clear()
        self._wq_bytes = 0
        self._owner.on_closed(self, reason, counter)

    def buffered_bytes(self) -> int:
        return len(self._rbuf) - self._rpos

    # --- poller -------------------------------------------------------------------------------------

    def _on_event(self, fd: int, event: int) -> None:
        if fd != self._fd or self.state == "closed":
            return
        now = _now()
        if self.state == "connecting":
            self._finish_connect(event)
            return
        if event & POLL_EVENT_TYPE.ERROR and not event & POLL_EVENT_TYPE.READ:
            self.close("socket error")
            return
        if self.state == "tls":
            self._handshake(now)
            return
        if event & POLL_EVENT_TYPE.WRITE:
            self._flush()
        if self.state != "closed" and event & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR):
            self._read(now)

    def _subscribe(self, mask: int) -> None:
        if self.state == "closed":
            return
        if mask != self._subscribed:
            self._poller.subscribe(self._fd, self._on_event, mask)
            self._subscribed = mask

    def _want_write(self) -> bool:
        return bool(self._wq) or self._inflight is not None

    # --- connect and TLS ----------------------------------------------------------------------------

    def _finish_connect(self, event: int) -> None:
        assert self._raw is not None
        err = self._raw.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err or event & POLL_EVENT_TYPE.ERROR:
            self.close(f"connect failed: {errno.errorcode.get(err, err)}")
            return
        if not event & POLL_EVENT_TYPE.WRITE:
            return
        self.state = "tls"
        self._wrap()
        self._handshake(_now())

    def _wrap(self) -> None:
        assert self._raw is not None
        raw, self._raw = self._raw, None
        self._sock = self._ctx.wrap_socket(raw, server_side=self.server_side, do_handshake_on_connect=False)
        self._fd = self._sock.fileno()

    def _handshake(self, now_s: float) -> None:
        assert self._sock is not None
        try:
            self._sock.do_handshake()
        except ssl.SSLWantReadError:
            self._subscribe(_READ)
            return
        except ssl.SSLWantWriteError:
            self._subscribe(_READ_WRITE)
            return
        except ssl.SSLError as exc:  # a certificate refused, a protocol violation, not TLS at all
            self.close(f"TLS handshake failed: {_short(exc)}", "tls_rejected")
            return
        except OSError as exc:  # reset or closed by the peer
            self.close(f"connection lost during the TLS handshake: {_short(exc)}")
            return
        self.state = "auth"
        self._last_read = now_s
        self._owner.on_tls_ready(self)
        if self.state != "closed":
            self._flush()
            self._read(now_s)  # the peer's first auth frame may already be here

    def peer_certificate(self) -> dict[str, object]:
        assert self._sock is not None
        return self._sock.getpeercert() or {}

    # --- reading ------------------------------------------------------------------------------------

    def _read(self, now_s: float, new_turn: bool = True) -> None:
        lim = self.limits
        if new_turn:
            self._frames_left = lim.read_budget_frames
        got = 0
        sock = self._sock
        while sock is not None and got < lim.read_budget_bytes and self.state != "closed":
            try:
                data = sock.recv(min(RECV_CHUNK, lim.read_budget_bytes - got))
            except (ssl.SSLWantReadError, BlockingIOError):
                break
            except ssl.SSLWantWriteError:
                self._subscribe(_READ_WRITE)
                break
            except (ssl.SSLError, OSError) as exc:
                self.close(f"read failed: {_short(exc)}")
                return
            if not data:
                self._parse(now_s)  # deliver what was complete before the peer closed
                self.close("closed by peer")
                return
            got += len(data)
            self._last_read = now_s
            if self._frame_started is None:
                self._frame_started = now_s
            self._rbuf += data
            if not self._parse(now_s):
                break  # frame budget spent (or closed): the rest is served on the next turn
        if self.state == "closed":
            return
        if self._leftover(sock):
            self._owner.request_wakeup(self)

    def _leftover(self, sock: ssl.SSLSocket | None) -> bool:
        if sock is None:
            return False
        if sock.pending() > 0:
            return True
        return self._complete_frame_buffered()

    def _complete_frame_buffered(self) -> bool:
        avail = len(self._rbuf) - self._rpos
        if avail < HEADER_BYTES:
            return False
        (n,) = HEADER.unpack_from(self._rbuf, self._rpos)
        return avail >= HEADER_BYTES + n or n > self.max_frame

    def _parse(self, now_s: float) -> bool:
        """Hand over complete frames (at most the frame budget); False once the budget is spent or
        the link closed. Compacts the buffer once per call."""
        frames = 0  # delivered by this call
        buf = self._rbuf
        ok = True
        while self.state != "closed":
            avail = len(buf) - self._rpos
            if avail < HEADER_BYTES:
                break
            (n,) = HEADER.unpack_from(buf, self._rpos)
            if n > self.max_frame:
                self.close(f"frame of {n} bytes announced, limit {self.max_frame}", "oversize_frames")
                return False
            if avail < HEADER_BYTES + n:
                break
            if self._frames_left <= 0:
                ok = False
                break
            start = self._rpos + HEADER_BYTES
            payload = bytes(buf[start:start + n])
            self._rpos = start + n
            frames += 1
            self._frames_left -= 1
            if n:
                self._owner.on_frame(self, payload)
        if self.state == "closed":
            return False
        if self._rpos:
            del buf[:self._rpos]
            self._rpos = 0
        if not buf:
            self._frame_started = None
        elif frames:
            self._frame_started = now_s  # the unfinished frame behind the delivered ones
        return ok

    # --- writing ------------------------------------------------------------------------------------

    def _flush(self) -> None:
        sock = self._sock
        while sock is not None and self.state != "closed" and (self._inflight is not None or self._wq):
            if self._inflight is None:
                head = self._wq.popleft()
                if len(head) > SEND_CHUNK:
                    self._wq.appendleft(head[SEND_CHUNK:])
                    head = head[:SEND_CHUNK]
                self._inflight = head
            piece = self._inflight
            try:
                n = sock.send(piece)
            except (ssl.SSLWantWriteError, BlockingIOError):
                break
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, OSError) as exc:
                self.close(f"write failed: {_short(exc)}")
                return
            self._wq_bytes -= n
            self._inflight = None if n >= len(piece) else piece[n:]
            self._last_sent = _now()
        if self.state != "closed":
            self._subscribe(_READ_WRITE if self._want_write() else _READ)


def _now() -> float:
    import time

    return time.monotonic()


def _short(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    text = str(exc) or type(exc).__name__
    return text[:120]
