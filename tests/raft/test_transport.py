"""The Raft transport (raft/transport.py) against hostile peers, on 127.0.0.1 with real sockets.

Each test starts a group of three configured members of which two run (the two smallest addresses:
a quorum); the third ("phantom") is never started, and the tests play it (its certificate, its
address, with or without the password) against the smallest member, the ``target``, which accepts
every connection (the larger address dials). Every wait has a deadline; every member is stopped.
"""

from __future__ import annotations

import pickle
import resource
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import CoordinatorConfig
from controlplane.tls import RaftPki, issue_coordinator_cert, make_raft_pki
from raft import codec, wire
from raft.node import RaftNode
from tests.raft.cluster import PASSWORD, breaker_write, cluster_configs
from tests.support.raft_peer import authenticate, closed_within, raw_connect, send_frame, tls_connect
from tests.support.waiting import wait_until

ELECT_S = 20.0
COMMIT_BOUND_S = 2.0


@dataclass
class Group:
    nodes: list[RaftNode]
    target: RaftNode
    phantom: dict[str, Any]
    pki: RaftPki
    next_write: int = 0

    @property
    def address(self) -> str:
        return self.target.cfg.raft_address

    def counters(self) -> dict[str, int]:
        stats = self.target.transport_stats()
        assert stats is not None
        return stats.counters

    def leader(self) -> RaftNode:
        return wait_until(lambda: next((n for n in self.nodes if n.is_leader()), None), ELECT_S, "a leader")

    def commit(self) -> float:
        """Commit one write through the leader; seconds it took."""
        self.next_write += 1
        t0 = time.monotonic()
        self.leader().submit(codec.encode(breaker_write(self.next_write)), timeout_s=COMMIT_BOUND_S)
        return time.monotonic() - t0

    def phantom_cert(self) -> tuple[Path, Path]:
        return self.pki.cert(self.phantom["node_id"]), self.pki.key(self.phantom["node_id"])


@contextmanager
def group(tmp_path: Path, inbound_filter: Any = None, **overrides: Any) -> Iterator[Group]:
    raws = sorted(cluster_configs(tmp_path, 3, **overrides), key=lambda r: r["raft_address"])
    nodes = [RaftNode(CoordinatorConfig.model_validate(raws[0]), inbound_filter=inbound_filter),
             RaftNode(CoordinatorConfig.model_validate(raws[1]))]
    try:
        for n in nodes:
            n.start()
        g = Group(nodes, nodes[0], raws[2], make_raft_pki(tmp_path / "raft-pki", []))
        g.commit()
        yield g
    finally:
        for n in nodes:
            n.stop()


def wait_count(g: Group, counter: str, at_least: int, timeout_s: float = 5.0) -> dict[str, int]:
    return wait_until(lambda: (c := g.counters())[counter] >= at_least and c, timeout_s, f"{counter} >= {at_least}")


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# --- authentication ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_peers_without_a_coordinator_certificate_of_the_raft_ca_are_refused_before_any_frame(tmp_path: Path) -> None:
    other = make_raft_pki(tmp_path / "other-ca", ["coord-2"])
    with group(tmp_path) as g:
        not_coordinator = issue_coordinator_cert(g.pki, "adapter-x", uri="controlplane://adapter/adapter-x")
        cases = [("no certificate", None, "tls_rejected"), ("another CA", (other.cert("coord-2"), other.key("coord-2")),
                                                           "tls_rejected"),
                 ("not a coordinator", not_coordinator, "identity_rejected")]
        evil = pickle.dumps(OSError("a pickle"))
        for what, cert, counter in cases:
            before = g.counters()
            sock = tls_connect(g.address, g.pki.ca_cert, cert)  # TLS 1.3: the client finishes first
            try:
                # what a peer sends right after the handshake never reaches a parser or a buffer
                send_frame(sock, evil)
                sock.sendall(struct.pack(">I", 0x7FFFFFFF))
            except OSError:
                pass
            assert closed_within(sock, 3.0) is not None, f"{what}: the connection stayed open"
            sock.close()
            after = wait_count(g, counter, before[counter] + 1)
            assert (after["bad_messages"], after["oversize_frames"]) == (before["bad_messages"], before["oversize_frames"]), what
        assert wait_until(lambda: g.target.transport_stats().pending_links == 0, 5.0, "no pending links")  # type: ignore[union-attr]
        assert g.commit() < COMMIT_BOUND_S


@pytest.mark.timeout(120)
def test_a_coordinator_certificate_must_match_the_member_it_claims_and_the_password_must_be_right(tmp_path: Path) -> None:
    with group(tmp_path) as g:
        intruder = issue_coordinator_cert(g.pki, "coord-9")
        for what, cert, claim, password, counter in [
            ("unknown address", intruder, "127.0.0.1:1", PASSWORD, "identity_rejected"),
            ("another member's address", intruder, g.phantom["raft_address"], PASSWORD, "identity_rejected"),
            ("a member that does not dial it", g.phantom_cert(), g.nodes[1].cfg.raft_address, PASSWORD,
             "identity_rejected"),
            ("wrong password", g.phantom_cert(), g.phantom["raft_address"], "not-the-group-password-1", "password_rejected"),
        ]:
            before = g.counters()
            sock = tls_connect(g.address, g.pki.ca_cert, cert)
            try:
                authenticate(sock, claim, password)
            except (ConnectionError, OSError):
                pass  # refused at HELLO: no challenge came back
            assert closed_within(sock, 3.0) is not None, f"{what}: the connection stayed open"
            sock.close()
            wait_count(g, counter, before[counter] + 1)
            assert dict(g.target.status().peers).get(g.phantom["node_id"]) is False, what
        # the right certificate and password do get in (the control)
        sock = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(sock, g.phantom["raft_address"], PASSWORD)
        wait_until(lambda: dict(g.target.status().peers).get(g.phantom["node_id"]), 5.0, "the phantom connected")
        sock.close()


# --- bounds -----------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_an_oversized_length_prefix_closes_the_connection_at_once_without_buffering(tmp_path: Path) -> None:
    with group(tmp_path) as g:
        # before authentication the limit is 512 bytes
        sock = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        sock.sendall(struct.pack(">I", 4096))
        assert closed_within(sock, 2.0) is not None
        sock.close()
        wait_count(g, "oversize_frames", 1)
        # after it, raft_max_frame_bytes; a 2 GiB announcement is refused at the header
        rss0 = rss_bytes()
        sock = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(sock, g.phantom["raft_address"], PASSWORD)
        t0 = time.monotonic()
        try:
            sock.sendall(struct.pack(">I", 0x7FFFFFFF) + b"x" * 65536)
        except OSError:
            pass  # closed while we were still sending: the header was enough
        closed = closed_within(sock, 2.0)
        assert closed is not None and time.monotonic() - t0 < 2.0
        sock.close()
        wait_count(g, "oversize_frames", 2)
        assert rss_bytes() - rss0 < 32 * 1024 * 1024
        assert g.commit() < COMMIT_BOUND_S


@pytest.mark.timeout(120)
def test_trickling_senders_do_not_stall_the_tick_or_the_other_links(tmp_path: Path) -> None:
    with group(tmp_path, raft_handshake_timeout_ms=30_000, raft_half_frame_timeout_ms=30_000) as g:
        slow_auth = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(slow_auth, g.phantom["raft_address"], PASSWORD)
        slow_auth.sendall(struct.pack(">I", 16 * 1024 * 1024))  # a legal size, sent a few bytes at a time
        slow_tls = raw_connect(g.address, source_ip="127.0.0.2")
        # a maximal TLS record whose ClientHello (type 1, legacy version 3.3) then trickles
        slow_tls.sendall(b"\x16\x03\x01\x40\x00" + b"\x01\x00\x3f\xfc\x03\x03")
        latencies = []
        t_end = time.monotonic() + 4.0
        next_trickle = 0.0
        while time.monotonic() < t_end:
            if time.monotonic() >= next_trickle:  # 64 B and 1 B every 20 ms: both stay unfinished
                next_trickle = time.monotonic() + 0.02
                slow_auth.sendall(b"\0" * 64)
                slow_tls.sendall(b"\1")
            latencies.append(g.commit())
        print(f"{len(latencies)} commits beside two trickling senders: max {max(latencies) * 1000:.1f} ms")
        assert len(latencies) >= 20 and max(latencies) < COMMIT_BOUND_S
        assert dict(g.target.status().peers)[g.nodes[1].node_id] is True
        for s in (slow_auth, slow_tls):
            s.close()


@pytest.mark.timeout(120)
def test_a_flood_of_small_messages_is_served_a_budget_at_a_time(tmp_path: Path) -> None:
    with group(tmp_path, raft_read_budget_frames=16) as g:
        flood = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(flood, g.phantom["raft_address"], PASSWORD)
        stale = wire.frame(wire.encode({"type": "response_vote", "term": 0}))  # valid, and ignored by pysyncobj
        before = g.counters()["filtered_messages"]
        flood.sendall(stale * 20_000)
        latencies = [g.commit() for _ in range(30)]
        print(f"30 commits during a 20 000-message flood: max {max(latencies) * 1000:.1f} ms")
        assert max(latencies) < COMMIT_BOUND_S
        assert dict(g.target.status().peers)[g.nodes[1].node_id] is True
        assert g.counters()["filtered_messages"] == before and g.counters()["bad_messages"] == 0
        flood.close()


@pytest.mark.timeout(120)
def test_a_frame_begun_and_not_finished_is_closed_after_the_half_frame_timeout(tmp_path: Path) -> None:
    with group(tmp_path, raft_half_frame_timeout_ms=800) as g:
        sock = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(sock, g.phantom["raft_address"], PASSWORD)
        sock.sendall(struct.pack(">I", 100_000) + b"\0" * 10)
        t0 = time.monotonic()
        closed = None
        while closed is None and time.monotonic() - t0 < 6.0:
            sock.sendall(b"\0")  # never idle, never complete
            closed = closed_within(sock, 0.1)
        assert closed is not None, "a half frame was held for 6 s"
        elapsed = time.monotonic() - t0
        assert 0.7 <= elapsed < 5.0, elapsed
        wait_count(g, "half_frame_timeout", 1)
        sock.close()


@pytest.mark.timeout(120)
def test_idle_and_handshake_timeouts_close_silent_connections_but_not_the_members(tmp_path: Path) -> None:
    with group(tmp_path, raft_idle_timeout_ms=900, raft_keepalive_ms=300, raft_handshake_timeout_ms=600) as g:
        silent_tcp = raw_connect(g.address)
        silent_tls = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())  # TLS done, no HELLO
        idle = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(idle, g.phantom["raft_address"], PASSWORD)
        t0 = time.monotonic()
        for s in (silent_tcp, silent_tls):
            assert closed_within(s, 4.0) is not None
        wait_count(g, "handshake_timeout", 2)
        assert closed_within(idle, 5.0) is not None
        assert time.monotonic() - t0 >= 0.8
        wait_count(g, "idle_timeout", 1)
        time.sleep(1.5)  # noqa: the members' own link must survive longer than the idle timeout (keep-alives)
        assert dict(g.target.status().peers)[g.nodes[1].node_id] is True
        assert g.counters()["idle_timeout"] == 1
        for s in (silent_tcp, silent_tls, idle):
            s.close()


@pytest.mark.timeout(120)
def test_connection_caps_per_address_and_in_total(tmp_path: Path) -> None:
    with group(tmp_path, raft_max_connections_per_ip=3, raft_max_connections=5,
               raft_handshake_timeout_ms=30_000) as g:
        held = []
        try:
            # the other member's link is one inbound connection of the target (from 127.0.0.1)
            from_2 = [raw_connect(g.address, "127.0.0.2") for _ in range(5)]
            held += from_2
            wait_count(g, "connection_cap", 2)
            refused = [s for s in from_2 if closed_within(s, 0.5) is not None]
            assert len(refused) == 2
            from_3 = [raw_connect(g.address, "127.0.0.3") for _ in range(2)]
            held += from_3
            wait_count(g, "connection_cap", 3)  # 1 member + 3 + 1 = 5 in total: the last one is refused
            assert sum(closed_within(s, 0.5) is not None for s in from_3) == 1
            assert g.commit() < COMMIT_BOUND_S  # established members are not affected
        finally:
            for s in held:
                s.close()
        wait_until(lambda: g.target.transport_stats().pending_links == 0, 10.0, "the held slots freed")  # type: ignore[union-attr]


# --- messages ---------------------------------------------------------------------------------------


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


@pytest.mark.timeout(120)
def test_an_authenticated_peer_cannot_get_a_pickle_run(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    with group(tmp_path) as g:
        sock = tls_connect(g.address, g.pki.ca_cert, g.phantom_cert())
        authenticate(sock, g.phantom["raft_address"], PASSWORD)
        send_frame(sock, pickle.dumps({"type": "append_entries", "x": _Touch(pwned)}))
        wait_count(g, "bad_messages", 1)
        # pysyncobj's own pickle (a large entry sent in chunks) is checked before pysyncobj sees it
        evil = pickle.dumps(_Touch(pwned), protocol=2)
        for kind, part in (("start", evil[:10]), ("finish", evil[10:])):
            send_frame(sock, wire.encode({"type": "append_entries", "term": 0, "commit_index": 0, "prevLogIdx": 0,
                                          "prevLogTerm": 0, "transmission": kind, "data": part}))
        wait_count(g, "bad_messages", 2)
        assert not pwned.exists()
        assert g.commit() < COMMIT_BOUND_S
        sock.close()


class Recorder:
    def __init__(self, refuse_from: str | None = None) -> None:
        self.seen: list[tuple[str, str]] = []
        self.refuse_from = refuse_from

    def admit(self, sender: str, message: object, now_s: float) -> bool:
        assert isinstance(message, dict) and now_s > 0
        self.seen.append((sender, str(message["type"])))
        return sender != self.refuse_from


@pytest.mark.timeout(120)
def test_every_decoded_message_goes_through_the_inbound_filter(tmp_path: Path) -> None:
    rec = Recorder()
    with group(tmp_path, inbound_filter=rec) as g:
        other = g.nodes[1].cfg.raft_address
        assert {s for s, _ in rec.seen} == {other}
        assert {"append_entries", "next_node_idx"} & {t for _, t in rec.seen}
        # a filter that refuses a sender: its messages are dropped and counted
        rec.refuse_from = other
        before = g.counters()["filtered_messages"]
        wait_until(lambda: g.counters()["filtered_messages"] > before + 5, 5.0, "messages refused by the filter")


# --- descriptors run out ----------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_after_emfile_on_accept_the_member_accepts_again_and_the_group_regains_quorum(tmp_path: Path) -> None:
    from tests.raft.procs import HarnessProc, stop_all, wait_holder

    raws = sorted(cluster_configs(tmp_path / "data", 3), key=lambda r: r["raft_address"])
    # the smallest address accepts from both others; it runs with a low descriptor limit
    a, b, c = (HarnessProc(r, tmp_path, env={"CP_TEST_NOFILE": "256"} if i == 0 else None) for i, r in enumerate(raws))
    procs = [a, b, c]
    try:
        for p in procs:
            p.start()
        wait_holder(procs, 30.0)
        c.quit()  # from here on a and b are the quorum
        b.kill()  # and b must dial a again
        wait_until(lambda: (t := a.ask("transport"))["open_links"] == 0 and t["pending_links"] == 0, 15.0,
                   "a to see both peers gone")
        held = a.ask("exhaust")["held"]
        assert held > 0
        b.start()  # b dials a: a's accept() fails with EMFILE
        wait_until(lambda: a.ask("transport")["counters"]["emfile_backoffs"] >= 3, 15.0, "repeated accept() back-offs on a")
        # no quorum while a cannot accept: once its election timer (or, as leader, its check-quorum)
        # expires it has no leader, and it cannot get one back until it accepts again
        wait_until(lambda: a.ask("status")["leader"] is None, 15.0, "a to be without a leader while it cannot accept")
        a.ask("release")
        # The regained leadership may move once more on a loaded machine (b's election timer fires while
        # a catches up): a proposal refused before anything was committed ("at": 0) is asked again of
        # the then holder, within a deadline; anything else is the answer.
        deadline = time.monotonic() + 60.0
        while True:
            holder, _ = wait_holder([a, b], 30.0)
            got = holder.ask("commit 0 5", timeout_s=30)
            if got.get("ok") or got.get("at") != 0 or time.monotonic() > deadline:
                break
        assert got == {"ok": True, "done": 5}
        counters = a.ask("transport")["counters"]
        lines = [ln for ln in a.log_tail(200_000).splitlines() if "accept() failed" in ln]
        print(f"a held {held} descriptors; {counters['emfile_backoffs']} accept() back-offs, {len(lines)} log line(s)")
        assert 1 <= len(lines) <= 2
        # the transport itself never raises for it (pysyncobj's journal may: its once-a-second meta
        # write needs a descriptor too, which is the journal's to report)
        assert "raft/transport.py" not in a.log_tail(200_000) and "raft/link.py" not in a.log_tail(200_000)
    finally:
        stop_all(procs)


@pytest.mark.timeout(60)
def test_a_busy_raft_port_fails_the_start_without_leaking_descriptors(tmp_path: Path) -> None:
    import os
    import socket

    from controlplane.domain.errors import Unavailable

    [raw] = cluster_configs(tmp_path, 1)
    host, _, port = raw["raft_address"].rpartition(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen(1)
        node = RaftNode(CoordinatorConfig.model_validate(raw))
        fds = len(os.listdir("/proc/self/fd"))
        with pytest.raises(Unavailable, match="cannot bind"):
            node.start()
        assert len(os.listdir("/proc/self/fd")) <= fds  # each failed attempt's transport was destroyed
