"""raft/tickwatch.py: pure bookkeeping with an explicit clock."""

from __future__ import annotations

import gc
import threading

from raft.tickwatch import TickWatch


def ae(term: int) -> dict[str, object]:
    return {"type": "append_entries", "term": term}


def test_tick_gaps_elections_leaders_and_leases() -> None:
    w = TickWatch("b", lambda: 0.0)
    w.observe_tick(1.00, "follower", 1, None)
    assert w.admit("a", ae(1), 1.01)  # always admits
    w.observe_tick(1.02, "follower", 1, "a")
    w.observe_tick(1.04, "follower", 1, "a")
    w.admit("a", ae(1), 1.70)  # read only in the tick that also campaigned (pysyncobj reads last)
    w.observe_tick(1.74, "candidate", 2, None)  # a 700 ms stall, then an election
    w.observe_tick(1.76, "candidate", 2, None)  # the same election: not counted again
    w.observe_tick(1.80, "leader", 2, "b")
    w.observe_lease(1.9, "b", 7)
    w.observe_lease(2.0, "b", 7)
    w.observe_lease(2.1, "", 0)
    s = w.summary()
    assert s["ticks"] == 6
    assert s["tick_gap_ms"]["max"] == 700.0 and s["tick_gap_ms"]["at_least"]["450"] == 1
    [e] = s["elections_started"]
    assert e["term"] == 2 and e["tick_gap_ms"] == 700.0 and e["previous_role"] == "follower"
    assert e["since_leader_msg_ms"] == 730.0  # judged by what was heard before the stalled tick
    assert [(x["term"], x["leader"]) for x in s["leaders_seen"]] == [(1, "a"), (2, "b")]
    assert [x["epoch"] for x in s["leases_seen"]] == [7]
    assert s["final_term"] == 2


def test_request_votes_and_gc_pauses_are_counted() -> None:
    now = [0.0]
    w = TickWatch("a", lambda: now[0])
    w.admit("c", {"type": "request_vote", "term": 5}, 1.0)
    w.admit("c", {"type": "request_vote", "term": 6}, 1.1)
    w.admit("c", "garbage", 1.2)
    w.gc_callback("start", {})
    now[0] = 0.025
    w.gc_callback("stop", {})
    w.gc_callback("stop", {})  # unmatched: ignored
    s = w.summary()
    assert s["vote_requests_received"] == {"c": 2}
    assert s["gc_pause_ms"]["n"] == 1 and s["gc_pause_ms"]["max"] == 25.0


class CollectsWhenCopied:
    """A lease holder value whose copy runs a garbage collection, i.e. a collection that starts
    inside ``summary()``'s locked section (where ``asdict`` deep-copies each record)."""

    def __deepcopy__(self, memo: dict) -> CollectsWhenCopied:  # type: ignore[type-arg]
        gc.collect()
        return self


def test_a_collection_inside_the_watch_s_own_locked_section_does_not_deadlock() -> None:
    w = TickWatch("a", lambda: 0.0)
    w.observe_lease(1.0, CollectsWhenCopied(), 1)  # type: ignore[arg-type]
    out: list[dict] = []  # type: ignore[type-arg]
    gc.callbacks.append(w.gc_callback)
    try:
        t = threading.Thread(target=lambda: out.append(w.summary()), daemon=True)
        t.start()
        t.join(10.0)
    finally:
        gc.callbacks.remove(w.gc_callback)
    assert not t.is_alive(), "summary() deadlocked on the GC callback"
    assert out[0]["leases_seen"][0]["epoch"] == 1
    assert w.summary()["gc_pause_ms"]["n"] >= 1  # the collection inside the first summary was counted
