"""``controlplane bench soak`` (controlplane/bench/soak.py), short: real processes on 127.0.0.1 (three
coordinators, three simulated adapters) for a few seconds with one fault. Checks the report's
schema, that samples were taken of every process and data dir, that the fault happened and the
group kept taking writes, and the verdict logic on synthetic series. The one-hour run is
``controlplane bench soak --minutes 60`` (docs/reliability.md, "Soak")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.bench import soak


@pytest.mark.timeout(150)
def test_a_short_soak_samples_every_process_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = soak.run_soak(0.2, out, sample_s=1.0, fault_every_s=5.0, write_every_s=0.5, root=tmp_path / "run",
                      down_s=1.0, pause_s=1.0)
    assert sorted(p.name for p in out.iterdir()) == sorted(soak.FILES)
    on_disk = json.loads((out / "soak.json").read_text(encoding="utf-8"))
    assert on_disk["schema"] == soak.SCHEMA and on_disk["verdict"] == r["verdict"]
    assert set(r) >= {"schema", "started", "duration_s", "config", "nodes", "anchor", "long_lived", "processes",
                      "faults", "writes", "samples", "verdict"}
    assert r["nodes"] == ["coord-a", "coord-b", "coord-c"] and r["anchor"] in r["nodes"]
    assert len(r["samples"]) >= 8
    for s in r["samples"]:
        assert set(s) == {"t_s", "procs", "leader", "commit_index", "data"}
        assert set(s["procs"]) == set(r["processes"])
        assert set(s["data"]) == set(r["nodes"])
        for d in s["data"].values():
            assert set(d) == {"journal_bytes", "journal_logical_bytes", "journal_entries", "meta_bytes", "snapshot_bytes",
                              "snapshot_mtime_ns"}
    last = r["samples"][-1]
    for name in r["long_lived"]:
        assert last["procs"][name]["rss_kib"] > 10_000 and last["procs"][name]["fds"] > 3, name
    # every member's journal was read with entries in it (at some sample: right after a compaction or
    # a restart a journal may hold none, and the last sample can fall there)
    assert all(any(s["data"][n]["journal_logical_bytes"] > 0 and s["data"][n]["journal_entries"] > 0 for s in r["samples"])
               for n in r["nodes"])
    assert all(last["data"][n]["journal_logical_bytes"] > 0 for n in r["nodes"])  # the header at least: readable
    assert r["faults"] and r["faults"][0]["kind"] == "leader" and r["faults"][0]["action"] in ("sigstop", "kill -9 + restart")
    assert r["writes"]["ok"] > 0
    v = r["verdict"]
    assert set(v) == {"memory_bounded", "fds_bounded", "journal_bounded", "processes", "journals"}
    assert set(v["processes"]) == set(r["long_lived"])
    assert v["journal_bounded"] is None  # shorter than the compaction period: no claim either way
    assert "# Soak" in (out / "report.md").read_text(encoding="utf-8")
    # tokens are never logged by the processes: neither the admin token's secret (the soak's API writer
    # sends it on every call, including during the faults) nor the adapter token
    run_dir = tmp_path / "run"
    secrets = [(run_dir / "admin.token").read_text(encoding="utf-8").strip().split("_", 2)[2],
               (run_dir / "adapter.token").read_text(encoding="utf-8").strip()]
    logs = sorted(run_dir.glob("*.log"))
    assert len(logs) == 6 and all(p.stat().st_size > 0 for p in logs)
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        assert not any(s in text for s in secrets), f"a token secret in {log.name}"


def test_memory_verdict_flags_steady_growth_and_accepts_a_plateau() -> None:
    hour = 3600.0
    growing = [(t, 100_000 + t * 20.0) for t in range(0, 3600, 10)]  # +70 MiB/h
    plateau = [(t, 100_000 + min(t, 600) * 20.0) for t in range(0, 3600, 10)]  # warm-up, then flat
    assert soak.memory_verdict(growing, hour)["bounded"] is False
    assert soak.memory_verdict(plateau, hour)["bounded"] is True
    assert soak.memory_verdict(growing[:1], hour)["bounded"] is None


def test_journal_verdict_needs_compaction_and_a_bounded_second_half() -> None:
    def series(f, entries=100):  # noqa: ANN001, ANN202
        return [{"t_s": t, "journal_logical_bytes": f(t), "journal_bytes": 2 * f(t), "journal_entries": entries,
                 "snapshot_bytes": 1000, "snapshot_mtime_ns": 1 + t // 300} for t in range(0, 3600, 10)]

    def first_max(ss):  # noqa: ANN001, ANN202
        return max(s["journal_logical_bytes"] for s in ss if s["t_s"] < 1800)

    sawtooth = series(lambda t: 100 + (t % 300) * 1_000)
    unbounded = [dict(s, snapshot_mtime_ns=1) for s in series(lambda t: 100 + t * 1_000)]
    assert soak.journal_verdict(sawtooth, 3600, 300, first_max(sawtooth), 5000)["bounded"] is True
    out = soak.journal_verdict(unbounded, 3600, 300, first_max(unbounded), 5000)
    assert out["bounded"] is False and out["compactions_seen"] == 0
    assert soak.journal_verdict(unbounded[:6], 60, 300, 0, 5000)["bounded"] is None
    # a member whose log peaks later than the others is judged against the group's first half
    late = series(lambda t: 100 + (t % 300) * (10_000 if t > 1800 else 1_000))
    assert soak.journal_verdict(late, 3600, 300, first_max(late), 5000)["bounded"] is False
    assert soak.journal_verdict(late, 3600, 300, 10 * first_max(late), 5000)["bounded"] is True
    too_many = series(lambda t: 100 + (t % 300) * 1_000, entries=9_000)
    assert soak.journal_verdict(too_many, 3600, 300, first_max(too_many), 5000)["bounded"] is False


def test_journal_entries_counts_the_records_in_the_journal(tmp_path: Path) -> None:
    from raft.journal import RaftJournal

    j = RaftJournal(tmp_path / "raft.journal", fsync=False)
    for i in range(1, 8):
        j.add(b"x" * i, i, 1)
    j.deleteEntriesTo(3)  # what compaction does: a new, shorter file
    j._destroy()
    assert soak.journal_entries(tmp_path / "raft.journal") == 4
    with open(tmp_path / "raft.journal", "ab") as f:
        f.write(b"\x00\x00\x00")  # a live file being appended to: the partial record is not counted
    assert soak.journal_entries(tmp_path / "raft.journal") == 4
    assert soak.journal_logical_bytes(tmp_path / "raft.journal") < (tmp_path / "raft.journal").stat().st_size
    assert soak.journal_entries(tmp_path / "missing") == 0
