"""Our pysyncobj transport: mutual TLS 1.3 between members, a password challenge inside it, strict
pickle-free messages, and a bound on everything a peer can make us hold or do.

Why not pysyncobj's ``TCPTransport`` (issue 14, reproduced): it buffers a frame until its announced
length arrives (2 GiB accepted, quadratic ``bytes +=``), reads a connection until EAGAIN (two slow
senders stopped all writes for ~72 s), holds half frames forever, has no connection cap, unbinds its
listener for good on ``accept()`` EMFILE, and unpickles every frame the Fernet password accepts.

How a connection becomes a Raft link (the larger address dials, as in pysyncobj; ``docs/security.md``):

1. TCP connect/accept. Inbound connections beyond ``raft_max_connections`` in total or
   ``raft_max_connections_per_ip`` from one address are accepted and closed at once (counted).
2. TLS 1.3 handshake, both sides verify the other's certificate against ``raft_tls.ca_file`` and
   require a coordinator identity: a URI SAN ``controlplane://coordinator/<node_id>``
   (:data:`controlplane.tls.COORDINATOR_URI_PREFIX`). Host names and ports are not checked, so the
   fault proxies of ``raft_dial_overrides`` can sit in the middle. Nothing is read before it ends.
3. The dialer sends ``HELLO(addr, nonce_c)``; the acceptor checks that ``addr`` is a current member
   that dials it and, when the member's node id is known (configuration), that the certificate names
   that node; it answers ``(nonce_s, HMAC_k("S"|nonce_c|nonce_s|addr))``; the dialer checks it and
   answers ``HMAC_k("C"|...)``; the acceptor checks that (constant-time compares). ``k`` is
   PBKDF2-SHA256 of the Raft password. Frames are at most 512 bytes until then.
4. Open: frames up to ``raft_max_frame_bytes`` carry :mod:`raft.wire` messages, each schema-checked,
   then offered to the :class:`InboundFilter`, then handed to pysyncobj.

All of it runs in the tick thread (pysyncobj's poller); nothing here blocks.
"""

from __future__ import annotations

import collections
import errno
import hmac
import logging
import os
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import Node, TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from controlplane.tls import COORDINATOR_URI_PREFIX
from raft import wire
from raft.link import Link, LinkLimits
from raft.peer_auth import (
    AUTH_VERSION,
    NONCE_BYTES,
    CertWatcher,
    coordinator_identity,
    derive_auth_key,
    mac as _mac,
)

log = logging.getLogger(__name__)

ACCEPT_BATCH = 16
"""Connections accepted per listener event (the rest wait for the next loop turn)."""
LISTEN_BACKLOG = 128
LOG_EVERY_S = 1.0
"""A counted refusal logs at most one line per kind per second (the rest are counted)."""

COUNTERS = (
    "tls_rejected", "identity_rejected", "password_rejected", "oversize_frames", "handshake_timeout",
    "idle_timeout", "half_frame_timeout", "connection_cap", "emfile_backoffs", "bad_messages",
    "send_queue", "filtered_messages", "dial_errors",
)


class InboundFilter(Protocol):
    """Decides, for every decoded message, whether pysyncobj sees it (e.g. vote filtering).
    ``sender`` is the sending member's Raft address (its pysyncobj identity)."""

    def admit(self, sender: str, message: object, now_s: float) -> bool: ...


class AdmitAll:
    def admit(self, sender: str, message: object, now_s: float) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class TransportSettings:
    ca_file: str
    cert_file: str
    key_file: str
    auth_key: bytes = field(repr=False)
    limits: LinkLimits
    max_connections: int
    max_connections_per_ip: int
    accept_backoff_s: float
    accept_backoff_max_s: float
    retry_s: float
    keepalive: tuple[int, int, int] = (16, 3, 5)

    @classmethod
    def from_config(cls, cfg: Any) -> TransportSettings:
        """From a :class:`controlplane.config.CoordinatorConfig` (raft_tls and the raft_* limits)."""
        if cfg.raft_tls is None or cfg.password is None:
            raise ValueError("raft_tls and password are required")
        password = cfg.password.get_secret_value().encode("utf-8")
        return cls(
            ca_file=str(cfg.raft_tls.ca_file), cert_file=str(cfg.raft_tls.cert_file), key_file=str(cfg.raft_tls.key_file),
            auth_key=derive_auth_key(password),
            limits=LinkLimits(
                max_frame=cfg.raft_max_frame_bytes, read_budget_bytes=cfg.raft_read_budget_bytes,
                read_budget_frames=cfg.raft_read_budget_frames, handshake_timeout_s=cfg.raft_handshake_timeout_ms / 1000,
                idle_timeout_s=cfg.raft_idle_timeout_ms / 1000, half_frame_timeout_s=cfg.raft_half_frame_timeout_ms / 1000,
                keepalive_s=cfg.raft_keepalive_ms / 1000, max_send_queue_bytes=cfg.raft_max_send_queue_bytes,
            ),
            max_connections=cfg.raft_max_connections, max_connections_per_ip=cfg.raft_max_connections_per_ip,
            accept_backoff_s=cfg.raft_accept_backoff_ms / 1000, accept_backoff_max_s=cfg.raft_accept_backoff_max_ms / 1000,
            retry_s=cfg.connection_retry_ms / 1000,
        )


@dataclass(frozen=True, slots=True)
class TransportStats:
    counters: dict[str, int]
    open_links: int
    pending_links: int
    accept_paused: bool


class TlsTransport(Transport):
    """pysyncobj ``Transport``, given to ``SyncObj(transportClass=...)`` through a factory that binds
    the keyword arguments (``RaftNode._build_transport``). ``expected_identity(raft_address)`` returns
    the node id a member's certificate must name, or None when unknown (a member added at run time on
    a node that did not propose it): then any coordinator certificate may claim that member's address."""

    def __init__(self, syncObj: Any, selfNode: Node | None, otherNodes: Any, *, settings: TransportSettings,  # noqa: N803
                 inbound_filter: InboundFilter | None = None,
                 expected_identity: Callable[[str], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        if not isinstance(selfNode, TCPNode):
            raise ValueError("TlsTransport needs a TCPNode self node (read-only nodes are not supported)")
        self._obj = syncObj
        self._poller = syncObj._poller
        self._self = selfNode
        self._s = settings
        self._filter: InboundFilter = inbound_filter or AdmitAll()
        self._expected = expected_identity or (lambda _addr: None)
        self._clock = clock
        self._certs = CertWatcher(settings.ca_file, settings.cert_file, settings.key_file, clock())
        self._nodes: dict[str, Node] = {}
        self._links: dict[Node, Link] = {}
        self._inbound: set[Link] = set()
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._last_dial: dict[Node, float] = {}
        self._counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._last_log: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._listener: socket.socket | None = None
        self._ready = False
        self._accept_paused_until: float | None = None
        self._backoff_s = settings.accept_backoff_s
        self._emfile_burst = 0
        self._wake_links: set[Link] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._woken = False
        self._poller.subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
        self._destroyed = False
        syncObj.addOnTickCallback(self._on_tick)
        for node in otherNodes:
            self.addNode(node)

    # --- pysyncobj Transport API --------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:  # noqa: N802
        if self._ready:
            return
        try:
            self._bind()
        except OSError as exc:
            log.warning("raft transport: cannot bind %s: %s", self._self.address, exc.strerror or exc)
            raise TransportNotReadyError from exc
        self._ready = True

    def waitReady(self) -> None:  # noqa: N802
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: Node) -> None:  # noqa: N802
        if isinstance(node, TCPNode):
            self._nodes[node.address] = node

    def dropNode(self, node: Node) -> None:  # noqa: N802
        if isinstance(node, TCPNode):
            self._nodes.pop(node.address, None)
        self._last_dial.pop(node, None)
        link = self._links.get(node)
        if link is not None:
            link.close("member removed")

    def send(self, node: Node, message: Any) -> bool:
        link = self._links.get(node)
        if link is None or link.state != "open":
            return False
        try:
            payload = wire.encode(message)
        except wire.WireError as exc:
            self._count_log("bad_messages", f"not sending a message to {node}: {exc}", logging.ERROR)
            return False
        if len(payload) > self._s.limits.max_frame:
            self._count_log("oversize_frames", f"not sending a {len(payload)}-byte message to {node}: over "
                            f"raft_max_frame_bytes = {self._s.limits.max_frame}", logging.ERROR)
            return False
        return link.send_frame(wire.frame(payload))

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for link in [*self._links.values(), *self._inbound]:
            link.close("transport destroyed")
        self._close_listener()
        self._poller.unsubscribe(self._wake_r)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # --- ours ---------------------------------------------------------------------------------------

    def statistics(self) -> TransportStats:
        links, inbound = list(self._links.values()), list(self._inbound)  # any thread: copy first
        open_links = sum(1 for link in links if link.state == "open")
        pending = sum(1 for link in [*links, *inbound] if link.state != "open")
        return TransportStats(dict(self._counts), open_links, pending, self._accept_paused_until is not None)

    def _bind(self) -> None:
        host, port = (self._obj.conf.bindAddress or self._self.address).rsplit(":", 1)
        ip = globalDnsResolver().resolve(host) or host
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ip, int(port)))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener = sock
        self._subscribe_listener()

    def _subscribe_listener(self) -> None:
        assert self._listener is not None
        self._poller.subscribe(self._listener.fileno(), self._on_accept, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._poller.unsubscribe(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def _should_dial(self, node: Node) -> bool:
        return isinstance(node, TCPNode) and self._self.address > node.address

    def _on_tick(self) -> None:
        if self._destroyed:
            return
        now = self._clock()
        if self._accept_paused_until is not None and now >= self._accept_paused_until and self._listener is not None:
            self._accept_paused_until = None
            self._subscribe_listener()
        self._certs.maybe_reload(now)
        for node in list(self._nodes.values()):
            if self._should_dial(node) and node not in self._links and \
                    now - self._last_dial.get(node, -1e9) >= self._s.retry_s:
                self._dial(node, now)
        for link in [*self._links.values(), *self._inbound]:
            link.tick(now)

    # --- wake-ups: data left over after a read budget was spent -------------------------------------

    def request_wakeup(self, link: Link) -> None:
        self._wake_links.add(link)
        if not self._woken:
            self._woken = True
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass

    def _on_wake(self, _fd: int, _event: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._woken = False
        links, self._wake_links = self._wake_links, set()
        now = self._clock()
        for link in links:
            link.service(now)

    # --- dialing and accepting ----------------------------------------------------------------------

    def _dial(self, node: Node, now: float) -> None:
        assert isinstance(node, TCPNode)
        self._last_dial[node] = now
        ip = node.ip
        if ip is None:
            return
        try:
            raw = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            self._count_log("dial_errors", f"cannot open a socket to dial {node}: {exc.strerror or exc}")
            return
        try:
            self._tune(raw)
            err = raw.connect_ex((ip, node.port))
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raw.close()
                return
            link = Link(self._poller, raw, self._certs.client, self._s.limits, self, server_side=False, now_s=now,
                        peer_ip=ip, connecting=True)
        except OSError as exc:
            raw.close()
            self._count_log("dial_errors", f"cannot dial {node}: {exc.strerror or exc}")
            return
        link.node = node
        self._links[node] = link

    def _tune(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        idle, interval, probes = self._s.keepalive
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)

    def _on_accept(self, _fd: int, _event: int) -> None:
        listener = self._listener
        if listener is None or self._accept_paused_until is not None:
            return
        for _ in range(ACCEPT_BATCH):
            try:
                raw, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                self._pause_accept(exc)  # EMFILE, ENFILE, ENOBUFS, ENOMEM...: back off, never unbind
                return
            self._accept_resumed()
            self._admit(raw, str(addr[0]))

    def _admit(self, raw: socket.socket, ip: str) -> None:
        total = len(self._inbound) + sum(1 for link in self._links.values() if link.server_side)
        if total >= self._s.max_connections or self._per_ip[ip] >= self._s.max_connections_per_ip:
            raw.close()
            which = "in total" if total >= self._s.max_connections else f"from {ip}"
            limit = self._s.max_connections if total >= self._s.max_connections else self._s.max_connections_per_ip
            self._count_log("connection_cap", f"refused a connection from {ip}: {limit} connections {which} already")
            return
        try:
            self._tune(raw)
            link = Link(self._poller, raw, self._certs.server, self._s.limits, self, server_side=True, now_s=self._clock(),
                        peer_ip=ip, connecting=False)
        except (OSError, ssl.SSLError) as exc:
            raw.close()
            log.debug("raft transport: dropped a connection from %s at accept: %s", ip, exc)
            return
        self._inbound.add(link)
        self._per_ip[ip] += 1
        link.counted = True

    def _pause_accept(self, exc: OSError) -> None:
        assert self._listener is not None
        self._counts["emfile_backoffs"] += 1
        self._poller.unsubscribe(self._listener.fileno())
        self._accept_paused_until = self._clock() + self._backoff_s
        if self._emfile_burst == 0:
            log.warning("raft transport: accept() failed on %s: %s; the listener stays bound, accepting again in "
                        "%.2fs (backing off up to %.2fs)", self._self.address,
                        errno.errorcode.get(exc.errno or 0, str(exc)), self._backoff_s, self._s.accept_backoff_max_s)
        self._emfile_burst += 1
        self._backoff_s = min(self._backoff_s * 2, self._s.accept_backoff_max_s)

    def _accept_resumed(self) -> None:
        if self._emfile_burst:
            log.warning("raft transport: accepting again on %s after %d accept() back-offs", self._self.address,
                        self._emfile_burst)
            self._emfile_burst = 0
            self._backoff_s = self._s.accept_backoff_s

    # --- LinkOwner: handshake, frames, closing ------------------------------------------------------

    def on_tls_ready(self, link: Link) -> None:
        identity = coordinator_identity(link.peer_certificate())
        if identity is None:
            link.close(f"certificate of {link.peer_ip} carries no single {COORDINATOR_URI_PREFIX}<node_id> URI",
                       "identity_rejected")
            return
        link.peer_identity = identity
        if link.server_side:
            return  # wait for HELLO
        node = link.node
        assert isinstance(node, TCPNode)
        expected = self._expected(node.address)
        if expected is not None and expected != identity:
            link.close(f"{node.address} presented coordinator {identity!r}, expected {expected!r}", "identity_rejected")
            return
        nonce = secrets.token_bytes(NONCE_BYTES)
        link.auth = {"c": nonce}
        link.send_frame(wire.frame(wire.encode({"v": AUTH_VERSION, "addr": self._self.address, "nonce": nonce})))

    def on_frame(self, link: Link, payload: bytes) -> None:
        if link.state == "open":
            self._deliver(link, payload)
            return
        try:
            msg = wire.decode(payload)
        except wire.WireError as exc:
            link.close(f"bad handshake frame: {exc}", "password_rejected")
            return
        if not isinstance(msg, dict):
            link.close("bad handshake frame", "password_rejected")
        elif link.server_side and "c" not in link.auth:
            self._on_hello(link, msg)
        elif link.server_side:
            self._on_client_proof(link, msg)
        else:
            self._on_challenge(link, msg)

    def _on_hello(self, link: Link, msg: dict[str, Any]) -> None:
        addr, nonce = msg.get("addr"), msg.get("nonce")
        if msg.get("v") != AUTH_VERSION or not isinstance(addr, str) or not isinstance(nonce, bytes) \
                or len(nonce) != NONCE_BYTES:
            link.close("malformed HELLO", "password_rejected")
            return
        node = self._nodes.get(addr)
        if node is None or self._should_dial(node):
            link.close(f"{link.peer_ip} claims {addr!r}, which is not a member that dials {self._self.address}",
                       "identity_rejected")
            return
        expected = self._expected(addr)
        if expected is not None and expected != link.peer_identity:
            link.close(f"certificate names coordinator {link.peer_identity!r} but {addr} is {expected!r}",
                       "identity_rejected")
            return
        link.node = node
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        link.auth = {"c": nonce, "s": server_nonce}
        proof = _mac(self._s.auth_key, b"S", nonce, server_nonce, addr)
        link.send_frame(wire.frame(wire.encode({"nonce": server_nonce, "mac": proof})))

    def _on_client_proof(self, link: Link, msg: dict[str, Any]) -> None:
        node = link.node
        assert isinstance(node, TCPNode)
        want = _mac(self._s.auth_key, b"C", link.auth["c"], link.auth["s"], node.address)
        got = msg.get("mac")
        if not isinstance(got, bytes) or not hmac.compare_digest(got, want):
            link.close(f"{node.address} ({link.peer_ip}) failed the password check", "password_rejected")
            return
        old = self._links.get(node)
        if old is not None and old is not link:
            old.close("replaced by a new connection from the same member")
        self._inbound.discard(link)
        self._links[node] = link
        link.open()
        self._onNodeConnected(node)

    def _on_challenge(self, link: Link, msg: dict[str, Any]) -> None:
        node = link.node
        assert isinstance(node, TCPNode)
        nonce_s, got = msg.get("nonce"), msg.get("mac")
        if not isinstance(nonce_s, bytes) or len(nonce_s) != NONCE_BYTES or not isinstance(got, bytes) or \
                not hmac.compare_digest(got, _mac(self._s.auth_key, b"S", link.auth["c"], nonce_s, self._self.address)):
            link.close(f"{node.address} failed the password check", "password_rejected")
            return
        proof = _mac(self._s.auth_key, b"C", link.auth["c"], nonce_s, self._self.address)
        link.send_frame(wire.frame(wire.encode({"mac": proof})))
        if link.state == "closed":
            return
        link.open()
        self._onNodeConnected(node)

    def _deliver(self, link: Link, payload: bytes) -> None:
        node = link.node
        assert isinstance(node, TCPNode)
        try:
            message = wire.decode_message(payload)
        except wire.WireError as exc:
            self._count_log("bad_messages", f"dropped a message from {node.address}: {exc}")
            return
        if message.get("transmission") is not None and not self._transmission_ok(link, message):
            return
        if not self._filter.admit(node.address, message, self._clock()):
            self._counts["filtered_messages"] += 1
            return
        self._onMessageReceived(node, message)

    def _transmission_ok(self, link: Link, message: dict[str, Any]) -> bool:
        """Chunks of one large entry: pysyncobj unpickles their concatenation, so check it first."""
        kind, data = message["transmission"], message["data"]
        assert isinstance(data, bytes)
        chunks = link.chunks
        if kind == "start":
            chunks.clear()
        chunks.append(data)
        if sum(len(c) for c in chunks) > self._s.limits.max_frame:
            chunks.clear()
            link.close("a chunked entry grew over raft_max_frame_bytes", "oversize_frames")
            return False
        if kind != "finish":
            return True
        problem = wire.entry_pickle_problem(b"".join(chunks))
        chunks.clear()
        if problem is not None:
            self._count_log("bad_messages", f"dropped a chunked entry from {link.node}: {problem}")
            return False
        return True

    def on_closed(self, link: Link, reason: str, counter: str | None) -> None:
        self._wake_links.discard(link)
        if link.counted:
            link.counted = False
            self._per_ip[link.peer_ip] -= 1
            if self._per_ip[link.peer_ip] <= 0:
                del self._per_ip[link.peer_ip]
        self._inbound.discard(link)
        if counter is not None:
            self._count_log(counter, f"closed the connection with {link.peer_ip}: {reason}")
        else:
            log.debug("raft transport: closed the connection with %s: %s", link.peer_ip, reason)
        node = link.node
        if node is not None and self._links.get(node) is link:
            del self._links[node]
            if link.opened:  # pysyncobj was told it connected
                self._onNodeDisconnected(node)

    def _count_log(self, counter: str, line: str, level: int = logging.WARNING) -> None:
        self._counts[counter] = self._counts.get(counter, 0) + 1
        now = self._clock()
        if now - self._last_log.get(counter, -1e9) < LOG_EVERY_S:
            self._suppressed[counter] += 1
            return
        self._last_log[counter] = now
        more = self._suppressed.pop(counter, 0)
        log.log(level, "raft transport [%s]: %s%s", counter, line, f" ({more} more since the last line)" if more else "")
