"""The replicated state machine on pysyncobj: one ``@replicated`` entry point, codec-encoded payloads.

What lives where (PYSYNCOBJ.md §0/§1.1 pitfalls):

* Replicated state (:class:`ControlState` + :class:`LeaseRecord`) lives in :class:`ControlFsm`, a
  ``SyncObjConsumer``, never in attributes of a ``SyncObj`` subclass.
* Every log entry of ours is one call of :meth:`ControlFsm.apply_entry` with ``payload`` = bytes from
  :func:`raft.codec.encode` (a domain ``Command`` or a lease command) and an optional fence
  ``(holder, epoch)``. pysyncobj pickles only that call tuple (bytes, str, int); domain objects never
  meet pickle.
* ``apply_entry`` runs on every node in pysyncobj's tick thread, in log order. Its log index is
  ``raftLastApplied + 1`` (pysyncobj bumps ``raftLastApplied`` after the call returns); that index
  is the fencing epoch of an ``AcquireLease``.
* The return value reaches only the submitter's callback, *on the submitter's own node*: a follower
  that forwarded a command waits until it applied the entry itself and gets its own local result.
  Results never cross the wire, so returning the ``ApplyResult`` / ``LeaseOutcome`` that ``apply``
  built anyway costs nothing.
* Not replicated, not snapshotted: ``t_obs_ms``, this node's clock reading when it applied the last
  lease *version change*. Set to "now" at start, on snapshot install and (naturally) on journal
  replay, which only makes contenders wait longer (conservative).

Snapshots: pysyncobj's ``serializer``/``deserializer`` hooks (see :func:`write_snapshot_file`) with
our own file format and :func:`raft.codec.encode_state`; no pickle in the snapshot file.

Change events: the FSM owns an :class:`~controlplane.runtime.events.EventLog` (``events``) and
records every applied domain entry into it under ``_lock``; a snapshot install resets it to the
installed state's revision (the events before it are not known here). A lease entry that changes the
holder or the epoch (an acquisition, a release; not a renewal) counts as one applied command
(``ControlState.applied`` + 1) and records a ``Lease`` event at that revision.

Thread safety: ``apply_entry`` and the snapshot hooks run in the tick thread and take ``_lock``;
readers (:meth:`state_copy`, :meth:`lease_view`) take the same lock and get a copy (dict tables are
shallow-copied: their values are frozen dataclasses). A copy is cached until the next change, so
the control loop reading ``state`` several times per tick costs one copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from controlplane.domain.state import ApplyResult, ControlState, apply
from controlplane.runtime.events import EventLog, capture, lease_event
from raft import codec
from raft.lease import AcquireLease, LeaseOutcome, LeaseRecord, ReleaseLease, RenewLease, apply_lease

log = logging.getLogger(__name__)

LEASE_TYPES = (AcquireLease, RenewLease, ReleaseLease)

FENCED_PREFIX = "fenced:"
"""Start of the error of a domain entry rejected because its fence no longer matches the lease."""

SNAPSHOT_MAGIC = b"CPSNAP\x00\x01"
SNAPSHOT_FORMAT = 1
MAX_SNAPSHOT_HEADER = 1 << 20
"""Bound on the JSON header of a snapshot file (the state itself is bounded by the codec)."""


@dataclass(frozen=True, slots=True)
class FsmStatistics:
    entries_applied: int
    """Our entries applied on this node (no-ops and membership entries are pysyncobj's)."""
    rejected: int
    """Entries whose payload did not decode, or whose fence did not match."""
    lease_changes: int
    snapshots_written: int
    snapshots_installed: int
    last_index: int
    """Log index of the last entry applied through :meth:`ControlFsm.apply_entry`."""


def copy_state(state: ControlState) -> ControlState:
    """A consistent, independent copy of ``state``'s containers (values are immutable)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, dict):
            value = {k: (dict(v) if isinstance(v, dict) else v) for k, v in value.items()}
        kwargs[f.name] = value
    return ControlState(**kwargs)


class ControlFsm(SyncObjConsumer):
    """Replicated :class:`ControlState` and lease record. Construct, then hand to ``SyncObj``."""

    def __init__(self, clock_ms: Callable[[], int], events: EventLog | None = None) -> None:
        super().__init__()
        self.events = events if events is not None else EventLog()
        """Change events of the entries applied here (see ``controlplane/runtime/events.py``)."""
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._state = ControlState()
        self._lease = LeaseRecord()
        self._t_obs_ms = clock_ms()
        self._change = 0
        self._copy: tuple[int, ControlState] | None = None
        self._stats = dict(
            entries_applied=0, rejected=0, lease_changes=0, snapshots_written=0, snapshots_installed=0, last_index=0
        )

    # --- the one replicated entry point -----------------------------------------------------------

    @replicated
    def apply_entry(self, payload: bytes, fence_holder: str = "", fence_epoch: int = 0) -> ApplyResult | LeaseOutcome:
        """Apply one of our log entries. Deterministic and total (runs on every node)."""
        log_index = self._syncObj.raftLastApplied + 1
        try:
            return self._apply(payload, fence_holder, fence_epoch, log_index)
        except Exception as exc:  # never let an entry wedge the tick thread: reject it identically
            log.exception("apply_entry failed at index %d", log_index)
            self._stats["rejected"] += 1
            return ApplyResult(False, f"internal error applying entry {log_index}: {type(exc).__name__}")

    def _apply(self, payload: bytes, holder: str, epoch: int, log_index: int) -> ApplyResult | LeaseOutcome:
        try:
            cmd = codec.decode(payload)
        except codec.CodecError as exc:
            self._stats["rejected"] += 1
            return ApplyResult(False, f"undecodable entry {log_index}: {exc}")
        with self._lock:
            self._stats["entries_applied"] += 1
            self._stats["last_index"] = log_index
            if isinstance(cmd, LEASE_TYPES):
                return self._apply_lease(cmd, log_index)
            if holder or epoch:
                problem = fence_problem(self._lease, holder, epoch)
                if problem:
                    self._stats["rejected"] += 1
                    return ApplyResult(False, problem)
            self._change += 1
            befores: list[object] = []
            result = apply(self._state, cmd, lambda state, member: befores.append(capture(state, member)))  # type: ignore[arg-type]
            try:
                self.events.record(cmd, result, befores, self._state.applied)  # type: ignore[arg-type]
            except Exception:  # a bug in event derivation must not change the entry's result
                log.exception("recording the events of entry %d failed", log_index)
            return result

    def _apply_lease(self, cmd: AcquireLease | RenewLease | ReleaseLease, log_index: int) -> LeaseOutcome:
        out = apply_lease(self._lease, cmd, log_index)
        if out.ok and out.record.version != self._lease.version:
            before = self._lease
            self._lease = out.record
            self._t_obs_ms = self._clock_ms()
            self._stats["lease_changes"] += 1
            if (before.holder, before.epoch) != (out.record.holder, out.record.epoch):
                # A change of holder or epoch (not a renewal) is a revision of its own, so that its
                # Lease event resumes exactly like any other (deterministic: every replica counts it).
                self._state.applied += 1
                self._change += 1
                try:
                    self.events.record_lease(lease_event(before, out.record, self._state.applied), self._state.applied)
                except Exception:  # a bug in event derivation must not change the entry's result
                    log.exception("recording the lease event of entry %d failed", log_index)
        return out

    # --- readers (any thread) ---------------------------------------------------------------------

    def state_copy(self) -> ControlState:
        with self._lock:
            if self._copy is None or self._copy[0] != self._change:
                self._copy = (self._change, copy_state(self._state))
            return self._copy[1]

    def lease_view(self) -> tuple[LeaseRecord, int]:
        """The applied lease record and ``t_obs_ms`` (when this node applied its last version change)."""
        with self._lock:
            return self._lease, self._t_obs_ms

    def statistics(self) -> FsmStatistics:
        with self._lock:
            return FsmStatistics(**self._stats)

    # --- snapshots ----------------------------------------------------------------------------------

    def encode_snapshot(self) -> bytes:
        with self._lock:
            data = codec.encode_state(self._state, self._lease)
            self._stats["snapshots_written"] += 1
            return data

    def install_snapshot(self, data: bytes) -> None:
        state, lease = codec.decode_state(data)
        with self._lock:
            self._state = state
            self._lease = lease
            self._t_obs_ms = self._clock_ms()  # conservative: as if the version changed now
            self._change += 1
            self._stats["snapshots_installed"] += 1
            self.events.reset(state.applied)

    # pysyncobj's own consumer serialization; unused while our serializer hooks are set (they are,
    # always, in raft/node.py), but kept codec-based so no path pickles domain objects.
    def _serialize(self) -> dict[str, bytes]:
        return {"codec_state": self.encode_snapshot()}

    def _deserialize(self, data: dict[str, bytes]) -> None:
        self.install_snapshot(data["codec_state"])


def fence_problem(lease: LeaseRecord, holder: str, epoch: int) -> str:
    """Why a fenced domain entry must be rejected ("" when its fence matches the lease record)."""
    if lease.holder != holder or lease.epoch != epoch:
        return (
            f"{FENCED_PREFIX} entry carries lease ({holder or 'nobody'}, epoch {epoch}) but the lease is held by "
            f"{lease.holder or 'nobody'} at epoch {lease.epoch}"
        )
    return ""


# --- snapshot file format ---------------------------------------------------------------------------
#
#   MAGIC (8 bytes) | header length (u32, big endian) | header (UTF-8 JSON) | body
#   header = {"format": 1, "last": [idx, term, len], "prev": [idx, term, len], "cluster": [addr...],
#             "state_len": n, "sha256": hex(body)}
#   body   = last entry's command bytes | prev entry's command bytes | codec.encode_state(...)
#
# pysyncobj hands the serializer (last applied entry, the entry before it, cluster nodes) and expects
# the same triple back from the deserializer; the entries' command bytes are pysyncobj's own
# (opaque here). The state comes from the FSM, which at that moment (tick thread, right after
# applying) is exactly the state after ``last``.

Entry = tuple[bytes, int, int]


def write_snapshot_file(
    path: str, fsm: ControlFsm, last: Entry, prev: Entry, cluster: Iterable[Any], *, fsync: bool
) -> None:
    state = fsm.encode_snapshot()
    last_cmd, prev_cmd = bytes(last[0]), bytes(prev[0])
    body = last_cmd + prev_cmd + state
    header = {
        "format": SNAPSHOT_FORMAT,
        "last": [int(last[1]), int(last[2]), len(last_cmd)],
        "prev": [int(prev[1]), int(prev[2]), len(prev_cmd)],
        "cluster": sorted(str(n.id) for n in cluster),
        "state_len": len(state),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(SNAPSHOT_MAGIC + struct.pack(">I", len(head)) + head + body)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    last: Entry
    prev: Entry
    cluster: tuple[str, ...]
    state: bytes


def read_snapshot_file(path: str) -> SnapshotFile:
    """Parse and verify a snapshot file. Raises :class:`codec.CodecError` on any corruption."""
    with open(path, "rb") as f:
        data = f.read()
    if data[: len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC:
        raise codec.CodecError("snapshot", f"{path}: not a controlplane snapshot (bad magic at byte offset 0)")
    off = len(SNAPSHOT_MAGIC)
    if len(data) < off + 4:
        raise codec.CodecError("snapshot", f"{path}: truncated at byte offset {len(data)} (inside the header)")
    (hlen,) = struct.unpack(">I", data[off : off + 4])
    if hlen > MAX_SNAPSHOT_HEADER:
        raise codec.CodecError("snapshot", f"{path}: header of {hlen} bytes exceeds the limit (at byte offset {off})")
    try:
        header = json.loads(data[off + 4 : off + 4 + hlen])
        body = data[off + 4 + hlen :]
        if header["format"] != SNAPSHOT_FORMAT:
            raise codec.CodecError("snapshot", f"{path}: unknown format {header['format']!r} (at byte offset {off + 4})")
        if hashlib.sha256(body).hexdigest() != header["sha256"]:
            raise codec.CodecError("snapshot", f"{path}: checksum mismatch over bytes {off + 4 + hlen}..{len(data)} "
                                               "(truncated or corrupt)")
        li, lt, ll = header["last"]
        pi, pt, pl = header["prev"]
        if ll + pl + header["state_len"] != len(body):
            raise codec.CodecError("snapshot", f"{path}: section lengths do not add up (at byte offset {off + 4 + hlen})")
        return SnapshotFile(
            last=(body[:ll], int(li), int(lt)),
            prev=(body[ll : ll + pl], int(pi), int(pt)),
            cluster=tuple(str(a) for a in header["cluster"]),
            state=body[ll + pl :],
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise codec.CodecError("snapshot", f"{path}: malformed header at byte offset {off + 4}: {exc}") from exc

