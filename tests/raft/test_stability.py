"""Stable leadership on a busy machine (issue 14 item 6): a fresh 3-member group of real processes
on 127.0.0.1 with the production timing defaults, beside eight CPU-burning processes and a disk-heavy
writer (``controlplane/bench/load.py``: bounded in size and time, started and stopped by
``run_stability``, killed in its ``finally``). No fault is injected, so every leader change is a
spurious one.

Default suite: 60 s, at most 1 leader change (the 10-minute target of 2, scaled and rounded up);
``CP_SLOW=1``: the full 10 minutes, at most 2. Both: a lease holder within 5 s of the group's start.
"""

from __future__ import annotations

import math

import pytest

from controlplane.bench.stability import run_stability
from tests.conftest import long_mode

BURNERS = 8
TARGET_CHANGES_PER_10_MIN = 2
FIRST_HOLDER_S = 5.0


def _explain(r: dict) -> str:  # type: ignore[type-arg]
    return (f"leader changes {r['leader_changes']}, holders {r['holders']}, elections {r['elections'][:10]}, "
            f"members {r['members']}, load {r['loadavg']}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_leadership_stays_put_beside_cpu_burners_and_a_disk_writer() -> None:
    seconds = 600.0 if long_mode() else 60.0
    bound = math.ceil(TARGET_CHANGES_PER_10_MIN * seconds / 600.0)
    r = run_stability(seconds, cpu=BURNERS, disk=True)
    assert all(m["ticks"] > 100 for m in r["members"]), r["members"]  # it really ran and was observed
    assert all(m["fsync"]["n"] > 0 for m in r["members"]), r["members"]  # lease renewals hit the disk
    assert r["first_holder_s"] is not None and r["first_holder_s"] <= FIRST_HOLDER_S, _explain(r)
    assert r["leader_changes"] <= bound, _explain(r)
    assert r["holder_changes"] <= bound, _explain(r)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("attempt", range(2))
def test_fresh_group_has_a_lease_holder_within_5s_under_load(attempt: int) -> None:
    r = run_stability(8.0, cpu=BURNERS, disk=True)
    assert r["first_holder_s"] is not None and r["first_holder_s"] <= FIRST_HOLDER_S, _explain(r)
    assert r["final_term"] <= 3, _explain(r)  # no run of split votes while the peers come up
