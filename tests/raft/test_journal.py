"""raft/journal.py: round trip, every corruption kind (named file + byte offset), the torn-tail rule,
the old-format refusal, and write failures (a fake disk layer and a real full tmpfs)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal

from raft.journal import (
    HEADER_SIZE,
    REC_HEADER_SIZE,
    JournalCorrupt,
    JournalError,
    JournalFormatError,
    JournalWriteFailed,
    OsDisk,
    RaftJournal,
    encode_record,
)

Entry = tuple[bytes, int, int]


def entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [(b'{"priority":1,"n":%d}' % i, i, term) for i in range(lo, hi + 1)]


def written(path: Path, items: list[Entry], *, term: int = 3, voted: str | None = "127.0.0.1:1") -> Path:
    j = RaftJournal(path, fsync=True)
    for e in items:
        j.add(*e)
    j.setCurrentTerm(term, voted)
    j.setRaftCommitIndex(items[-1][1] if items else 1)
    j._destroy()
    return path


def offsets(items: list[Entry]) -> list[int]:
    out, off = [], HEADER_SIZE
    for e in items:
        out.append(off)
        off += REC_HEADER_SIZE + len(e[0])
    return out


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x06  # '1' -> '7' in a payload digit
    path.write_bytes(bytes(data))


def reopen(path: Path) -> RaftJournal:
    return RaftJournal(path, fsync=True)


# --- round trip --------------------------------------------------------------------------------------


def test_round_trip_entries_term_vote_commit_and_slices(tmp_path: Path) -> None:
    path = written(tmp_path / "raft.journal", entries(1, 20), term=7, voted="127.0.0.1:9")
    j = reopen(path)
    assert list(j[:]) == entries(1, 20) and len(j) == 20
    assert j[-1] == entries(20, 20)[0] and j[3:5] == entries(4, 5)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (7, "127.0.0.1:9", 20)
    j.setRaftCommitIndex(20)
    j.onOneSecondTimer()
    j.deleteEntriesTo(5)  # compaction: a new generation file
    assert j[0] == entries(6, 6)[0]
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == entries(6, 20) and again.getCurrentTerm() == 7
    again.clear()
    again.add(*entries(30, 30)[0])
    again._destroy()
    assert list(reopen(path)[:]) == entries(30, 30)
    assert b"\x80\x04" not in path.read_bytes() and b"\x80" not in Path(str(path) + ".meta").read_bytes()[:1]


def test_fresh_directory_gets_a_header_and_metadata(tmp_path: Path) -> None:
    j = RaftJournal(tmp_path / "d" / "raft.journal", fsync=True)
    assert len(j) == 0 and j.getCurrentTerm() == 0 and j.getVotedForNodeId() is None
    j._destroy()
    assert (tmp_path / "d" / "raft.journal").stat().st_size == HEADER_SIZE
    assert reopen(tmp_path / "d" / "raft.journal").getRaftCommitIndex() == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=12), term=st.integers(0, 2**40),
       cut=st.integers(0, 12), data=st.data())
def test_hypothesis_round_trip_and_every_single_byte_flip_is_detected(
    payloads: list[bytes], term: int, cut: int, data: st.DataObject
) -> None:
    items = [(p, i + 1, term) for i, p in enumerate(payloads)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raft.journal"
        j = RaftJournal(path, fsync=False)
        for e in items:
            j.add(*e)
        j.deleteEntriesFrom(min(cut, len(items)))
        j.setCurrentTerm(term, None)
        j._destroy()
        kept = items[: min(cut, len(items))]
        assert list(reopen(path)[:]) == kept
        reopen(path)._destroy()
        target = data.draw(st.sampled_from([path, path, path, Path(str(path) + ".meta")]))
        size = target.stat().st_size
        at = data.draw(st.integers(0, 2**20)) % size  # the metadata's size varies with its random generation
        raw = bytearray(target.read_bytes())
        raw[at] ^= data.draw(st.integers(1, 255))
        target.write_bytes(bytes(raw))
        with pytest.raises(JournalError):
            reopen(path)


# --- corruption: one clear error naming the file and the byte offset ------------------------------


def test_flipped_byte_in_a_committed_payload(tmp_path: Path) -> None:
    items = entries(1, 10)
    path = written(tmp_path / "raft.journal", items)
    at = offsets(items)[4] + REC_HEADER_SIZE + items[4][0].index(b"1")
    flip(path, at)
    with pytest.raises(JournalCorrupt) as err:
        reopen(path)
    assert err.value.path == path and err.value.offset == offsets(items)[4] + REC_HEADER_SIZE
    assert "payload checksum mismatch in the entry with index 5" in str(err.value)
    assert f"at byte offset {err.value.offset}" in str(err.value) and str(path) in str(err.value)


def test_flipped_byte_in_a_record_header(tmp_path: Path) -> None:
    items = entries(1, 10)
    path = written(tmp_path / "raft.journal", items)
    flip(path, offsets(items)[2] + 3)  # the length field
    with pytest.raises(JournalCorrupt, match="record header checksum mismatch") as err:
        reopen(path)
    assert err.value.offset == offsets(items)[2]


def test_garbage_bytes_over_the_middle(tmp_path: Path) -> None:
    items = entries(1, 30)
    path = written(tmp_path / "raft.journal", items)
    raw = bytearray(path.read_bytes())
    raw[offsets(items)[10] : offsets(items)[10] + 200] = os.urandom(200)
    path.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt, match="checksum mismatch") as err:
        reopen(path)
    assert err.value.offset >= offsets(items)[10]


@pytest.mark.parametrize("cut", ["mid_record", "record_boundary", "inside_header"])
def test_truncated_journal(tmp_path: Path, cut: str) -> None:
    items = entries(1, 10)
    path = written(tmp_path / "raft.journal", items)
    size = {"mid_record": offsets(items)[7] + 10, "record_boundary": offsets(items)[7], "inside_header": 10}[cut]
    os.truncate(path, size)
    with pytest.raises(JournalCorrupt, match="truncated") as err:
        reopen(path)
    assert err.value.offset == size if cut != "mid_record" else err.value.offset == offsets(items)[7]


@pytest.mark.parametrize("which", ["journal", "meta"])
def test_empty_file(tmp_path: Path, which: str) -> None:
    path = written(tmp_path / "raft.journal", entries(1, 3))
    target = path if which == "journal" else Path(str(path) + ".meta")
    target.write_bytes(b"")
    with pytest.raises(JournalCorrupt, match=r"empty file \(0 bytes\)") as err:
        reopen(path)
    assert err.value.path == target and err.value.offset == 0


def test_corrupt_and_missing_meta(tmp_path: Path) -> None:
    path = written(tmp_path / "raft.journal", entries(1, 3))
    meta = Path(str(path) + ".meta")
    good = meta.read_bytes()
    flip(meta, len(good) - 3)
    with pytest.raises(JournalCorrupt, match="checksum mismatch"):
        reopen(path)
    meta.write_bytes(good[:10])
    with pytest.raises(JournalCorrupt, match="truncated"):
        reopen(path)
    meta.unlink()
    with pytest.raises(JournalCorrupt, match="missing while the journal exists"):
        reopen(path)
    meta.write_bytes(good)
    path.unlink()
    with pytest.raises(JournalCorrupt, match="missing while its metadata exists"):
        reopen(path)


def test_old_pysyncobj_data_dir_is_refused_with_the_upgrade_note(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    old = FileJournal(str(path))
    old.add(b"x", 1, 1)
    old.setCurrentTerm(1, "127.0.0.1:1")
    old._destroy()
    with pytest.raises(JournalFormatError, match="pysyncobj's FileJournal.*docs/operations.md"):
        reopen(path)
    Path(str(path) + ".meta").unlink()
    with pytest.raises(JournalFormatError):
        reopen(path)


# --- the torn tail: cut only beyond the durable watermark -------------------------------------------


@pytest.mark.parametrize("tail", ["partial_header", "partial_payload", "zeros"])
def test_torn_last_record_beyond_the_watermark_is_cut(tmp_path: Path, tail: str, caplog: pytest.LogCaptureFixture) -> None:
    items = entries(1, 5)
    path = written(tmp_path / "raft.journal", items)
    size = path.stat().st_size
    record = encode_record(b'{"never":"acked"}', 6, 1)
    torn = {"partial_header": record[:11], "partial_payload": record[:-4], "zeros": b"\0" * 64}[tail]
    with open(path, "ab") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="raft.journal"):
        j = reopen(path)
    assert list(j[:]) == items
    lines = [r.getMessage() for r in caplog.records if r.name == "raft.journal"]
    assert len(lines) == 1 and f"at byte offset {size}" in lines[0] and "torn" in lines[0]
    j.add(*entries(6, 6)[0])
    j._destroy()
    assert Path(str(path) + ".torn").read_bytes() == torn
    assert list(reopen(path)[:]) == entries(1, 6)


def test_a_torn_shape_below_the_watermark_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    items = entries(1, 5)
    path = written(tmp_path / "raft.journal", items)
    os.truncate(path, path.stat().st_size - 4)  # the last, fsync'ed, acknowledged record loses its end
    with pytest.raises(JournalCorrupt, match="below the durable length"):
        reopen(path)


# --- write failures ---------------------------------------------------------------------------------


class FullDisk(OsDisk):
    """Writes up to ``budget`` bytes, then ENOSPC (a partial write first, as a real disk does)."""

    def __init__(self, budget: int, err: int = errno.ENOSPC) -> None:
        self.budget, self.err = budget, err

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        if len(data) > self.budget:
            os.pwrite(fd, data[: self.budget], offset)
            self.budget = 0
            raise OSError(self.err, os.strerror(self.err))
        self.budget -= len(data)
        super().pwrite(fd, data, offset)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_write_failure_fails_the_journal_and_keeps_the_file_valid(tmp_path: Path, err: int) -> None:
    path = written(tmp_path / "raft.journal", entries(1, 5))
    disk = FullDisk(3 * len(encode_record(entries(6, 6)[0][0], 6, 1)) + 10, err)
    j = RaftJournal(path, fsync=True, disk=disk)
    seen: list[JournalError] = []
    j.on_failure = seen.append
    acked = 5
    with pytest.raises(JournalWriteFailed) as exc:
        for e in entries(6, 50):
            j.add(*e)
            acked = e[1]
    assert acked == 8 and len(j) == 8 and exc.value.errno == err
    assert exc.value.disk_full == (err in (errno.ENOSPC, errno.EDQUOT)) and len(seen) == 1
    with pytest.raises(JournalWriteFailed):
        j.setCurrentTerm(9, "127.0.0.1:2")  # no vote can follow a failure
    with pytest.raises(JournalWriteFailed):
        j.add(*entries(9, 9)[0])
    assert j[-1][1] == 8  # reads still work
    j._destroy()
    again = reopen(path)
    assert list(again[:]) == entries(1, 8) and again.getCurrentTerm() == 3  # the term stayed what was durable


def test_meta_write_failure_leaves_the_old_meta(tmp_path: Path) -> None:
    path = written(tmp_path / "raft.journal", entries(1, 2), term=4)
    j = RaftJournal(path, fsync=True, disk=FullDisk(0))
    with pytest.raises(JournalWriteFailed, match="storing term and vote"):
        j.setCurrentTerm(5, "127.0.0.1:3")
    j._destroy()
    assert reopen(path).getCurrentTerm() == 4 and not Path(str(path) + ".meta.tmp").exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB tmpfs (CI runs as root). Fails, never skips, when it cannot be mounted."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert res.returncode == 0, f"cannot mount a tmpfs for the full-disk test (needs root): {res.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_real_full_disk_is_an_error_and_a_restart_after_freeing_space_has_every_acked_entry(small_tmpfs: Path) -> None:
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"f" * 300 * 1024)
    path = small_tmpfs / "raft.journal"
    j = RaftJournal(path, fsync=True)
    acked: list[Entry] = []
    payload = b"x" * 3000
    with pytest.raises(JournalWriteFailed) as exc:
        for i in range(1, 10_000):
            j.add(payload, i, 1)
            acked.append((payload, i, 1))
    assert exc.value.disk_full and "ENOSPC" in str(exc.value) and len(acked) > 20
    j._destroy()  # the final metadata write is skipped after a failure: never raises
    full = reopen(path)  # readable while the disk is still full
    assert list(full[:]) == acked
    with pytest.raises(JournalWriteFailed):
        full.add(payload, len(acked) + 1, 1)
    full._destroy()
    filler.unlink()  # space freed
    j2 = reopen(path)
    assert list(j2[:]) == acked  # complete: every acknowledged entry, nothing partial
    j2.add(payload, len(acked) + 1, 1)
    j2._destroy()
    assert list(reopen(path)[:]) == acked + [(payload, len(acked) + 1, 1)]


def test_out_of_descriptors_stores_a_vote_and_defers_only_the_commit_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection flood that takes every descriptor (EMFILE) must not stop the member: the next
    metadata file and the directory are held open ahead, so a term and vote are still stored durably,
    and the once-a-second commit index (a hint) is retried instead of failing the journal."""
    path = tmp_path / "raft.journal"
    j = RaftJournal(path, fsync=True)
    j.add(*entries(1, 1)[0])
    j.setCurrentTerm(1, None)  # opens the directory and the spare metadata file
    real_open = os.open

    def no_descriptors(p: object, *args: object, **kwargs: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", no_descriptors)
    with caplog.at_level(logging.WARNING, logger="raft.journal"):
        j.setCurrentTerm(2, "127.0.0.1:2")  # the vote: uses the spare, durable
        j.setRaftCommitIndex(7)
        j.onOneSecondTimer()  # no spare left, no descriptor: deferred
        j.onOneSecondTimer()
        assert j.failed == ""
        assert sum("deferred" in r.getMessage() for r in caplog.records) == 1  # one line per burst
        with pytest.raises(JournalWriteFailed, match="EMFILE"):  # a second vote now cannot be stored
            j.setCurrentTerm(3, "127.0.0.1:3")
    monkeypatch.setattr(os, "open", real_open)
    assert j.failed  # a vote that could not be stored stops the member (it must not be sent)
    j2 = RaftJournal(path, fsync=True)  # what is on disk: the stored vote, never the unstored one
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (2, "127.0.0.1:2")
    j2._destroy()


def test_a_deferred_commit_index_is_stored_when_descriptors_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raft.journal"
    j = RaftJournal(path, fsync=True)
    j.add(*entries(1, 1)[0])
    j.setCurrentTerm(1, None)
    j.setRaftCommitIndex(1)
    real_open = os.open

    def no_descriptors(p: object, *args: object, **kwargs: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", no_descriptors)
    j.add(*entries(2, 2)[0])  # the journal's own descriptor is open: appends go on
    j.setRaftCommitIndex(2)
    j.onOneSecondTimer()  # stored through the spare; the next spare cannot be opened
    j.add(*entries(3, 3)[0])
    j.setRaftCommitIndex(3)
    j.onOneSecondTimer()  # deferred
    assert j.failed == "" and j._meta_dirty
    monkeypatch.setattr(os, "open", real_open)
    j.onOneSecondTimer()  # descriptors back: stored
    j._destroy()
    j2 = RaftJournal(path, fsync=True)
    assert j2.getRaftCommitIndex() == 3 and len(j2) == 3
    j2._destroy()
