"""The fault-injecting proxy (tests/support/faultproxy.py): real sockets on 127.0.0.1, short
deadlines, polling instead of fixed sleeps; and one in-process 3-node pysyncobj failover through a
Partitioner."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.batteries import ReplCounter
from pysyncobj.encryptor import HAS_CRYPTO
from pysyncobj.node import TCPNode

from tests.support.faultproxy import (
    LOOPBACK,
    LinkProxy,
    Mode,
    Partitioner,
    ProxiedTCPNode,
    dialer,
    free_loopback_ports,
    mapping_from_env,
    proxied_nodes,
)

T = TypeVar("T")

IO_TIMEOUT_S = 3.0
"""Upper bound for any single expected network event (generous for 2 shared cores)."""
QUIET_S = 0.3
"""How long 'nothing arrives' is observed for stall."""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = _EchoServer((LOOPBACK, 0), _Echo)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(IO_TIMEOUT_S)


@pytest.fixture
def proxy(echo_port: int) -> Iterator[LinkProxy]:
    with LinkProxy(echo_port, name="echo") as p:
        yield p


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S)
    sock.settimeout(IO_TIMEOUT_S)
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    deadline = time.monotonic() + IO_TIMEOUT_S
    while len(buf) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _echo_roundtrip(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    return _recv_exact(sock, len(payload))


def _closed_by_peer(sock: socket.socket) -> bool:
    """True if the peer closed/reset the connection within IO_TIMEOUT_S."""
    sock.settimeout(IO_TIMEOUT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _wait_for(predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


# ---- LinkProxy -----------------------------------------------------------------------------------


def test_pass_forwards_both_directions(proxy: LinkProxy) -> None:
    with _connect(proxy.port) as sock:
        assert _echo_roundtrip(sock, b"hello") == b"hello"
        # More than the proxy buffers (several chunks in flight), sent while reading.
        payload = bytes(range(256)) * 4096  # 1 MiB
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        assert _recv_exact(sock, len(payload)) == payload
        sender.join(IO_TIMEOUT_S)
    stats = proxy.statistics()
    assert stats.accepted == 1 and stats.mode is Mode.PASS
    assert stats.bytes_to_target >= len(payload) + 5


def test_stall_holds_data_until_pass(proxy: LinkProxy) -> None:
    with _connect(proxy.port) as sock:
        assert _echo_roundtrip(sock) == b"ping"
        proxy.set_mode("stall")
        sock.sendall(b"held")
        sock.settimeout(QUIET_S)
        with pytest.raises(TimeoutError):
            sock.recv(4)
        with _connect(proxy.port) as late:  # the kernel accepts, but nothing flows
            late.sendall(b"late")
            late.settimeout(QUIET_S)
            with pytest.raises(TimeoutError):
                late.recv(4)
            proxy.set_mode(Mode.PASS)
            assert _recv_exact(sock, 4) == b"held"
            assert _recv_exact(late, 4) == b"late"
            assert _echo_roundtrip(late) == b"ping"


def test_drop_closes_connections_and_refuses_new_ones(proxy: LinkProxy) -> None:
    with _connect(proxy.port) as sock:
        assert _echo_roundtrip(sock) == b"ping"
        proxy.set_mode(Mode.DROP)
        assert _closed_by_peer(sock)
    with _connect(proxy.port) as sock:
        assert _closed_by_peer(sock)
    proxy.set_mode(Mode.PASS)
    with _connect(proxy.port) as sock:
        assert _echo_roundtrip(sock) == b"ping"
    stats = proxy.statistics()
    assert stats.dropped == 1 and stats.refused == 1 and stats.accepted == 2


def test_delay_adds_latency_per_direction(proxy: LinkProxy) -> None:
    delay_s = 0.15
    with _connect(proxy.port) as sock:
        assert _echo_roundtrip(sock) == b"ping"
        proxy.set_mode(Mode.DELAY, delay_s=delay_s)
        start = time.monotonic()
        assert _echo_roundtrip(sock) == b"ping"
        # Through the proxy twice (request and echo), each chunk held >= delay_s.
        assert time.monotonic() - start >= 2 * delay_s
        proxy.set_mode(Mode.PASS)
        assert _echo_roundtrip(sock) == b"ping"


def test_mode_arguments_are_validated(proxy: LinkProxy) -> None:
    with pytest.raises(ValueError):
        proxy.set_mode("delay")
    with pytest.raises(ValueError):
        proxy.set_mode("pass", delay_s=0.1)
    with pytest.raises(ValueError):
        proxy.set_mode("delay", delay_s=10_000)
    with pytest.raises(ValueError):
        proxy.set_mode("lose")
    assert proxy.mode is Mode.PASS


def test_stop_releases_port_and_is_idempotent(echo_port: int) -> None:
    proxy = LinkProxy(echo_port, name="stop-test")
    proxy.start()
    proxy.start()
    port = proxy.port
    sock = _connect(port)
    assert _echo_roundtrip(sock) == b"ping"
    proxy.stop()
    proxy.stop()
    assert not proxy.running
    assert not [t for t in threading.enumerate() if t.name == "faultproxy stop-test"]
    assert _closed_by_peer(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S).close()
    # The listener is gone: another socket can listen there (SO_REUSEADDR only skips TIME_WAIT).
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind((LOOPBACK, port))
    probe.listen(1)
    probe.close()
    # A stopped proxy restarts on the same port, so peers' mappings stay valid.
    with proxy:
        assert proxy.port == port
        with _connect(port) as again:
            assert _echo_roundtrip(again) == b"ping"


# ---- Partitioner and the pysyncobj hook -------------------------------------------------------


def _addresses(n: int) -> list[str]:
    return [f"{LOOPBACK}:{p}" for p in free_loopback_ports(n)]


def test_partitioner_mapping_env_and_nodes() -> None:
    addrs = _addresses(3)
    with Partitioner(addrs) as net:
        a, b, c = addrs
        mapping = net.mapping_for(a)
        assert set(mapping) == {b, c}
        ports = {net.proxy_port(s, d) for s in addrs for d in addrs if s != d}
        assert len(ports) == 6 and not ports & {int(x.rsplit(":", 1)[1]) for x in addrs}
        assert mapping_from_env(net.env_for(a)) == mapping
        assert mapping_from_env({}) is None

        nodes = proxied_nodes(a, addrs, mapping)
        assert [n.address for n in nodes] == [b, c]
        for node in nodes:
            assert isinstance(node, ProxiedTCPNode)
            assert node.port == mapping[node.address] and node.host == LOOPBACK
            assert node == TCPNode(node.address) and hash(node) == hash(TCPNode(node.address))
        assert all(type(n) is TCPNode for n in proxied_nodes(a, addrs, None))
        with pytest.raises(ValueError):
            proxied_nodes(a, addrs, {b: mapping[b]})

        net.cut_off(a)
        modes = {pair: s.mode for pair, s in net.statistics().items()}
        assert all((m is Mode.STALL) == (a in pair) for pair, m in modes.items())
        net.heal()
        net.partition([a, b], [c], mode=Mode.DROP)
        modes = {pair: s.mode for pair, s in net.statistics().items()}
        assert all((m is Mode.DROP) == (c in pair) for pair, m in modes.items())
        net.heal()
        assert all(s.mode is Mode.PASS for s in net.statistics().values())
    assert dialer(a, b) == max(a, b)
    with pytest.raises(ValueError):
        Partitioner(["localhost:1", "127.0.0.1:2"])


def _conf(self_addr: str) -> SyncObjConf:
    return SyncObjConf(
        # pysyncobj needs `cryptography` for a password; without it the test runs unencrypted
        # (still 127.0.0.1 only). Encryption does not change what the proxy sees: opaque bytes.
        password="faultproxy-test" if HAS_CRYPTO else None,
        bindAddress=self_addr,  # default would be 0.0.0.0
        raftMinTimeout=0.15,
        raftMaxTimeout=0.45,
        appendEntriesPeriod=0.04,  # validate() needs raftMinTimeout > 3 * appendEntriesPeriod
        connectionTimeout=1e9,  # stalled links stay open, as with TCP retransmission
        connectionRetryTime=0.2,
        appendEntriesUseBatch=False,
    )


def _leaders(nodes: list[SyncObj]) -> list[SyncObj]:
    return [n for n in nodes if n._isLeader()]


def _settled_leader(nodes: list[SyncObj]) -> SyncObj | None:
    """The single leader, once every node agrees on it."""
    leaders = _leaders(nodes)
    if len(leaders) != 1:
        return None
    leader = leaders[0]
    known = {str(n._getLeader()) for n in nodes}
    return leader if known == {leader.selfNode.address} else None


def test_pysyncobj_failover_and_heal_through_partitioner() -> None:
    addrs = _addresses(3)
    with Partitioner(addrs) as net:
        counters = [ReplCounter() for _ in addrs]
        nodes = [
            SyncObj(a, proxied_nodes(a, addrs, net.mapping_for(a)), conf=_conf(a), consumers=[c])
            for a, c in zip(addrs, counters)
        ]
        try:
            old = _wait_for(lambda: _settled_leader(nodes), 10, "a first leader")
            counters[nodes.index(old)].inc(sync=True, timeout=IO_TIMEOUT_S)
            _wait_for(lambda: all(c.get() == 1 for c in counters), 5, "replication to all")
            # Traffic really goes through the dialers' proxies.
            for s in addrs:
                for d in addrs:
                    if s == dialer(s, d) and s != d:
                        assert net.link(s, d).statistics().bytes_to_target > 0

            net.cut_off(old.selfNode.address)
            rest = [n for n in nodes if n is not old]
            new = _wait_for(lambda: _settled_leader(rest), 10, "a leader among the other two")
            assert new is not old and new._getTerm() > old._getTerm()
            counters[nodes.index(new)].inc(sync=True, timeout=IO_TIMEOUT_S)
            assert counters[nodes.index(old)].get() == 1  # isolated: did not see the commit

            net.heal()
            healed = _wait_for(lambda: _settled_leader(nodes), 10, "exactly one leader after heal")
            assert healed is not old or healed._getTerm() > new._getTerm()
            _wait_for(lambda: all(c.get() == 2 for c in counters), 5, "catch-up after heal")
        finally:
            for node in nodes:
                node.destroy()
            for node in nodes:
                node.destroy_synchronous()
