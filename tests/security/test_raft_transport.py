"""The Raft port under attack, on 127.0.0.1 (raft/transport.py: mutual TLS + password + strict messages).

* **Encryption, by capture.** Two coordinators' Raft link is routed through a recording TCP proxy
  (tests/support/recordproxy.py, the node's ``raft_dial_overrides``) while a command carrying a
  known marker is committed. Every byte on the wire belongs to a TLS record (content types 20-23,
  version 0x0303, length <= 2^14 + 256), everything after the first ClientHello/ServerHello is
  ``application_data`` (TLS 1.3 encrypts the rest of the handshake too), and the marker appears
  nowhere. The control: the marker is in the bytes our wire format would carry in clear, so the
  capture would see it if the link were not encrypted.
* **A pysyncobj peer never joins**, with no password, a wrong one or even the group's password:
  it speaks pysyncobj's framing without a certificate, so every connection ends in the TLS
  handshake (counted as ``tls_rejected``); the group never reports it connected, the command it
  submits is never applied, the members' state does not change, it never learns a leader.
* **Pickle payloads.** Raw frames carrying a pickle that would create a directory when unpickled
  (plain and zlib-compressed, as pysyncobj frames them) sent to a member's Raft port do nothing (they
  fail the TLS handshake); the control: the same bytes sent to a bare pysyncobj node without a
  password do create it. (tests/raft/test_transport.py: what an authenticated peer's pickles do.)
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.batteries import ReplDict

from controlplane.cli.up import free_ports
from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.records import BreakerRecord
from raft import codec, wire
from raft.node import RaftNode, dial_override_node_class
from tests.raft.cluster import PASSWORD, cluster_configs
from tests.support.recordproxy import RecordingProxy
from tests.support.waiting import wait_until

MARKER = "zq-plaintext-marker-7731"
TLS_CONTENT_TYPES = {20, 21, 22, 23}
APPLICATION_DATA = 23
MAX_RECORD = (1 << 14) + 256


def tls_records(stream: bytes) -> list[tuple[int, int]]:
    """(content type, length) of every TLS record in ``stream``; raises if a byte is not part of one
    (a trailing partial record, cut by the end of the capture, is allowed)."""
    out, at = [], 0
    while at + 5 <= len(stream):
        kind, major, minor, n = stream[at], stream[at + 1], stream[at + 2], int.from_bytes(stream[at + 3:at + 5], "big")
        assert kind in TLS_CONTENT_TYPES and major == 3 and minor in (1, 3) and n <= MAX_RECORD, \
            f"not a TLS record at byte {at}: {stream[at:at + 8].hex()}"
        out.append((kind, n))
        at += 5 + n
    return out


@contextmanager
def proxied_pair(tmp_path: Path) -> Iterator[tuple[list[RaftNode], list[RecordingProxy]]]:
    raws = cluster_configs(tmp_path, 2)
    proxies = [RecordingProxy(raws[1]["raft_address"]).start(), RecordingProxy(raws[0]["raft_address"]).start()]
    nodes: list[RaftNode] = []
    try:
        for raw, proxy in zip(raws, proxies):
            other = raws[1] if raw is raws[0] else raws[0]
            overrides = {other["raft_address"]: proxy.address}
            cfg = CoordinatorConfig.model_validate({**raw, "raft_dial_overrides": overrides})
            nodes.append(RaftNode(cfg, node_class=dial_override_node_class(overrides)))
        for n in nodes:
            n.start()
        yield nodes, proxies
    finally:
        for n in nodes:
            n.stop()
        for p in proxies:
            p.stop()


def commit_marker(nodes: list[RaftNode]) -> None:
    leader = wait_until(lambda: next((n for n in nodes if n.running and n.is_leader()), None), 20.0, "a Raft leader")
    leader.submit(codec.encode(c.PutBreaker(key=MARKER, record=BreakerRecord(failures=7))), timeout_s=10.0)
    wait_until(lambda: all(MARKER in n.state_copy().breakers for n in nodes), 10.0, "the marker on both nodes")


def captured(proxies: list[RecordingProxy]) -> list[bytes]:
    streams = []
    for p in proxies:
        streams += list(p.recorded())
    return [s for s in streams if s]


@pytest.mark.timeout(120)
def test_raft_traffic_is_tls_records_only_and_the_marker_never_crosses_in_clear(tmp_path: Path) -> None:
    with proxied_pair(tmp_path / "enc") as (nodes, proxies):
        commit_marker(nodes)
        streams = captured(proxies)
    assert sum(p.connections for p in proxies) >= 1 and sum(map(len, streams)) > 1_000, "no traffic went through the proxy"
    assert MARKER.encode() not in b"".join(streams)
    for stream in streams:
        records = tls_records(stream)
        assert records and records[0][0] == 22, "a stream that does not start with a TLS handshake record"
        # TLS 1.3: after the (Client|Server)Hello and an optional change_cipher_spec, all is encrypted
        later = [kind for kind, _ in records[1:] if kind != 20]
        assert later and all(kind == APPLICATION_DATA for kind in later), "a clear-text record after the hello"
    assert sum(len(tls_records(s)) for s in streams) > 10
    # control: in clear, the marker would be on the wire (our encoding of the entry carries it verbatim)
    entry = codec.encode(c.PutBreaker(key=MARKER, record=BreakerRecord(failures=7)))
    assert MARKER.encode() in wire.encode({"type": "apply_command", "command": entry})


def _attacker(address: str, dial: dict[str, str], password: str | None) -> tuple[SyncObj, ReplDict]:
    """A bare pysyncobj node at ``address`` that dials the members at ``dial`` (member -> proxy)."""
    store = ReplDict()
    conf = SyncObjConf(password=password, bindAddress=address, raftMinTimeout=0.1, raftMaxTimeout=0.2,
                       appendEntriesPeriod=0.02, connectionRetryTime=0.1, connectionTimeout=1e9,
                       commandsWaitLeader=True)
    return SyncObj(address, list(dial), conf=conf, consumers=[store], nodeClass=dial_override_node_class(dial)), store


@pytest.mark.timeout(120)
@pytest.mark.parametrize("password", [None, "not-the-group-password-123", PASSWORD],
                         ids=["no-password", "wrong-password", "the-group-password"])
def test_a_pysyncobj_peer_never_joins(tmp_path: Path, password: str | None) -> None:
    raws = cluster_configs(tmp_path, 3)
    intruder_addr = raws[2]["raft_address"]
    # every connection between the intruder and a member, whichever side dials, goes through a proxy:
    # the proxies count the attempts (pysyncobj retries a refused handshake)
    to_intruder = RecordingProxy(intruder_addr).start()
    to_members = {r["raft_address"]: RecordingProxy(r["raft_address"]).start() for r in raws[:2]}
    proxies = [to_intruder, *to_members.values()]
    members = [RaftNode(CoordinatorConfig.model_validate({**r, "raft_dial_overrides": {intruder_addr: to_intruder.address}}),
                        node_class=dial_override_node_class({intruder_addr: to_intruder.address})) for r in raws[:2]]
    intruder = None
    try:
        for m in members:
            m.start()
        leader = wait_until(lambda: next((m for m in members if m.is_leader()), None), 20.0, "a leader of the two")
        leader.submit(codec.encode(c.PutBreaker(key="before", record=BreakerRecord(failures=1))), timeout_s=10.0)
        wait_until(lambda: all("before" in m.state_copy().breakers for m in members), 10.0, "the write on both")
        before = [m.state_copy().breakers for m in members]
        intruder, store = _attacker(intruder_addr, {a: p.address for a, p in to_members.items()}, password)
        store.set("intruder", MARKER, sync=False)
        wait_until(lambda: sum(p.connections for p in proxies) >= 6, 30.0, "repeated connection attempts")
        for st in (m.status() for m in members):
            assert dict(st.peers).get("coord-2") is False, f"{st.node_id} reports the intruder connected: {st.peers}"
        assert intruder.getStatus()["leader"] is None and not intruder.isReady()
        assert store.get("intruder") is None
        assert [m.state_copy().breakers for m in members] == before
        assert all(m.running for m in members)
        assert sum(m.transport_stats().counters["tls_rejected"] for m in members) >= 1  # type: ignore[union-attr]
        # and what the intruder sent never reached a member's log in clear: no frame of its decompresses
        # into anything the members understood (they hung up at the first frame)
        assert MARKER.encode() not in b"".join(s for p in proxies for s in p.recorded())
    finally:
        if intruder is not None:
            intruder.destroy()
        for m in members:
            m.stop()
        for p in proxies:
            p.stop()


class _MakeDir:
    """A pickle that creates a directory when it is unpickled (what an attacker would run instead)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _send_frames(address: str, payloads: list[bytes]) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        for p in payloads:
            try:
                s.sendall(struct.pack("<i", len(p)) + p)
            except (ConnectionResetError, BrokenPipeError):
                return  # the member hung up on the garbage before all of it was sent: what it should do
        s.settimeout(2)
        try:
            s.recv(1024)  # until the node answers or hangs up
        except OSError:
            pass


def _evil_frames(target: Path) -> list[bytes]:
    pickled = pickle.dumps(_MakeDir(target))
    return [zlib.compress(pickled, 3), pickled]


@pytest.mark.timeout(120)
def test_pickle_payloads_on_the_raft_port_are_never_unpickled(tmp_path: Path) -> None:
    [raw] = cluster_configs(tmp_path, 1)
    node = RaftNode(CoordinatorConfig.model_validate(raw))
    pwned = tmp_path / "pwned-coordinator"
    try:
        node.start()
        wait_until(node.is_leader, 20.0, "the single member to lead")
        _send_frames(raw["raft_address"], _evil_frames(pwned))
        _send_frames(raw["raft_address"], _evil_frames(pwned)[:1])
        # the node keeps working: a commit after the attack goes through
        node.submit(codec.encode(c.PutBreaker(key="after", record=BreakerRecord(failures=2))), timeout_s=10.0)
        assert node.running and "after" in node.state_copy().breakers
        assert not pwned.exists(), "the Raft port unpickled an attacker's payload"
        assert node.transport_stats().counters["tls_rejected"] >= 2  # type: ignore[union-attr]
    finally:
        node.stop()

    # control: pysyncobj without a password runs it
    [port] = free_ports(1)
    address = f"127.0.0.1:{port}"
    bare = SyncObj(address, [], conf=SyncObjConf(bindAddress=address))
    control = tmp_path / "pwned-bare-pysyncobj"
    try:
        wait_until(lambda: bare.isReady() or bare._isLeader(), 10.0, "the bare node")
        _send_frames(address, _evil_frames(control)[:1])
        wait_until(control.exists, 10.0, "the bare node to unpickle the payload")
    finally:
        bare.destroy()
