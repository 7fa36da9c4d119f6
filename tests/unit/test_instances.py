"""The instance lifecycle: the TRANSITIONS table, ``transition()`` and the generated diagram."""

from __future__ import annotations

import itertools
import re
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import IllegalTransition, PermanentError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import (
    INIT_METHOD_OF,
    TRANSITIONS,
    InitMethod,
    Instance,
    InstanceEvent,
    InstanceState,
    Transitioned,
    mermaid_diagram,
    next_state,
    transition,
)

S, E = InstanceState, InstanceEvent
ALL_PAIRS = list(itertools.product(InstanceState, InstanceEvent))
LIFECYCLE_DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"


def make_instance(state: InstanceState = S.PENDING, *, since_ms: int = 1_000,
                  init: InitMethod = InitMethod.COLD) -> Instance:
    return Instance(
        id=InstanceId("i-1"),
        deployment=DeploymentId("chat"),
        tenant=TenantId("acme"),
        cluster=ClusterId("c1"),
        zone=ZoneId("z1"),
        pool=PoolId("h100"),
        gpus=2,
        state=state,
        init_method=init,
        created_ms=0,
        state_since_ms=since_ms,
    )


def reachable_from_pending() -> set[InstanceState]:
    seen = {S.PENDING}
    todo = deque([S.PENDING])
    while todo:
        s = todo.popleft()
        for (src, _ev), dst in TRANSITIONS.items():
            if src is s and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return seen


# --- the table ----------------------------------------------------------------------------------


def test_expected_table() -> None:
    """The lifecycle written out by hand, so a change to the table is a visible change here."""
    expected = {
        (S.PENDING, E.START_WARMUP): S.WARMING,
        (S.PENDING, E.CANCEL): S.TERMINATED,
        (S.WARMING, E.WARMED): S.READY,
        (S.WARMING, E.WARMUP_FAILED): S.FAILED,
        (S.WARMING, E.DRAIN): S.DRAINING,
        (S.READY, E.WORK): S.BUSY,
        (S.BUSY, E.IDLE): S.READY,
        (S.READY, E.SLEEP): S.STANDBY,
        (S.BUSY, E.SLEEP): S.STANDBY,
        (S.STANDBY, E.WAKE): S.WARMING,
        (S.READY, E.DRAIN): S.DRAINING,
        (S.BUSY, E.DRAIN): S.DRAINING,
        (S.STANDBY, E.DRAIN): S.DRAINING,
        (S.DRAINING, E.DRAINED): S.TERMINATED,
    }
    for s in InstanceState:
        if not s.terminal:
            expected[(s, E.LOST)] = S.FAILED
    assert TRANSITIONS == expected


def test_every_state_is_reachable_from_pending() -> None:
    assert reachable_from_pending() == set(InstanceState)


def test_terminal_states_have_no_outgoing_transitions() -> None:
    terminal = {s for s in InstanceState if s.terminal}
    assert terminal == {S.TERMINATED, S.FAILED}
    assert not [k for k in TRANSITIONS if k[0] in terminal]


def test_every_non_terminal_state_can_be_lost() -> None:
    for s in InstanceState:
        assert ((s, E.LOST) in TRANSITIONS) is (not s.terminal)


def test_state_properties() -> None:
    assert {s for s in InstanceState if s.serving} == {S.READY, S.BUSY}
    assert {s for s in InstanceState if s.holds_gpus} == {s for s in InstanceState if not s.terminal}


@pytest.mark.parametrize(("state", "event"), ALL_PAIRS, ids=lambda v: v.value)
def test_every_state_event_pair(state: InstanceState, event: InstanceEvent) -> None:
    inst = make_instance(state)
    if (state, event) in TRANSITIONS:
        new, rec = transition(inst, event, 5_000)
        assert new.state is TRANSITIONS[(state, event)]
        assert next_state(inst.id, state, event) is new.state
        assert rec == Transitioned(inst.id, state, new.state, event, 4_000, new.init_method, 5_000)
        assert new.state_since_ms == 5_000
        assert (new.id, new.deployment, new.gpus, new.created_ms) == (inst.id, inst.deployment, 2, 0)
    else:
        with pytest.raises(IllegalTransition) as info:
            transition(inst, event, 5_000)
        err = info.value
        assert isinstance(err, PermanentError)
        assert (err.instance_id, err.from_state, err.event) == ("i-1", state.value, event.value)
        assert str(err) == f"instance i-1: no transition from {state.value} on {event.value}"
        with pytest.raises(IllegalTransition):
            next_state(inst.id, state, event)


# --- init method, latency, drain fields ---------------------------------------------------------


def test_init_method_of_table() -> None:
    assert INIT_METHOD_OF == {
        (S.PENDING, E.START_WARMUP): InitMethod.COLD,
        (S.STANDBY, E.WAKE): InitMethod.WARM,
    }
    # Both begin a warm-up.
    assert all(TRANSITIONS[k] is S.WARMING for k in INIT_METHOD_OF)


@pytest.mark.parametrize("before", list(InitMethod), ids=lambda m: m.value)
def test_pending_to_warming_is_a_cold_start(before: InitMethod) -> None:
    new, rec = transition(make_instance(S.PENDING, init=before), E.START_WARMUP, 2_000)
    assert new.init_method is InitMethod.COLD
    assert rec.init_method is InitMethod.COLD


@pytest.mark.parametrize("before", list(InitMethod), ids=lambda m: m.value)
def test_standby_to_warming_is_a_warm_start(before: InitMethod) -> None:
    new, rec = transition(make_instance(S.STANDBY, init=before), E.WAKE, 2_000)
    assert new.state is S.WARMING
    assert new.init_method is InitMethod.WARM
    assert rec.init_method is InitMethod.WARM


@pytest.mark.parametrize(
    ("state", "event"), [k for k in TRANSITIONS if k not in INIT_METHOD_OF], ids=lambda v: v.value
)
@pytest.mark.parametrize("before", list(InitMethod), ids=lambda m: m.value)
def test_init_method_is_kept_by_other_transitions(
    state: InstanceState, event: InstanceEvent, before: InitMethod
) -> None:
    new, rec = transition(make_instance(state, init=before), event, 2_000)
    assert new.init_method is before
    assert rec.init_method is before


def test_warm_start_is_remembered_until_the_next_warm_up() -> None:
    inst = make_instance(S.PENDING)
    path = [(E.START_WARMUP, InitMethod.COLD), (E.WARMED, InitMethod.COLD), (E.SLEEP, InitMethod.COLD),
            (E.WAKE, InitMethod.WARM), (E.WARMED, InitMethod.WARM), (E.WORK, InitMethod.WARM),
            (E.IDLE, InitMethod.WARM), (E.DRAIN, InitMethod.WARM), (E.DRAINED, InitMethod.WARM)]
    for t, (event, method) in enumerate(path):
        inst, rec = transition(inst, event, 10_000 + t)
        assert inst.init_method is method, event
        assert rec.init_method is method
    assert inst.state is S.TERMINATED


@pytest.mark.parametrize(("since_ms", "at_ms", "latency_ms"), [
    (0, 0, 0),
    (1_000, 1_000, 0),
    (1_000, 31_000, 30_000),
    (123, 1_123_456, 1_123_333),
])
def test_latency_is_time_spent_in_the_previous_state(since_ms: int, at_ms: int, latency_ms: int) -> None:
    inst = make_instance(S.PENDING, since_ms=since_ms)
    new, rec = transition(inst, E.START_WARMUP, at_ms)
    assert rec.latency_ms == latency_ms == at_ms - since_ms
    assert (rec.from_state, rec.to_state, rec.event, rec.at_ms) == (S.PENDING, S.WARMING, E.START_WARMUP, at_ms)
    assert new.state_since_ms == at_ms


def test_latency_never_negative_when_time_goes_backwards() -> None:
    # A new leader's clock may be behind the old one's stamp: the record clamps rather than lies.
    _, rec = transition(make_instance(S.PENDING, since_ms=5_000), E.START_WARMUP, 4_000)
    assert rec.latency_ms == 0


def test_transition_is_pure() -> None:
    inst = make_instance(S.READY)
    transition(inst, E.DRAIN, 9_000, drain_deadline_ms=40_000, preempted=True)
    assert inst == make_instance(S.READY)


def test_drain_records_deadline_and_preemption() -> None:
    new, _ = transition(make_instance(S.BUSY), E.DRAIN, 9_000, drain_deadline_ms=40_000, preempted=True)
    assert (new.state, new.drain_deadline_ms, new.preempted) == (S.DRAINING, 40_000, True)
    # Both are kept on the way out.
    done, _ = transition(new, E.DRAINED, 12_000)
    assert (done.state, done.drain_deadline_ms, done.preempted) == (S.TERMINATED, 40_000, True)


def test_deadline_and_preempted_ignored_unless_entering_draining() -> None:
    new, _ = transition(make_instance(S.READY), E.WORK, 9_000, drain_deadline_ms=40_000, preempted=True)
    assert (new.state, new.drain_deadline_ms, new.preempted) == (S.BUSY, 0, False)


# --- properties ---------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.sampled_from(list(InstanceEvent)), st.integers(0, 10_000)), max_size=40))
def test_random_event_sequences_stay_in_the_table(steps: list[tuple[InstanceEvent, int]]) -> None:
    reachable = reachable_from_pending()
    inst = make_instance(S.PENDING, since_ms=0)
    now = 0
    was_terminal = False
    for event, dt in steps:
        now += dt
        before = inst
        if (inst.state, event) in TRANSITIONS:
            inst, rec = transition(inst, event, now)
            assert inst.state is TRANSITIONS[(before.state, event)]
            assert inst.state in reachable
            assert rec.from_state is before.state and rec.to_state is inst.state
            assert rec.latency_ms == now - before.state_since_ms
        else:
            with pytest.raises(IllegalTransition):
                transition(inst, event, now)
            assert inst is before  # unchanged (frozen, and transition() is pure)
        if was_terminal:
            assert inst == before and inst.state.terminal
        was_terminal = inst.state.terminal


@given(st.sampled_from([s for s in InstanceState if s.terminal]), st.lists(st.sampled_from(list(InstanceEvent))))
def test_terminal_stays_terminal(state: InstanceState, events: list[InstanceEvent]) -> None:
    inst = make_instance(state)
    for event in events:
        with pytest.raises(IllegalTransition):
            transition(inst, event, 99_000)
    assert inst.state is state


# --- the generated diagram in docs/lifecycle.md ------------------------------------------------


def test_mermaid_diagram_lists_every_transition() -> None:
    text = mermaid_diagram()
    assert text.startswith("stateDiagram-v2\n    [*] --> Pending\n")
    edges = re.findall(r"^    (\w+) --> (\w+): (\w+)$", text, flags=re.M)
    assert sorted(edges) == sorted((s.value, d.value, e.value) for (s, e), d in TRANSITIONS.items())
    assert mermaid_diagram() == text  # deterministic


def test_lifecycle_doc_embeds_the_generated_diagram() -> None:
    doc = LIFECYCLE_DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"^```mermaid\n(.*?)^```$", doc, flags=re.M | re.S)
    hint = (
        "docs/lifecycle.md is stale: replace its ```mermaid block with the output of\n"
        "  .venv/bin/python -c 'from controlplane.domain.instances import mermaid_diagram as m; "
        "print(m(), end=\"\")'"
    )
    assert len(blocks) == 1, hint
    assert blocks[0] == mermaid_diagram(), hint
