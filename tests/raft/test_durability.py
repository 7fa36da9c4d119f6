"""The pysyncobj internals we depend on, the journal hook (fsync, lazy truncation, start-up alignment),
the snapshot file format, the SyncObjConf we build, and the failure-code translation.

If pysyncobj is upgraded, ``test_pysyncobj_internals_we_rely_on`` is the first thing that should fail.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.journal import FileJournal
from pysyncobj.serializer import Serializer
from pysyncobj.version import VERSION

from controlplane.config import ConfigError, CoordinatorConfig
from controlplane.domain.errors import CommitTimeout, Conflict, LeadershipLost, NotLeader, QueueFull
from controlplane.domain.state import ControlState
from raft import codec
from raft.fsm import ControlFsm, read_snapshot_file, write_snapshot_file
from raft.lease import LeaseRecord
from raft.node import DurableJournal, RaftNode, _wrap_journal, failure_error
from raft.replicator import RaftReplicator
from tests.raft.cluster import PASSWORD, breaker_write, free_ports
from tests.support.waiting import wait_until


def single_node_cfg(tmp_path: Path, **overrides: object) -> CoordinatorConfig:
    raft_port, api_port = free_ports(2)
    return CoordinatorConfig(
        node_id="solo", zone="az-1", raft_address=f"127.0.0.1:{raft_port}", api_address=f"127.0.0.1:{api_port}",
        data_dir=tmp_path / "solo", password=PASSWORD, **overrides,  # type: ignore[arg-type]
    )


def test_pysyncobj_internals_we_rely_on(tmp_path: Path) -> None:
    assert VERSION == "0.3.17", "re-verify raft/node.py (_wrap_journal, DurableJournal) and PYSYNCOBJ.md, then pin"
    src = inspect.getsource(SyncObj)
    assert "self.__raftLog = createJournal(self.__conf.journalFile)" in src
    for call in ("self.__raftLog.add(", "self.__raftLog.setCurrentTerm(", "self.__deleteEntriesFrom(prevLogIdx + 1)"):
        assert call in src, call
    for name in ("add", "clear", "deleteEntriesFrom", "deleteEntriesTo", "setCurrentTerm", "flush", "_destroy"):
        assert callable(getattr(FileJournal, name)), name
    assert "self.__serializer(tmpFile, data[1:])" in inspect.getsource(Serializer)
    assert "return (None,) + self.__deserializer(self.__fileName)" in inspect.getsource(Serializer)

    node = RaftNode(single_node_cfg(tmp_path))
    node.start()
    try:
        journal = node._obj._SyncObj__raftLog  # type: ignore[union-attr]
        assert isinstance(journal, DurableJournal)
        assert isinstance(journal._inner, FileJournal)
    finally:
        node.stop()


def test_wrap_journal_refuses_an_unknown_journal(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    obj = SyncObj(f"127.0.0.1:{port}", [], conf=SyncObjConf(autoTick=False))  # in-memory journal
    try:
        with pytest.raises(RuntimeError, match="internals changed"):
            _wrap_journal(obj, tmp_path / "j", fsync=True)
    finally:
        obj.destroy()


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
    with pytest.raises(ConfigError, match="password: required: pysyncobj pickles its wire messages"):
        RaftNode(cfg)


def test_syncobj_conf_from_config(tmp_path: Path) -> None:
    cfg = single_node_cfg(tmp_path)
    conf = RaftNode(cfg)._conf()
    assert conf.password == PASSWORD
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


def journal_with(tmp_path: Path, items: list[tuple[bytes, int, int]]) -> DurableJournal:
    path = tmp_path / "raft.journal"
    inner = FileJournal(str(path))
    for e in items:
        inner.add(*e)
    return DurableJournal(inner, path, fsync=True)


def test_lazy_truncation_skips_identical_entries(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 5))
    j.deleteEntriesFrom(2)  # pysyncobj: "truncate after index 2", then re-adds what the leader re-sent
    j.add(*entries(3, 3)[0])
    j.add(*entries(4, 4)[0])
    assert j.statistics().skipped_rewrites == 2
    assert len(j) == 4  # the read completes the cut: entry 5 goes, as pysyncobj asked
    assert [j[i] for i in range(4)] == entries(1, 4)
    j._destroy()
    assert [FileJournal(str(tmp_path / "raft.journal"))[i] for i in range(4)] == entries(1, 4)


def test_lazy_truncation_replaces_conflicting_entries(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 5))
    j.deleteEntriesFrom(2)
    j.add(*entries(3, 3)[0])  # same
    j.add(*entries(4, 4, term=2)[0])  # conflict: truncate here, then append
    assert [j[i] for i in range(len(j))] == entries(1, 3) + entries(4, 4, term=2)
    j._destroy()
    reread = FileJournal(str(tmp_path / "raft.journal"))
    assert [reread[i] for i in range(len(reread))] == entries(1, 3) + entries(4, 4, term=2)


def test_align_to_snapshot_keeps_entries_after_it(tmp_path: Path) -> None:
    j = journal_with(tmp_path, entries(1, 10))
    prev, last = entries(5, 6)
    assert j.align_to_snapshot(prev, last) == 4
    assert [j[i] for i in range(len(j))] == entries(5, 10)
    assert j.align_to_snapshot(prev, last) == 0  # already aligned
    assert j.align_to_snapshot(*entries(7, 8, term=9)) == 0  # not this log: leave it to pysyncobj
    j._destroy()


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
