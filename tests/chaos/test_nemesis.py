"""Fault schedules from a seed: deterministic, bounded, every kind reachable. Pure."""

from __future__ import annotations

import pytest

from controlplane.chaos.nemesis import KINDS, generate


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert generate(7) == generate(7)
    assert generate(7).describe().startswith("seed=7 ")
    assert any(generate(7).faults != generate(s).faults for s in range(8, 12))


def test_schedules_stay_within_their_bounds() -> None:
    lease_ms, bound = 1200, 12
    seen = set()
    for seed in range(300):
        s = generate(seed, lease_ms=lease_ms, drift_bound_ms=bound)
        assert len(s.faults) == 3 and s.start_load in ("low", "high") and s.final_load in ("low", "high")
        for f in s.faults:
            seen.add(f.kind)
            assert 0 < f.duration_s <= 3.0 and 0 < f.gap_s < 1.0
            if f.kind == "pause":
                assert f.duration_s > lease_ms / 1000  # a pause longer than the lease
            if f.kind == "clock":
                assert 0 < abs(f.value) <= bound  # within the drift bound
            if f.kind == "slow_disk":
                assert f.value > 0
            if f.kind == "split":
                assert len(f.peer.split(",")) == 1  # 3 nodes: a minority of one
    assert seen == set(KINDS)


def test_five_nodes_split_two_against_three() -> None:
    splits = [f for seed in range(200) for f in generate(seed, nodes=5).faults if f.kind == "split"]
    assert splits and all(len(f.peer.split(",")) == 2 for f in splits)


def test_kinds_can_be_restricted_and_bad_arguments_are_refused() -> None:
    assert {f.kind for seed in range(50) for f in generate(seed, kinds=("kill",)).faults} == {"kill"}
    with pytest.raises(ValueError):
        generate(1, nodes=4)
    with pytest.raises(ValueError):
        generate(1, faults=0)
    with pytest.raises(ValueError):
        generate(1, kinds=("meteor",))
