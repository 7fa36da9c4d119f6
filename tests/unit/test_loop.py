"""The control loop shell: gather -> facts commit -> decide -> commit -> act, with fencing.

Runs :class:`ControlLoop` over a :class:`LocalReplicator` with a scripted observation source and a
recording adapter (fakes for the two ports). Time is the ``now_ms`` argument of ``tick``; nothing
sleeps.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
import structlog
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from controlplane.core import reconcile as r
from controlplane.core.signals import LOAD_SIGNALS
from controlplane.domain import commands as c
from controlplane.domain.errors import CommitTimeout, NotFound, StaleEpoch, Unavailable
from controlplane.domain.ids import (
    ClusterId,
    DeploymentId,
    InstanceId,
    PoolId,
    TenantId,
    ZoneId,
)
from controlplane.domain.instances import (
    InitMethod,
    InstanceEvent,
    InstanceState,
    Transitioned,
)
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.domain.records import BreakerPhase, BreakerRecord
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.topology import Cluster
from controlplane.ports import AdapterCommand, Fence
from controlplane.runtime.loop import (
    REPORT_REPLAY_MS,
    ControlLoop,
    LoopStatistics,
    TickReport,
)
from controlplane.runtime.replicator import LocalReplicator
from controlplane.runtime.transitions import TRANSITIONS_METRIC, TransitionRecorder

S, E = InstanceState, InstanceEvent
H100 = PoolId("h100")
T0 = 1_000_000
TICK_MS = 250
EPOCH = 7

# --- fakes ----------------------------------------------------------------------------------------


def idle(ids: Sequence[str], at_ms: int) -> list[InstanceSample]:
    """Idle samples of ``ids``: a scale-in needs the load known (a silent instance holds it)."""
    return [InstanceSample(InstanceId(i), DeploymentId("chat"), at_ms, 0, 0, 0.0, 0.0, 0.0) for i in ids]


class ScriptedSource:
    """ObservationSource: returns what the test queued for a given tick time (else nothing)."""

    def __init__(self) -> None:
        self.script: dict[int, Observations] = {}
        self.calls: list[int] = []

    def at(
        self, now_ms: int, *, reports: Sequence[InstanceReport] = (), samples: Sequence[InstanceSample] = ()
    ) -> None:
        self.script[now_ms] = Observations(now_ms, tuple(samples), tuple(reports))

    def gather(self, now_ms: int) -> Observations:
        self.calls.append(now_ms)
        return self.script.pop(now_ms, Observations(now_ms))


# The state each action must already have produced in the replicated state when the adapter hears of
# it (commit, then act). A cancelled Pending instance is Terminated and has left the state.
COMMITTED_STATE = {
    "create": S.PENDING,
    "wake": S.WARMING,
    "sleep": S.STANDBY,
    "drain": S.DRAINING,
    "cancel": None,
}


@dataclass
class Sent:
    cluster: ClusterId
    command: AdapterCommand
    fence: Fence
    now_ms: int
    committed_entries: int
    delivered: bool = False


@dataclass
class RecordingAdapter:
    """ClusterAdapter: records every send, checks commit-before-act, raises what ``fail`` says."""

    replicator: LocalReplicator
    fail: Callable[[ClusterId, AdapterCommand], Exception | None] = lambda cluster, cmd: None
    sent: list[Sent] = field(default_factory=list)
    """Every send attempt, delivered or not."""
    violations: list[str] = field(default_factory=list)

    def send(self, cluster_id: ClusterId, command: AdapterCommand, fence: Fence, now_ms: int) -> None:
        attempt = Sent(cluster_id, command, fence, now_ms, self.replicator.entries)
        self.sent.append(attempt)
        inst = self.replicator.state.instances.get(command.instance.id)
        want = COMMITTED_STATE[command.action]
        have = None if inst is None else inst.state
        if have is not want:
            self.violations.append(f"{command.action} {command.instance.id}: replicated state is {have}, want {want}")
        if cluster_id != command.instance.cluster:
            self.violations.append(f"{command.instance.id} sent to {cluster_id}, lives in {command.instance.cluster}")
        error = self.fail(cluster_id, command)
        if error is not None:
            raise error
        attempt.delivered = True

    def actions(self) -> list[tuple[str, str, str]]:
        return [(s.command.action, s.command.instance.id, s.cluster) for s in self.sent]


# --- builders -------------------------------------------------------------------------------------


def chat(min_replicas: int = 1, warm_pool: int = 0) -> c.PutDeployment:
    """The deployment. The loop feeds the scaling decision real (here: zero) load, so the tests set
    the replica count through ``min_replicas`` (the decision's clamp)."""
    return c.PutDeployment(
        Deployment(DeploymentId("chat"), TenantId("acme"), Engine.VLLM, "llama3-8b-h100", H100, 1,
                   min_replicas=min_replicas, max_replicas=16, warm_pool=warm_pool)
    )


def setup(
    *, clusters: Sequence[tuple[str, str, int]] = (("c1", "z1", 8),), min_replicas: int = 1, warm_pool: int = 0
) -> list[c.Command]:
    return [
        *[c.PutCluster(Cluster(ClusterId(cid), ZoneId(z), capacity={H100: n})) for cid, z, n in clusters],
        c.PutTenant(Tenant(TenantId("acme"), 10, {H100: 16})),
        chat(min_replicas, warm_pool),
    ]


@dataclass
class Rig:
    replicator: LocalReplicator
    adapter: RecordingAdapter
    source: ScriptedSource
    loop: ControlLoop
    transitions: list[Transitioned]

    @property
    def state(self) -> ControlState:
        return self.replicator.state

    def commit(self, *commands: c.Command) -> None:
        result = self.replicator.commit(commands, 0)
        assert result.ok, [x.error for x in result.results]


def rig(
    commands: Sequence[c.Command],
    *,
    authority: Callable[[int], int | None] = lambda now_ms: EPOCH,
    fail: Callable[[ClusterId, AdapterCommand], Exception | None] = lambda cluster, cmd: None,
    on_transitions: Callable[[Sequence[Transitioned]], None] | None = None,
) -> Rig:
    state = ControlState()
    for cmd in commands:
        assert apply(state, cmd).ok, cmd
    seen: list[Transitioned] = []

    def hook(records: Sequence[Transitioned]) -> None:
        seen.extend(records)
        if on_transitions is not None:
            on_transitions(records)

    replicator = LocalReplicator(state, on_transitions=hook)
    adapter = RecordingAdapter(replicator, fail)
    source = ScriptedSource()
    loop = ControlLoop(replicator, adapter, source, rng=random.Random(5), authority=authority)
    return Rig(replicator, adapter, source, loop, seen)


def report(iid: str, event: InstanceEvent, at_ms: int) -> InstanceReport:
    return InstanceReport(InstanceId(iid), event.value, at_ms)


def actionable(plan: r.Plan | None) -> list[tuple[str, str]]:
    """The adapter actions a committed plan implies, in plan order."""
    assert plan is not None
    names = {E.WAKE: "wake", E.SLEEP: "sleep", E.DRAIN: "drain", E.CANCEL: "cancel"}
    out = []
    for cmd in plan.commands:
        if isinstance(cmd, c.CreateInstance):
            out.append(("create", cmd.instance_id))
        elif isinstance(cmd, c.TransitionInstance) and cmd.event in names:
            out.append((names[cmd.event], cmd.instance_id))
    return out


# --- commit before act, fencing -------------------------------------------------------------------


def test_commands_are_committed_before_they_are_sent_in_plan_order_with_fences() -> None:
    # Two zones, 2 replicas + 1 warm wanted from nothing.
    rg = rig(setup(clusters=(("c1", "z1", 4), ("c2", "z2", 4)), min_replicas=2, warm_pool=1))

    # t0: three cold starts, spread over the zones.
    rep = rg.loop.tick(T0)
    assert rep.acted and rep.facts == 0 and rep.sent == 3 and rep.send_failures == 0
    ids = [f"chat-{T0}-{k}" for k in range(3)]
    assert actionable(rep.plan) == [("create", i) for i in ids]
    assert rg.adapter.actions() == [("create", ids[0], "c1"), ("create", ids[1], "c2"), ("create", ids[2], "c1")]
    assert all(s.committed_entries == rg.replicator.entries == 1 for s in rg.adapter.sent)

    # t1: all three warm up (facts), and the surplus one is put to sleep (plan) in the same tick.
    t1 = T0 + 40_000
    warmups = [report(i, ev, T0 + 30_000 + k) for k, i in enumerate(ids) for ev in (E.START_WARMUP, E.WARMED)]
    rg.source.at(t1, reports=warmups)
    rep = rg.loop.tick(t1)
    assert rep.facts == 6 and rep.sent == 1
    assert actionable(rep.plan) == [("sleep", ids[0])]

    # t2: one more replica: the sleeper is woken, a cold start refills the pool.
    t2 = t1 + TICK_MS
    rg.commit(chat(3, 1))
    rep = rg.loop.tick(t2)
    assert actionable(rep.plan) == [("wake", ids[0]), ("create", f"chat-{t2}-0")]

    # t3: back to 1 replica (+1 warm): the instances still starting go first (the waking one is
    # drained with the scale-in grace, the Pending one cancelled), then a Ready one refills the pool.
    t3 = t2 + TICK_MS
    rg.commit(chat(1, 1))
    rg.source.at(t3, samples=idle(ids, t3))
    rep = rg.loop.tick(t3)
    plan_actions = actionable(rep.plan)
    assert plan_actions == [("drain", ids[0]), ("cancel", f"chat-{t2}-0"), ("sleep", ids[1])]

    sent = rg.adapter.sent
    assert rg.adapter.violations == []
    assert [(s.command.action, s.command.instance.id) for s in sent[-3:]] == plan_actions
    assert [s.command.deadline_ms for s in sent if s.command.action == "drain"] == [t3 + 60_000]
    assert [s.fence for s in sent] == [Fence(EPOCH, k) for k in range(1, len(sent) + 1)]
    assert len({s.command.request_id for s in sent}) == len(sent)
    # Commits: t0 plan, t1 facts + plan, t2 plan, t3 plan (the test's own two commits are not the loop's).
    assert rg.replicator.entries == 5 + 2
    assert rg.loop.statistics() == LoopStatistics(
        ticks=4, commits=5, commands_sent=len(sent), send_failures=0, stale_rejections=0, replayed_epochs=0
    )


def test_the_epoch_of_each_tick_comes_from_authority() -> None:
    epochs = {T0: 3, T0 + TICK_MS: 4}
    rg = rig(setup(min_replicas=1), authority=lambda now_ms: epochs[now_ms])
    rg.loop.tick(T0)
    rg.commit(chat(2))
    rg.loop.tick(T0 + TICK_MS)
    fences = [s.fence for s in rg.adapter.sent]
    assert [f.epoch for f in fences] == [3, 4]
    assert fences[0].seq < fences[1].seq
    assert len({s.command.request_id for s in rg.adapter.sent}) == 2


def test_without_authority_the_loop_gathers_and_filters_but_neither_commits_nor_sends() -> None:
    rg = rig(setup(min_replicas=1), authority=lambda now_ms: None)
    rg.commit(c.CreateInstance(InstanceId("r1"), DeploymentId("chat"), ClusterId("c1"), T0 - 9_000))
    rg.commit(c.TransitionInstance(InstanceId("r1"), E.START_WARMUP, T0 - 8_000),
              c.TransitionInstance(InstanceId("r1"), E.WARMED, T0 - 7_000))
    entries = rg.replicator.entries
    busy = InstanceSample(InstanceId("r1"), DeploymentId("chat"), T0, 200, 50, 0.9, 1_000.0, 5_000.0)
    rg.source.at(T0, samples=[busy], reports=[report("r1", E.LOST, T0)])

    rep = rg.loop.tick(T0)
    assert rep == TickReport(T0, False, None, 0, 0, 0)
    assert rg.source.calls == [T0]
    sig = rg.loop.last_signals["chat"]
    assert sig is not None and sig.stable["concurrency"] == 250.0
    assert rg.replicator.entries == entries
    assert rg.state.instances["r1"].state is S.READY  # neither the WORK sample nor the LOST report committed
    assert rg.adapter.sent == []
    assert rg.loop.statistics() == LoopStatistics(
        ticks=1, commits=0, commands_sent=0, send_failures=0, stale_rejections=0, replayed_epochs=0
    )


# --- undeliverable commands -----------------------------------------------------------------------


def test_an_undeliverable_create_marks_the_instance_lost_and_feeds_the_cluster_breaker() -> None:
    down = {"c1"}
    rg = rig(
        setup(clusters=(("c1", "z1", 4), ("c2", "z2", 4)), min_replicas=1),
        fail=lambda cluster, cmd: Unavailable(f"{cluster} unreachable") if cluster in down else None,
    )
    # Three ticks, three creates placed in c1 (the emptiest), none delivered.
    for k in range(3):
        now = T0 + k * TICK_MS
        rep = rg.loop.tick(now)
        assert (rep.sent, rep.send_failures) == (0, 1)
        assert rep.facts == (0 if k == 0 else 2)  # the previous tick's failure: LOST + breaker update
        assert [i.id for i in rg.state.instances.values()] == [f"chat-{now}-0"]
        if k:
            prev = f"chat-{now - TICK_MS}-0"
            assert prev not in rg.state.instances
            assert rg.transitions[-1] == Transitioned(
                InstanceId(prev), S.PENDING, S.FAILED, E.LOST, 0, InitMethod.COLD, now - TICK_MS
            )
            assert rg.state.breakers[r.cluster_key("c1")] == BreakerRecord(failures=k)
    assert rg.adapter.actions() == [("create", f"chat-{T0 + k * TICK_MS}-0", "c1") for k in range(3)]

    # The third failure opens the breaker; its replacement goes to c2 and is delivered.
    now = T0 + 3 * TICK_MS
    rep = rg.loop.tick(now)
    assert rep.facts == 2 and (rep.sent, rep.send_failures) == (1, 0)
    assert rg.state.breakers[r.cluster_key("c1")].phase is BreakerPhase.OPEN
    assert rg.adapter.actions()[-1] == ("create", f"chat-{now}-0", "c2")
    stats = rg.loop.statistics()
    assert (stats.send_failures, stats.commands_sent, stats.ticks) == (3, 1, 4)
    assert rg.adapter.violations == []


def test_a_refused_create_fails_only_that_command_and_feeds_its_deployment_breaker_not_the_cluster() -> None:
    # c1 has no workload for this deployment (the adapter answers NotFound): the tick goes on, the
    # instance is lost, and the deployment-on-c1 breaker (not c1's) counts the failure.
    rg = rig(
        setup(clusters=(("c1", "z1", 4), ("c2", "z2", 4)), min_replicas=1),
        fail=lambda cluster, cmd: NotFound("deployment", "chat on c1") if cluster == "c1" else None,
    )
    for k in range(3):
        now = T0 + k * TICK_MS
        rep = rg.loop.tick(now)  # never raises: one refused command does not fail the tick
        assert (rep.sent, rep.send_failures) == (0, 1)
        if k:
            assert rg.state.breakers[r.deployment_key("c1", "chat")] == BreakerRecord(failures=k)
            assert r.cluster_key("c1") not in rg.state.breakers
    now = T0 + 3 * TICK_MS
    rep = rg.loop.tick(now)  # the deployment's breaker on c1 opened: the replacement goes to c2
    assert rg.state.breakers[r.deployment_key("c1", "chat")].phase is BreakerPhase.OPEN
    assert (rep.sent, rep.send_failures) == (1, 0) and rg.adapter.actions()[-1] == ("create", f"chat-{now}-0", "c2")
    assert rg.loop._undelivered == {}  # a refusal is never re-sent


def test_a_stale_epoch_stops_sending_to_that_cluster_only() -> None:
    """A command refused as stale (the adapter learnt a higher epoch between this tick's fence and
    the send) fences that cluster out for the rest of the tick: its other commands are not tried
    and count as undelivered (they feed its breaker); another cluster's commands still go out."""
    def fail(cluster: ClusterId, cmd: AdapterCommand) -> Exception | None:
        return StaleEpoch(EPOCH, EPOCH + 1) if cluster == "c1" else None

    rg = rig(setup(clusters=(("c1", "z1", 8), ("c2", "z2", 8)), min_replicas=4), fail=fail)
    with capture_logs() as logs:
        rep = rg.loop.tick(T0)
    ids = [f"chat-{T0}-{k}" for k in range(4)]
    assert actionable(rep.plan) == [("create", i) for i in ids]
    on_c1 = [i for i in ids if rg.state.instances[InstanceId(i)].cluster == "c1"]
    on_c2 = [i for i in ids if rg.state.instances[InstanceId(i)].cluster == "c2"]
    assert len(on_c1) == 2 and len(on_c2) == 2
    # c1: the first command is refused as stale, the second is not even tried; c2 gets both.
    assert [(s.cluster, s.command.instance.id) for s in rg.adapter.sent] == (
        [("c1", on_c1[0]), ("c2", on_c2[0]), ("c2", on_c2[1])])
    assert (rep.sent, rep.send_failures) == (2, 2)
    assert rg.loop.statistics().stale_rejections == 1
    assert set(rg.loop.fenced_out) == {"c1"}
    f = rg.loop.fenced_out[ClusterId("c1")]
    assert (f.epoch, f.adapter_epoch, f.since_ms) == (EPOCH, EPOCH + 1, T0)
    errors = [e for e in logs if e["event"] == "adapter_stale_epoch"]
    assert [(e["cluster"], e["epoch"], e["adapter_epoch"], e["log_level"]) for e in errors] == [
        ("c1", EPOCH, EPOCH + 1, "error")]


@dataclass
class PerClusterFencing(RecordingAdapter):
    """Each cluster's adapter holds its own highest epoch (``ahead`` presets some)."""

    ahead: dict[str, int] = field(default_factory=dict)
    fences: list[tuple[ClusterId, Fence]] = field(default_factory=list)

    def fence(self, cluster_id: ClusterId, fence: Fence, now_ms: int) -> None:
        highest = self.ahead.get(cluster_id, 0)
        if fence.epoch < highest:
            raise StaleEpoch(fence.epoch, highest)
        self.fences.append((cluster_id, fence))


def test_one_poisoned_adapter_never_stalls_the_other_clusters() -> None:
    """The reproduced failure: one adapter holding an epoch above every real one (``2**63-1``) made
    every tick skip every cluster. Now that cluster alone is fenced out (condition, metric, one
    error line naming it and both epochs), the others are decided and commanded every tick, and the
    cluster is commanded again once its adapter accepts the epoch (an operator reset it)."""
    from controlplane.runtime.metrics import MetricsView, families

    r = rig(setup(clusters=(("c1", "z1", 8), ("c2", "z2", 8), ("c3", "z3", 8)), min_replicas=3))
    adapter = PerClusterFencing(r.replicator, ahead={"c2": 2**63 - 1})
    loop = ControlLoop(r.replicator, adapter, r.source, rng=random.Random(5), authority=lambda now: EPOCH, holder="n1")
    with capture_logs() as logs:
        for k in range(4):
            rep = loop.tick(T0 + k * TICK_MS)
            assert rep.acted
    assert {cid for cid, _ in adapter.fences} == {"c1", "c3"}
    assert "c2" not in {s.cluster for s in adapter.sent}
    assert {s.cluster for s in adapter.sent} >= {"c1", "c3"}  # the others were commanded
    assert set(loop.fenced_out) == {"c2"} and loop.stale_answers == {"c2": 4}
    errors = [e for e in logs if e["event"] == "adapter_stale_epoch"]
    assert len(errors) == 1 and (errors[0]["cluster"], errors[0]["epoch"], errors[0]["adapter_epoch"]) == (
        "c2", EPOCH, 2**63 - 1)  # raised once, not once per tick
    view = MetricsView("n1", "z1", True, 1, 1, 1, (), True, EPOCH, 1000, r.replicator.state,
                       fenced_clusters=frozenset(map(str, loop.fenced_out)), stale_answers=dict(loop.stale_answers))
    got = {(sm.name, tuple(sm.labels.values())): sm.value for fam in families(view) for sm in fam.samples}
    assert got[("controlplane_adapter_stale_epoch", ("c2",))] == 1.0
    assert got[("controlplane_adapter_stale_epoch", ("c1",))] == 0.0
    assert got[("controlplane_adapter_stale_epoch_answers_total", ("c2",))] == 4.0
    # Recovery: the operator reset c2's epoch file; the next tick's fence is accepted.
    adapter.ahead.clear()
    with capture_logs() as logs:
        loop.tick(T0 + 10 * TICK_MS)
    assert loop.fenced_out == {}
    assert [e["cluster"] for e in logs if e["event"] == "adapter_epoch_accepted"] == ["c2"]


def test_signed_fences_and_commands_carry_the_signature() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from controlplane.fencing import FenceSigner, FenceVerifier

    key = Ed25519PrivateKey.generate()
    signer = FenceSigner(key)
    r = rig(setup(min_replicas=2))
    adapter = PerClusterFencing(r.replicator)
    loop = ControlLoop(r.replicator, adapter, r.source, rng=random.Random(5), authority=lambda now: 11, holder="n2",
                       signer=signer)
    loop.tick(1_000)
    verifier = FenceVerifier([key.public_key()])
    tokens = [f for _, f in adapter.fences] + [s.fence for s in adapter.sent]
    assert len(tokens) == 3
    assert all(t.key_id == signer.key_id and verifier.problem(t.epoch, t.holder, t.key_id, t.signature) is None
               for t in tokens)
    assert verifier.problem(12, "n2", signer.key_id, tokens[0].signature) is not None  # bound to the epoch


def test_an_undeliverable_drain_is_delivered_once_the_cluster_is_back() -> None:
    outage = [True]
    rg = rig(
        setup(min_replicas=2),
        fail=lambda cluster, cmd: Unavailable("down") if outage[0] and cmd.action == "drain" else None,
    )
    a, b = f"chat-{T0}-0", f"chat-{T0}-1"
    rg.loop.tick(T0)
    rg.source.at(T0 + 1_000, reports=[report(i, ev, T0 + 500) for i in (a, b) for ev in (E.START_WARMUP, E.WARMED)])
    rg.loop.tick(T0 + 1_000)
    rg.commit(chat(1))
    rg.source.at(T0 + 2_000, samples=idle((a, b), T0 + 2_000))
    rep = rg.loop.tick(T0 + 2_000)
    (drained,) = [i for action, i in actionable(rep.plan) if action == "drain"]
    assert rep.send_failures == 1
    outage[0] = False

    # The cluster is reachable again; a delivered drain completes (DRAINED) by the next tick. Two
    # minutes (twice the scale-in grace) later the instance must be gone.
    for k in range(1, 25):
        now = T0 + 2_000 + 5_000 * k
        done = [s.command.instance.id for s in rg.adapter.sent if s.delivered and s.command.action == "drain"]
        rg.source.at(now, reports=[report(i, E.DRAINED, now - 1) for i in done if i in rg.state.instances])
        rg.loop.tick(now)
    assert drained not in rg.state.instances, rg.state.instances[drained]


# --- transition records: logs and metrics ---------------------------------------------------------


def test_each_transition_is_one_log_event_and_one_counter_increment() -> None:
    registry = CollectorRegistry()
    with capture_logs() as logs:
        recorder = TransitionRecorder(registry, structlog.get_logger("test"))
        rg = rig(setup(min_replicas=1, warm_pool=1), on_transitions=recorder.record)
        a, b = f"chat-{T0}-0", f"chat-{T0}-1"

        rg.loop.tick(T0)  # creates a and b (no transitions yet)
        rg.source.at(T0 + 1_000, reports=[report(a, E.START_WARMUP, T0 + 500), report(b, E.START_WARMUP, T0 + 500)])
        rg.loop.tick(T0 + 1_000)
        rg.source.at(T0 + 31_000, reports=[report(a, E.WARMED, T0 + 30_500), report(b, E.WARMED, T0 + 30_500)])
        rg.loop.tick(T0 + 31_000)  # ... and a, the surplus, is put to sleep
        rg.commit(chat(2, 1))
        rg.loop.tick(T0 + 40_000)  # a is woken (warm start); a cold start refills the pool
        rg.source.at(T0 + 41_500, reports=[report(a, E.WARMED, T0 + 41_000)])
        rg.loop.tick(T0 + 41_500)

    events = [e for e in logs if e["event"] == "instance_transition"]
    assert len(events) == len(logs) == recorder.count == len(rg.transitions) == 7
    fields = ("instance_id", "from", "to", "latency_ms", "init_method")
    assert [tuple(e[k] for k in fields) for e in events] == [
        (a, "Pending", "Warming", 500, "cold"),
        (b, "Pending", "Warming", 500, "cold"),
        (a, "Warming", "Ready", 30_000, "cold"),
        (b, "Warming", "Ready", 30_000, "cold"),
        (a, "Ready", "Standby", 500, "cold"),
        (a, "Standby", "Warming", 9_000, "warm"),
        (a, "Warming", "Ready", 1_000, "warm"),
    ]
    assert [(e["trigger"], e["at_ms"], e["log_level"]) for e in events][-2:] == [
        ("wake", T0 + 40_000, "info"), ("warmed", T0 + 41_000, "info"),
    ]

    def counted(src: str, dst: str, init: str) -> float | None:
        labels = {"from_state": src, "to_state": dst, "init_method": init}
        return registry.get_sample_value(f"{TRANSITIONS_METRIC}_total", labels)

    assert counted("Pending", "Warming", "cold") == 2
    assert counted("Warming", "Ready", "cold") == 2
    assert counted("Ready", "Standby", "cold") == 1
    assert counted("Standby", "Warming", "warm") == 1
    assert counted("Warming", "Ready", "warm") == 1
    assert counted("Warming", "Ready", "other") is None
    assert counted("Pending", "Terminated", "cold") is None


def test_the_recorder_uses_the_default_structlog_logger() -> None:
    registry = CollectorRegistry()
    with capture_logs() as logs:
        recorder = TransitionRecorder(registry)
        recorder.record([Transitioned(InstanceId("i1"), S.READY, S.DRAINING, E.DRAIN, 42, InitMethod.WARM, T0)])
    assert logs == [{
        "event": "instance_transition", "log_level": "info", "instance_id": "i1", "from": "Ready", "to": "Draining",
        "trigger": "drain", "latency_ms": 42, "init_method": "warm", "at_ms": T0,
    }]
    labels = {"from_state": "Ready", "to_state": "Draining", "init_method": "warm"}
    assert registry.get_sample_value(f"{TRANSITIONS_METRIC}_total", labels) == 1.0


@dataclass
class FencingAdapter(RecordingAdapter):
    """A RecordingAdapter that also takes bare fences and enforces the highest epoch, like
    adapters.service.FencingGuard."""

    fences: list[tuple[ClusterId, Fence]] = field(default_factory=list)
    highest: int = 0

    def fence(self, cluster_id: ClusterId, fence: Fence, now_ms: int) -> None:
        if fence.epoch < self.highest:
            raise StaleEpoch(fence.epoch, self.highest)
        self.highest = fence.epoch
        self.fences.append((cluster_id, fence))


def test_every_acting_tick_fences_every_adapter_before_sending() -> None:
    r = rig(setup(clusters=(("c1", "z1", 8), ("c2", "z2", 8)), min_replicas=2))
    adapter = FencingAdapter(r.replicator)
    loop = ControlLoop(r.replicator, adapter, r.source, rng=random.Random(5), authority=lambda now: 11, holder="n2")
    loop.tick(1_000)
    assert [(cid, f.epoch, f.holder) for cid, f in adapter.fences] == [("c1", 11, "n2"), ("c2", 11, "n2")]
    # Fences come first: their sequence numbers precede the commands'.
    assert max(f.seq for _, f in adapter.fences) < min(s.fence.seq for s in adapter.sent)
    assert all(s.fence.holder == "n2" for s in adapter.sent) and len(adapter.sent) == 2


def test_a_holder_whose_fence_is_refused_sends_that_adapter_nothing() -> None:
    """A newer holder fenced the only adapter: this holder sends it nothing. (Its commits are the
    replicated log's to refuse: ``RaftReplicator`` fences them with the lease, which a newer holder
    has taken; this in-memory replicator does not.)"""
    r = rig(setup(min_replicas=2))
    adapter = FencingAdapter(r.replicator, highest=12)  # a newer holder fenced this adapter already
    loop = ControlLoop(r.replicator, adapter, r.source, rng=random.Random(5), authority=lambda now: 11, holder="n1")
    report = loop.tick(1_000)
    assert adapter.sent == [] and adapter.fences == [] and report.sent == 0
    assert loop.statistics().stale_rejections == 1 and set(loop.fenced_out) == {"c1"}


def test_authority_is_checked_again_before_every_send() -> None:
    """A lease that lapses between the tick's check and its sends (a slow commit, a pause) stops
    the sends at once: only commands sent while the lease was still valid go out."""
    calls = {"n": 0}

    def authority(now_ms: int) -> int | None:
        calls["n"] += 1
        return EPOCH if calls["n"] <= 2 else None  # the tick's check and the first send only

    r = rig(setup(min_replicas=3), authority=authority)
    r.loop.tick(1_000)
    assert len(r.adapter.sent) == 1
    assert len([i for i in r.state.instances.values()]) == 3  # committed, not all sent


class ReplayingSource(ScriptedSource):
    """A source with a ring buffer: ``recent`` returns what the adapters sampled before this tick."""

    def __init__(self, history: list[Observations]) -> None:
        super().__init__()
        self.history = history
        self.asked: list[int] = []

    def recent(self, since_ms: int) -> list[Observations]:
        self.asked.append(since_ms)
        return [o for o in self.history if o.at_ms > since_ms]


def test_a_new_holder_rebuilds_its_filters_from_the_adapters_recent_samples() -> None:
    """Failover keeps the damping history: the first decision of a new holder sees the last 30 s."""
    r = rig(setup(min_replicas=1) + [c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 0),
                                     c.TransitionInstance(InstanceId("i1"), InstanceEvent.START_WARMUP, 1),
                                     c.TransitionInstance(InstanceId("i1"), InstanceEvent.WARMED, 2)])
    t0 = 100_000
    busy = [Observations(t, (InstanceSample(InstanceId("i1"), DeploymentId("chat"), t, 200, 40, 0.5, 0.0, 0.0),))
            for t in range(t0 - 20_000, t0, 250)]
    for source, expect_replay in ((ReplayingSource(busy), True), (ScriptedSource(), False)):
        loop = ControlLoop(r.replicator, RecordingAdapter(r.replicator), source, rng=random.Random(5),
                           authority=lambda now: 9)
        loop.tick(t0)
        sig = loop.last_signals[DeploymentId("chat")]
        if expect_replay:
            assert source.asked == [t0 - REPORT_REPLAY_MS]  # reports: 2 min; samples: the 30 s stable window
            assert loop.statistics().replayed_epochs == 1
            # 80 replayed samples of 240 in flight; this tick brought no sample of the serving i1, so
            # its load is unknown now and not fed as a 0.
            assert sig is not None and sig.stable["concurrency"] == pytest.approx(240.0)
            assert sig.unknown == frozenset(LOAD_SIGNALS)
        else:
            assert sig is not None and sig.stable == {}  # nothing to rebuild from,
            assert sig.unknown == frozenset(LOAD_SIGNALS)  # and this tick's load is unknown


def test_a_new_holder_commits_the_lifecycle_reports_its_predecessor_did_not() -> None:
    """A follower drops the reports it gathers; a holder that died before committing a ``warmed``
    would strand the instance in Warming. The new holder replays the adapters' recent reports: the
    missing one moves the instance, reports older than its current state change nothing."""
    r = rig(setup(min_replicas=1) + [c.CreateInstance(InstanceId("i1"), DeploymentId("chat"), ClusterId("c1"), 0),
                                     c.TransitionInstance(InstanceId("i1"), InstanceEvent.START_WARMUP, 1_000)])
    t0 = 100_000
    history = [
        Observations(500, reports=(report("i1", InstanceEvent.START_WARMUP, 500),)),  # committed already
        Observations(900, reports=(report("i1", InstanceEvent.WARMUP_FAILED, 900),)),  # older than Warming: stale
        Observations(60_000, reports=(report("i1", InstanceEvent.WARMED, 60_000),)),  # never committed
    ]
    loop = ControlLoop(r.replicator, RecordingAdapter(r.replicator), ReplayingSource(history), rng=random.Random(5),
                       authority=lambda now: 9)
    loop.tick(t0)
    inst = r.state.instances[InstanceId("i1")]
    assert inst.state is S.READY and inst.state_since_ms == 60_000
    assert [(t.event, t.latency_ms) for t in r.transitions if t.instance_id == "i1"] == [(InstanceEvent.WARMED, 59_000)]
    loop.tick(t0 + 250)  # the replay happens once per epoch
    assert r.state.instances[InstanceId("i1")].state is S.READY


# --- live decisions -------------------------------------------------------------------------------


def test_an_acting_tick_records_a_live_decision_per_deployment_and_a_passive_one_clears_them() -> None:
    holding = {"now": True}
    rg = rig(setup(min_replicas=1), authority=lambda now_ms: EPOCH if holding["now"] else None)
    rg.commit(c.CreateInstance(InstanceId("r1"), DeploymentId("chat"), ClusterId("c1"), T0 - 9_000))
    rg.commit(c.TransitionInstance(InstanceId("r1"), E.START_WARMUP, T0 - 8_000),
              c.TransitionInstance(InstanceId("r1"), E.WARMED, T0 - 7_000))
    busy = InstanceSample(InstanceId("r1"), DeploymentId("chat"), T0, 60, 12, 0.5, 1_000.0, 5_000.0)
    rg.source.at(T0, samples=[busy])

    rep = rg.loop.tick(T0)
    assert rep.acted and rep.plan is not None
    live = rg.loop.live_decisions[DeploymentId("chat")]
    (dec,) = [d for _, d in rep.plan.decisions]
    assert (live.at_ms, live.current, live.target, live.granted) == (T0, 1, dec.target, dec.target)
    assert dec.target == 3  # 72 requests at 24 per replica
    assert (live.reason, live.message, live.panic) == (dec.reason.value, dec.message, dec.panic)
    assert live.proposals == dict(dec.proposals)
    assert live.signals["concurrency"] == 72.0 and live.signals["serving"] == 1.0
    assert rg.loop.signals_of(DeploymentId("chat")) is rg.loop.last_signals["chat"]
    assert rg.loop.signals_of(DeploymentId("nope")) is None
    # The committed decision carries the same message.
    assert rg.state.desired["chat"].replicas == 3

    before = rg.loop.live_decisions
    holding["now"] = False
    rg.loop.tick(T0 + TICK_MS)
    assert rg.loop.live_decisions == {} and before[DeploymentId("chat")] is live  # replaced, never mutated


# --- instances no longer reported by a delivering adapter -------------------------------------------


class FleetSource:
    """ObservationSource over a live fleet: each gather samples the instances in ``alive`` (one
    batch per tick, like an adapter every 250 ms). With ``connected`` (cluster -> stream up), like
    ``adapters.client.RemoteObservations``."""

    def __init__(self, alive: set[str], connected: dict[str, bool] | None = None,
                 observe_failing: dict[str, bool] | None = None) -> None:
        self.alive = alive
        if connected is not None:
            self.connected = connected
        if observe_failing is not None:
            self.observe_failing = observe_failing

    def gather(self, now_ms: int) -> Observations:
        return Observations(now_ms, tuple(
            InstanceSample(InstanceId(i), DeploymentId("chat"), now_ms, 0, 0, 0.0, 0.0, 0.0) for i in sorted(self.alive)))


@dataclass
class ReachableAdapter(RecordingAdapter):
    """Takes bare fences while ``up`` (else Unavailable), like an adapter process that is running or not."""

    up: bool = True

    def fence(self, cluster_id: ClusterId, fence: Fence, now_ms: int) -> None:
        if not self.up:
            raise Unavailable(f"{cluster_id} unreachable")


def serving_rig(ids: Sequence[str], source: FleetSource, *, adapter_up: bool | None = None,
                authority: Callable[[int], int | None] = lambda now_ms: EPOCH) -> tuple[Rig, ControlLoop]:
    """Ready instances ``ids`` on c1 (warmed at T0 - 30 s); a loop over ``source``; with
    ``adapter_up`` set, an adapter that takes fences while that flag (``adapter.up``) says so."""
    rg = rig(setup(min_replicas=len(ids)))
    for iid in ids:
        rg.commit(c.CreateInstance(InstanceId(iid), DeploymentId("chat"), ClusterId("c1"), T0 - 60_000),
                  c.TransitionInstance(InstanceId(iid), E.START_WARMUP, T0 - 59_000),
                  c.TransitionInstance(InstanceId(iid), E.WARMED, T0 - 30_000))
    adapter = RecordingAdapter(rg.replicator) if adapter_up is None else ReachableAdapter(rg.replicator, up=adapter_up)
    loop = ControlLoop(rg.replicator, adapter, source, rng=random.Random(5), authority=authority)
    rg.adapter = adapter
    return rg, loop


def run_ticks(loop: ControlLoop, start_ms: int, end_ms: int) -> None:
    for now in range(start_ms, end_ms + 1, TICK_MS):
        loop.tick(now)


LOST_MS = r.UNREPORTED_LOST_MS


def test_a_serving_instance_its_adapter_stops_naming_is_lost_after_the_bound_and_replaced() -> None:
    source = FleetSource({"r1", "r2"})
    rg, loop = serving_rig(["r1", "r2"], source)
    run_ticks(loop, T0, T0 + 5_000)
    source.alive.discard("r1")  # r1's engine died with nobody to report it; r2's batches keep coming
    gone_at = T0 + 5_000  # the last batch that named r1
    with capture_logs() as logs:
        run_ticks(loop, gone_at + TICK_MS, gone_at + LOST_MS)
        assert rg.state.instances[InstanceId("r1")].state is S.READY  # not before the bound
        assert logs == []
        loop.tick(gone_at + LOST_MS + TICK_MS)
    assert InstanceId("r1") not in rg.state.instances  # Failed, GPUs released
    lost = [t for t in rg.transitions if t.instance_id == "r1"][-1]
    assert (lost.from_state, lost.to_state, lost.event, lost.at_ms) == (S.READY, S.FAILED, E.LOST, gone_at + LOST_MS + TICK_MS)
    assert rg.state.breakers[r.cluster_key("c1")].failures == 1  # as a ``lost`` report would
    (event,) = [e for e in logs if e["event"] == "instance_unreported"]
    assert event["instance"] == "r1" and event["unreported_ms"] == LOST_MS + TICK_MS
    assert event["reason"].startswith(f"no longer reported by its adapter for {LOST_MS + TICK_MS} ms")
    # The plan of the same tick replaces it (min_replicas 2); r2 was never in doubt.
    assert [a for a, _, _ in rg.adapter.actions()] == ["create"]
    assert rg.state.instances[InstanceId("r2")].state is S.READY


def test_a_sample_before_the_bound_resets_the_unreported_clock() -> None:
    source = FleetSource({"r1", "r2"})
    rg, loop = serving_rig(["r1", "r2"], source)
    t = T0
    for _ in range(3):  # three gaps just under the bound, each ended by one batch naming r1
        source.alive.discard("r1")
        run_ticks(loop, t, t + LOST_MS - TICK_MS)
        t += LOST_MS
        source.alive.add("r1")
        loop.tick(t)
        t += TICK_MS
    assert rg.state.instances[InstanceId("r1")].state is S.READY
    assert [x for x in rg.transitions if x.event is E.LOST] == []


def test_instances_of_a_silent_or_unreachable_adapter_are_never_declared_lost_and_its_return_restarts_the_clock() -> None:
    connected = {"c1": False}
    source = FleetSource(set(), connected)  # the adapter process is down: no batches, no fences
    rg, loop = serving_rig(["r1", "r2"], source, adapter_up=False)
    run_ticks(loop, T0, T0 + 60_000)
    assert {i.state for i in rg.state.instances.values()} == {S.READY}  # a partition is not a death
    # The adapter is back (restarted: its engines died with it) and delivers empty batches.
    assert isinstance(rg.adapter, ReachableAdapter)
    rg.adapter.up, connected["c1"] = True, True
    back = T0 + 60_000 + TICK_MS
    run_ticks(loop, back, back + LOST_MS)
    assert {i.state for i in rg.state.instances.values()} == {S.READY}  # the clock started at its return
    loop.tick(back + LOST_MS + TICK_MS)
    assert not ({InstanceId("r1"), InstanceId("r2")} & set(rg.state.instances))
    assert [(t.instance_id, t.event) for t in rg.transitions if t.event is E.LOST] == [("r1", E.LOST), ("r2", E.LOST)]


def test_an_answering_adapter_without_an_open_stream_or_a_source_without_stream_state_is_not_delivering() -> None:
    for connected in ({"c1": False}, None):  # fences answered, but no stream / no way to know
        rg, loop = serving_rig(["r1"], FleetSource(set(), connected), adapter_up=True)
        run_ticks(loop, T0, T0 + 3 * LOST_MS)
        assert rg.state.instances[InstanceId("r1")].state is S.READY


def test_empty_batches_from_a_backend_that_cannot_observe_never_declare_instances_lost() -> None:
    # The Kubernetes API is down: the adapter answers fences, its stream is up, and every batch is
    # empty but marked observe_failed. Its instances may be serving fine: nothing is declared lost.
    failing = {"c1": True}
    rg, loop = serving_rig(["r1", "r2"], FleetSource(set(), {"c1": True}, failing), adapter_up=True)
    run_ticks(loop, T0, T0 + 3 * LOST_MS)
    assert {i.state for i in rg.state.instances.values()} == {S.READY}
    failing["c1"] = False  # observing again, and the cluster really is empty now
    back = T0 + 3 * LOST_MS + TICK_MS
    run_ticks(loop, back, back + LOST_MS + TICK_MS)
    assert [(t.instance_id, t.event) for t in rg.transitions if t.event is E.LOST] == [("r1", E.LOST), ("r2", E.LOST)]


def test_a_new_holder_starts_its_unreported_clocks_at_its_own_first_batch() -> None:
    epoch = {"now": EPOCH}
    source = FleetSource({"r1", "r2"})
    rg, loop = serving_rig(["r1", "r2"], source, authority=lambda now_ms: epoch["now"])
    run_ticks(loop, T0, T0 + 1_000)
    source.alive.discard("r1")
    run_ticks(loop, T0 + 1_250, T0 + 9_000)  # unnamed for 8 s under epoch 7
    epoch["now"] = EPOCH + 1  # this node lost the lease and won it again: a new term, fresh clocks
    run_ticks(loop, T0 + 9_250, T0 + 9_250 + LOST_MS)
    assert rg.state.instances[InstanceId("r1")].state is S.READY  # not lost at 10 s since its last batch
    loop.tick(T0 + 9_250 + LOST_MS + TICK_MS)
    assert InstanceId("r1") not in rg.state.instances  # 10 s after the new term's first batch
    # A brand-new holder (another coordinator's loop) likewise waits the bound from its first tick.
    source2 = FleetSource({"r2"})
    rg2, loop2 = serving_rig(["r1", "r2"], source2)
    run_ticks(loop2, T0, T0 + LOST_MS)
    assert rg2.state.instances[InstanceId("r1")].state is S.READY
    loop2.tick(T0 + LOST_MS + TICK_MS)
    assert InstanceId("r1") not in rg2.state.instances


def test_standby_and_warming_instances_are_not_declared_lost_for_being_unsampled() -> None:
    source = FleetSource({"r1"})
    rg, loop = serving_rig(["r1"], source)
    rg.commit(c.CreateInstance(InstanceId("w1"), DeploymentId("chat"), ClusterId("c1"), T0),
              c.TransitionInstance(InstanceId("w1"), E.START_WARMUP, T0 + 1),
              c.CreateInstance(InstanceId("s1"), DeploymentId("chat"), ClusterId("c1"), T0 - 60_000),
              c.TransitionInstance(InstanceId("s1"), E.START_WARMUP, T0 - 59_000),
              c.TransitionInstance(InstanceId("s1"), E.WARMED, T0 - 58_000),
              c.TransitionInstance(InstanceId("s1"), E.SLEEP, T0 - 57_000))
    rg.commit(chat(2, warm_pool=1))  # r1 and w1 wanted, s1 kept asleep
    run_ticks(loop, T0, T0 + 3 * LOST_MS)
    assert rg.state.instances[InstanceId("w1")].state is S.WARMING
    assert rg.state.instances[InstanceId("s1")].state is S.STANDBY
    assert [t for t in rg.transitions if t.event is E.LOST] == []


# --- a lease that lapses and comes back with the same epoch ---------------------------------------
# (docs/reliability.md, "Convergence failures beside CPU burners": on a starved machine a holder's
# renewal comes late, or Raft steps it down and re-elects it, and it adopts its own lease again: the
# epoch does not change, so no replay of the adapters' ring buffers happens.)


class Switch:
    """authority(): EPOCH while ``on``; ``off_after`` calls from now on it turns off by itself."""

    def __init__(self) -> None:
        self.on = True
        self.off_after: int | None = None

    def __call__(self, now_ms: int) -> int | None:
        if self.off_after is not None:
            if self.off_after <= 0:
                self.on, self.off_after = False, None
            else:
                self.off_after -= 1
        return EPOCH if self.on else None


def test_reports_gathered_while_the_lease_lapsed_are_committed_when_the_same_epoch_acts_again() -> None:
    auth = Switch()
    rg = rig(setup(min_replicas=2), authority=auth)
    a, b = f"chat-{T0}-0", f"chat-{T0}-1"
    rg.loop.tick(T0)  # two creates, sent
    rg.source.at(T0 + 1_000, reports=[report(i, ev, T0 + 500) for i in (a, b) for ev in (E.START_WARMUP, E.WARMED)])
    rg.loop.tick(T0 + 1_000)
    rg.commit(chat(1))
    rg.source.at(T0 + 2_000, samples=idle((a, b), T0 + 2_000))
    rep = rg.loop.tick(T0 + 2_000)
    (victim,) = [i for action, i in actionable(rep.plan) if action == "drain"]
    assert rg.state.instances[victim].state is S.DRAINING

    # The lease lapses; the adapter's "drained" arrives in that gap (the gather consumes it).
    auth.on = False
    rg.source.at(T0 + 2_250, reports=[report(victim, E.DRAINED, T0 + 2_100)])
    assert not rg.loop.tick(T0 + 2_250).acted
    # Back, same epoch: no new-epoch replay, yet the report is not lost.
    auth.on = True
    rep = rg.loop.tick(T0 + 2_500)
    assert rep.acted and rep.facts >= 1
    assert victim not in rg.state.instances  # Terminated (it leaves the state)
    assert [t.to_state for t in rg.transitions if t.instance_id == victim][-1] is S.TERMINATED
    assert rg.loop.statistics().replayed_epochs == 0


def test_held_reports_are_bounded_by_age() -> None:
    auth = Switch()
    auth.on = False
    rg = rig(setup(min_replicas=1), authority=auth)
    for k in range(3):
        rg.source.at(T0 + k * TICK_MS, reports=[report(f"x{k}", E.LOST, T0 + k * TICK_MS)])
        rg.loop.tick(T0 + k * TICK_MS)
    later = T0 + REPORT_REPLAY_MS + 1_000
    rg.loop.tick(later)
    assert rg.loop._held_reports == []  # all older than the replay horizon


def test_commands_a_lapsed_lease_kept_from_being_sent_are_sent_when_this_node_acts_again() -> None:
    """Three creates committed; the lease lapses after the first is sent. The other two reached no
    adapter: they are sent (same request ids) when the node acts again, nothing is declared lost and
    no breaker counts a failure. One of them, meanwhile declared lost, is not sent."""
    auth = Switch()
    auth.off_after = 2  # the tick's check and the first send
    rg = rig(setup(min_replicas=3), authority=auth)
    rg.loop.tick(T0)
    assert len(rg.adapter.sent) == 1
    first = rg.adapter.sent[0].command.instance.id
    pending = sorted(i for i in rg.state.instances if i != first)
    assert len(pending) == 2
    assert not rg.loop.tick(T0 + TICK_MS).acted
    rg.commit(c.TransitionInstance(InstanceId(pending[0]), E.LOST, T0 + 300))  # meanwhile (another holder)

    auth.on = True
    rg.loop.tick(T0 + 2 * TICK_MS)
    later = [s.command for s in rg.adapter.sent[1:]]
    assert later[0].action == "create" and later[0].instance.id == pending[1]
    assert later[0].request_id == f"e{EPOCH}-r3"  # the request id it was given when committed
    assert pending[0] not in [cmd.instance.id for cmd in later]  # lost meanwhile: not started
    assert rg.state.instances[pending[1]].state is S.PENDING  # not declared lost
    assert all(rec.failures == 0 for rec in rg.state.breakers.values())
    assert rg.adapter.violations == []
    rg.loop.tick(T0 + 3 * TICK_MS)  # delivered: never sent again
    assert [s.command.instance.id for s in rg.adapter.sent].count(pending[1]) == 1


@dataclass
class FlakyReplicator:
    """A LocalReplicator whose next ``fail`` commits raise CommitTimeout (nothing applied)."""

    inner: LocalReplicator
    fail: int = 0

    @property
    def state(self) -> ControlState:
        return self.inner.state

    def commit(self, commands: Sequence[c.Command], now_ms: int):
        if self.fail > 0:
            self.fail -= 1
            raise CommitTimeout("commit timed out")
        return self.inner.commit(commands, now_ms)


def test_reports_and_send_failures_of_a_tick_whose_facts_did_not_commit_are_used_by_the_next() -> None:
    """A facts commit that times out (TemporaryError: the coordinator skips the tick) must not consume
    the reports and send failures it was made of: the next tick commits them."""
    def fail(cluster: ClusterId, cmd: AdapterCommand) -> Exception | None:
        return Unavailable("down") if cmd.instance.id.endswith("-1") else None

    rg = rig(setup(min_replicas=2), fail=fail)
    flaky = FlakyReplicator(rg.replicator)
    loop = ControlLoop(flaky, rg.adapter, rg.source, rng=random.Random(5),  # type: ignore[arg-type]
                       authority=lambda now_ms: EPOCH)
    a, b = f"chat-{T0}-0", f"chat-{T0}-1"
    loop.tick(T0)  # a sent; b's create fails (it must become lost and be replaced)
    assert rg.state.instances[b].state is S.PENDING
    rg.source.at(T0 + 1_000, reports=[report(a, ev, T0 + 500) for ev in (E.START_WARMUP, E.WARMED)])
    flaky.fail = 1
    with pytest.raises(CommitTimeout):
        loop.tick(T0 + 1_000)
    assert rg.state.instances[a].state is S.PENDING and rg.state.instances[b].state is S.PENDING
    loop.tick(T0 + 1_250)
    assert rg.state.instances[a].state is S.READY
    assert b not in rg.state.instances  # lost (terminal states leave the state) ...
    assert [t.to_state for t in rg.transitions if t.instance_id == b] == [S.FAILED]
    assert sum(1 for i in rg.state.instances.values() if i.state is S.PENDING) == 1  # ... and replaced
