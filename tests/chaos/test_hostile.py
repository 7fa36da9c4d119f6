"""The hostile bench's pure parts: seeded plans, and verdicts fed hand-made observations -- each
check is shown to fail on the observation of a defence that does not hold, and to pass on one that
does (a verdict that cannot fail proves nothing)."""

from __future__ import annotations

import pytest

from controlplane.chaos import hostile as h

GOOD_GLOBAL = {"max_commit_gap_ms": 150.0, "lost_writes": [], "divergent": [], "tracebacks": {"coord-a": 0}}

GOOD = {
    "poisoned_fence": {"fence_code": "PERMISSION_DENIED", "persisted_epoch": 3, "scale_code": "UNAUTHENTICATED",
                       "scale_carried_out": False, "decided_ms": 400.0},
    "raft_frames": {"rss_before_mib": 75.0, "rss_max_mib": 78.0, "term_before": 2, "term_after": 2, "alive_after": True},
    "fd_exhaustion": {"reached_limit": True, "member_fds_peak": 84, "limit": 84, "reaccepts": True, "quorum_ms": 2500.0,
                      "alive_after": True},
    "journal_corruption": {"variants": {
        "flip": {"returncode": 2, "clear_line": True}, "empty_meta": {"health": "NOT_SERVING", "clear_line": True},
        "garbage": {"returncode": 2, "clear_line": True},
        "truncate": {"health": "SERVING", "caught_up": True, "clear_line": True}}},
    "disk_full": {"filled": True, "free_bytes": 0, "returncode": None, "reported": True, "report": "NOT_SERVING",
                  "recovered_ms": 900.0},
    "watch_flood": {"other_watch": "OPEN", "status_ms": {"a": 12.0, "b": 30.0}, "holder_before": (3, "coord-a"),
                    "holder_after": (3, "coord-a"), "streams_opened": 248},
    "object_flood": {"created": 100, "max_objects": 150, "refused_code": "RESOURCE_EXHAUSTED", "other_code": "OK"},
}

# (attack, what the current code did, the check that must fail)
BAD = [
    ("poisoned_fence", {"fence_code": "OK"}, "poisoned_fence_refused"),
    ("poisoned_fence", {"persisted_epoch": h.POISON_EPOCH}, "poisoned_epoch_not_persisted"),
    ("poisoned_fence", {"scale_code": "OK", "scale_carried_out": True}, "forged_scale_refused"),
    ("poisoned_fence", {"scale_code": "DEADLINE_EXCEEDED", "scale_carried_out": True}, "forged_scale_refused"),
    ("poisoned_fence", {"decided_ms": None}, "decisions_continue"),
    ("raft_frames", {"rss_max_mib": 155.0}, "rss_bounded"),
    ("raft_frames", {"term_before": 25, "term_after": 250}, "term_stable"),
    ("raft_frames", {"term_after": None}, "term_stable"),
    ("raft_frames", {"alive_after": False}, "member_alive"),
    ("fd_exhaustion", {"reached_limit": False}, "attack_reached_the_limit"),
    ("fd_exhaustion", {"reaccepts": False}, "reaccepts_after_release"),
    ("fd_exhaustion", {"quorum_ms": None}, "quorum_with_the_member"),
    ("fd_exhaustion", {"quorum_ms": 10_001.0}, "quorum_with_the_member"),
    ("disk_full", {"returncode": -7}, ("no_sigbus", "member_survives")),  # SIGBUS: the mmap'd journal
    ("disk_full", {"returncode": 1}, "member_survives"),  # exited: no SIGBUS, but it did not survive
    ("disk_full", {"reported": False}, "member_reports_it"),
    ("disk_full", {"filled": False, "free_bytes": 1 << 20}, "disk_was_full"),
    ("disk_full", {"recovered_ms": None}, "recovers_after_space_freed"),  # restart read a partial state
    ("watch_flood", {"other_watch": "RESOURCE_EXHAUSTED"}, "other_tenant_can_watch"),
    ("watch_flood", {"status_ms": {"a": 12.0, "b": None}}, "admin_status_answers"),
    ("watch_flood", {"status_ms": {"a": 1500.0}}, "admin_status_answers"),
    ("watch_flood", {"status_ms": {}}, "admin_status_answers"),
    ("watch_flood", {"holder_after": (4, "coord-b")}, "lease_does_not_move"),
    ("watch_flood", {"streams_opened": 0}, "flood_was_sent"),
    ("object_flood", {"refused_code": None, "created": 150}, "refused_at_a_cap"),
    ("object_flood", {"refused_code": "UNAVAILABLE"}, "refused_at_a_cap"),
    ("object_flood", {"other_code": "RESOURCE_EXHAUSTED"}, "other_tenant_unaffected"),
]


@pytest.mark.parametrize("kind", h.KINDS)
def test_a_defence_that_holds_passes(kind: str) -> None:
    v = h.verdict(kind, GOOD[kind], GOOD_GLOBAL)
    assert v.passed, v.failed_checks
    assert v.to_json()["verdict"] == "pass" and v.to_json()["failed"] == []


@pytest.mark.parametrize(("kind", "change", "check"), BAD)
def test_a_defence_that_does_not_hold_fails_its_check(kind: str, change: dict, check: str | tuple[str, ...]) -> None:
    expected = {check} if isinstance(check, str) else set(check)
    v = h.verdict(kind, {**GOOD[kind], **change}, GOOD_GLOBAL)
    failed = {c.name for c in v.checks if not c.ok}
    assert failed == expected, v.failed_checks
    assert not v.passed and v.to_json()["verdict"] == "fail"
    assert {s.split(":")[0] for s in v.to_json()["failed"]} == expected


@pytest.mark.parametrize(("change", "check"), [
    ({"max_commit_gap_ms": 72_000.0}, "keeps_committing"),
    ({"max_commit_gap_ms": None}, "keeps_committing"),
    ({"lost_writes": ["cw-0-7 on coord-b"]}, "no_lost_writes"),
    ({"divergent": ["tenant/cw-0-7@12: coord-a has 'priority: 1', coord-b has 'priority: 7'"]}, "no_silent_divergence"),
    ({"tracebacks": {"coord-a": 0, "coord-b": 40}}, "no_traceback"),
])
def test_the_global_checks_fail_every_attack(change: dict, check: str) -> None:
    for kind in h.KINDS:
        v = h.verdict(kind, GOOD[kind], {**GOOD_GLOBAL, **change})
        assert {c.name for c in v.checks if not c.ok} == {check}, (kind, v.failed_checks)


def test_an_attack_that_could_not_run_fails() -> None:
    v = h.verdict("disk_full", {**GOOD["disk_full"], "error": "PermissionError: disk_full needs root"}, GOOD_GLOBAL)
    assert not v.passed and v.failed_checks[0].startswith("attack_ran: measured PermissionError")


@pytest.mark.parametrize(("obs", "outcome", "ok"), [
    ({"returncode": 2, "clear_line": True}, "stopped_cleanly", True),
    ({"health": "NOT_SERVING", "clear_line": True}, "stopped_cleanly", True),
    ({"health": "SERVING", "caught_up": True}, "recovered", True),
    ({"returncode": 2, "clear_line": False}, "stopped_silently", False),
    ({"returncode": -6, "clear_line": True}, "killed", False),
    ({"returncode": -7}, "killed", False),
    ({"health": "SERVING", "caught_up": False, "tracebacks": 364}, "traceback", False),
    ({"health": "SERVING", "caught_up": False}, "serving_but_stuck", False),
    ({"health": "SERVING", "caught_up": True, "diverged": ["tenant/x@5: a has 1, b has 7"]}, "diverged", False),
    ({"health": "SERVING", "caught_up": True, "requires_notice": True}, "recovered_silently", False),
    ({"health": "SERVING", "caught_up": True, "requires_notice": True, "clear_line": True}, "recovered", True),
    ({"health": None}, "unresponsive", False),
])
def test_journal_outcomes(obs: dict, outcome: str, ok: bool) -> None:
    got, passed, why = h.journal_outcome(obs)
    assert (got, passed) == (outcome, ok), why
    assert why


def test_a_journal_verdict_without_variants_fails() -> None:
    assert not h.verdict("journal_corruption", {"variants": {}}, GOOD_GLOBAL).passed


def test_divergence_is_the_same_version_with_another_value_and_lag_is_not() -> None:
    views = {"coord-a": {"tenant/x": (5, "priority: 1"), "tenant/y": (6, "priority: 1")},
             "coord-b": {"tenant/x": (5, "priority: 7")},  # diverged
             "coord-c": {"tenant/x": (4, "priority: 3")}}  # lags: an older version, and y not yet
    found = h.divergence(views)
    assert len(found) == 1 and found[0].startswith("tenant/x@5: coord-a") and "coord-b" in found[0]
    assert h.divergence({"a": {"t": (1, "v")}, "b": {"t": (1, "v")}, "c": {}}) == []


def test_max_gap_counts_from_the_start_to_the_end_of_the_window() -> None:
    assert h.max_gap_ms([10.1, 10.2, 13.2], 10.0, 14.0) == pytest.approx(3000.0)
    assert h.max_gap_ms([10.1, 10.2], 10.0, 13.0) == pytest.approx(2800.0)  # silent to the end
    assert h.max_gap_ms([9.0, 15.0], 10.0, 14.0) is None  # nothing inside the window


def test_plans_are_seeded_bounded_and_cover_every_attack() -> None:
    assert h.plan(7) == h.plan(7) and h.plan(7) != h.plan(8)
    specs = h.plan(7, h.KINDS, h.SHORT)
    assert [s.kind for s in specs] == list(h.KINDS)
    for s in specs:
        assert 0.5 <= s.start_s <= 1.5 and 0 < s.duration_s <= 10
    journal = next(s for s in specs if s.kind == "journal_corruption")
    assert sorted(journal.params["variants"]) == sorted(h.JOURNAL_VARIANTS)
    assert next(s for s in specs if s.kind == "disk_full").target.isdigit()
    with pytest.raises(ValueError, match="unknown"):
        h.plan(1, ["nope"])
    with pytest.raises(ValueError, match="empty"):
        h.plan(1, [])
