"""The fault hooks of the chaos processes and the proxy's one-way mode (real sockets on 127.0.0.1)."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

from controlplane.chaos.node import FaultClock
from controlplane.chaos.proxy import LinkProxy, Mode, Partitioner, dialer

IO_TIMEOUT_S = 3.0


def test_the_fault_clock_jumps_within_its_bound_and_never_runs_backwards() -> None:
    clock = FaultClock(12)
    before = clock.ms()
    assert clock.set_offset(500) == 12  # clamped to the drift bound
    assert clock.ms() >= before + 12 - 1
    high = clock.ms()
    assert clock.set_offset(-500) == -12
    assert clock.ms() >= high  # a jump back stands still instead
    assert clock.to_real_ms(1000) == 1012


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


def _recv(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


def test_one_way_modes_stop_one_direction_only() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with LinkProxy(server.server_address[1]) as proxy:
            sock = socket.create_connection(("127.0.0.1", proxy.port), IO_TIMEOUT_S)
            sock.sendall(b"a")
            assert _recv(sock, IO_TIMEOUT_S) == b"a"
            proxy.set_mode(Mode.STALL_TO_CLIENT)  # requests reach the echo server, replies do not come back
            sock.sendall(b"b")
            assert _recv(sock, 0.3) == b""
            proxy.set_mode(Mode.PASS)
            assert _recv(sock, IO_TIMEOUT_S) == b"b"  # held, not lost: TCP retransmission as seen by the ends
            proxy.set_mode(Mode.STALL_TO_TARGET)
            sock.sendall(b"c")
            assert _recv(sock, 0.3) == b""
            proxy.set_mode(Mode.PASS)
            assert _recv(sock, IO_TIMEOUT_S) == b"c"
            sock.close()
    finally:
        server.shutdown()
        server.server_close()


def test_partitioner_one_way_picks_the_dialers_proxy_and_direction() -> None:
    a, b = "127.0.0.1:20001", "127.0.0.1:20002"
    net = Partitioner([a, b])  # not started: modes are only recorded
    net.one_way(a, b)
    assert dialer(a, b) == b
    assert net.link(b, a).mode is Mode.STALL_TO_CLIENT and net.link(a, b).mode is Mode.PASS
    net.heal()
    net.one_way(b, a)
    assert net.link(b, a).mode is Mode.STALL_TO_TARGET
    time.sleep(0)
