"""raft/stickiness.py with hand-made pysyncobj message sequences and an explicit clock (no sleeps)."""

from __future__ import annotations

import pytest

from raft.stickiness import Stickiness

R = 0.5  # minimum election timeout
REJOIN = 3.0


def sticky(n: int = 3) -> Stickiness:
    return Stickiness(n, R, rejoin_after_s=REJOIN)


def ae(term: int) -> dict[str, object]:
    return {"type": "append_entries", "term": term, "commit_index": 5, "prevLogIdx": 5, "prevLogTerm": term, "entries": []}


def rv(term: int) -> dict[str, object]:
    return {"type": "request_vote", "term": term, "last_log_index": 5, "last_log_term": 1}


def nni() -> dict[str, object]:
    return {"type": "next_node_idx", "next_node_idx": 6, "reset": False, "success": True}


def follower_of(s: Stickiness, leader: str, term: int, now: float) -> None:
    s.observe_tick(now, "follower", term, leader)
    assert s.admit(leader, ae(term), now)


def test_fresh_group_admits_every_vote_request() -> None:
    s = sticky()
    s.observe_tick(0.0, "follower", 0, None)
    assert s.admit("b", rv(1), 0.1)
    assert s.admit("c", rv(2), 0.2)
    assert s.statistics().dropped_votes == 0


def test_follower_with_a_live_leader_drops_a_higher_term_vote_request() -> None:
    s = sticky()
    follower_of(s, "a", 1, 10.0)
    assert not s.admit("c", rv(2), 10.0 + R - 0.01)
    assert s.statistics().dropped_votes == 1


def test_follower_admits_once_the_leader_was_quiet_for_the_minimum_timeout() -> None:
    s = sticky()
    follower_of(s, "a", 1, 10.0)
    assert s.admit("c", rv(2), 10.0 + R)  # the leader may be dead: a real election


def test_votes_at_or_below_our_term_and_other_messages_always_pass() -> None:
    s = sticky()
    follower_of(s, "a", 3, 10.0)
    assert s.admit("c", rv(3), 10.1)  # same term: pysyncobj decides (votedFor)
    assert s.admit("c", rv(2), 10.1)
    assert s.admit("c", {"type": "response_vote", "term": 9}, 10.1)
    assert s.admit("c", {"type": "apply_command", "command": b"x"}, 10.1)
    assert s.admit("a", {"type": "timeout_now", "term": 3}, 10.1)
    assert s.admit("c", "not a dict", 10.1)


def test_a_stale_append_entries_does_not_count_as_a_live_leader() -> None:
    s = sticky()
    s.observe_tick(10.0, "follower", 5, None)
    assert s.admit("a", ae(4), 10.0)  # pysyncobj ignores it; so do we for liveness
    assert s.admit("c", rv(6), 10.1)


def test_healthy_leader_with_a_quorum_drops_a_disruptive_vote_request() -> None:
    s = sticky()
    s.observe_tick(10.0, "leader", 4, None)
    assert s.admit("b", nni(), 10.2)  # b answers: a majority (self + b) of 3
    assert not s.admit("c", rv(9), 10.3)  # c stalled and campaigns: the leader keeps its term


def test_leader_without_a_quorum_admits() -> None:
    s = sticky()
    s.observe_tick(10.0, "leader", 4, None)
    assert s.admit("c", rv(5), 10.3)  # nobody answered this leadership yet
    s = sticky()
    s.observe_tick(10.0, "leader", 4, None)
    s.admit("b", nni(), 10.0)
    assert s.admit("c", rv(5), 10.0 + R)  # the answer is too old


def test_answers_from_an_earlier_leadership_do_not_count() -> None:
    s = sticky()
    s.observe_tick(1.0, "leader", 1, None)
    s.admit("b", nni(), 1.1)
    s.observe_tick(1.2, "follower", 2, "c")
    s.observe_tick(1.3, "leader", 3, None)
    assert s.admit("c", rv(4), 1.35)


def test_five_members_need_two_fresh_answers() -> None:
    s = sticky(5)
    s.observe_tick(0.0, "leader", 2, None)
    s.admit("b", nni(), 0.1)
    assert s.admit("e", rv(3), 0.2)
    s.admit("c", nni(), 0.25)
    assert not s.admit("e", rv(4), 0.3)


def test_a_member_stuck_at_a_higher_term_is_let_back_after_rejoin_after() -> None:
    """Partitioned-then-healed (or stalled) peer c: dropped while the leader is healthy, admitted once
    after REJOIN of continuous disruption, then dropped again for another REJOIN."""
    s = sticky()
    t = 100.0
    s.observe_tick(t, "follower", 7, "a")
    admitted_at = []
    term = 20
    while t < 100.0 + 2.5 * REJOIN:
        s.admit("a", ae(7), t)  # the leader keeps heartbeating
        term += 1
        if s.admit("c", rv(term), t + 0.01):
            admitted_at.append(t)
        t += 0.3
    assert len(admitted_at) == 2, admitted_at
    assert admitted_at[0] - 100.0 >= REJOIN - 1e-9
    assert admitted_at[1] - admitted_at[0] >= REJOIN - 1e-9
    st = s.statistics()
    assert st.rejoin_admits == 2 and st.dropped_votes > 10


def test_rejoin_clock_restarts_when_the_disruptor_follows_again() -> None:
    s = sticky()
    follower_of(s, "a", 7, 0.0)
    assert not s.admit("c", rv(9), 0.1)
    s.observe_tick(1.0, "follower", 9, "a")  # the group's term moved on (another path): c's record goes
    s.admit("a", ae(9), 1.0)
    assert not s.admit("c", rv(10), 1.1)
    s.admit("a", ae(9), 1.1 + REJOIN - 0.3)
    assert not s.admit("c", rv(11), 1.1 + REJOIN - 0.2)  # less than REJOIN since *this* disruption began


def test_transfer_target_is_admitted_by_the_leader_once() -> None:
    s = sticky()
    s.observe_tick(10.0, "leader", 4, None)
    s.admit("b", nni(), 10.0)
    s.admit("c", nni(), 10.0)
    s.expect_transfer("b", 10.05)
    assert not s.admit("c", rv(5), 10.1)  # not the target
    assert s.admit("b", rv(5), 10.1)
    assert s.statistics().transfer_admits == 1
    assert not s.admit("b", rv(6), 10.15)  # one campaign only


def test_transfer_window_expires() -> None:
    s = Stickiness(3, R, rejoin_after_s=REJOIN, transfer_window_s=0.2)
    s.observe_tick(0.0, "leader", 4, None)
    s.admit("b", nni(), 0.0)
    s.expect_transfer("c", 0.0)
    s.admit("b", nni(), 0.3)
    assert not s.admit("c", rv(5), 0.3)


def test_candidate_admits_competing_vote_requests() -> None:
    s = sticky()
    follower_of(s, "a", 1, 0.0)
    s.observe_tick(0.6, "candidate", 2, None)
    assert s.admit("c", rv(3), 0.61)


@pytest.mark.parametrize("kwargs, field", [
    (dict(group_size=0, min_election_timeout_s=1, rejoin_after_s=2), "group_size"),
    (dict(group_size=3, min_election_timeout_s=0, rejoin_after_s=2), "min_election_timeout_s"),
    (dict(group_size=3, min_election_timeout_s=1, rejoin_after_s=0.5), "rejoin_after_s"),
])
def test_bad_parameters_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Stickiness(**kwargs)  # type: ignore[arg-type]
