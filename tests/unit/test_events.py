"""The change feed: events derived from applied commands (what each command makes, with the data it
needs from before it was applied), and the ``EventLog``'s retention, filters, waits and resets."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId, PoolId, TenantId, ZoneId
from controlplane.domain.instances import InstanceEvent
from controlplane.domain.records import BreakerPhase, BreakerRecord, ScaleMemory
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.domain.topology import Cluster, Zone
from controlplane.runtime import event_types as et
from controlplane.runtime.events import ChangeEvent, EventLog, EventsCompacted, capture
from raft import codec
from raft.fsm import ControlFsm
from raft.lease import AcquireLease, LeaseRecord, ReleaseLease, RenewLease

E = InstanceEvent


def deployment(did: str = "chat", tid: str = "acme", **kw: Any) -> Deployment:
    return Deployment(DeploymentId(did), TenantId(tid), Engine.VLLM, "m", PoolId("h100"), 1, max_replicas=8, **kw)


class Replica:
    """A state and its event log, fed the way ``raft/fsm.py`` feeds them."""

    def __init__(self, log: EventLog | None = None) -> None:
        self.state = ControlState()
        self.log = log or EventLog()

    def run(self, *cmds: c.Command) -> list[ChangeEvent]:
        start = self.log.last_revision
        for cmd in cmds:
            befores: list[Any] = []
            result = apply(self.state, cmd, lambda s, m, out=befores: out.append(capture(s, m)))
            self.log.record(cmd, result, befores, self.state.applied)
        return self.log.since(max(start, self.log.first_revision))


SETUP = (
    c.PutTenant(Tenant(TenantId("acme"), 1), at_ms=10),
    c.PutCluster(Cluster(ClusterId("c1"), ZoneId("z1"), capacity={"h100": 8}), at_ms=11),
    c.PutDeployment(deployment(), at_ms=12),
)


def replica() -> Replica:
    r = Replica()
    r.run(*SETUP)
    return r


def test_object_puts_and_removes() -> None:
    r = Replica()
    assert r.run(*SETUP) == [
        ChangeEvent(1, 10, "ADDED", "Tenant", "acme", tenant="acme"),
        ChangeEvent(2, 11, "ADDED", "Cluster", "c1", cluster="c1", zone="z1"),
        ChangeEvent(3, 12, "ADDED", "Deployment", "chat", tenant="acme", deployment="chat"),
    ]
    assert r.run(
        c.PutDeployment(deployment(warm_pool=1), at_ms=20),
        c.PutZone(Zone(ZoneId("z1")), at_ms=21),
        c.PutZone(Zone(ZoneId("z1"), cordoned=True), at_ms=22),
        c.PutDeployment(deployment(deleting=True), at_ms=23),
        c.RemoveDeployment(DeploymentId("chat")),
        c.RemoveTenant(TenantId("acme")),
        c.RemoveCluster(ClusterId("c1")),
        c.RemoveZone(ZoneId("z1")),
    ) == [
        ChangeEvent(4, 20, "MODIFIED", "Deployment", "chat", tenant="acme", deployment="chat"),
        ChangeEvent(5, 21, "ADDED", "Zone", "z1", zone="z1"),
        ChangeEvent(6, 22, "MODIFIED", "Zone", "z1", zone="z1"),
        ChangeEvent(7, 23, "MODIFIED", "Deployment", "chat", tenant="acme", deployment="chat"),
        ChangeEvent(8, 0, "DELETED", "Deployment", "chat", tenant="acme", deployment="chat"),
        ChangeEvent(9, 0, "DELETED", "Tenant", "acme", tenant="acme"),
        ChangeEvent(10, 0, "DELETED", "Cluster", "c1", cluster="c1", zone="z1"),
        ChangeEvent(11, 0, "DELETED", "Zone", "z1", zone="z1"),
    ]


def test_instance_lifecycle_in_one_batch_keeps_the_instance_data() -> None:
    """A terminal transition removes the instance; its event still names where it ran, even when it
    was created in the same batch."""
    r = replica()
    events = r.run(c.Batch((
        c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 100),
        c.TransitionInstance(InstanceId("i1"), E.START_WARMUP, 101),
        c.TransitionInstance(InstanceId("nope"), E.WARMED, 102),  # rejected: no event
        c.TransitionInstance(InstanceId("i1"), E.WARMUP_FAILED, 103),
    )))
    where = {"tenant": "acme", "deployment": "chat", "cluster": "c1", "zone": "z1"}
    assert events == [
        ChangeEvent(4, 100, "TRANSITION", "Instance", "i1", to_state="Pending", event="create", **where),
        ChangeEvent(5, 101, "TRANSITION", "Instance", "i1", from_state="Pending", to_state="Warming",
                    event="start_warmup", **where),
        ChangeEvent(6, 103, "TRANSITION", "Instance", "i1", from_state="Warming", to_state="Failed",
                    event="warmup_failed", **where),
    ]
    assert "i1" not in r.state.instances


def test_decisions_are_kept_per_deployment() -> None:
    r = Replica(EventLog(capacity=3, decisions_per_deployment=2))
    r.run(*SETUP)
    r.run(*[c.SetDesired(DeploymentId("chat"), n, 0, f"r{n}", 100 + n, f"m{n}") for n in range(1, 5)])
    newest = ChangeEvent(7, 104, "DECIDED", "Decision", "chat", tenant="acme", deployment="chat", replicas=4,
                         reason="r4", message="m4")
    assert r.log.decisions("chat", 10) == [
        ChangeEvent(6, 103, "DECIDED", "Decision", "chat", tenant="acme", deployment="chat", replicas=3,
                    reason="r3", message="m3"),
        newest,
    ]
    assert r.log.decisions("chat", 1) == [newest]
    assert r.log.decisions("chat", 0) == [] and r.log.decisions("other", 5) == []
    r.run(c.SetDesired(DeploymentId("chat"), 0, 0, "bye", 200), c.PutDeployment(deployment(deleting=True)),
          c.RemoveDeployment(DeploymentId("chat")))
    assert r.log.decisions("chat", 10) == []


def test_tokens_and_memory_make_no_events_but_move_the_revision() -> None:
    r = replica()
    record = TokenRecord("0123456789ab", "f" * 64, Role.ADMIN)
    assert r.run(
        c.PutToken(record), c.RemoveToken("0123456789ab"), c.PutScaleMemory(DeploymentId("chat"), ScaleMemory()),
    ) == []
    assert r.log.last_revision == r.state.applied == 6


def test_breaker_events_are_significant_when_the_phase_changes() -> None:
    r = replica()
    key = "deployment/c1/chat"
    events = r.run(
        c.PutBreaker(key, BreakerRecord(failures=1, changed_ms=50)),  # closed -> closed: a failure counted
        c.PutBreaker(key, BreakerRecord(BreakerPhase.OPEN, 3, 1, 900, changed_ms=60)),
        c.PutBreaker("cluster/c1", BreakerRecord(BreakerPhase.OPEN, 2, 1, 900, changed_ms=61)),
        c.PutBreaker(key, BreakerRecord(BreakerPhase.HALF_OPEN, 3, 1, 900, changed_ms=70)),
    )
    where = {"tenant": "acme", "deployment": "chat", "cluster": "c1", "type": "TRANSITION", "kind": "Breaker"}
    assert events == [
        ChangeEvent(4, 50, name=key, from_state="closed", to_state="closed", event="closed",
                    message="failures 1, trips 0", significant=False, **where),
        ChangeEvent(5, 60, name=key, from_state="closed", to_state="open", event="trip",
                    message="failures 3, trips 1", **where),
        ChangeEvent(6, 61, "TRANSITION", "Breaker", "cluster/c1", cluster="c1", from_state="closed", to_state="open",
                    event="trip", message="failures 2, trips 1"),
        ChangeEvent(7, 70, name=key, from_state="open", to_state="half_open", event="half_open",
                    message="failures 3, trips 1", **where),
    ]
    assert [et.event_type(e) for e in events] == ["breaker"] * 4


def test_decisions_that_change_no_count_are_not_significant() -> None:
    r = replica()
    d = DeploymentId("chat")
    events = r.run(c.SetDesired(d, 2, 0, "scale_up", 10), c.SetDesired(d, 2, 0, "hold", 11),
                   c.SetDesired(d, 2, 1, "warm", 12), c.SetDesired(d, 1, 1, "scale_down", 13))
    assert [(e.reason, e.significant) for e in events] == [
        ("scale_up", True), ("hold", False), ("warm", True), ("scale_down", True)]
    assert {et.event_type(e) for e in events} == {"decision"}


def test_busy_flips_are_not_significant_and_preemptions_are_named() -> None:
    r = replica()
    i = InstanceId("i1")
    events = r.run(
        c.CreateInstance(i, DeploymentId("chat"), ClusterId("c1"), 1), c.TransitionInstance(i, E.START_WARMUP, 2),
        c.TransitionInstance(i, E.WARMED, 3), c.TransitionInstance(i, E.WORK, 4), c.TransitionInstance(i, E.IDLE, 5),
        c.TransitionInstance(i, E.DRAIN, 6, drain_deadline_ms=100, preempted=True),
    )
    assert [(e.to_state, et.event_type(e), e.significant) for e in events] == [
        ("Pending", "lifecycle", True), ("Warming", "lifecycle", True), ("Ready", "lifecycle", True),
        ("Busy", "busy", False), ("Ready", "busy", False), ("Draining", "preemption", True)]
    assert events[-1].reason == "preempted"


def test_the_selector_of_a_watch() -> None:
    r = replica()
    i = InstanceId("i1")
    events = r.run(c.CreateInstance(i, DeploymentId("chat"), ClusterId("c1"), 1),
                   c.TransitionInstance(i, E.START_WARMUP, 2), c.TransitionInstance(i, E.WARMED, 3),
                   c.TransitionInstance(i, E.WORK, 4), c.SetDesired(DeploymentId("chat"), 1, 0, "r", 5),
                   c.SetDesired(DeploymentId("chat"), 1, 0, "same", 6))
    revs = lambda sel: [e.revision for e in events if sel(e)]  # noqa: E731
    assert revs(et.selector(False, frozenset())) == [4, 5, 6, 8]  # default: significant only
    assert revs(et.selector(True, frozenset())) == [4, 5, 6, 7, 8, 9]
    assert revs(et.selector(False, frozenset({"busy", "decision"}))) == [7, 8, 9]
    assert revs(et.selector(True, frozenset({"lifecycle"}))) == [4, 5, 6]  # types win over all
    assert et.parse_types(["Decision", "lease"]) == {"decision", "lease"}
    with pytest.raises(ValueError, match=r"types\[1\]: unknown type 'bogus'"):
        et.parse_types(["busy", "bogus"])


def test_rejected_commands_make_no_events() -> None:
    r = replica()
    assert r.run(c.RemoveTenant(TenantId("acme")), c.PutTenant(Tenant(TenantId("acme"), 1), expect_version=99),
                 c.Batch((c.Batch(()), c.RemoveZone(ZoneId("z9"))))) == []
    assert r.log.last_revision == 3


def test_since_filters_limits_and_ahead_of_the_log() -> None:
    r = replica()
    r.run(c.PutTenant(Tenant(TenantId("beta"), 1)), c.PutZone(Zone(ZoneId("z2"))))
    assert [e.revision for e in r.log.since(0)] == [1, 2, 3, 4, 5]
    assert [e.revision for e in r.log.since(3)] == [4, 5]
    assert [e.name for e in r.log.since(0, match=lambda e: e.tenant == "acme")] == ["acme", "chat"]
    assert [e.revision for e in r.log.since(0, limit=2)] == [1, 2]
    assert [e.revision for e in r.log.since(1, match=lambda e: e.kind != "Cluster", limit=2)] == [3, 4]
    assert r.log.since(5) == [] and r.log.since(99) == []
    with pytest.raises(ValueError, match="limit"):
        r.log.since(0, limit=-1)


def test_compaction_moves_first_revision_and_since_raises_below_it() -> None:
    r = Replica(EventLog(capacity=2))
    assert r.log.first_revision == 0
    r.run(*SETUP, c.PutScaleMemory(DeploymentId("chat"), ScaleMemory()), c.PutZone(Zone(ZoneId("z1"))))
    assert [e.revision for e in r.log.since(2)] == [3, 5]
    assert (r.log.first_revision, r.log.last_revision) == (2, 5)
    with pytest.raises(EventsCompacted) as info:
        r.log.since(1)
    assert (info.value.revision, info.value.oldest) == (1, 2)
    assert "revision 1 is compacted" in str(info.value)


def test_reset_forgets_everything_before_the_snapshot() -> None:
    r = replica()
    r.run(c.SetDesired(DeploymentId("chat"), 1, 0, "r", 5))
    r.log.reset(40)
    assert (r.log.first_revision, r.log.last_revision) == (40, 40)
    assert r.log.since(40) == [] and r.log.decisions("chat", 5) == []
    with pytest.raises(EventsCompacted):
        r.log.since(39)


def test_wait_after_returns_at_once_or_when_something_is_recorded() -> None:
    r = replica()
    assert r.log.wait_after(2, timeout_s=0) == 3
    assert r.log.wait_after(3, timeout_s=0.01) == 3  # timed out
    started = threading.Event()
    got: list[int] = []

    def waiter() -> None:
        started.set()
        got.append(r.log.wait_after(3, timeout_s=30))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait(5)
    r.run(c.PutBreaker("k", BreakerRecord()))
    t.join(10)
    assert got == [4]


def test_capture_never_raises_on_malformed_commands() -> None:
    state = replica().state
    assert capture(state, c.RemoveDeployment(["x"])) is None  # type: ignore[arg-type]
    assert capture(state, c.PutTenant(None)) is None  # type: ignore[arg-type]
    assert capture(state, c.Command()) is None


def test_every_replica_derives_the_same_events() -> None:
    cmds = [*SETUP, c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 5),
            c.SetDesired(DeploymentId("chat"), 1, 0, "r", 6), c.TransitionInstance(InstanceId("i1"), E.CANCEL, 7)]
    a, b = Replica(), Replica()
    a.run(*cmds)
    b.run(c.Batch(tuple(cmds)))
    assert a.log.since(0) == b.log.since(0) and a.log.last_revision == b.log.last_revision == 6


def test_the_fsm_records_applied_entries_and_resets_on_snapshot_install() -> None:
    fsm = ControlFsm(lambda: 0)
    fsm._apply(codec.encode(c.Batch(SETUP)), "", 0, 1)  # what apply_entry runs for log index 1
    fsm._apply(codec.encode(AcquireLease("n1", 0, 1_000)), "", 0, 2)  # a lease change: revision 4
    fsm._apply(codec.encode(RenewLease("n1", 2)), "", 0, 3)  # a renewal: nothing
    fsm._apply(codec.encode(c.RemoveZone(ZoneId("z9"))), "", 0, 4)  # rejected: nothing
    assert [e.name for e in fsm.events.since(0)] == ["acme", "c1", "chat", "lease"] and fsm.events.last_revision == 4
    assert fsm.state_copy().applied == 4
    state = replica().state
    state.applied = 50
    fsm.install_snapshot(codec.encode_state(state, LeaseRecord()))
    assert (fsm.events.first_revision, fsm.events.last_revision) == (50, 50)
    fsm._apply(codec.encode(c.PutZone(Zone(ZoneId("z1")), at_ms=9)), "", 0, 60)
    assert fsm.events.since(50) == [ChangeEvent(51, 9, "ADDED", "Zone", "z1", zone="z1")]


def test_lease_changes_are_events_of_their_own_revision_and_a_failover_is_named() -> None:
    fsm = ControlFsm(lambda: 0)
    fsm._apply(codec.encode(c.Batch(SETUP)), "", 0, 1)
    fsm._apply(codec.encode(AcquireLease("n1", 0, 1_000)), "", 0, 2)
    fsm._apply(codec.encode(ReleaseLease("n1", 2)), "", 0, 3)
    fsm._apply(codec.encode(AcquireLease("n2", 2, 1_000)), "", 0, 4)
    lease, _ = fsm.lease_view()
    assert (lease.holder, lease.epoch) == ("n2", 4)
    # a takeover without a release (the holder's lease expired): simulated through the record
    fsm._lease = LeaseRecord("n3", 4, lease.version, 1_000)
    fsm._apply(codec.encode(AcquireLease("n1", lease.version, 1_000)), "", 0, 5)
    got = [(e.revision, e.type, e.kind, e.event, e.from_state, e.to_state, e.reason) for e in fsm.events.since(3)]
    assert got == [
        (4, "TRANSITION", "Lease", "acquire", "", "n1", ""),
        (5, "TRANSITION", "Lease", "release", "n1", "", ""),
        (6, "TRANSITION", "Lease", "acquire", "", "n2", ""),
        (7, "TRANSITION", "Lease", "acquire", "n3", "n1", "failover"),
    ]
    assert fsm.events.since(6)[0].message == "n1 holds the lease at epoch 5 (was n3 at epoch 4)"
    assert {et.event_type(e) for e in fsm.events.since(3)} == {"lease"}
    assert all(e.significant for e in fsm.events.since(3)) and fsm.events.last_revision == 7
