"""One Raft member: pysyncobj configured from :class:`CoordinatorConfig`, its tick thread, membership,
durability, and a thread-safe view of its status and lease.

Decisions (details and measurements in ``docs/lease.md``):

* **Password mandatory.** pysyncobj pickles its wire messages; without encryption anyone who reaches
  the port executes code. :class:`RaftNode` refuses to start without one (``ConfigError``).
* **Journal + snapshot in ``data_dir``** (``raft.journal``, ``raft.journal.meta``, ``raft.snapshot``):
  an in-memory journal would make a restarted voter forget its term and vote (PYSYNCOBJ.md §1.5).
* **Transport**: ``connectionTimeout`` effectively infinite and ``connectionRetryTime`` from the config
  (PYSYNCOBJ.md §0: with the stock 3.5 s / 5 s an idle follower-follower connection is torn down on
  first use and the first RequestVote of an election is lost; reconnects are throttled for 5 s).
  Dead peers are still noticed: a killed process closes its sockets; a silent one is caught by TCP
  keepalive (pysyncobj's default 16 s idle + 3 x 5 s).
* **Blunt check-quorum**: ``leaderFallbackTimeout <= raftMinTimeout`` (validated in the config).
* **appendEntriesUseBatch=False**: a command is sent at once (ms commit latency, not 1 period).
* **commandsWaitLeader=False**: while no leader is known a command fails at once with
  ``MISSING_LEADER`` (-> :class:`NotLeader`, a definite "not committed") instead of waiting in a
  queue and committing later, possibly long after its proposer lost the lease.
* **Own tick thread** (``autoTick=False``): the journal hook below is installed before the first
  tick (no race with pysyncobj's auto-tick thread), every tick publishes an immutable
  :class:`RaftStatus` for other threads, and :meth:`RaftNode.stop` joins deterministically.
* **Durability** (``fsync: entry``): pysyncobj never fsyncs. We wrap its journal object so that every
  appended entry is fsync'ed before pysyncobj continues (a follower acks only after that; the leader
  counts itself only after that), term/vote changes are fsync'ed before any message depending on
  them, and the snapshot file and its rename are durable before the journal is truncated behind
  them. The one private attribute involved is reached in :func:`_wrap_journal` only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pysyncobj import FAIL_REASON, HAS_CRYPTO, SyncObj, SyncObjConf, SyncObjException
from pysyncobj.journal import FileJournal
from pysyncobj.node import TCPNode
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from controlplane.config import PASSWORD_REQUIRED, ConfigError, CoordinatorConfig, address_problem
from controlplane.domain.errors import (
    CommitTimeout,
    Conflict,
    ControlPlaneError,
    LeadershipLost,
    NotLeader,
    QueueFull,
    Unavailable,
    ValidationError,
)
from controlplane.domain.state import ControlState
from controlplane.runtime.events import EventLog
from raft import codec
from raft.fsm import ControlFsm, read_snapshot_file, write_snapshot_file
from raft.lease import LeaseCommand, LeaseOutcome, LeaseRecord
from raft.timers import read_before_timers

log = logging.getLogger(__name__)

Role = Literal["leader", "follower", "candidate"]
_ROLES: dict[int, Role] = {0: "follower", 1: "candidate", 2: "leader"}

JOURNAL_FILE = "raft.journal"
SNAPSHOT_FILE = "raft.snapshot"
BIND_ATTEMPTS = 10
BIND_RETRY_S = 0.2
STOP_JOIN_S = 5.0
DNS_CACHE_S = 1.0
"""How long a peer name's DNS answer (or failure) is reused before the next dial resolves it again."""


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class RaftStatus:
    node_id: str
    role: Role
    term: int
    leader_id: str | None
    commit_index: int
    applied_index: int
    log_len: int
    peers: tuple[tuple[str, bool], ...]
    """(node id, TCP-connected) per other member, sorted by id. Members added at run time without
    a known id appear under their Raft address."""


@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    raft_address: str
    api_address: str | None


@dataclass(frozen=True, slots=True)
class DurabilityStats:
    mode: str
    fsyncs: int
    fsync_ms_total: float
    fsync_ms_max: float
    skipped_rewrites: int
    """Re-sent entries identical to the ones on file, not rewritten (see :class:`DurableJournal`)."""


# --- pysyncobj failure codes -> the control plane's error tree --------------------------------------


def failure_error(code: object, leader_hint: str | None, what: str = "command") -> ControlPlaneError:
    """Translate a pysyncobj failure (``FAIL_REASON`` code or ``'Timeout'``) for ``what``."""
    if code in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
        why = "no leader is known" if code == FAIL_REASON.MISSING_LEADER else "the node it reached is not the leader"
        return NotLeader(f"{what} not committed: {why}", leader_hint=leader_hint)
    if code in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED):
        name = "LEADER_CHANGED" if code == FAIL_REASON.LEADER_CHANGED else "DISCARDED"
        return LeadershipLost(f"{what}: leadership changed while in flight ({name}): outcome unknown")
    if code == FAIL_REASON.QUEUE_FULL:
        return QueueFull(f"{what}: the Raft command queue is full")
    if code == FAIL_REASON.REQUEST_DENIED:
        return Conflict(f"{what}: request denied by the leader")
    if code in ("Timeout", FAIL_REASON.UNKNOWN_OUTCOME):
        return CommitTimeout(f"{what}: no answer in time: unknown outcome")
    return CommitTimeout(f"{what}: pysyncobj failure {code!r}: unknown outcome")


# --- durability: the journal hook -------------------------------------------------------------------


def _fsync_path(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableJournal:
    """Delegates to pysyncobj's ``FileJournal``; with ``fsync`` it makes each mutation durable
    before returning to pysyncobj (which then sends the messages that depend on it).

    It also makes truncation lazy. pysyncobj truncates a follower's log at ``prevLogIdx + 1`` on
    *every* append that overlaps what the follower has (the leader re-sends unacknowledged entries
    on each new command), then re-adds the same entries: an fsync'ed rewrite of acknowledged
    entries, and a window in which a kill -9 leaves them missing from disk. Here the cut is only
    remembered; re-added entries identical to the ones on file are skipped, and whatever still lies
    beyond the cut is deleted at the first differing add or the next read (the log pysyncobj sees
    is exactly the one it asked for).
    """

    def __init__(
        self, inner: FileJournal, journal_path: Path, fsync: bool, applied: Callable[[], int] | None = None
    ) -> None:
        self._inner = inner
        self._path = journal_path
        self._meta = Path(str(journal_path) + ".meta")
        self._dir = journal_path.parent
        self._fsync = fsync
        self._applied = applied
        self._fd = os.open(journal_path, os.O_RDONLY) if fsync else -1
        self._cut: int | None = None
        self._lock = threading.Lock()
        self._n = 0
        self._total = 0.0
        self._max = 0.0
        self._skipped = 0

    # journal API used by SyncObj (all calls come from the tick thread) -----------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._cut is not None:
            if self._cut < len(self._inner) and self._inner[self._cut] == (command, idx, term):
                self._cut += 1  # the same entry is already on file (and was synced when written)
                self._skipped += 1
                return
            self._finish_cut()
        self._inner.add(command, idx, term)
        self._sync_journal()

    def deleteEntriesFrom(self, entry_from: int) -> None:  # noqa: N802 (pysyncobj's name)
        self._finish_cut()
        self._cut = entry_from

    def clear(self) -> None:
        self._cut = None
        self._sync_dir()  # a snapshot renamed into place must be durable before the log behind it goes
        self._inner.clear()

    def deleteEntriesTo(self, entry_to: int) -> None:  # noqa: N802
        self._finish_cut()
        self._sync_dir()
        self._inner.deleteEntriesTo(entry_to)
        self._sync_journal()

    def setCurrentTerm(self, term: int, voted_for: Any) -> None:  # noqa: N802
        self._inner.setCurrentTerm(term, voted_for)
        if self._fsync:
            self._timed(lambda: (_fsync_path(self._meta), _fsync_path(self._dir)))

    def __getitem__(self, item: Any) -> Any:
        self._finish_cut()
        return self._inner[item]

    def __len__(self) -> int:
        self._finish_cut()
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:  # getRaftCommitIndex, onOneSecondTimer, flush...
        return getattr(self._inner, name)

    def _destroy(self) -> None:
        self._finish_cut()
        self._inner._destroy()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ours -------------------------------------------------------------------------------------------
    def _finish_cut(self) -> None:
        cut, self._cut = self._cut, None
        if cut is None or cut >= len(self._inner):
            return
        first = self._inner[cut][1]
        if self._applied is not None and first <= self._applied():
            log.critical(
                "truncating already-applied log entries from index %d (last applied %d): this replica's "
                "state machine may have diverged", first, self._applied(),
            )
        self._inner.deleteEntriesFrom(cut)
        self._sync_journal()

    def align_to_snapshot(self, prev: tuple[bytes, int, int], last: tuple[bytes, int, int]) -> int:
        """At start-up: if the journal still holds entries older than a snapshot that was renamed
        into place just before a crash (pysyncobj truncates one tick later), drop only those, so
        pysyncobj does not clear the newer entries along with them. Returns entries dropped."""
        self._finish_cut()
        n = len(self._inner)
        if n < 2:
            return 0
        k = prev[1] - self._inner[0][1]
        if 0 < k < n - 1 and self._inner[k] == prev and self._inner[k + 1] == last:
            self._inner.deleteEntriesTo(k)
            self._sync_journal()
            return k
        return 0

    def statistics(self) -> DurabilityStats:
        with self._lock:
            return DurabilityStats(
                "entry" if self._fsync else "none", self._n, self._total, self._max, self._skipped
            )

    def _sync_journal(self) -> None:
        if self._fsync:
            self._timed(lambda: (self._inner.flush(), os.fsync(self._fd)))

    def _sync_dir(self) -> None:
        if self._fsync:
            self._timed(lambda: _fsync_path(self._dir))

    def _timed(self, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1000.0
        with self._lock:
            self._n += 1
            self._total += dt
            self._max = max(self._max, dt)


class _DropSpuriousTruncationWarning(logging.Filter):
    """pysyncobj logs CRITICAL "truncating already-applied log entries" whenever the leader re-sends
    entries a follower already has, which is routine; :class:`DurableJournal` logs the real case
    (an applied entry actually removed) instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


logging.getLogger("pysyncobj.syncobj").addFilter(_DropSpuriousTruncationWarning())


def _wrap_journal(obj: SyncObj, journal_path: Path, fsync: bool) -> DurableJournal:
    """THE ONE PLACE that touches a pysyncobj private attribute: ``SyncObj.__raftLog`` (name-mangled
    ``_SyncObj__raftLog``), the journal object SyncObj writes every entry, term and vote to. pysyncobj
    offers no hook between "entry appended" and "ack sent", so we replace the object with a
    delegating wrapper. ``tests/raft/test_durability.py`` fails if pysyncobj renames or changes it."""
    inner = getattr(obj, "_SyncObj__raftLog", None)
    if not isinstance(inner, FileJournal):
        raise RuntimeError(
            f"pysyncobj {PYSYNCOBJ_VERSION} internals changed: SyncObj._SyncObj__raftLog "
            f"is {type(inner).__name__}, expected FileJournal; raft/node.py _wrap_journal must be updated"
        )
    wrapped = DurableJournal(inner, journal_path, fsync, applied=lambda: obj.raftLastApplied)
    obj._SyncObj__raftLog = wrapped  # type: ignore[attr-defined]
    return wrapped


# --- the node ---------------------------------------------------------------------------------------


class RaftNode:
    """A pysyncobj member running :class:`ControlFsm`. ``start()`` binds and starts ticking.

    ``node_class`` builds pysyncobj's node objects from addresses (self, peers, members added later,
    members restored from a snapshot); tests pass a factory that routes peers through fault proxies.
    ``clock_ms`` is the monotonic millisecond clock that stamps ``t_obs_ms`` (LeaseGuard's default)."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        node_class: Callable[[str], TCPNode] | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if cfg.password is None or not cfg.password.get_secret_value():
            raise ConfigError(f"password: {PASSWORD_REQUIRED}", field="password")
        if not HAS_CRYPTO:
            raise ConfigError(
                "password: Raft encryption needs the 'cryptography' package, which is not installed", field="password"
            )
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.clock_ms: Callable[[], int] = clock_ms or monotonic_ms
        self.fsm = ControlFsm(self.clock_ms)
        self._node_class: Callable[[str], TCPNode] = node_class or TCPNode
        self._journal_path = cfg.data_dir / JOURNAL_FILE
        self._snapshot_path = cfg.data_dir / SNAPSHOT_FILE
        self._members = {m.raft_address: Member(m.node_id, m.raft_address, m.api_address) for m in cfg.members()}
        self._members_lock = threading.Lock()
        self._obj: SyncObj | None = None
        self._journal: DurableJournal | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ticked = False
        self._fatal = ""
        self._status = RaftStatus(self.node_id, "follower", 0, None, 0, 0, 0, ())
        self._leader_address: str | None = None
        self._tick_observers: list[Callable[[RaftStatus], None]] = []

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._obj is not None:
            raise RuntimeError("RaftNode already started")
        others = [p.raft_address for p in self.cfg.peers]
        last_exc: Exception | None = None
        for _ in range(BIND_ATTEMPTS):
            try:
                self._obj = SyncObj(
                    self.cfg.raft_address, others, conf=self._conf(), consumers=[self.fsm], nodeClass=self._node_class
                )
                break
            except SyncObjException as exc:  # BindError: the port is busy (or in TIME_WAIT elsewhere)
                last_exc = exc
                time.sleep(BIND_RETRY_S)
        if self._obj is None:
            raise Unavailable(f"raft: cannot bind {self.cfg.raft_address}: {last_exc}") from last_exc
        self._journal = _wrap_journal(self._obj, self._journal_path, self.cfg.fsync == "entry")
        self._thread = threading.Thread(target=self._run, name=f"raft-tick-{self.node_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_JOIN_S) -> None:
        """Stop ticking, close connections and the journal (flushed). Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("raft tick thread of %s did not stop within %.1fs", self.node_id, timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _conf(self) -> SyncObjConf:
        c = self.cfg
        if c.password is None:
            raise ConfigError(f"password: {PASSWORD_REQUIRED}", field="password")
        return SyncObjConf(
            password=c.password.get_secret_value(),
            bindAddress=c.raft_address,  # without it pysyncobj binds 0.0.0.0
            journalFile=str(self._journal_path),
            fullDumpFile=str(self._snapshot_path),
            serializer=self._serialize,
            deserializer=self._deserialize,
            dynamicMembershipChange=True,
            appendEntriesUseBatch=False,
            commandsWaitLeader=False,
            commandsQueueSize=c.raft_queue_size,
            raftMinTimeout=c.raft_min_timeout_ms / 1000.0,
            raftMaxTimeout=c.raft_max_timeout_ms / 1000.0,
            appendEntriesPeriod=c.append_entries_period_ms / 1000.0,
            leaderFallbackTimeout=c.leader_fallback_timeout_ms / 1000.0,
            connectionTimeout=1e9,
            connectionRetryTime=c.connection_retry_ms / 1000.0,
            logCompactionMinEntries=c.log_compaction_min_entries,
            logCompactionMinTime=c.log_compaction_min_time_ms / 1000.0,
            autoTick=False,
            bindRetryTime=0.05,
            maxBindRetries=1,
            # pysyncobj caches a peer's DNS answer for 600 s by default; on Kubernetes a restarted
            # coordinator keeps its name but gets a new pod IP, so peers would dial the dead IP for
            # up to 10 minutes (two restarts in a rolling upgrade = no quorum). Names are resolved
            # only when a connection is (re)dialled, so a short cache costs one lookup per retry.
            dnsCacheTime=DNS_CACHE_S,
            dnsFailCacheTime=DNS_CACHE_S,
        )

    def _tick_wait_s(self) -> float:
        return max(0.005, min(0.05, self.cfg.append_entries_period_ms / 2000.0))

    def _run(self) -> None:
        obj = self._obj
        if obj is None:
            return
        wait = self._tick_wait_s()
        try:
            while not self._stopping.is_set() and not self._fatal:
                try:
                    if self._ticked and self.cfg.raft_read_before_timers:
                        read_before_timers(obj)
                    obj.doTick(wait)
                except Exception:
                    log.exception("raft tick failed on %s", self.node_id)
                    time.sleep(wait)
                self._ticked = True
                self._publish(obj)
                for fn in self._tick_observers:
                    fn(self._status)
        finally:
            try:
                obj.destroy()  # autoTick=False: closes the transport and the journal (msync) right here
            except Exception:
                log.exception("raft destroy failed on %s", self.node_id)
            st = self._status
            self._status = RaftStatus(st.node_id, "follower", st.term, None, st.commit_index, st.applied_index,
                                      st.log_len, tuple((p, False) for p, _ in st.peers))
            self._leader_address = None

    def _publish(self, obj: SyncObj) -> None:
        st = obj.getStatus()
        leader = st["leader"]
        leader_addr = None if leader is None else str(leader.id)
        peers = tuple(sorted((self._id_of(str(n.id)), obj.isNodeConnected(n)) for n in obj.otherNodes))
        self._leader_address = leader_addr
        self._status = RaftStatus(
            node_id=self.node_id,
            role=_ROLES.get(st["state"], "follower"),
            term=st["raft_term"],
            leader_id=None if leader_addr is None else self._id_of(leader_addr),
            commit_index=st["commit_idx"],
            applied_index=st["last_applied"],
            log_len=st["log_len"],
            peers=peers,
        )

    # --- observation hooks (issue 14: stable leadership; controlplane/bench/stability.py) -------------

    def add_tick_observer(self, fn: Callable[[RaftStatus], None]) -> None:
        """Call ``fn(status)`` in the tick thread after every tick (keep it short: it delays the
        next tick). Add observers before :meth:`start`."""
        self._tick_observers.append(fn)

    # --- snapshot hooks (tick thread) ---------------------------------------------------------------

    def _serialize(self, path: str, data: tuple[Any, Any, Any]) -> None:
        last, prev, cluster = data
        write_snapshot_file(path, self.fsm, last, prev, cluster, fsync=self.cfg.fsync == "entry")

    def _deserialize(self, path: str) -> tuple[Any, Any, list[TCPNode]]:
        try:
            snap = read_snapshot_file(path)
            if self.cfg.fsync == "entry":  # a snapshot received from the leader was renamed unsynced
                _fsync_path(path)
                _fsync_path(self.cfg.data_dir)
            if not self._ticked and self._journal is not None:
                dropped = self._journal.align_to_snapshot(snap.prev, snap.last)
                if dropped:
                    log.warning("%s: dropped %d journal entries already covered by the snapshot", self.node_id, dropped)
            self.fsm.install_snapshot(snap.state)
        except (OSError, codec.CodecError) as exc:
            # Running on without the snapshot would replay a truncated journal onto an empty state:
            # a silently diverged replica. Stop this member instead (it no longer votes or acks).
            self._fatal = f"cannot load snapshot {path}: {exc}"
            log.critical("%s: %s; stopping this Raft member", self.node_id, self._fatal)
            raise
        return snap.last, snap.prev, [self._node_class(a) for a in snap.cluster]

    # --- views (any thread) -------------------------------------------------------------------------

    def status(self) -> RaftStatus:
        return self._status

    def is_leader(self) -> bool:
        return self._status.role == "leader" and self.running

    def leader_id(self) -> str | None:
        return self._status.leader_id

    def leader_address(self) -> str | None:
        return self._leader_address

    def leader_api_address(self) -> str | None:
        addr = self._leader_address
        if addr is None:
            return None
        with self._members_lock:
            m = self._members.get(addr)
        return None if m is None else m.api_address

    def lease_view(self) -> tuple[LeaseRecord, int]:
        return self.fsm.lease_view()

    def state_copy(self) -> ControlState:
        return self.fsm.state_copy()

    @property
    def events(self) -> EventLog:
        """This replica's change events (what the API's ``Watch`` and ``Explain`` read)."""
        return self.fsm.events

    def fatal_error(self) -> str:
        return self._fatal

    def durability(self) -> DurabilityStats:
        if self._journal is None:
            return DurabilityStats(self.cfg.fsync, 0, 0.0, 0.0, 0)
        return self._journal.statistics()

    def wait_leader(self, timeout_s: float) -> str | None:
        """Poll until some leader is known (returns its node id) or the timeout passes (None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self._status.leader_id
            if leader is not None:
                return leader
            time.sleep(0.01)
        return None

    def _id_of(self, raft_address: str) -> str:
        with self._members_lock:
            m = self._members.get(raft_address)
        return raft_address if m is None else m.node_id

    # --- commands -----------------------------------------------------------------------------------

    def submit(self, payload: bytes, *, timeout_s: float, fence: tuple[str, int] | None = None) -> object:
        """Submit one encoded entry and wait until it is applied on this node; returns its local
        result. Raises the translated error (NotLeader, LeadershipLost, QueueFull, CommitTimeout)."""
        if self._obj is None or not self.running:
            raise Unavailable(f"raft node {self.node_id} is not running")
        holder, epoch = fence if fence is not None else ("", 0)
        try:
            return self.fsm.apply_entry(payload, holder, epoch, sync=True, timeout=timeout_s)
        except SyncObjException as exc:
            raise failure_error(exc.errorCode, self.leader_api_address()) from exc

    def commit_lease(self, cmd: LeaseCommand, timeout_s: float | None = None) -> LeaseOutcome:
        """Commit one lease command; the outcome says whether its compare-and-set succeeded. Raises
        like :meth:`submit`."""
        timeout = timeout_s if timeout_s is not None else self.cfg.commit_timeout_ms / 1000.0
        result = self.submit(codec.encode(cmd), timeout_s=timeout)
        if not isinstance(result, LeaseOutcome):
            reason = getattr(result, "error", type(result).__name__)
            raise CommitTimeout(f"lease command got no lease outcome ({reason}): unknown outcome")
        return result

    def add_member(
        self, raft_address: str, *, node_id: str | None = None, api_address: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Add a voting member (one change at a time). The new node must be started with the full
        member list. Raises ValidationError, NotLeader, Conflict (a change is in progress / already
        a member), LeadershipLost or CommitTimeout."""
        self._membership("add", raft_address, timeout_s)
        with self._members_lock:
            self._members[raft_address] = Member(node_id or raft_address, raft_address, api_address)

    def remove_member(self, raft_address: str, *, timeout_s: float | None = None) -> None:
        """Remove a member (one change at a time); stop the removed process afterwards."""
        if raft_address == self.cfg.raft_address:
            raise ValidationError("raft_address", "a node cannot remove itself; ask another member")
        self._membership("remove", raft_address, timeout_s)

    def _membership(self, op: str, raft_address: str, timeout_s: float | None) -> None:
        problem = address_problem(raft_address)
        if problem:
            raise ValidationError("raft_address", problem)
        obj = self._obj
        if obj is None or not self.running:
            raise Unavailable(f"raft node {self.node_id} is not running")
        done = threading.Event()
        box: list[object] = []

        def callback(_res: object, err: object) -> None:
            box.append(err)
            done.set()

        fn = obj.addNodeToCluster if op == "add" else obj.removeNodeFromCluster
        fn(raft_address, callback=callback)
        timeout = timeout_s if timeout_s is not None else self.cfg.commit_timeout_ms / 1000.0
        if not done.wait(timeout):
            raise CommitTimeout(f"{op} member {raft_address}: no answer in {timeout:.1f}s: unknown outcome")
        if box[0] != FAIL_REASON.SUCCESS:
            err = failure_error(box[0], self.leader_api_address(), f"{op} member {raft_address}")
            if isinstance(err, Conflict):
                err = Conflict(
                    f"{op} member {raft_address}: refused (another membership change is in progress, the leader "
                    f"has not committed its first entry yet, or the member is already {'in' if op == 'add' else 'out of'} "
                    "the cluster)"
                )
            raise err

    def force_compaction(self) -> None:
        """Ask pysyncobj to snapshot and truncate the log at its next tick."""
        if self._obj is not None:
            self._obj.forceLogCompaction()


def dial_override_node_class(overrides: dict[str, str]) -> Callable[[str], TCPNode]:
    """pysyncobj node objects whose identity is their real address but which are *dialed* at
    ``overrides[address]`` when present (used to route each Raft link through a fault-injecting proxy
    in tests: ``raft_dial_overrides`` in the configuration). Only loopback addresses are accepted."""
    ports: dict[str, int] = {}
    for address, dial in overrides.items():
        host, _, port = dial.rpartition(":")
        if host != "127.0.0.1" or not port.isdigit():
            raise ConfigError(f"raft_dial_overrides: {dial!r} must be 127.0.0.1:port", field="raft_dial_overrides")
        ports[address] = int(port)

    class DialOverrideNode(TCPNode):
        @property
        def port(self) -> int:  # pysyncobj connects to (node.ip, node.port)
            return ports.get(self.address, super().port)

    return DialOverrideNode
