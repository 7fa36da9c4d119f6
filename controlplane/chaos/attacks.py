"""The attackers of ``controlplane bench hostile``: raw sockets, files and API calls aimed at the
processes the bench started on 127.0.0.1 (``hostile_run.py`` decides when and against whom; the
verdicts are in ``hostile.py``). Every loop here is bounded in count and in time and stops by itself.

Format knowledge is kept in one place each, so that the bench keeps working when the code it
attacks changes: :func:`journal_paths` (the Raft files in a member's data directory),
:func:`adapter_channel` (how to reach an adapter: its token, TLS), :data:`FRAME_HEADER` (pysyncobj's
4-byte little-endian length prefix; an authenticated transport refuses the bytes before that matters).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import resource
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from controlplane.procfs import open_fds, rss_kib

FRAME_HEADER = struct.Struct("<i")
"""pysyncobj frames a message as a 4-byte signed native (little-endian here) length, then the bytes."""
CHUNK = 16 * 1024
CONNECT_TIMEOUT_S = 0.3
JOURNAL_FILE, META_SUFFIX = "raft.journal", ".meta"
PYSYNCOBJ_HEADER = b"PYSYNCOBJ"
PYSYNCOBJ_LAST_RECORD_OFFSET = 24 + 8 + 4
"""pysyncobj's FileJournal header: name (24), version (8), format (4), then the last record's offset."""
FLIP_PATTERN = re.compile(rb'"priority":1([,}])')
"""A tenant the chaos client created (priority 1) inside a committed entry: the digit is flipped to 7."""


# --- process figures --------------------------------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    kib = rss_kib(pid)
    return None if kib is None else round(kib / 1024, 1)


def limit_fds(pid: int, limit: int) -> None:
    """Lower ``pid``'s RLIMIT_NOFILE (soft and hard) to ``limit`` (``prlimit(2)``)."""
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))


def raise_own_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(wanted, soft), hard), hard))


def count_tracebacks(path: Path) -> int:
    try:
        return path.read_bytes().count(b"Traceback")
    except OSError:
        return 0


def split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"hostile attacks target 127.0.0.1 only, not {address}")
    return host, int(port)


# --- Raft port: oversized, trickled and half frames -------------------------------------------------


@dataclass
class FrameStats:
    sent_bytes: int = 0
    dropped_by_peer: int = 0
    """Connections the member closed or reset (a bounded transport drops such a sender)."""
    connect_errors: int = 0


class FrameFlood:
    """``senders`` connections that announce ``announced``-byte frames and trickle their bodies at
    ``rate_bps`` each (after ``preload`` bytes at full speed), plus one connection that sends half of
    a ``2 * half_bytes`` frame and then holds it open. Stops at ``deadline`` (monotonic) or
    :meth:`stop`; every socket is closed then."""

    def __init__(self, address: str, *, senders: int, rate_bps: int, announced: int, preload: int,
                 half_bytes: int, deadline: float) -> None:
        self.address = split(address)
        self.senders, self.rate_bps, self.announced, self.preload = senders, rate_bps, announced, preload
        self.half_bytes, self.deadline = half_bytes, deadline
        self.stats = FrameStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._trickle, name=f"hostile-frame-{i}", daemon=True)
                         for i in range(senders)]
        self._threads.append(threading.Thread(target=self._half, name="hostile-half-frame", daemon=True))

    def start(self) -> FrameFlood:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5.0)

    def _count(self, n: int) -> None:
        with self._lock:
            self.stats.sent_bytes += n

    def _connect(self) -> socket.socket | None:
        try:
            return socket.create_connection(self.address, timeout=1.0)
        except OSError:
            with self._lock:
                self.stats.connect_errors += 1
            return None

    def _send(self, sock: socket.socket, data: bytes) -> None:
        """Send ``data``; a receiver that stops reading (a full window) is waited for, not a drop."""
        view = memoryview(data)
        while view and not self._stop.is_set() and time.monotonic() < self.deadline:
            try:
                n = sock.send(view)
            except TimeoutError:
                continue
            self._count(n)
            view = view[n:]

    def _trickle(self) -> None:
        sock = self._connect()
        if sock is None:
            return
        chunk = b"\x00" * CHUNK
        try:
            sock.settimeout(0.5)
            self._send(sock, FRAME_HEADER.pack(self.announced))
            sent = 0
            while sent < self.preload and not self._stop.is_set() and time.monotonic() < self.deadline:
                self._send(sock, chunk)
                sent += CHUNK
            pace = CHUNK / max(1, self.rate_bps)
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                self._send(sock, chunk)
                self._stop.wait(pace)
        except OSError:  # the member closed or reset the connection
            with self._lock:
                self.stats.dropped_by_peer += 1
        finally:
            sock.close()

    def _half(self) -> None:
        sock = self._connect()
        if sock is None:
            return
        try:
            sock.sendall(FRAME_HEADER.pack(2 * self.half_bytes) + b"\x00" * self.half_bytes)
            self._count(self.half_bytes)
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                self._stop.wait(0.2)
                sock.settimeout(0.0)
                try:
                    if sock.recv(1) == b"":
                        raise ConnectionResetError("closed by the member")
                except BlockingIOError:
                    pass
        except OSError:
            with self._lock:
                self.stats.dropped_by_peer += 1
        finally:
            sock.close()


# --- descriptors: connect until refused -------------------------------------------------------------


@dataclass
class FdHog:
    """Connections held open against a member, opened by :meth:`open` and closed by :meth:`release`."""

    socks: list[socket.socket] = field(default_factory=list)
    refused: str = ""
    timeouts: int = 0

    def open(self, address: str, most: int, deadline: float, *, stop_when: Callable[[], bool] = lambda: False) -> int:
        """Connect to ``address`` until refused, ``most`` attempts, ``deadline`` (monotonic) or
        ``stop_when()``; returns how many this call opened. A connection that times out (the member
        is slow to accept, its backlog is full) is counted and the next one tried."""
        target = split(address)
        n = 0
        for _ in range(most):
            if stop_when() or time.monotonic() > deadline:
                break
            try:
                s = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
            except TimeoutError:
                self.timeouts += 1
                continue
            except OSError as exc:
                self.refused = f"{type(exc).__name__}: {exc}"
                break
            self.socks.append(s)
            n += 1
        return n

    def release(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()
        self.socks.clear()


def accepts(address: str, timeout_s: float = 1.0) -> bool:
    """A TCP connection to ``address`` is accepted and not closed right away by the other side."""
    try:
        with socket.create_connection(split(address), timeout=timeout_s) as s:
            s.settimeout(0.2)
            try:
                return s.recv(1) != b""  # b"": closed by the peer (nobody there to read)
            except TimeoutError:
                return True
    except OSError:
        return False


# --- journal corruption -----------------------------------------------------------------------------


def journal_paths(data_dir: Path) -> tuple[Path, Path]:
    """The member's Raft journal and its metadata file."""
    journal = data_dir / JOURNAL_FILE
    return journal, Path(str(journal) + META_SUFFIX)


def _used_length(data: bytes) -> int:
    """How much of the journal file holds records (pysyncobj's header says; else the whole file)."""
    if data.startswith(PYSYNCOBJ_HEADER) and len(data) >= PYSYNCOBJ_LAST_RECORD_OFFSET + 4:
        (last,) = struct.unpack_from("<I", data, PYSYNCOBJ_LAST_RECORD_OFFSET)
        if 0 < last <= len(data):
            return last
    return len(data)


def corrupt(data_dir: Path, variant: str, seed: int) -> str:
    """Change the member's files (it must be stopped); returns what was done, for the report."""
    journal, meta = journal_paths(data_dir)
    if not journal.is_file():
        raise FileNotFoundError(f"no {journal.name} in {data_dir}")
    if variant == "empty_meta":
        if not meta.is_file():
            raise FileNotFoundError(f"no {meta.name} in {data_dir}")
        meta.write_bytes(b"")
        return f"{meta.name}: emptied"
    data = bytearray(journal.read_bytes())
    used = _used_length(bytes(data))
    if variant == "truncate":
        keep = max(1, used // 2)
        with open(journal, "r+b") as f:
            f.truncate(keep)
        return f"{journal.name}: truncated from {len(data)} to {keep} bytes (records ended at {used})"
    if variant == "garbage":
        rng = random.Random(seed)
        start = max(64, used // 3)
        n = max(0, min(4096, used - start))
        data[start:start + n] = bytes(rng.randrange(256) for _ in range(n))
        journal.write_bytes(bytes(data))
        return f"{journal.name}: {n} random bytes at offset {start} (records end at {used})"
    if variant == "flip":
        hits = [m for m in FLIP_PATTERN.finditer(bytes(data[:used]))]
        if hits:
            m = hits[len(hits) // 2]  # an old entry, long committed
            at = m.start(1) - 1
            data[at:at + 1] = b"7"
            journal.write_bytes(bytes(data))
            return f"{journal.name}: '\"priority\":1' -> 7 at offset {at} (entry {len(hits) // 2 + 1} of {len(hits)} tenant writes)"
        at = used // 2
        data[at] ^= 0x01
        journal.write_bytes(bytes(data))
        return f"{journal.name}: no tenant write visible in the file; flipped one bit at offset {at}"
    raise ValueError(f"variant: unknown {variant!r}")


# --- disk full --------------------------------------------------------------------------------------


def mount_tmpfs(path: Path, mib: int) -> None:
    if os.geteuid() != 0:
        raise PermissionError("disk_full needs root (it mounts a small tmpfs for one member's data "
                              "directory); run the bench as root or leave the attack out with --attacks")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(path)],
                   check=True, capture_output=True, timeout=10)


def unmount(path: Path) -> None:
    r = subprocess.run(["umount", str(path)], capture_output=True, timeout=10)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


def fill(path: Path, most_bytes: int) -> int:
    """Write ``path/hostile.fill`` until the file system is full (at most ``most_bytes``); returns
    the bytes left free."""
    with open(path / "hostile.fill", "wb", buffering=0) as f:
        written = 0
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            block = b"\x00" * size
            while written < most_bytes:
                try:
                    written += f.write(block)
                except OSError:
                    break
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# --- adapters: forged fences ------------------------------------------------------------------------


def adapter_channel(config: Path) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """A channel to the adapter of ``config`` as a token holder would open it: its bearer token
    when it has one, TLS (trusting the adapter's own certificate, no client certificate) when it
    serves TLS. Returns the channel and the call metadata."""
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    address = cfg["listen"]
    split(address)
    metadata: tuple[tuple[str, str], ...] = ()
    if cfg.get("auth_token_file"):
        token = Path(cfg["auth_token_file"]).read_text(encoding="utf-8").strip()
        metadata = (("authorization", f"Bearer {token}"),)
    tls = cfg.get("tls") or {}
    if tls.get("cert_file"):
        root = Path(tls.get("ca_file") or tls["cert_file"]).read_bytes()
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root)), metadata
    return grpc.insecure_channel(address), metadata


def adapter_call(config: Path, method: str, request: Any, timeout_s: float = 3.0) -> str:
    """Call ``ClusterAdapter.method`` on the adapter of ``config``; the gRPC code name it answered."""
    from controlplane.api.v1 import adapter_pb2_grpc

    channel, metadata = adapter_channel(config)
    try:
        getattr(adapter_pb2_grpc.ClusterAdapterStub(channel), method)(request, timeout=timeout_s, metadata=metadata)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name
    finally:
        channel.close()


# --- tenants: watch and object floods ---------------------------------------------------------------


class WatchFlood:
    """``once`` ``Watch(once=True, since_revision=0)`` streams (all at once, each read to its end) and
    ``live`` live watches held open until :meth:`stop`, spread over ``endpoints``, as one tenant."""

    def __init__(self, endpoints: list[str], token: str, *, once: int, live: int, deadline: float) -> None:
        from controlplane.api.channel import open_channel

        self.channels = [open_channel(ep, token=token) for ep in endpoints]
        self.once, self.live, self.deadline = once, live, deadline
        self.codes: dict[str, int] = {}
        self.opened = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._calls: list[Any] = []
        self._threads: list[threading.Thread] = []

    def _note(self, code: str) -> None:
        with self._lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def _watch(self, i: int, once: bool) -> None:
        from controlplane.api.v1 import api_pb2, api_pb2_grpc

        stub = api_pb2_grpc.ScalingStub(self.channels[i % len(self.channels)])
        timeout = max(0.5, self.deadline - time.monotonic())
        call = stub.Watch(api_pb2.WatchRequest(once=once, since_revision=0, all=True), timeout=timeout)  # every event: the heaviest read
        with self._lock:
            self._calls.append(call)
            self.opened += 1
        try:
            for _ in call:
                if self._stop.is_set():
                    break
            self._note("OK")
        except grpc.RpcError as err:
            self._note("OPEN" if err.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED) and not once
                       else err.code().name)

    def start(self) -> WatchFlood:
        for i in range(self.live):
            self._threads.append(threading.Thread(target=self._watch, args=(i, False), daemon=True))
        for i in range(self.once):
            self._threads.append(threading.Thread(target=self._watch, args=(i, True), daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            calls = list(self._calls)
        for c in calls:
            c.cancel()
        for t in self._threads:
            t.join(max(0.1, min(5.0, self.deadline + 5.0 - time.monotonic())))
        for ch in self.channels:
            ch.close()


def try_watch(endpoint: str, token: str, bound_s: float) -> str:
    """A live watch of another tenant: ``OK`` (ended), ``OPEN`` (still open when ``bound_s`` passed:
    it was admitted), or the code it was refused with."""
    from controlplane.api.channel import open_channel
    from controlplane.api.v1 import api_pb2, api_pb2_grpc

    channel = open_channel(endpoint, token=token)
    try:
        call = api_pb2_grpc.ScalingStub(channel).Watch(api_pb2.WatchRequest(once=False), timeout=bound_s)
        for _ in call:
            pass
        return "OK"
    except grpc.RpcError as err:
        return "OPEN" if err.code() is grpc.StatusCode.DEADLINE_EXCEEDED else err.code().name
    finally:
        channel.close()


def timed_status(endpoint: str, token: str, timeout_s: float) -> float | None:
    """ms for an admin ``Status`` on ``endpoint``; None when it did not answer within ``timeout_s``."""
    from controlplane.api.channel import open_channel
    from controlplane.api.v1 import admin_pb2, admin_pb2_grpc

    channel = open_channel(endpoint, token=token)
    t0 = time.monotonic()
    try:
        admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=timeout_s)
        return (time.monotonic() - t0) * 1000
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def health(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """grpc.health.v1 Check of a coordinator: ``SERVING``, ``NOT_SERVING``... or None (no answer)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(endpoint)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError:
        return None
    finally:
        channel.close()
