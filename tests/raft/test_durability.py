"""The pysyncobj internals we depend on, the journal hook (fsync, lazy truncation, start-up alignment),
the snapshot file format, the SyncObjConf we build, and the failure-code translation.

If pysyncobj is upgraded, ``test_pysyncobj_internals_we_rely_on`` is the first thing that should fail.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.serializer import Serializer
from pysyncobj.version import VERSION

from controlplane.config import ConfigError, CoordinatorConfig
from controlplane.domain.errors import CommitTimeout, Conflict, LeadershipLost, NotLeader, QueueFull
from controlplane.domain.state import ControlState
from raft import codec
from raft.fsm import ControlFsm, read_snapshot_file, write_snapshot_file
from raft.lease import LeaseRecord
from raft.journal import RaftJournal
from raft.node import RaftNode, construct_with_journal, failure_error
from raft.replicator import RaftReplicator
from raft.peer_auth import derive_auth_key
from tests.raft.cluster import PASSWORD, breaker_write, free_ports
from tests.support.raft_pki import raft_tls
from tests.support.waiting import wait_until


def single_node_cfg(tmp_path: Path, **overrides: object) -> CoordinatorConfig:
    raft_port, api_port = free_ports(2)
    return CoordinatorConfig(
        node_id="solo", zone="az-1", raft_address=f"127.0.0.1:{raft_port}", api_address=f"127.0.0.1:{api_port}",
        data_dir=tmp_path / "solo", password=PASSWORD, raft_tls=raft_tls(tmp_path, "solo"),
        **overrides,  # type: ignore[arg-type]
    )


def test_pysyncobj_internals_we_rely_on(tmp_path: Path) -> None:
    assert VERSION == "0.3.17", "re-verify raft/node.py (construct_with_journal), raft/journal.py and PYSYNCOBJ.md, then pin"
    import pysyncobj.syncobj as syncobj_module
    from pysyncobj.journal import Journal

    src = inspect.getsource(SyncObj)
    assert "self.__raftLog = createJournal(self.__conf.journalFile)" in src
    assert "from .journal import createJournal" in inspect.getsource(syncobj_module)
    # every journal method SyncObj calls exists on ours (the interface of pysyncobj.journal.Journal)
    called = set(__import__("re").findall(r"self\.__raftLog\.(\w+)\(", src))
    assert called <= {"add", "clear", "deleteEntriesFrom", "deleteEntriesTo", "setRaftCommitIndex",
                      "getRaftCommitIndex", "setCurrentTerm", "getCurrentTerm", "getVotedForNodeId",
                      "onOneSecondTimer", "_destroy"}, called
    for name in called | {"__getitem__", "__len__", "flush"}:
        assert getattr(RaftJournal, name) is not getattr(Journal, name, None), f"RaftJournal.{name} not implemented"
    assert "self.__serializer(tmpFile, data[1:])" in inspect.getsource(Serializer)
    assert "return (None,) + self.__deserializer(self.__fileName)" in inspect.getsource(Serializer)

    node = RaftNode(single_node_cfg(tmp_path))
    node.start()
    try:
        journal = node._obj._SyncObj__raftLog  # type: ignore[union-attr]  (checking the hook, not using it)
        assert isinstance(journal, RaftJournal) and journal is node._journal
        assert syncobj_module.createJournal.__module__ == "pysyncobj.journal"  # the factory is restored
    finally:
        node.stop()


def test_construct_with_journal_refuses_a_syncobj_that_did_not_ask(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    journal = RaftJournal(tmp_path / "raft.journal", fsync=True)
    with pytest.raises(RuntimeError, match="internals changed"):
        # journalFile=None: SyncObj builds an in-memory journal, as a changed pysyncobj would bypass ours
        construct_with_journal(journal, lambda: SyncObj(f"127.0.0.1:{port}", [], conf=SyncObjConf(autoTick=False)))
    journal._destroy()


@pytest.mark.parametrize("mode", ["entry", "none"])
def test_fsync_per_entry_only_in_entry_mode(tmp_path: Path, mode: str) -> None:
    node = RaftNode(single_node_cfg(tmp_path, fsync=mode))
    node.start()
    try:
        wait_until(lambda: node.is_leader(), 10, "the single member to lead")
        before = node.durability().fsyncs
        repl = RaftReplicator(node)
        for i in range(10):
            assert repl.commit([breaker_write(i)], i).ok
        d = node.durability()
        assert d.mode == mode
        if mode == "entry":
            assert d.fsyncs - before >= 10 and d.fsync_ms_max > 0
        else:
            assert d.fsyncs == 0
    finally:
        node.stop()


def test_refuses_to_start_without_password(tmp_path: Path) -> None:
    cfg = single_node_cfg(tmp_path).model_copy(update={"password": None})
    with pytest.raises(ConfigError, match="password: required: Raft members prove it to each other inside mutual TLS"):
        RaftNode(cfg)


def test_refuses_to_start_without_raft_tls(tmp_path: Path) -> None:
    cfg = single_node_cfg(tmp_path).model_copy(update={"raft_tls": None})
    with pytest.raises(ConfigError, match="raft_tls: required: Raft members authenticate each other with mutual TLS"):
        RaftNode(cfg)


def test_syncobj_conf_from_config(tmp_path: Path) -> None:
    cfg = single_node_cfg(tmp_path)
    node = RaftNode(cfg)
    conf = node._conf()
    assert conf.password is None  # the password is checked by raft/transport.py, not by pysyncobj's Fernet layer
    assert node._transport_settings.auth_key == derive_auth_key(PASSWORD.encode())
    assert conf.bindAddress == cfg.raft_address  # never 0.0.0.0
    assert conf.journalFile == str(cfg.data_dir / "raft.journal")
    assert conf.fullDumpFile == str(cfg.data_dir / "raft.snapshot")
    assert conf.dynamicMembershipChange and not conf.appendEntriesUseBatch and not conf.commandsWaitLeader
    assert conf.connectionTimeout >= 1e6 and conf.connectionRetryTime == 0.2
    assert (conf.raftMinTimeout, conf.raftMaxTimeout, conf.appendEntriesPeriod) == (1.0, 1.5, 0.04)
    assert conf.leaderFallbackTimeout == 0.9 and not conf.autoTick
    # a restarted pod keeps its DNS name but not its IP: never dial a cached dead IP for minutes
    assert conf.dnsCacheTime == conf.dnsFailCacheTime == 1.0
    assert conf.serializer is not None and conf.deserializer is not None
    conf.validate()


FAILURES = [
    (FAIL_REASON.MISSING_LEADER, NotLeader),
    (FAIL_REASON.NOT_LEADER, NotLeader),
    (FAIL_REASON.LEADER_CHANGED, LeadershipLost),
    (FAIL_REASON.DISCARDED, LeadershipLost),
    (FAIL_REASON.QUEUE_FULL, QueueFull),
    (FAIL_REASON.REQUEST_DENIED, Conflict),
    (FAIL_REASON.UNKNOWN_OUTCOME, CommitTimeout),
    ("Timeout", CommitTimeout),
]


@pytest.mark.parametrize(("code", "error"), FAILURES)
def test_failure_translation(code: object, error: type) -> None:
    exc = failure_error(code, "127.0.0.1:9000")
    assert type(exc) is error
    if isinstance(exc, NotLeader):
        assert exc.leader_hint == "127.0.0.1:9000"
    if isinstance(exc, (CommitTimeout, LeadershipLost)):
        assert "unknown" in str(exc)


# --- journal wrapper on a real FileJournal --------------------------------------------------------


def entries(lo: int, hi: int, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(b"cmd-%d-%d" % (i, term), i, term) for i in range(lo, hi + 1)]


def journal_with(tmp_path: Path, items: list[tuple[bytes, int, int]]) -> RaftJournal:
    j = RaftJournal(tmp_path / "raft.journal", fsync=True)
    for e in items:
        j.add(*e)
    return j


def reread(tmp_path: Path) -> list[tuple[bytes, int, int]]:
    j = RaftJournal(tmp_path / "raft.journal", fsync=True)
    try:
        return list(j[:])
    finally:
        j._destroy()


def test_lazy_truncation_skips_identical_entries(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 5))
    j.deleteEntriesFrom(2)  # pysyncobj: "truncate after index 2", then re-adds what the leader re-sent
    j.add(*entries(3, 3)[0])
    j.add(*entries(4, 4)[0])
    assert j.statistics().skipped_rewrites == 2
    assert len(j) == 4  # the read completes the cut: entry 5 goes, as pysyncobj asked
    assert [j[i] for i in range(4)] == entries(1, 4)
    j._destroy()
    assert reread(tmp_path) == entries(1, 4)


def test_lazy_truncation_replaces_conflicting_entries(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 5))
    j.deleteEntriesFrom(2)
    j.add(*entries(3, 3)[0])  # same
    j.add(*entries(4, 4, term=2)[0])  # conflict: truncate here, then append
    assert [j[i] for i in range(len(j))] == entries(1, 3) + entries(4, 4, term=2)
    j._destroy()
    assert reread(tmp_path) == entries(1, 3) + entries(4, 4, term=2)


def test_align_to_snapshot_keeps_entries_after_it(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 10))
    prev, last = entries(5, 6)
    assert j.align_to_snapshot(prev, last) == 4
    assert [j[i] for i in range(len(j))] == entries(5, 10)
    assert j.align_to_snapshot(prev, last) == 0  # already aligned
    assert j.align_to_snapshot(*entries(7, 8, term=9)) == 0  # not this log: leave it to pysyncobj
    j._destroy()
    assert reread(tmp_path) == entries(5, 10)


# --- snapshot file ---------------------------------------------------------------------------------


class _N:
    def __init__(self, addr: str) -> None:
        self.id = addr


def test_snapshot_file_round_trip_and_corruption(tmp_path: Path) -> None:
    fsm = ControlFsm(lambda: 0)
    fsm.install_snapshot(codec.encode_state(ControlState(), LeaseRecord("coord-a", 7, 3, 1200)))
    path = str(tmp_path / "snap")
    last, prev = (b"\x00last", 9, 2), (b"\x01prev", 8, 2)
    write_snapshot_file(path, fsm, last, prev, [_N("127.0.0.1:2"), _N("127.0.0.1:1")], fsync=True)
    snap = read_snapshot_file(path)
    assert (snap.last, snap.prev, snap.cluster) == (last, prev, ("127.0.0.1:1", "127.0.0.1:2"))
    state, lease = codec.decode_state(snap.state)
    assert lease == LeaseRecord("coord-a", 7, 3, 1200) and state.applied == 0
    assert b"pickle" not in open(path, "rb").read()

    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(codec.CodecError, match="checksum"):
        read_snapshot_file(path)
    open(path, "wb").write(b"\x80\x04not ours")
    with pytest.raises(codec.CodecError, match="bad magic"):
        read_snapshot_file(path)


# --- the fatal path: storage that cannot be used stops the member ------------------------------------


class _FailingDisk:
    """Works until ``broken`` is set, then every write is ENOSPC."""

    def __init__(self) -> None:
        self.broken = False

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        import errno
        import os

        if self.broken:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        import os

        os.fsync(fd)


def test_a_full_disk_stops_a_running_member_with_one_line_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from controlplane.domain.errors import Unavailable

    disk = _FailingDisk()
    node = RaftNode(single_node_cfg(tmp_path), disk=disk)
    told: list[tuple[str, str]] = []
    node.add_fatal_listener(lambda kind, reason: told.append((kind, reason)))
    node.start()
    try:
        wait_until(lambda: node.is_leader(), 10, "the single member to lead")
        repl = RaftReplicator(node)
        assert repl.commit([breaker_write(1)], 1).ok
        disk.broken = True
        with pytest.raises(Exception):  # noqa: B017  (the write's outcome is unknown or refused)
            repl.commit([breaker_write(2)], 2)
        wait_until(lambda: not node.running, 10, "the tick thread to stop")
        assert told and told[0][0] == "disk" and "ENOSPC" in told[0][1] and len(told) == 1
        assert "ENOSPC" in node.fatal_error() and node.fatal_kind() == "disk"
        with pytest.raises(Unavailable, match="stopped: .*ENOSPC"):
            node.submit(b"x", timeout_s=1)
        stopped = [r for r in caplog.records if "stopped:" in r.getMessage()]
        assert len(stopped) == 1 and not any(r.exc_info for r in caplog.records if r.levelno >= logging.ERROR)
    finally:
        node.stop()
    again = RaftNode(single_node_cfg(tmp_path).model_copy(update={"data_dir": tmp_path / "solo"}))
    again.start()  # space is back (a working disk): every acknowledged entry is there
    try:
        wait_until(lambda: "w000001" in {str(k) for k in again.state_copy().breakers}, 10, "the acked write after restart")
        assert not again.fatal_error()
    finally:
        again.stop()


def test_a_corrupt_snapshot_stops_the_member_before_raft_starts(tmp_path: Path) -> None:
    cfg = single_node_cfg(tmp_path, log_compaction_min_entries=2)
    node = RaftNode(cfg)
    node.start()
    try:
        wait_until(lambda: node.is_leader(), 10, "the single member to lead")
        repl = RaftReplicator(node)
        for i in range(5):
            assert repl.commit([breaker_write(i)], i).ok
        node.force_compaction()
        wait_until(lambda: (cfg.data_dir / "raft.snapshot").exists(), 10, "a snapshot")
    finally:
        node.stop()
    snap = cfg.data_dir / "raft.snapshot"
    data = bytearray(snap.read_bytes())
    data[-2] ^= 0x01
    snap.write_bytes(bytes(data))
    told: list[str] = []
    again = RaftNode(cfg)
    again.add_fatal_listener(lambda kind, reason: told.append(kind))
    again.start()
    try:
        assert not again.running and again._obj is None  # no SyncObj: no port, no vote, no ack
        assert "raft.snapshot" in again.fatal_error() and "checksum mismatch over bytes" in again.fatal_error()
        assert told == ["corrupt"]
    finally:
        again.stop()


def test_the_coordinator_turns_a_storage_failure_into_not_serving_unavailable_and_a_metric(tmp_path: Path) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from controlplane.api.v1 import api_pb2, api_pb2_grpc
    from controlplane.coordinator import Coordinator

    cfg = single_node_cfg(tmp_path)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    (cfg.data_dir / "raft.journal").write_bytes(b"")
    (cfg.data_dir / "raft.journal.meta").write_bytes(b"")
    coord = Coordinator(cfg)
    coord.start()
    try:
        assert coord.registry.get_sample_value("controlplane_raft_storage_failed", {"kind": "corrupt"}) == 1
        with grpc.insecure_channel(cfg.api_address) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as err:
                api_pb2_grpc.TenantsStub(ch).ListTenants(api_pb2.ListRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details().startswith("member solo stopped: raft.journal") and "empty file" in err.value.details()
    finally:
        coord.stop()
