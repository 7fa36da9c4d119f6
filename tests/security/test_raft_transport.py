"""The Raft port (pysyncobj, whose wire messages are pickles) under attack, on 127.0.0.1.

* **Encryption, by capture.** Two coordinators' Raft link is routed through a recording TCP proxy
  (tests/support/recordproxy.py, the node's ``raft_dial_overrides``) while a command carrying a
  known marker is committed. Every frame on the wire is a Fernet token and the marker appears
  nowhere, neither in the raw bytes nor in any frame that would decompress. The control: the same
  two nodes with encryption switched off in a test-only subclass show the marker in the decompressed
  frames of the same capture, so the capture does see commands when they are in clear.
* **No password, wrong password.** A pysyncobj peer listed in the group's membership (it binds the
  third member's address) but without the password, or with another one, never joins: while it and
  the members retry their connections (counted by recording proxies on every link to it), the group
  never reports it connected, the command it submits is never applied anywhere, the members' state
  does not change, and it never learns a leader (pysyncobj does not even campaign without a
  connected peer, so no vote request of its can disturb the group).
* **Pickle payloads.** Raw frames carrying a pickle that would create a directory when unpickled
  (plain and zlib-compressed, as pysyncobj frames them) sent to a member's Raft port do nothing; the
  control: the same bytes sent to a bare pysyncobj node without a password do create it (why the
  password is mandatory: ``raft/node.py`` refuses to start without one).
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
from raft import codec
from raft.node import RaftNode, dial_override_node_class
from tests.raft.cluster import cluster_configs
from tests.support.recordproxy import RecordingProxy, frames, plaintexts
from tests.support.waiting import wait_until

MARKER = "zq-plaintext-marker-7731"
FERNET_PREFIX = b"gAAAAA"
"""A Fernet token is urlsafe base64 of version byte 0x80 and a 64-bit timestamp: it starts so."""


class PlaintextRaftNode(RaftNode):
    """Test-only control: the same node with pysyncobj's encryption switched off."""

    def _conf(self) -> SyncObjConf:
        conf = super()._conf()
        conf.password = None
        return conf


@contextmanager
def proxied_pair(tmp_path: Path, node_type: type[RaftNode]) -> Iterator[tuple[list[RaftNode], list[RecordingProxy]]]:
    raws = cluster_configs(tmp_path, 2)
    proxies = [RecordingProxy(raws[1]["raft_address"]).start(), RecordingProxy(raws[0]["raft_address"]).start()]
    nodes: list[RaftNode] = []
    try:
        for raw, proxy in zip(raws, proxies):
            other = raws[1] if raw is raws[0] else raws[0]
            overrides = {other["raft_address"]: proxy.address}
            cfg = CoordinatorConfig.model_validate({**raw, "raft_dial_overrides": overrides})
            nodes.append(node_type(cfg, node_class=dial_override_node_class(overrides)))
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
def test_raft_traffic_is_encrypted_and_the_capture_sees_clear_text_when_it_is_not(tmp_path: Path) -> None:
    with proxied_pair(tmp_path / "enc", RaftNode) as (nodes, proxies):
        commit_marker(nodes)
        streams = captured(proxies)
    assert sum(p.connections for p in proxies) >= 1 and sum(map(len, streams)) > 1_000, "no traffic went through the proxy"
    wire = b"".join(streams)
    assert MARKER.encode() not in wire
    every_frame = [f for s in streams for f in frames(s)]
    assert len(every_frame) > 10
    assert all(f.startswith(FERNET_PREFIX) for f in every_frame), "a Raft frame that is not a Fernet token"
    assert not any(plaintexts(s) for s in streams), "a Raft frame that decompresses without the key"

    with proxied_pair(tmp_path / "plain", PlaintextRaftNode) as (nodes, proxies):
        commit_marker(nodes)
        streams = captured(proxies)
    clear = [m for s in streams for m in plaintexts(s)]
    assert clear and any(MARKER.encode() in m for m in clear), "the capture cannot see a clear-text command"


def _attacker(address: str, dial: dict[str, str], password: str | None) -> tuple[SyncObj, ReplDict]:
    """A bare pysyncobj node at ``address`` that dials the members at ``dial`` (member -> proxy)."""
    store = ReplDict()
    conf = SyncObjConf(password=password, bindAddress=address, raftMinTimeout=0.1, raftMaxTimeout=0.2,
                       appendEntriesPeriod=0.02, connectionRetryTime=0.1, connectionTimeout=1e9,
                       commandsWaitLeader=True)
    return SyncObj(address, list(dial), conf=conf, consumers=[store], nodeClass=dial_override_node_class(dial)), store


@pytest.mark.timeout(120)
@pytest.mark.parametrize("password", [None, "not-the-group-password-123"], ids=["no-password", "wrong-password"])
def test_a_peer_without_the_password_never_joins(tmp_path: Path, password: str | None) -> None:
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
            s.sendall(struct.pack("<i", len(p)) + p)
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
