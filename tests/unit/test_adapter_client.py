"""The coordinators' side of the observation stream: RemoteObservations against real adapter servers
(scripted backends, pumped by hand), and ClockMap.

Every adapter here runs ``serve_adapter`` with a one-minute observe interval: its hub thread pumps
once at start, and the test pumps every further batch itself (``server.hub.pump()``). Waiting for a
batch to cross the real gRPC stream is a bounded poll (:func:`tests.support.waiting.wait_until`), never a fixed sleep.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.client import SAMPLE_MAX_AGE_MS, ClockMap, RemoteObservations
from adapters.service import AdapterServer, serve_adapter
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.runtime.clock import wall_ms
from tests.support.waiting import wait_until

OFFSET = -10**12
"""The coordinator's clock runs this far behind the adapters' clocks."""


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class QueueBackend:
    """Backend fake: ``observe`` returns the next queued Observations (or builds it from a callable
    of ``now_ms``), else an empty one. Commands are ignored."""

    def __init__(self) -> None:
        self.queue: deque[Observations | Callable[[int], Observations]] = deque()
        self._lock = threading.Lock()

    def apply(self, command, now_ms: int) -> None:
        pass

    def scale(self, command, now_ms: int) -> None:
        pass

    def observe(self, now_ms: int) -> Observations:
        with self._lock:
            nxt = self.queue.popleft() if self.queue else None
        if nxt is None:
            return Observations(now_ms)
        return nxt(now_ms) if callable(nxt) else nxt

    def close(self) -> None:
        pass


def sample(iid: str, at_ms: int, running: int = 2, dep: str = "d1") -> InstanceSample:
    return InstanceSample(iid, dep, at_ms, running, 1, 0.25, 100.0, 200.0, 55.0, 1, 2, True)


class Adapters:
    """Starts scripted adapter servers and stops them all at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self.servers: list[AdapterServer] = []

    def start(self, cluster_id: str, clock: Callable[[], int], address: str = "127.0.0.1:0",
              backend: QueueBackend | None = None, **security) -> tuple[AdapterServer, QueueBackend]:
        backend = backend or QueueBackend()
        server = serve_adapter(cluster_id, address, self._tmp / f"state-{cluster_id}", backend,
                               observe_interval_ms=60_000, ring_s=3_600, clock_ms=clock, **security)
        self.servers.append(server)
        hub = server.hub
        assert hub is not None
        wait_until(lambda: len(hub.after(0, timeout_s=0)) == 1, what="the hub thread's first pump")
        return server, backend

    def stop_all(self) -> None:
        for s in self.servers:
            s.stop(0.1)


@pytest.fixture
def adapters(tmp_path: Path):
    a = Adapters(tmp_path)
    yield a
    a.stop_all()


@pytest.fixture
def observations():
    """RemoteObservations factory; every one made is closed at the end."""
    made: list[RemoteObservations] = []

    def make(addresses: dict[str, str], clock: Callable[[], int], start: bool = True, **security) -> RemoteObservations:
        obs = RemoteObservations(addresses, clock, reconnect_max_s=0.2, **security)
        made.append(obs)
        if start:
            obs.start()
        return obs

    yield make
    for obs in made:
        obs.close()


def addr(server: AdapterServer) -> str:
    return f"127.0.0.1:{server.port}"


def pumped(obs: RemoteObservations, server: AdapterServer, local: FakeClock | None = None,
           local_now: int | None = None) -> None:
    """Pump one batch on ``server`` and wait until the client has received it (the local clock is set
    first, so the receive time is known)."""
    if local is not None and local_now is not None:
        local.now = local_now
    before = obs.batches_received
    server.hub.pump()
    wait_until(lambda: obs.batches_received == before + 1, what="the batch to arrive")


# --- ClockMap ------------------------------------------------------------------------------------------


def test_clock_map_offset_is_the_minimum_of_the_last_window() -> None:
    m = ClockMap(window=3)
    assert m.offset() is None
    m.observe(1_000, 1_050)  # 50
    assert m.offset() == 50
    m.observe(2_000, 2_020)  # 20
    m.observe(3_000, 3_090)  # 90
    assert m.offset() == 20
    m.observe(4_000, 4_070)  # 70: the window is now 20, 90, 70
    assert m.offset() == 20
    m.observe(5_000, 5_080)  # 80: 20 has left the window
    assert m.offset() == 70
    m.observe(6_000, 6_000 + OFFSET)  # a remote clock far ahead of the local one
    assert m.offset() == OFFSET


# --- RemoteObservations over real streams ----------------------------------------------------------------


def test_sample_times_are_mapped_onto_the_local_clock_never_after_receipt(adapters, observations) -> None:
    server, backend = adapters.start("c1", wall_ms)  # the adapter stamps with the real wall clock
    receipts: list[int] = []

    def local() -> int:
        now = wall_ms() + OFFSET
        receipts.append(now)
        return now

    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    for _ in range(3):
        backend.queue.append(lambda now: Observations(now, (sample("i1", now),)))
        pumped(obs, server)
    received_at = receipts[-1]  # the client reads its clock once per batch
    got = obs.gather(local())
    (s,) = got.samples
    assert s.at_ms <= received_at
    assert received_at - s.at_ms < 1_000  # near the local clock, not 10**12 ms away
    assert abs(got.at_ms - s.at_ms) < 2_000
    assert obs.connected == {"c1": True}


def test_offset_uses_the_fastest_recent_batch(adapters, observations) -> None:
    adapter = FakeClock(2 * 10**12)
    local = FakeClock(adapter.now + OFFSET + 5)  # the first batch arrives 5 ms "late"
    server, backend = adapters.start("c1", adapter)
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    adapter.now += 1_000
    backend.queue.append(Observations(adapter.now, (sample("i1", adapter.now),),
                                      (InstanceReport("i1", "warmed", adapter.now - 100),)))
    pumped(obs, server, local, adapter.now + OFFSET + 40)  # this one 40 ms late
    got = obs.gather(local.now)
    (s,) = got.samples
    assert s.at_ms == adapter.now + OFFSET + 5  # mapped with the smallest difference seen
    assert [(r.instance_id, r.event, r.at_ms) for r in got.reports] == [("i1", "warmed", adapter.now - 100 + OFFSET + 5)]
    assert (s.running, s.waiting, s.kv_usage, s.ttft_p99_ms, s.gpu_mem_total_bytes) == (2, 1, 0.25, 55.0, 2)


def test_the_newest_sample_is_held_between_batches_then_dropped_when_old(adapters, observations) -> None:
    adapter = FakeClock(3 * 10**12)
    local = FakeClock(adapter.now + OFFSET)
    server, backend = adapters.start("c1", adapter)
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    adapter.now += 250
    backend.queue.append(Observations(adapter.now, (sample("i1", adapter.now, running=1), sample("i2", adapter.now))))
    pumped(obs, server, local, adapter.now + OFFSET)
    t1 = local.now
    adapter.now += 250
    backend.queue.append(Observations(adapter.now, (sample("i1", adapter.now, running=7),)))  # i2 not in this one
    pumped(obs, server, local, adapter.now + OFFSET)
    t2 = local.now
    adapter.now += 250
    pumped(obs, server, local, adapter.now + OFFSET)  # an empty batch: the values are held
    held = obs.gather(local.now)
    assert [(s.instance_id, s.running, s.at_ms) for s in held.samples] == [("i1", 7, t2), ("i2", 2, t1)]
    assert [s.instance_id for s in obs.gather(t1 + SAMPLE_MAX_AGE_MS).samples] == ["i1", "i2"]
    assert [s.instance_id for s in obs.gather(t1 + SAMPLE_MAX_AGE_MS + 1).samples] == ["i1"]
    assert obs.gather(t2 + SAMPLE_MAX_AGE_MS + 1).samples == ()
    assert obs.gather(t2).samples == ()  # dropped for good, not resurrected by an earlier "now"


def test_reports_are_returned_by_exactly_one_gather(adapters, observations) -> None:
    adapter = FakeClock(10**13)
    local = FakeClock(adapter.now + OFFSET)
    server, backend = adapters.start("c1", adapter)
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    adapter.now += 250
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i1", "start_warmup", adapter.now - 10),
                                                        InstanceReport("i2", "lost", adapter.now - 5, "node gone"))))
    pumped(obs, server, local, adapter.now + OFFSET)
    adapter.now += 250
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i1", "warmed", adapter.now),)))
    pumped(obs, server, local, adapter.now + OFFSET)
    first = obs.gather(local.now)
    assert [(r.instance_id, r.event, r.detail) for r in first.reports] == [
        ("i1", "start_warmup", ""), ("i2", "lost", "node gone"), ("i1", "warmed", "")]
    assert obs.gather(local.now).reports == ()
    adapter.now += 250
    pumped(obs, server, local, adapter.now + OFFSET)
    assert obs.gather(local.now).reports == ()


def test_gateway_queues_sum_across_clusters_and_follow_the_newest_batch(adapters, observations) -> None:
    a1, a2 = FakeClock(10**12), FakeClock(10**12 + 77)
    local = FakeClock(10)
    s1, b1 = adapters.start("c1", a1)
    s2, b2 = adapters.start("c2", a2)
    obs = observations({"c1": addr(s1), "c2": addr(s2)}, local)
    wait_until(lambda: obs.batches_received == 2, what="both first batches")
    b1.queue.append(Observations(a1.now, (), (), (("d1", 3), ("d2", 1))))
    pumped(obs, s1)
    b2.queue.append(Observations(a2.now, (), (), (("d1", 4),)))
    pumped(obs, s2)
    assert obs.gather(local.now).gateway_waiting == (("d1", 7), ("d2", 1))
    assert obs.gather(local.now).gateway_waiting == (("d1", 7), ("d2", 1))  # a level, not an event
    pumped(obs, s1)  # c1's queues are empty now
    assert obs.gather(local.now).gateway_waiting == (("d1", 4),)
    b2.queue.append(Observations(a2.now, (), (), (("d1", 2),)))
    pumped(obs, s2)
    assert obs.gather(local.now).gateway_waiting == (("d1", 2),)


def test_the_client_reconnects_to_a_restarted_adapter(adapters, observations, tmp_path: Path) -> None:
    adapter = FakeClock(4 * 10**12)
    local = FakeClock(adapter.now + OFFSET)
    server, backend = adapters.start("c1", adapter)
    port = server.port
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i1", "warmed", adapter.now),)))
    pumped(obs, server)
    old_stream = server.hub.stream_id
    assert [r.event for r in obs.gather(local.now).reports] == ["warmed"]
    server.stop(0.1)
    wait_until(lambda: not obs.connected["c1"], what="the client to notice the adapter is gone")

    restarted, backend2 = adapters.start("c1", adapter, address=f"127.0.0.1:{port}")
    assert restarted.hub.stream_id != old_stream
    # The restarted adapter's ring starts again at seq 1: the client must take it from the start,
    # although it had already seen seq 2 of the old stream.
    wait_until(lambda: obs.connected["c1"] and obs.batches_received >= 3, what="the reconnection")
    adapter.now += 250
    local.now += 250
    backend2.queue.append(Observations(adapter.now, (sample("i2", adapter.now),),
                                       (InstanceReport("i2", "start_warmup", adapter.now),)))
    pumped(obs, restarted)
    got = obs.gather(local.now)
    assert [(r.instance_id, r.event) for r in got.reports] == [("i2", "start_warmup")]
    assert "i2" in [s.instance_id for s in got.samples]


def test_a_broken_stream_resumes_after_the_last_batch_without_duplicates(adapters, observations) -> None:
    adapter = FakeClock(5 * 10**12)
    local = FakeClock(adapter.now + OFFSET)
    server, backend = adapters.start("c1", adapter)
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i1", "warmed", adapter.now),)))
    pumped(obs, server)
    assert [r.instance_id for r in obs.gather(local.now).reports] == ["i1"]
    with obs._lock:
        broken = obs._calls["c1"]
    broken.cancel()  # the stream breaks (as on a network blip); the adapter keeps its ring
    wait_until(lambda: not obs.connected["c1"], what="the client to notice")
    wait_until(lambda: obs._calls["c1"] is not broken, what="the client to reconnect")
    before = obs.batches_received
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i2", "warmed", adapter.now),)))
    server.hub.pump()
    wait_until(lambda: obs.batches_received > before, what="the next batch")
    assert [r.instance_id for r in obs.gather(local.now).reports] == ["i2"]  # i1 not delivered again
    assert obs.batches_received == before + 1 == 3


def test_recent_returns_mapped_observations_oldest_first_and_skips_unreachable_adapters(adapters, observations) -> None:
    a1, a2 = FakeClock(6 * 10**12), FakeClock(6 * 10**12)
    s1, b1 = adapters.start("c1", a1)  # first batch at T
    s2, b2 = adapters.start("c2", a2)
    T = a1.now
    for k in range(1, 4):  # c1 at T+1000, T+2000, T+3000; c2 at T+1500, T+2500, T+3500
        a1.now = T + 1000 * k
        b1.queue.append(Observations(a1.now, (sample("c1-i", a1.now),)))
        s1.hub.pump()
        a2.now = T + 1000 * k + 500
        b2.queue.append(Observations(a2.now, (sample("c2-i", a2.now),)))
        s2.hub.pump()
    a1.now = a2.now = T + 4000
    local = FakeClock(T + 4000 + OFFSET)
    obs = observations({"c1": addr(s1), "c2": addr(s2), "c3": "127.0.0.1:1"}, local, start=False)
    started = time.monotonic()
    got = obs.recent(T + 1800 + OFFSET)
    assert time.monotonic() - started < 2.0  # the unreachable adapter is skipped, not waited for long
    assert [o.at_ms - OFFSET - T for o in got] == [2000, 2500, 3000, 3500]
    assert [[s.instance_id for s in o.samples] for o in got] == [["c1-i"], ["c2-i"], ["c1-i"], ["c2-i"]]
    assert all(s.at_ms == o.at_ms for o in got for s in o.samples)
    assert len(obs.recent(T + OFFSET)) == 8  # both rings, including the thread's first batches


def test_close_returns_promptly(adapters, observations) -> None:
    adapter = FakeClock(10**12)
    server, _ = adapters.start("c1", adapter)
    obs = RemoteObservations({"c1": addr(server), "c9": "127.0.0.1:1"}, FakeClock(0), reconnect_max_s=0.2)
    obs.start()
    wait_until(lambda: obs.batches_received == 1, what="the first batch")
    started = time.monotonic()
    obs.close()
    assert time.monotonic() - started < 2.0
    assert not any(t.is_alive() for t in obs._threads)


def test_ring_buffer_batches_sent_at_connect_keep_their_age(adapters, observations) -> None:
    """A coordinator that (re)connects first receives the adapter's ring buffer. A report from a
    minute ago must be mapped a minute into the past, not to the moment it arrived: otherwise it
    would pass ``facts``' "older than the instance's state" check as if it had just happened."""
    adapter = FakeClock(6 * 10**12)
    server, backend = adapters.start("c1", adapter)  # the hub's first pump, at t0
    old_at = adapter.now - 60_000
    backend.queue.append(Observations(adapter.now, (), (InstanceReport("i1", "warmed", old_at),)))
    server.hub.pump()  # in the ring before any coordinator connects
    adapter.now += 60_000  # a minute later, a coordinator connects
    local = FakeClock(adapter.now + OFFSET)
    obs = observations({"c1": addr(server)}, local)
    wait_until(lambda: obs.batches_received == 2, what="the ring buffer")
    got = obs.gather(local.now)
    assert [(r.instance_id, r.at_ms) for r in got.reports] == [("i1", old_at + OFFSET)]


# --- authentication and TLS ---------------------------------------------------------------------------

TOKEN = "adapter-token-0123456789abcdef"


def test_observations_flow_with_the_token_over_mutual_tls(adapters, observations, tmp_path: Path) -> None:
    from adapters.client import AdapterTls
    from controlplane.tls import issue_coordinator_cert, make_dev_pki

    pki = make_dev_pki(tmp_path / "pki")
    clock = FakeClock(5_000_000)
    server, backend = adapters.start("c1", clock, auth_token=TOKEN,
                                     tls=(pki.server_cert.read_bytes(), pki.server_key.read_bytes()),
                                     client_ca=pki.ca_cert.read_bytes())
    local = FakeClock(5_000_000)
    cert, key = issue_coordinator_cert(pki, "n1")
    obs = observations({"c1": addr(server)}, local, token=TOKEN, tls=AdapterTls(pki.ca_cert, cert, key))
    wait_until(lambda: obs.connected["c1"], what="the stream to connect")
    backend.queue.append(Observations(clock.now, (sample("i1", clock.now),)))
    pumped(obs, server)
    assert [s.instance_id for s in obs.gather(local.now).samples] == ["i1"]
    assert len(obs.recent(local.now - 60_000)) == 2  # Recent carries the token too
    assert obs.refused == {} and server.auth is not None and server.auth.refused == 0


def test_a_wrong_token_is_logged_once_and_nothing_is_received(adapters, observations) -> None:
    from structlog.testing import capture_logs

    server, _ = adapters.start("c1", FakeClock(5_000_000), auth_token=TOKEN)
    assert server.auth is not None
    with capture_logs() as logs:
        obs = observations({"c1": addr(server)}, FakeClock(5_000_000), token="not-the-token-0123456789")
        wait_until(lambda: server.auth.refused >= 3, timeout_s=10, what="three refused connection attempts")
    assert "UNAUTHENTICATED" in obs.refused["c1"] and not obs.connected["c1"] and obs.batches_received == 0
    refused = [e for e in logs if e["event"] == "observe_refused"]
    assert len(refused) == 1 and refused[0]["cluster"] == "c1" and "not this adapter's" in refused[0]["reason"]
    assert TOKEN not in repr(logs) and "not-the-token-0123456789" not in repr(logs)


def test_a_cluster_registered_later_is_followed_and_a_moved_one_reconnects(adapters, observations, tmp_path: Path) -> None:
    first, backend1 = adapters.start("c1", wall_ms)
    obs = observations({}, wall_ms)  # started with no adapters at all
    assert obs.ensure("c1", addr(first)) is True
    assert obs.ensure("c1", addr(first)) is False  # same address: nothing to do
    wait_until(lambda: obs.connected.get("c1") is True, what="the stream to the registered cluster")
    backend1.queue.append(lambda now: Observations(now, (sample("i1", now),)))
    pumped(obs, first)
    assert [s.instance_id for s in obs.gather(wall_ms()).samples] == ["i1"]

    backend2 = QueueBackend()  # the cluster's adapter moves to another address (its own state dir)
    second = serve_adapter("c1", "127.0.0.1:0", tmp_path / "moved", backend2, observe_interval_ms=60_000,
                           ring_s=3_600, clock_ms=wall_ms)
    adapters.servers.append(second)
    assert obs.ensure("c1", addr(second)) is True
    backend2.queue.extend(lambda now: Observations(now, (sample("i2", now),)) for _ in range(1_000))
    wait_until(lambda: (second.hub.pump(), any(s.instance_id == "i2" for s in obs.gather(wall_ms()).samples))[1],
               what="samples from the new address")


def test_remote_adapter_ensure_replaces_the_channel() -> None:
    from adapters.client import RemoteAdapter

    ra = RemoteAdapter({"c1": "127.0.0.1:1"})
    try:
        assert ra.ensure("c1", "127.0.0.1:1") is False
        assert ra.ensure("c2", "127.0.0.1:2") is True
        assert ra.clusters() == ["c1", "c2"]
        assert ra.ensure("c1", "127.0.0.1:3") is True
    finally:
        ra.close()


def test_pressure_wakes_the_caller_only_for_batches_worth_acting_on(adapters) -> None:
    server, backend = adapters.start("c1", wall_ms)
    woken = threading.Event()
    obs = RemoteObservations({"c1": addr(server)}, wall_ms, reconnect_max_s=0.2, on_pressure=woken.set)
    obs.start()
    try:
        wait_until(lambda: obs.batches_received >= 1, what="the first batch")
        idle_queue = lambda now: InstanceSample("i1", "d1", now, 2, 0, 0.25, 100.0, 200.0, 55.0, 1, 2, True)  # noqa: E731
        backend.queue.append(lambda now: Observations(now, (idle_queue(now),)))  # busy, nothing queued
        pumped(obs, server)
        backend.queue.append(lambda now: Observations(now, (idle_queue(now),)))  # the same again: steady
        pumped(obs, server)
        assert not woken.is_set()
        jump = lambda now: InstanceSample("i1", "d1", now, 4, 0, 0.25, 100.0, 200.0, 55.0, 1, 2, True)  # noqa: E731
        backend.queue.append(lambda now: Observations(now, (jump(now),)))  # 2 -> 4 running, nothing queued yet
        pumped(obs, server)
        assert woken.is_set()
        woken.clear()
        queued = lambda now: InstanceSample("i1", "d1", now, 4, 5, 0.25, 100.0, 200.0, 55.0, 1, 2, True)  # noqa: E731
        backend.queue.append(lambda now: Observations(now, (queued(now),)))  # a queue forms: 5 waiting
        pumped(obs, server)
        assert woken.is_set()
        woken.clear()
        backend.queue.append(lambda now: Observations(now, (queued(now),)))  # the same queue: sustained, not news
        pumped(obs, server)
        assert not woken.is_set()
    finally:
        obs.close()
