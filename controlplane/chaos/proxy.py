"""Fault-injecting TCP proxies (per Raft link), on 127.0.0.1 only: the chaos harness's network nemesis
and the partition tests use them (``tests/support/faultproxy.py`` re-exports this module).

Why a proxy per link (design: ``/work/shared/design/PYSYNCOBJ.md`` §4.3, §4.4): pysyncobj keeps one
TCP connection per pair of nodes, and only the node whose address string is *lexicographically
larger* dials it (``TCPTransport._shouldConnect``: ``selfNode.address > node.address``). The dial is
``TcpConnection.connect(node.ip, node.port)`` (``TCPTransport._connectIfNecessarySingle``); the
node's identity everywhere else (``Node.id``, ``node.address``, the address string the dialer sends
as its first message, ``_nodeAddrToNode``) is the address string. So a test can route a link
through a proxy by handing the dialer a peer node whose ``port`` is the proxy's port while its
address stays the real one: that is :class:`ProxiedTCPNode`. In pysyncobj 0.3.17 the only other
reader of ``node.port`` is the ``syncobj_admin`` utility client (``utility.py``); the server binds
``conf.bindAddress`` or the self node's *address* string, never its ``port`` property.

Pieces:

* :class:`LinkProxy` — one listener on ``127.0.0.1:<port>`` forwarding every accepted connection to
  ``127.0.0.1:<target_port>``, with a runtime :class:`Mode`: ``pass``, ``stall`` (stop reading and
  writing both directions, sockets stay open: packet loss + TCP retransmission as the endpoints see
  it), ``drop`` (abort current connections, accept-and-abort new ones), ``delay`` (each chunk is
  forwarded no earlier than ``delay_s`` after the proxy read it; pipelined, so it adds latency, not
  a throughput cap), ``stall-to-target`` / ``stall-to-client`` (one-way loss: only the bytes of one
  direction stop, the other direction flows). One asyncio loop in one daemon thread per proxy.
* :class:`Partitioner` — one :class:`LinkProxy` per *directed* pair ``(src, dst)`` of N nodes: the
  proxy ``src`` must connect to in order to reach ``dst``. A TCP connection carries both directions,
  so a directed proxy carries all traffic of the one connection ``src`` dials; only the proxies
  with ``src == dialer(src, dst)`` carry traffic with stock pysyncobj, the others are idle spares.
  ``cut_off``/``partition``/``set_pair`` therefore always set *both* directed proxies of a pair.
* :func:`proxied_nodes` / :func:`mapping_from_env` / :data:`ENV_VAR` — how a coordinator (in this
  process or a child process) builds its ``otherNodes``.

Starting a coordinator as a separate process::

    # parent (the test) owns the proxies
    with Partitioner(addrs) as net:
        for addr in addrs:
            env = {**os.environ, **net.env_for(addr), "PYTHONPATH": str(REPO_ROOT)}
            procs.append(subprocess.Popen([sys.executable, "-m", "...", "--self", addr,
                                           "--peers", ",".join(addrs)], env=env))
        net.cut_off(addrs[0]); ...; net.heal()

    # child (the coordinator) — ENV_VAR holds {"<peer address>": <proxy port on 127.0.0.1>, ...}
    from controlplane.chaos.proxy import mapping_from_env, proxied_nodes
    others = proxied_nodes(self_addr, peers, mapping_from_env())   # plain TCPNodes if unset
    SyncObj(self_addr, others, conf=SyncObjConf(bindAddress=self_addr, password=..., ...))

``bindAddress=self_addr`` matters: without it pysyncobj binds ``0.0.0.0`` (``_createServer``).
Production code should not import ``tests``; a coordinator that wants the hook can accept a
``peer -> connect port`` mapping in its own config and build the same 10-line node subclass.

Limits (TigerBeetle-style "a limit on everything") live in :class:`ProxyLimits`: chunk size,
queued chunks per direction, connections per proxy, connect/control timeouts, maximum delay, and
:data:`MAX_NODES` for a :class:`Partitioner`. Per connection the proxy buffers at most about
``2 * (queued_chunks + 5) * chunk_bytes`` bytes (416 KiB with the defaults); beyond that it stops
reading (TCP back-pressure).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pysyncobj.node import TCPNode

LOOPBACK = "127.0.0.1"
ENV_VAR = "CP_FAULTPROXY_PEER_PORTS"
"""Environment variable for a child coordinator: JSON object ``{"<peer address>": <port>}``; the
port is on 127.0.0.1 and is where this process must connect to reach that peer."""
MAX_NODES = 9
"""A Partitioner for N nodes runs N*(N-1) proxies, each with a thread."""


class Mode(StrEnum):
    PASS = "pass"
    STALL = "stall"
    DROP = "drop"
    DELAY = "delay"
    STALL_TO_TARGET = "stall-to-target"
    """One-way loss: bytes from the dialing side to the target stop; the reverse direction flows."""
    STALL_TO_CLIENT = "stall-to-client"
    """One-way loss: bytes from the target back to the dialing side stop."""


@dataclass(frozen=True)
class ProxyLimits:
    chunk_bytes: int = 16 * 1024
    """Largest single read from a socket, and the high-water mark of each write buffer."""
    queued_chunks: int = 8
    """Chunks queued per direction per connection between reading and writing (delay pipeline)."""
    max_connections: int = 16
    """Concurrent connections per proxy; further ones are accepted and aborted (counted refused)."""
    backlog: int = 16
    connect_timeout_s: float = 2.0
    """Proxy -> target connect."""
    control_timeout_s: float = 5.0
    """How long start/stop/set_mode wait for the proxy thread, and stop() for its join."""
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("chunk_bytes", "queued_chunks", "max_connections", "backlog"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProxyLimits.{name} must be >= 1")
        for name in ("connect_timeout_s", "control_timeout_s", "max_delay_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ProxyLimits.{name} must be > 0")


@dataclass(frozen=True)
class ProxyStats:
    mode: Mode
    delay_s: float
    accepted: int
    """Connections accepted for forwarding."""
    refused: int
    """Connections aborted on accept (mode drop, or max_connections reached)."""
    dropped: int
    """Established connections aborted by switching to drop."""
    active: int
    bytes_to_target: int
    bytes_to_client: int


@dataclass(eq=False)
class _Conn:
    task: asyncio.Task[None]
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None

    def abort(self) -> None:
        self.task.cancel()
        self.abort_transports()

    def abort_transports(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class LinkProxy:
    """Forward ``127.0.0.1:port`` to ``127.0.0.1:target_port``; the fault mode is set at runtime.

    ``start()``/``stop()`` are idempotent; a stopped proxy can be started again and keeps its port.
    ``set_mode`` is thread-safe and returns once the mode is in effect in the proxy thread (for
    ``drop``: once current connections are aborted). Call it from test threads, never from the
    proxy's own thread. ``stall`` stops new bytes; bytes already handed to the kernel still arrive,
    like packets already on the wire. Use as a context manager to get ``stop()`` on exit.
    """

    def __init__(
        self,
        target_port: int,
        listen_port: int = 0,
        *,
        name: str = "",
        limits: ProxyLimits | None = None,
    ) -> None:
        _check_port(target_port, allow_zero=False)
        _check_port(listen_port, allow_zero=True)
        self._target_port = target_port
        self._port = listen_port
        self._name = name or f"->{target_port}"
        self._limits = limits or ProxyLimits()
        self._control = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Owned by the proxy thread while running; set directly while stopped.
        self._mode = Mode.PASS
        self._delay_s = 0.0
        self._flowing: asyncio.Event | None = None
        self._flow_to_target: asyncio.Event | None = None
        self._flow_to_client: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._accepted = 0
        self._refused = 0
        self._dropped = 0
        self._bytes_to_target = 0
        self._bytes_to_client = 0

    # ---- public API (any thread but the proxy's) -------------------------------------------------

    @property
    def port(self) -> int:
        """The listening port on 127.0.0.1 (known once started, or when given explicitly)."""
        if self._port == 0:
            raise RuntimeError(f"proxy {self._name}: port unknown before start()")
        return self._port

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def target_port(self) -> int:
        return self._target_port

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> LinkProxy:
        with self._control:
            if self._thread is not None:
                return self
            sock = _listen_socket(self._port, self._limits.backlog)
            self._port = sock.getsockname()[1]
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_run_loop, args=(loop,), name=f"faultproxy {self._name}", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._call(self._serve(sock))
            except BaseException:
                sock.close()
                self._halt()
                raise
            return self

    def stop(self) -> None:
        """Close the listener and every connection, then join the thread (bounded)."""
        with self._control:
            if self._thread is None:
                return
            try:
                self._call(self._shutdown())
            except (TimeoutError, RuntimeError):
                pass  # the loop is stopped below either way; _run_loop cancels what is left
            finally:
                self._halt()

    def set_mode(self, mode: Mode | str, delay_s: float | None = None) -> None:
        """Switch mode; ``delay_s`` is required for ``delay`` and rejected otherwise."""
        mode = Mode(mode)
        delay = self._checked_delay(mode, delay_s)
        with self._control:
            if self._thread is None:
                self._mode, self._delay_s = mode, delay
                return
            if threading.current_thread() is self._thread:
                raise RuntimeError("set_mode() called from the proxy thread")
            self._call(self._set_mode(mode, delay))

    def statistics(self) -> ProxyStats:
        """A snapshot; counters are written by the proxy thread only."""
        return ProxyStats(
            mode=self._mode,
            delay_s=self._delay_s,
            accepted=self._accepted,
            refused=self._refused,
            dropped=self._dropped,
            active=len(self._conns),
            bytes_to_target=self._bytes_to_target,
            bytes_to_client=self._bytes_to_client,
        )

    def __enter__(self) -> LinkProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"LinkProxy({self._name!r}, port={self._port}, target={self._target_port}, "
                f"mode={self._mode})")

    # ---- control plumbing ---------------------------------------------------------------------

    def _checked_delay(self, mode: Mode, delay_s: float | None) -> float:
        if mode is not Mode.DELAY:
            if delay_s is not None:
                raise ValueError(f"delay_s is only valid with mode {Mode.DELAY.value!r}")
            return 0.0
        if delay_s is None or not 0 < delay_s <= self._limits.max_delay_s:
            raise ValueError(f"delay_s must be in (0, {self._limits.max_delay_s}], got {delay_s!r}")
        return float(delay_s)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            future.result(self._limits.control_timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _halt(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass  # loop already closed
        thread.join(self._limits.control_timeout_s)
        if thread.is_alive():
            raise RuntimeError(f"proxy {self._name}: thread did not stop within "
                               f"{self._limits.control_timeout_s}s")

    # ---- proxy thread -------------------------------------------------------------------------

    async def _serve(self, sock: socket.socket) -> None:
        self._flowing = asyncio.Event()
        self._flow_to_target = asyncio.Event()
        self._flow_to_client = asyncio.Event()
        self._apply_mode(self._mode, self._delay_s)
        self._server = await asyncio.start_server(
            self._on_client, sock=sock, limit=self._limits.chunk_bytes, backlog=self._limits.backlog
        )

    async def _shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._abort_all()
        if server is not None:
            await server.wait_closed()

    async def _set_mode(self, mode: Mode, delay_s: float) -> None:
        self._apply_mode(mode, delay_s)
        if mode is Mode.DROP:
            self._dropped += len(self._conns)
            await self._abort_all()

    def _apply_mode(self, mode: Mode, delay_s: float) -> None:
        assert self._flowing is not None
        assert self._flow_to_target is not None and self._flow_to_client is not None
        self._mode, self._delay_s = mode, delay_s
        if mode is Mode.STALL:
            self._flowing.clear()
        else:
            self._flowing.set()
        for event, stalled in ((self._flow_to_target, Mode.STALL_TO_TARGET), (self._flow_to_client, Mode.STALL_TO_CLIENT)):
            if mode is stalled:
                event.clear()
            else:
                event.set()

    async def _abort_all(self) -> None:
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        if conns:
            await asyncio.wait([c.task for c in conns], timeout=self._limits.control_timeout_s / 2)
        # Transports close their sockets in connection_lost, scheduled with call_soon.
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._mode is Mode.DROP or len(self._conns) >= self._limits.max_connections:
            self._refused += 1
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None and self._flowing is not None
        conn = _Conn(task=task, client=writer)
        self._conns.add(conn)
        self._accepted += 1
        try:
            await self._flowing.wait()  # stalled: the target does not even see the connection yet
            connect = asyncio.open_connection(
                LOOPBACK, self._target_port, limit=self._limits.chunk_bytes
            )
            up_reader, up_writer = await asyncio.wait_for(connect, self._limits.connect_timeout_s)
            conn.upstream = up_writer
            for w in (writer, up_writer):
                w.transport.set_write_buffer_limits(high=self._limits.chunk_bytes)
            await self._relay(reader, up_writer, up_reader, writer)
        except (OSError, TimeoutError):
            pass
        finally:
            self._conns.discard(conn)
            conn.abort_transports()

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
    ) -> None:
        size = self._limits.queued_chunks
        to_target: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(size)
        to_client: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(size)
        tasks = [
            asyncio.create_task(self._read_side(client_r, to_target, toward_target=True)),
            asyncio.create_task(self._write_side(to_target, up_w, toward_target=True)),
            asyncio.create_task(self._read_side(up_r, to_client, toward_target=False)),
            asyncio.create_task(self._write_side(to_client, client_w, toward_target=False)),
        ]
        try:
            # Ends when both directions saw EOF, or at the first error (then the link is closed).
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_side(
        self, src: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes] | None], *, toward_target: bool
    ) -> None:
        assert self._flowing is not None and self._flow_to_target is not None and self._flow_to_client is not None
        direction = self._flow_to_target if toward_target else self._flow_to_client
        loop = asyncio.get_running_loop()
        while True:
            await self._flowing.wait()
            await direction.wait()
            data = await src.read(self._limits.chunk_bytes)
            if not data:
                await queue.put(None)
                return
            delay = self._delay_s if self._mode is Mode.DELAY else 0.0
            await queue.put((loop.time() + delay, data))

    async def _write_side(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        dst: asyncio.StreamWriter,
        *,
        toward_target: bool,
    ) -> None:
        while True:
            item = await queue.get()
            if item is None:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            due, data = item
            await self._wait_flowing_until(due)
            await (self._flow_to_target if toward_target else self._flow_to_client).wait()  # type: ignore[union-attr]
            dst.write(data)
            await dst.drain()
            if toward_target:
                self._bytes_to_target += len(data)
            else:
                self._bytes_to_client += len(data)

    async def _wait_flowing_until(self, due: float) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._flowing.wait()
            remaining = due - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(remaining)


class Partitioner:
    """One :class:`LinkProxy` per directed pair of ``addresses`` (``"127.0.0.1:port"`` each).

    ``mapping_for(node)`` is what ``node`` passes to :func:`proxied_nodes`. Fault operations are
    additive: ``cut_off``/``partition`` change only the pairs they name; ``heal()`` resets all.
    """

    def __init__(self, addresses: Iterable[str], *, limits: ProxyLimits | None = None) -> None:
        nodes = tuple(addresses)
        if not 2 <= len(nodes) <= MAX_NODES:
            raise ValueError(f"need 2..{MAX_NODES} nodes, got {len(nodes)}")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate node addresses: {nodes}")
        for addr in nodes:
            _loopback_port(addr)
        self._nodes = nodes
        self._links = {
            (src, dst): LinkProxy(_loopback_port(dst), name=f"{src}->{dst}", limits=limits)
            for src in nodes
            for dst in nodes
            if src != dst
        }

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    def start(self) -> Partitioner:
        try:
            for link in self._links.values():
                link.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        errors = []
        for link in self._links.values():
            try:
                link.stop()
            except RuntimeError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Partitioner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def link(self, src: str, dst: str) -> LinkProxy:
        """The proxy ``src`` connects to in order to reach ``dst``."""
        try:
            return self._links[(src, dst)]
        except KeyError:
            raise KeyError(f"no link {src} -> {dst}; nodes are {self._nodes}") from None

    def proxy_port(self, src: str, dst: str) -> int:
        return self.link(src, dst).port

    def mapping_for(self, node: str) -> dict[str, int]:
        """``{peer address: proxy port}`` for ``node`` (input of :func:`proxied_nodes`)."""
        self._check_node(node)
        return {peer: self.proxy_port(node, peer) for peer in self._nodes if peer != node}

    def mapping(self) -> dict[str, dict[str, int]]:
        return {node: self.mapping_for(node) for node in self._nodes}

    def env_for(self, node: str) -> dict[str, str]:
        """Environment entries for a child process running ``node``."""
        return {ENV_VAR: json.dumps(self.mapping_for(node), sort_keys=True)}

    def set_link(self, src: str, dst: str, mode: Mode | str, delay_s: float | None = None) -> None:
        """One directed proxy (it carries both directions of the connection ``src`` dials)."""
        self.link(src, dst).set_mode(mode, delay_s)

    def set_pair(self, a: str, b: str, mode: Mode | str, delay_s: float | None = None) -> None:
        """Both directed proxies between ``a`` and ``b``, whichever of them dials."""
        self.set_link(a, b, mode, delay_s)
        self.set_link(b, a, mode, delay_s)

    def one_way(self, src: str, dst: str) -> None:
        """One-way loss: bytes from ``src`` to ``dst`` stop, ``dst`` -> ``src`` still flows (on the
        one connection of the pair, whichever of them dials it)."""
        self._check_node(src)
        self._check_node(dst)
        if dialer(src, dst) == src:
            self.set_link(src, dst, Mode.STALL_TO_TARGET)
        else:
            self.set_link(dst, src, Mode.STALL_TO_CLIENT)

    def cut_off(self, node: str, mode: Mode | str = Mode.STALL) -> None:
        """Isolate ``node`` from every other node; other pairs are unchanged."""
        self._check_node(node)
        for peer in self._nodes:
            if peer != node:
                self.set_pair(node, peer, mode)

    def partition(
        self, group_a: Iterable[str], group_b: Iterable[str], mode: Mode | str = Mode.STALL
    ) -> None:
        """Cut every pair with one node in each group; pairs inside a group are unchanged."""
        a, b = tuple(group_a), tuple(group_b)
        if not a or not b or set(a) & set(b):
            raise ValueError(f"groups must be non-empty and disjoint: {a} / {b}")
        for x in a:
            self._check_node(x)
            for y in b:
                self._check_node(y)
                self.set_pair(x, y, mode)

    def heal(self) -> None:
        for link in self._links.values():
            link.set_mode(Mode.PASS)

    def statistics(self) -> dict[tuple[str, str], ProxyStats]:
        return {pair: link.statistics() for pair, link in self._links.items()}

    def _check_node(self, node: str) -> None:
        if node not in self._nodes:
            raise KeyError(f"unknown node {node!r}; nodes are {self._nodes}")


# ---- pysyncobj integration ----------------------------------------------------------------------


class ProxiedTCPNode(TCPNode):
    """A peer whose identity (``id``/``address``/``host``) is its real address but which pysyncobj
    dials at ``127.0.0.1:connect_port`` (``TcpConnection.connect(node.ip, node.port)``)."""

    def __init__(self, address: str, connect_port: int) -> None:
        _loopback_port(address)
        _check_port(connect_port, allow_zero=False)
        super().__init__(address)
        self._connect_port = connect_port

    @property
    def port(self) -> int:
        return self._connect_port

    @property
    def real_port(self) -> int:
        return _loopback_port(self.address)


def dialer(a: str, b: str) -> str:
    """The node that opens the pair's TCP connection in pysyncobj (string comparison)."""
    return max(a, b)


def proxied_nodes(
    self_addr: str, peers: Iterable[str], mapping: Mapping[str, int] | None
) -> list[TCPNode]:
    """``otherNodes`` for ``SyncObj(self_addr, otherNodes, ...)``.

    ``mapping`` is ``{peer address: proxy port}`` (``Partitioner.mapping_for(self_addr)`` or
    :func:`mapping_from_env`). ``None`` means no proxies: plain ``TCPNode``s. With a mapping, every
    peer must be in it, so that no link silently bypasses the fault injection. ``self_addr`` is
    skipped if it appears in ``peers``.
    """
    others = [p for p in peers if p != self_addr]
    if mapping is None:
        return [TCPNode(p) for p in others]
    missing = [p for p in others if p not in mapping]
    if missing:
        raise ValueError(f"no proxy port for peers {missing} of {self_addr}")
    return [ProxiedTCPNode(p, int(mapping[p])) for p in others]


def mapping_from_env(environ: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """Parse :data:`ENV_VAR`; ``None`` when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not raw:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{ENV_VAR} must be a JSON object, got {type(data).__name__}")
    mapping: dict[str, int] = {}
    for peer, port in data.items():
        if not isinstance(peer, str) or isinstance(port, bool) or not isinstance(port, int):
            raise ValueError(f"{ENV_VAR}: bad entry {peer!r}: {port!r}")
        _check_port(port, allow_zero=False)
        mapping[peer] = port
    return mapping


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago (racy, fine for tests)."""
    if not 1 <= count <= 64:
        raise ValueError("count must be in 1..64")
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ---- helpers ------------------------------------------------------------------------------------


def _check_port(port: int, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if not isinstance(port, int) or not low <= port <= 65535:
        raise ValueError(f"bad port {port!r}")


def _loopback_port(address: str) -> int:
    host, sep, port = address.rpartition(":")
    if not sep or host != LOOPBACK or not port.isdigit():
        raise ValueError(f"address must be '{LOOPBACK}:<port>', got {address!r}")
    value = int(port)
    _check_port(value, allow_zero=False)
    return value


def _listen_socket(port: int, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Rebinding the same port after stop() must not fail on TIME_WAIT leftovers.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
