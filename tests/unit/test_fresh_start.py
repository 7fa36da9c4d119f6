"""The fresh-start measurement of ``controlplane bench stability --fresh-starts`` (issue 14 item 6):
what it computes from the members' start-up marks, not how fast anything is (that is the bench's).

The figures are in seconds from the first member's spawn; a trial's start-up marks come from
``stability_node``'s ``started`` line and its ``first_authority_s`` from the member's report.
"""

from __future__ import annotations

import pytest

from controlplane.bench.fresh_start import summarize_trials, trial_view
from controlplane.bench.stability import run_stability, startup_summary

SPAWNED = [100.0, 100.1, 100.2]


def started(node: str, main: float, raft: float, ready: float) -> dict:
    return {"started": node, "t_s": raft,
            "phases": {"main_s": main, "config_s": main + 0.1, "raft_started_s": raft, "ready_s": ready}}


def report(node: str, first_authority: float | None) -> dict:
    return {"node_id": node, "first_authority_s": first_authority}


def test_first_holder_is_timed_from_the_first_spawn_and_from_the_first_and_last_raft_start() -> None:
    st = [started("a", 101.0, 101.5, 101.6), started("b", 101.2, 101.9, 102.9), started("c", 101.1, 102.0, 102.2)]
    s = startup_summary(st, [report("a", None), report("b", 103.2), report("c", 103.4)], SPAWNED)
    assert s["first_holder_from_spawn_s"] == 3.2  # b first held at 103.2; a spawned at 100.0
    assert s["first_holder_from_first_raft_start_s"] == 1.7  # a's Raft started at 101.5
    assert s["first_holder_from_last_raft_start_s"] == 1.2  # c's at 102.0
    assert s["holder_ready_from_spawn_s"] == 3.2  # b was ready (102.9) before it held the lease
    assert s["members"][1] == {"node": "b", "spawn_s": 0.1, "main_s": 1.2, "config_s": 1.3,
                               "raft_started_s": 1.9, "ready_s": 2.9}


def test_a_holder_that_is_still_loading_is_ready_only_when_everything_started() -> None:
    st = [started("a", 101.0, 101.5, 104.0), started("b", 101.0, 101.6, 103.0), started("c", 101.0, 101.6, 103.5)]
    s = startup_summary(st, [report("a", 102.7), report("b", None), report("c", None)], SPAWNED)
    assert s["first_holder_from_spawn_s"] == 2.7
    assert s["holder_ready_from_spawn_s"] == 4.0  # a held the lease at 2.7 s but its API and loop at 4.0 s


def test_no_holder_gives_no_figures() -> None:
    st = [started(n, 101.0, 101.5, 101.6) for n in "abc"]
    s = startup_summary(st, [report(n, None) for n in "abc"], SPAWNED)
    assert (s["first_holder_from_spawn_s"], s["first_holder_from_first_raft_start_s"],
            s["holder_ready_from_spawn_s"]) == (None, None, None)


def _result(first_from_spawn: float | None, final_term: int = 1) -> dict:
    st = [started("a", 101.0, 101.5, 101.6), started("b", 101.0, 102.0, 102.1), started("c", 101.0, 101.8, 101.9)]
    first = None if first_from_spawn is None else 100.0 + first_from_spawn
    summary = startup_summary(st, [report("a", first), report("b", None), report("c", None)], SPAWNED)
    return {"startup": summary, "final_term": final_term, "leader_changes": 0,
            "loadavg": ["3.10 2.00 1.00 1/100 1", "9.50 4.00 2.00 12/110 2", "9.90 4.10 2.00 1/100 3"]}


def test_a_trial_in_milliseconds_with_the_load_when_the_group_was_spawned() -> None:
    t = trial_view(_result(3.25))
    assert t["first_holder_from_spawn_ms"] == 3250
    assert t["first_holder_from_first_raft_start_ms"] == 1750
    assert t["first_holder_from_last_raft_start_ms"] == 1250
    assert t["last_raft_start_from_spawn_ms"] == 2000
    assert (t["load1_before"], t["load1_at_spawn"]) == (3.1, 9.5)


def test_summary_is_median_and_max_over_the_trials_that_had_a_holder() -> None:
    trials = [trial_view(_result(s, term)) for s, term in ((3.0, 1), (5.5, 2), (4.0, 1), (None, 1))]
    s = summarize_trials(trials)
    assert s["first_holder_from_spawn_ms"] == {"n": 3, "missing": 1, "median": 4000, "max": 5500}
    assert s["load1_at_spawn"]["median"] == 9.5
    assert s["max_final_term"] == 2


@pytest.mark.parametrize(("kwargs", "field"), [({"mode": "fast"}, "mode"), ({"bytecode": "none"}, "bytecode")])
def test_a_bad_mode_or_bytecode_is_refused_before_anything_starts(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be one of"):
        run_stability(1.0, **kwargs)
