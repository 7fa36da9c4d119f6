"""The Raft journal of a member: our own file format, checksummed, plain file I/O (no mmap).

pysyncobj's ``FileJournal`` has no checksums, mmaps the file (a full disk is a SIGBUS), stores term
and vote as a pickle, and never fsyncs. :class:`RaftJournal` implements the same interface
(``pysyncobj.journal.Journal``: ``add``, ``clear``, ``__getitem__`` incl. slices, ``__len__``,
``deleteEntriesFrom/To``, ``get/setRaftCommitIndex``, ``getCurrentTerm``/``setCurrentTerm``,
``getVotedForNodeId``, ``onOneSecondTimer``, ``flush``, ``_destroy``); ``raft/node.py`` hands it to
SyncObj through the journal factory (``construct_with_journal``). Format and rules in
``docs/reliability.md`` ("Journal integrity"):

* ``raft.journal``: a 24-byte header (magic ``CPRAFTJ1``, format, generation, CRC-32 of the header),
  then records ``[length u32][index u64][term u64][payload CRC-32][header CRC-32][payload]``.
  Appended with ``os.pwrite`` and fsync'ed (``fsync: entry``) before :meth:`add` returns, so
  pysyncobj acks or counts an entry only once it is durable.
* ``raft.journal.meta``: magic ``CPRAFTM1``, length, CRC-32, then JSON ``{term, voted_for,
  commit_index, generation, journal_bytes}``; replaced atomically (tmp, fsync, rename, dir fsync)
  before :meth:`setCurrentTerm` returns. ``journal_bytes`` is the *durable watermark*: every byte of
  the journal below it was fsync'ed when the metadata was written.
* Checksum: ``zlib.crc32`` (C speed, catches every burst error up to 32 bits and all but 2^-32 of
  random damage); this detects accidental corruption, not an attacker who can write the data dir.
* Loading verifies every header and payload checksum, index continuity (+1 each) and non-decreasing
  terms. Any failure raises :class:`JournalCorrupt` naming the file and byte offset; nothing from the
  data directory is unpickled by us, and pysyncobj unpickles an entry's call tuple only when it
  applies it, i.e. after this verification (entries live in memory from then on).
* Torn tail: the one repair. A record that runs past the end of the file (or a header shorter than
  28 bytes, or an all-zero tail) *at or beyond the durable watermark* is the append that was being
  written when the process died: its write+fsync did not complete, so :meth:`add` never returned and
  nothing was acknowledged. It is cut off with one WARNING line and the bytes are kept in
  ``raft.journal.torn``. Below the watermark the same shape is a truncated file: corrupt.
* A write or fsync error (ENOSPC, EDQUOT, EIO...) raises :class:`JournalWriteFailed` and leaves the
  journal *failed*: every later mutation raises too (no ack, no vote can follow), the in-memory log
  never gets an entry that is not on disk, and what is on disk stays a valid journal (a partial
  record is cut back when possible, else it is a torn tail beyond the watermark).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pysyncobj.journal import Journal

log = logging.getLogger(__name__)

MAGIC = b"CPRAFTJ1"
META_MAGIC = b"CPRAFTM1"
FORMAT = 1
PYSYNCOBJ_MAGIC = b"PYSYNCOBJ"
"""How pysyncobj's FileJournal starts: an old data directory (refused, see docs/operations.md)."""

_HEAD = struct.Struct(">8sIQ")  # magic, format, generation
HEADER_SIZE = _HEAD.size + 4  # + CRC-32 of the above
_REC = struct.Struct(">IQQI")  # payload length, index, term, payload CRC-32
REC_HEADER_SIZE = _REC.size + 4  # + CRC-32 of the above
_META = struct.Struct(">8sII")  # magic, body length, CRC-32 of the body
MAX_ENTRY_BYTES = 256 * 1024 * 1024
"""Largest payload a record may declare (far above any legal entry; a larger one is corrupt)."""
MAX_META_BYTES = 64 * 1024
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}
FD_ERRNOS = {errno.EMFILE, errno.ENFILE}
"""Out of file descriptors: a process-wide, passing condition (a connection flood), not a disk fault.
The journal keeps the descriptors it needs for its durable writes open ahead of time (the journal,
its directory, and the next metadata file), so only a deferrable write can meet it: the once-a-second
commit-index store, which is retried at the next second instead of stopping the member."""

Entry = tuple[bytes, int, int]


class JournalError(Exception):
    """Base: this member must stop taking part in Raft. ``str()`` is the one log line."""


class JournalCorrupt(JournalError):
    def __init__(self, path: Path, offset: int, problem: str) -> None:
        self.path, self.offset, self.problem = path, offset, problem
        super().__init__(f"{path}: {problem} (at byte offset {offset})")


class JournalFormatError(JournalError):
    """A data directory written by another format (pysyncobj's FileJournal)."""


class JournalWriteFailed(JournalError):
    def __init__(self, path: Path, op: str, exc: OSError) -> None:
        self.path, self.op, self.errno = path, op, exc.errno
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.disk_full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        super().__init__(f"{path}: {op} failed: {name} ({exc.strerror}); journal left intact, member stopped")


class Disk(Protocol):
    """The few system calls that can fail on a full or broken disk (a fake in tests)."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> None: ...

    def fsync(self, fd: int) -> None: ...


class OsDisk:
    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


@dataclass(frozen=True, slots=True)
class Meta:
    term: int = 0
    voted_for: str | None = None
    commit_index: int = 1
    generation: int = 0
    journal_bytes: int = 0


@dataclass(frozen=True, slots=True)
class JournalStats:
    fsync: bool
    fsyncs: int
    fsync_ms_total: float
    fsync_ms_max: float
    skipped_rewrites: int


def _crc(*parts: bytes) -> int:
    c = 0
    for p in parts:
        c = zlib.crc32(p, c)
    return c


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    head = _REC.pack(len(command), idx, term, _crc(command))
    return head + struct.pack(">I", _crc(head)) + command


def encode_header(generation: int) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT, generation)
    return head + struct.pack(">I", _crc(head))


def encode_meta(meta: Meta) -> bytes:
    body = json.dumps(
        {"term": meta.term, "voted_for": meta.voted_for, "commit_index": meta.commit_index,
         "generation": meta.generation, "journal_bytes": meta.journal_bytes},
        sort_keys=True, separators=(",", ":"),
    ).encode()
    return _META.pack(META_MAGIC, len(body), _crc(body)) + body


def decode_meta(path: Path, data: bytes) -> Meta:
    if not data:
        raise JournalCorrupt(path, 0, "empty file (0 bytes): term, vote and commit index are lost")
    if data[:1] == b"\x80":
        raise JournalFormatError(old_format_message(path))
    if len(data) < _META.size:
        raise JournalCorrupt(path, len(data), f"truncated: {len(data)} bytes, shorter than the {_META.size}-byte header")
    magic, length, crc = _META.unpack_from(data)
    if magic != META_MAGIC:
        raise JournalCorrupt(path, 0, "bad magic: not a controlplane journal metadata file")
    body = data[_META.size:]
    if length > MAX_META_BYTES or len(body) != length:
        raise JournalCorrupt(path, _META.size, f"body is {len(body)} bytes, the header says {length}")
    if _crc(body) != crc:
        raise JournalCorrupt(path, _META.size, "checksum mismatch")
    try:
        obj = json.loads(body)
        meta = Meta(int(obj["term"]), obj["voted_for"], int(obj["commit_index"]), int(obj["generation"]),
                    int(obj["journal_bytes"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalCorrupt(path, _META.size, f"malformed body: {exc}") from None
    if meta.voted_for is not None and not isinstance(meta.voted_for, str):
        raise JournalCorrupt(path, _META.size, "voted_for is not a node id")
    return meta


def old_format_message(path: Path) -> str:
    return (f"{path}: written by pysyncobj's FileJournal (the data-dir format before the checksummed journal); "
            "this version cannot read it: re-sync this member from the group (docs/operations.md, "
            "'Upgrading the data directory')")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Loaded:
    entries: list[Entry]
    offsets: list[int]
    end: int
    generation: int
    torn: int
    """Bytes cut off as a torn tail (0: none)."""


def scan(path: Path, data: bytes, watermark: int | None) -> Loaded:
    """Parse and verify a journal file's bytes. ``watermark``: the durable length from the metadata
    (None when it does not apply to this file's generation). Raises :class:`JournalCorrupt`."""
    if not data:
        raise JournalCorrupt(path, 0, f"empty file (0 bytes), expected a {HEADER_SIZE}-byte journal header")
    if data.startswith(PYSYNCOBJ_MAGIC):
        raise JournalFormatError(old_format_message(path))
    if len(data) < HEADER_SIZE:
        raise JournalCorrupt(path, len(data), f"truncated inside the {HEADER_SIZE}-byte file header")
    magic, fmt, generation = _HEAD.unpack_from(data)
    (hcrc,) = struct.unpack_from(">I", data, _HEAD.size)
    if magic != MAGIC:
        raise JournalCorrupt(path, 0, "bad magic: not a controlplane Raft journal")
    if hcrc != _crc(data[: _HEAD.size]):
        raise JournalCorrupt(path, _HEAD.size, "file header checksum mismatch")
    if fmt != FORMAT:
        raise JournalCorrupt(path, 8, f"unknown journal format {fmt} (this version reads {FORMAT})")
    entries: list[Entry] = []
    offsets: list[int] = []
    off, size = HEADER_SIZE, len(data)
    durable = HEADER_SIZE if watermark is None else watermark
    while off < size:
        torn_why = ""
        rest = size - off
        if rest < REC_HEADER_SIZE:
            torn_why = f"{rest} bytes left, shorter than a record header"
        else:
            length, idx, term, pcrc = _REC.unpack_from(data, off)
            (rcrc,) = struct.unpack_from(">I", data, off + _REC.size)
            if rcrc != _crc(data[off : off + _REC.size]):
                if data[off:].count(0) == rest:
                    torn_why = "an all-zero tail"
                else:
                    raise JournalCorrupt(path, off, "record header checksum mismatch")
            elif length > MAX_ENTRY_BYTES:
                raise JournalCorrupt(path, off, f"record declares {length} bytes (limit {MAX_ENTRY_BYTES})")
            elif off + REC_HEADER_SIZE + length > size:
                torn_why = f"the record declares {length} bytes but only {rest - REC_HEADER_SIZE} follow"
            else:
                start = off + REC_HEADER_SIZE
                payload = data[start : start + length]
                if _crc(payload) != pcrc:
                    raise JournalCorrupt(path, start, f"payload checksum mismatch in the entry with index {idx}")
                if entries and idx != entries[-1][1] + 1:
                    raise JournalCorrupt(path, off, f"entry index {idx} follows index {entries[-1][1]}")
                if entries and term < entries[-1][2]:
                    raise JournalCorrupt(path, off, f"entry term {term} is below the previous term {entries[-1][2]}")
                entries.append((payload, idx, term))
                offsets.append(off)
                off = start + length
                continue
        if off < durable:
            raise JournalCorrupt(path, off, f"truncated ({torn_why}) below the durable length {durable} "
                                            "recorded in the metadata")
        return Loaded(entries, offsets, off, generation, size - off)
    if off < durable:
        raise JournalCorrupt(path, off, f"truncated: the file ends at byte {off} but {durable} bytes were durable "
                                        "at the last metadata write")
    return Loaded(entries, offsets, off, generation, 0)


class RaftJournal(Journal):
    """See the module doc. All calls come from pysyncobj's tick thread (or before it starts), except
    :meth:`statistics`."""

    def __init__(self, path: Path, *, fsync: bool, disk: Disk | None = None,
                 applied: Callable[[], int] | None = None) -> None:
        self.path = Path(path)
        self.meta_path = Path(str(path) + ".meta")
        self._dir = self.path.parent
        self._fsync = fsync
        self._disk: Disk = disk or OsDisk()
        self.applied = applied
        self.failed = ""
        self.on_failure: Callable[[JournalError], None] | None = None
        self._lock = threading.Lock()
        self._n, self._total, self._max, self._skipped = 0, 0.0, 0.0, 0
        self._cut: int | None = None
        self._meta_dirty = False
        self._fd = -1
        self._dir_fd = -1
        self._spare_fd = -1
        """The next metadata file (``.meta.tmp``), opened ahead so storing a term and vote needs no new
        descriptor (see :data:`FD_ERRNOS`)."""
        self._deferred = 0
        self._load()

    # --- load --------------------------------------------------------------------------------------
    def _load(self) -> None:
        have_j, have_m = self.path.exists(), self.meta_path.exists()
        if not have_j and not have_m:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._meta = Meta(generation=int.from_bytes(os.urandom(8), "big"))
            self._entries, self._offsets = [], []
            self._install_file(b"")
            return
        if have_j and not have_m:
            head = self.path.read_bytes()[: len(PYSYNCOBJ_MAGIC)]
            if head == PYSYNCOBJ_MAGIC:
                raise JournalFormatError(old_format_message(self.path))
            raise JournalCorrupt(self.meta_path, 0, "missing while the journal exists: term and vote are lost")
        meta = decode_meta(self.meta_path, self.meta_path.read_bytes())
        if not have_j:
            raise JournalCorrupt(self.path, 0, "missing while its metadata exists: the log is lost")
        data = self.path.read_bytes()
        gen = _HEAD.unpack_from(data)[2] if len(data) >= _HEAD.size else None
        loaded = scan(self.path, data, meta.journal_bytes if gen == meta.generation else None)
        self._meta = Meta(meta.term, meta.voted_for, meta.commit_index, loaded.generation, loaded.end)
        self._entries, self._offsets, self._end = loaded.entries, loaded.offsets, loaded.end
        self._fd = os.open(self.path, os.O_RDWR)
        if loaded.torn:
            self._cut_torn_tail(data[loaded.end :])

    def _cut_torn_tail(self, tail: bytes) -> None:
        log.warning("%s: cut a torn last record of %d bytes at byte offset %d (an append interrupted before its "
                    "fsync completed: never acknowledged); the bytes are kept in %s.torn",
                    self.path, len(tail), self._end, self.path)
        try:
            with open(str(self.path) + ".torn", "wb") as f:
                f.write(tail)
            os.ftruncate(self._fd, self._end)
            self._sync(self._fd)
            self._write_meta()
        except OSError as exc:
            raise JournalWriteFailed(self.path, "cutting the torn tail", exc) from None

    # --- pysyncobj's journal interface ------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        self._check()
        command = bytes(command)
        if self._cut is not None:
            if self._cut < len(self._entries) and self._entries[self._cut] == (command, idx, term):
                self._cut += 1  # already on file, fsync'ed when first written
                self._skipped += 1
                return
            self._finish_cut()
        if self._entries and idx != self._entries[-1][1] + 1:
            raise self._fail(JournalCorrupt(self.path, self._end, f"refusing to append index {idx} after {self._entries[-1][1]}"))
        record = encode_record(command, idx, term)
        try:
            self._disk.pwrite(self._fd, record, self._end)
            self._sync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._end)  # best effort: needs no space
            except OSError:
                pass
            raise self._fail(JournalWriteFailed(self.path, f"appending the entry with index {idx}", exc)) from None
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802,N803 (pysyncobj's names)
        """Lazy: remembered, applied at the first differing :meth:`add` or the next read (pysyncobj
        re-sends and re-adds the same entries on every overlapping append; rewriting them would be an
        fsync'ed rewrite of acknowledged entries and a window in which a kill -9 loses them)."""
        self._finish_cut()
        self._cut = entryFrom

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802,N803
        self._check()
        self._finish_cut()
        self._sync_dir()  # the snapshot renamed into place is durable before the log behind it goes
        self._rewrite(self._entries[entryTo:])

    def clear(self) -> None:
        self._check()
        self._cut = None
        self._sync_dir()
        self._rewrite([])

    def __getitem__(self, item: Any) -> Any:
        self._finish_cut()
        return self._entries[item]

    def __len__(self) -> int:
        self._finish_cut()
        return len(self._entries)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802,N803
        if raftCommitIndex != self._meta.commit_index:
            self._meta = _replace(self._meta, commit_index=raftCommitIndex)
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self._meta.commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803
        """Durable before it returns: pysyncobj sends the vote (or the request) right after."""
        self._check()
        if votedForNodeId is not None and not isinstance(votedForNodeId, str):
            raise TypeError(f"voted_for must be a node id string, not {type(votedForNodeId).__name__}")
        self._meta = _replace(self._meta, term=int(term), voted_for=votedForNodeId)
        self._store_meta("storing term and vote")

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._meta.term

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        return self._meta.voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty and not self.failed:
            self._store_meta("storing the commit index", deferrable=True)

    def flush(self) -> None:
        if self._fd >= 0 and not self.failed:
            try:
                self._timed(lambda: os.fsync(self._fd))
            except OSError as exc:
                raise self._fail(JournalWriteFailed(self.path, "fsync", exc)) from None

    def _destroy(self) -> None:
        if not self.failed:
            try:
                self._finish_cut()
                self._store_meta("storing metadata at stop")
            except JournalError:
                pass  # already reported by _fail
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for name in ("_dir_fd", "_spare_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    # --- ours -----------------------------------------------------------------------------------------
    @property
    def meta(self) -> Meta:
        return self._meta

    @property
    def size(self) -> int:
        return self._end

    def align_to_snapshot(self, prev: Entry, last: Entry) -> int:
        """At start-up: if the journal still holds entries older than a snapshot renamed into place
        just before a crash (pysyncobj truncates one tick later), drop only those, so pysyncobj does
        not clear the newer entries with them. Returns the number of entries dropped."""
        self._finish_cut()
        n = len(self._entries)
        if n < 2:
            return 0
        k = prev[1] - self._entries[0][1]
        if 0 < k < n - 1 and self._entries[k] == prev and self._entries[k + 1] == last:
            self._rewrite(self._entries[k:])
            return k
        return 0

    def statistics(self) -> JournalStats:
        with self._lock:
            return JournalStats(self._fsync, self._n, self._total, self._max, self._skipped)

    def _check(self) -> None:
        if self.failed:
            raise JournalWriteFailed(self.path, "writing after an earlier failure", OSError(errno.EIO, self.failed))

    def _fail(self, exc: JournalError) -> JournalError:
        if not self.failed:
            self.failed = str(exc)
            if self.on_failure is not None:
                self.on_failure(exc)
        return exc

    def _finish_cut(self) -> None:
        cut, self._cut = self._cut, None
        if cut is None or cut >= len(self._entries) or self.failed:
            return
        first = self._entries[cut][1]
        if self.applied is not None and first <= self.applied():
            log.critical("%s: truncating already-applied log entries from index %d (last applied %d): this "
                         "replica's state machine may have diverged", self.path, first, self.applied())
        new_end = self._offsets[cut]
        if self._meta.journal_bytes > new_end:  # lower the watermark first: a crash then sees a longer file
            self._store_meta("lowering the durable length before a truncation", new_end)
        try:
            os.ftruncate(self._fd, new_end)
            self._sync(self._fd)
        except OSError as exc:
            raise self._fail(JournalWriteFailed(self.path, "truncating", exc)) from None
        del self._entries[cut:]
        del self._offsets[cut:]
        self._end = new_end

    def _rewrite(self, entries: list[Entry]) -> None:
        """Replace the journal by a new generation holding ``entries`` (tmp, fsync, rename, dir fsync),
        then the metadata with the new watermark. A crash in between leaves generations that differ:
        the old watermark is then not applied to the new file."""
        self._meta = _replace(self._meta, generation=int.from_bytes(os.urandom(8), "big"))
        body = b"".join(encode_record(*e) for e in entries)
        old_fd, self._fd = self._fd, -1
        try:
            self._install_file(body, entries)
        finally:
            if old_fd >= 0:
                os.close(old_fd)

    def _install_file(self, body: bytes, entries: list[Entry] | None = None) -> None:
        tmp = Path(str(self.path) + ".tmp")
        data = encode_header(self._meta.generation) + body
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._disk.pwrite(fd, data, 0)
                self._sync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._sync_dir()
        except OSError as exc:
            _unlink(tmp)
            raise self._fail(JournalWriteFailed(self.path, "rewriting", exc)) from None
        self._fd = os.open(self.path, os.O_RDWR)
        self._entries = list(entries or [])
        self._offsets = []
        off = HEADER_SIZE
        for e in self._entries:
            self._offsets.append(off)
            off += REC_HEADER_SIZE + len(e[0])
        self._end = len(data)
        self._store_meta("storing metadata after a rewrite")

    def _store_meta(self, what: str, watermark: int | None = None, *, deferrable: bool = False) -> None:
        try:
            self._write_meta(watermark)
        except OSError as exc:
            if deferrable and exc.errno in FD_ERRNOS:  # the commit index is a hint: store it next second
                if not self._deferred:
                    log.warning("%s: %s deferred: %s (out of file descriptors; retried every second)",
                                self.meta_path, what, errno.errorcode.get(exc.errno or 0, exc.errno))
                self._deferred += 1
                return
            raise self._fail(JournalWriteFailed(self.meta_path, what, exc)) from None
        if self._deferred:
            log.warning("%s: stored again after %d deferred attempt(s)", self.meta_path, self._deferred)
            self._deferred = 0

    def _write_meta(self, watermark: int | None = None) -> None:
        """``journal_bytes`` = the journal's length now (every byte of it was fsync'ed by :meth:`add`),
        or ``watermark`` when lowering it ahead of a truncation."""
        self._meta = _replace(self._meta, journal_bytes=self._end if watermark is None else watermark)
        tmp = Path(str(self.meta_path) + ".tmp")
        try:
            fd, self._spare_fd = self._spare_fd, -1
            if fd < 0:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._disk.pwrite(fd, encode_meta(self._meta), 0)
                self._sync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.meta_path)
            self._sync_dir()
        except OSError:
            _unlink(tmp)
            raise
        self._meta_dirty = False
        try:  # the next one, ahead of time (an empty .meta.tmp is never read)
            self._spare_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            self._spare_fd = -1  # opened at the next store instead

    def _sync(self, fd: int) -> None:
        if self._fsync:
            self._timed(lambda: self._disk.fsync(fd))

    def _sync_dir(self) -> None:
        if self._fsync:
            if self._dir_fd < 0:  # kept open: a rename is made durable without a new descriptor
                self._dir_fd = os.open(self._dir, os.O_RDONLY)
            self._timed(lambda: os.fsync(self._dir_fd))

    def _timed(self, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1000.0
        with self._lock:
            self._n += 1
            self._total += dt
            self._max = max(self._max, dt)


def _replace(meta: Meta, **changes: Any) -> Meta:
    fields = {"term": meta.term, "voted_for": meta.voted_for, "commit_index": meta.commit_index,
              "generation": meta.generation, "journal_bytes": meta.journal_bytes}
    fields.update(changes)
    return Meta(**fields)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
