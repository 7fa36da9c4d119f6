"""One Raft member: pysyncobj configured from :class:`CoordinatorConfig`, its tick thread, membership,
durability, and a thread-safe view of its status and lease.

Decisions (details and measurements in ``docs/lease.md``):

* **Transport: our own** (:class:`raft.transport.TlsTransport`, docs/security.md "Raft transport"):
  mutual TLS 1.3 between members (``raft_tls``, mandatory), the password as a second layer (an HMAC
  challenge inside TLS, mandatory), strict pickle-free messages and a bound on every frame, buffer,
  timeout and connection count. pysyncobj's ``TCPTransport`` (and its Fernet layer) is not used.
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
* **Durability and integrity**: the journal is ours (:class:`raft.journal.RaftJournal`: checksummed
  records, plain file I/O, fsync per entry with ``fsync: entry``), handed to SyncObj through its
  journal factory in :func:`construct_with_journal` (the one place touching pysyncobj internals).
  A corrupt, truncated or empty journal, metadata or snapshot file, or a failed write (full disk),
  stops this member: one log line, no Raft (no vote, no ack), :meth:`RaftNode.fatal_error` set and
  the fatal listeners told (the coordinator turns health NOT_SERVING and the API UNAVAILABLE).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pysyncobj import FAIL_REASON, HAS_CRYPTO, SyncObj, SyncObjConf, SyncObjException
from pysyncobj.node import TCPNode
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from controlplane.config import (
    PASSWORD_REQUIRED,
    RAFT_TLS_REQUIRED,
    ConfigError,
    CoordinatorConfig,
    address_problem,
)
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
from raft.journal import Disk, JournalError, JournalWriteFailed, RaftJournal
from raft.lease import LeaseCommand, LeaseOutcome, LeaseRecord
from raft.transport import InboundFilter, TlsTransport, TransportSettings, TransportStats
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
    """Re-sent entries identical to the ones on file, not rewritten (see :class:`RaftJournal`)."""


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


# --- durability: our journal, handed to SyncObj ----------------------------------------------------


def _fsync_path(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _DropSpuriousTruncationWarning(logging.Filter):
    """pysyncobj logs CRITICAL "truncating already-applied log entries" whenever the leader re-sends
    entries a follower already has, which is routine; :class:`RaftJournal` logs the real case (an
    applied entry actually removed) instead. pysyncobj also logs a traceback for "failed to load full
    dump" around our deserializer; when that failure was already reported (one line, member stopped)
    the traceback is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("truncating already-applied log entries"):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (_Reported, JournalError))


class _Reported(Exception):
    """Raised through pysyncobj after the failure was logged and the member marked fatal."""


logging.getLogger("pysyncobj.syncobj").addFilter(_DropSpuriousTruncationWarning())

_JOURNAL_FACTORY_LOCK = threading.Lock()


def construct_with_journal(journal: RaftJournal, build: Callable[[], SyncObj]) -> SyncObj:
    """THE ONE PLACE that touches pysyncobj internals. ``SyncObj.__init__`` builds its journal with
    ``createJournal(conf.journalFile)`` (a name imported into ``pysyncobj.syncobj``) and reads it at
    once (length, a NO_OP for an empty log, term, vote, commit index), so the journal must be ours
    *before* ``__init__`` runs: for the duration of ``build()`` that name is replaced by a factory that
    returns ``journal`` for its path (any other path: pysyncobj's own factory). Raises RuntimeError if
    the SyncObj did not ask for it; ``tests/raft/test_durability.py`` fails if pysyncobj changes."""
    import pysyncobj.syncobj as syncobj_module

    original = syncobj_module.createJournal
    asked: list[str] = []

    def factory(journal_file: str | None = None) -> Any:
        if journal_file == str(journal.path):
            asked.append(journal_file)
            return journal
        return original(journal_file)

    with _JOURNAL_FACTORY_LOCK:
        syncobj_module.createJournal = factory
        try:
            obj = build()
        finally:
            syncobj_module.createJournal = original
    if not asked:
        raise RuntimeError(
            f"pysyncobj {PYSYNCOBJ_VERSION} internals changed: SyncObj did not build its journal through "
            "pysyncobj.syncobj.createJournal; raft/node.py construct_with_journal must be updated"
        )
    return obj


# --- the node ---------------------------------------------------------------------------------------


class RaftNode:
    """A pysyncobj member running :class:`ControlFsm`. ``start()`` binds and starts ticking.

    ``node_class`` builds pysyncobj's node objects from addresses (self, peers, members added later,
    members restored from a snapshot); tests pass a factory that routes peers through fault proxies.
    ``clock_ms`` is the monotonic millisecond clock that stamps ``t_obs_ms`` (LeaseGuard's default).
    ``disk`` is the journal's write/fsync layer (tests pass one that fails like a full disk)."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        node_class: Callable[[str], TCPNode] | None = None,
        clock_ms: Callable[[], int] | None = None,
        disk: Disk | None = None,
        inbound_filter: InboundFilter | None = None,
    ) -> None:
        if cfg.password is None or not cfg.password.get_secret_value():
            raise ConfigError(f"password: {PASSWORD_REQUIRED}", field="password")
        if cfg.raft_tls is None:
            raise ConfigError(f"raft_tls: {RAFT_TLS_REQUIRED}", field="raft_tls")
        self._transport_settings = TransportSettings.from_config(cfg)
        self._inbound_filter = inbound_filter
        self._transport: TlsTransport | None = None
        if not HAS_CRYPTO:
            raise ConfigError(
                "password: Raft encryption needs the 'cryptography' package, which is not installed", field="password"
            )
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.clock_ms: Callable[[], int] = clock_ms or monotonic_ms
        self.fsm = ControlFsm(self.clock_ms)
        self._node_class: Callable[[str], TCPNode] = node_class or TCPNode
        self._disk = disk
        self._journal_path = cfg.data_dir / JOURNAL_FILE
        self._snapshot_path = cfg.data_dir / SNAPSHOT_FILE
        self._members = {m.raft_address: Member(m.node_id, m.raft_address, m.api_address) for m in cfg.members()}
        self._members_lock = threading.Lock()
        self._obj: SyncObj | None = None
        self._journal: RaftJournal | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ticked = False
        self._fatal = ""
        self._fatal_kind = ""
        self._fatal_listeners: list[Callable[[str, str], None]] = []
        self._status = RaftStatus(self.node_id, "follower", 0, None, 0, 0, 0, ())
        self._leader_address: str | None = None
        self._tick_observers: list[Callable[[RaftStatus], None]] = []

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._obj is not None:
            raise RuntimeError("RaftNode already started")
        others = [p.raft_address for p in self.cfg.peers]
        # --- storage: verified before SyncObj exists (a bad file stops this member: no port, no vote)
        journal = self._open_storage()
        if journal is None:
            return
        self._journal = journal
        last_exc: Exception | None = None
        for _ in range(BIND_ATTEMPTS):
            busy = _bind_problem(self.cfg.raft_address)
            if busy is not None:  # probe first: a SyncObj that fails to bind leaks its journal and pipes
                last_exc = busy
                time.sleep(BIND_RETRY_S)
                continue
            try:
                self._obj = construct_with_journal(journal, lambda: SyncObj(
                    self.cfg.raft_address, others, conf=self._conf(), consumers=[self.fsm], nodeClass=self._node_class,
                    transportClass=self._build_transport,
                ))
                break
            except JournalError:  # the NO_OP of a fresh log could not be written: already reported
                journal._destroy()
                return
            except SyncObjException as exc:  # BindError: the port is busy (or in TIME_WAIT elsewhere)
                last_exc = exc
                if self._transport is not None:  # SyncObj does not destroy a transport it gave up on
                    self._transport.destroy()
                    self._transport = None
                time.sleep(BIND_RETRY_S)
        if self._obj is None:
            journal._destroy()
            raise Unavailable(f"raft: cannot bind {self.cfg.raft_address}: {last_exc}") from last_exc
        self._thread = threading.Thread(target=self._run, name=f"raft-tick-{self.node_id}", daemon=True)
        self._thread.start()

    # --- storage and the fatal path ---------------------------------------------------------------
    def _open_storage(self) -> RaftJournal | None:
        """Open and verify the journal, its metadata and the snapshot. None (member stopped, reported)
        when any of them is unusable."""
        try:
            journal = RaftJournal(self._journal_path, fsync=self.cfg.fsync == "entry", disk=self._disk,
                                  applied=lambda: self._obj.raftLastApplied if self._obj is not None else 0)
        except JournalError as exc:
            self._set_fatal(str(exc), "disk" if isinstance(exc, JournalWriteFailed) else "corrupt")
            return None
        except OSError as exc:
            self._set_fatal(f"{exc.filename}: cannot read: {exc.strerror}", "disk")
            return None
        journal.on_failure = lambda exc: self._set_fatal(
            str(exc), "disk" if isinstance(exc, JournalWriteFailed) else "corrupt")
        snap_last = 0
        if self._snapshot_path.exists():
            try:
                snap_last = read_snapshot_file(str(self._snapshot_path)).last[1]
            except (OSError, codec.CodecError) as exc:
                journal._destroy()
                self._set_fatal(f"cannot load snapshot: {exc}", "corrupt")
                return None
        last = journal[-1][1] if len(journal) else 0
        commit = journal.meta.commit_index
        if commit > 1 and commit > max(last, snap_last):
            journal._destroy()
            self._set_fatal(f"{self._journal_path}: ends at index {last} (snapshot: {snap_last}) but its metadata "
                            f"records index {commit} as committed: committed entries are missing "
                            f"(at byte offset {journal.size})", "corrupt")
            return None
        return journal

    def _set_fatal(self, reason: str, kind: str) -> None:
        """Stop taking part in Raft for good (until an operator repairs the data dir and restarts)."""
        if self._fatal:
            return
        self._fatal_kind = kind
        self._fatal = reason
        log.critical("raft member %s stopped: %s", self.node_id, reason)
        for cb in list(self._fatal_listeners):
            cb(kind, reason)

    def add_fatal_listener(self, cb: Callable[[str, str], None]) -> None:
        """``cb(kind, reason)`` when this member stops for a storage problem (``kind``: ``corrupt`` or
        ``disk``); called at once if it already has."""
        self._fatal_listeners.append(cb)
        if self._fatal:
            cb(self._fatal_kind, self._fatal)

    def fatal_kind(self) -> str:
        return self._fatal_kind

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

    def _build_transport(self, obj: SyncObj, self_node: TCPNode, other_nodes: Any) -> TlsTransport:
        """pysyncobj's ``transportClass``: our transport, bound to this node's settings and members."""
        self._transport = TlsTransport(
            obj, self_node, other_nodes, settings=self._transport_settings, inbound_filter=self._inbound_filter,
            expected_identity=self._expected_identity,
        )
        return self._transport

    def _expected_identity(self, raft_address: str) -> str | None:
        """The node id a member's certificate must name (None: a member added at run time whose id
        this node was not told)."""
        with self._members_lock:
            m = self._members.get(raft_address)
        return None if m is None or m.node_id == raft_address else m.node_id

    def transport_stats(self) -> TransportStats | None:
        """The Raft transport's counters (None before start)."""
        t = self._transport
        return None if t is None else t.statistics()

    def _conf(self) -> SyncObjConf:
        c = self.cfg
        # No ``password`` here: the password is checked by our transport (an HMAC challenge inside
        # TLS); pysyncobj's Fernet layer belongs to the TCPTransport we replace.
        return SyncObjConf(
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
                except (JournalError, _Reported):
                    pass  # reported once by _set_fatal; the loop ends on self._fatal
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
            self._set_fatal(f"cannot load snapshot: {exc}", "corrupt")
            raise _Reported(str(exc)) from None
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
        st = self._journal.statistics()
        return DurabilityStats("entry" if st.fsync else "none", st.fsyncs, st.fsync_ms_total, st.fsync_ms_max,
                               st.skipped_rewrites)

    def wait_leader(self, timeout_s: float) -> str | None:
        """Poll until some leader is known (returns its node id) or the timeout passes (None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self._status.leader_id
            if leader is not None:
                return leader
            time.sleep(0.01)
        return None

    def _not_running(self) -> str:
        if self._fatal:
            return f"raft member {self.node_id} stopped: {self._fatal}"
        return f"raft node {self.node_id} is not running"

    def _id_of(self, raft_address: str) -> str:
        with self._members_lock:
            m = self._members.get(raft_address)
        return raft_address if m is None else m.node_id

    # --- commands -----------------------------------------------------------------------------------

    def submit(self, payload: bytes, *, timeout_s: float, fence: tuple[str, int] | None = None) -> object:
        """Submit one encoded entry and wait until it is applied on this node; returns its local
        result. Raises the translated error (NotLeader, LeadershipLost, QueueFull, CommitTimeout)."""
        if self._obj is None or not self.running:
            raise Unavailable(self._not_running())
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
            raise Unavailable(self._not_running())
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


def _bind_problem(address: str) -> OSError | None:
    """Why ``address`` cannot be bound right now (None: it can; the probe socket is closed again)."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        return exc
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the transport binds
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return exc
    return None


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
