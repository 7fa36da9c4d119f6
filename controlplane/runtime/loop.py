"""The control loop: gather -> decide -> commit -> act, one tick at a time.

The loop owns only soft state (signal filters, undelivered-command failures, and on the lease
holder when each instance was last named by its adapter); everything a new leader needs is in the
replicated state behind the :class:`~controlplane.ports.Replicator`. Each tick:

1. **gather** observations from the adapters (samples, lifecycle reports, gateway queues);
2. commit the **facts** they imply (instance transitions, breaker updates);
3. **decide** (:func:`controlplane.core.reconcile.plan`) from the replicated state and filtered signals;
4. **commit** the plan as one log entry;
5. **act**: send each *committed* instance command to its cluster's adapter with a fencing token.
   Undeliverable commands are remembered and fed to the breakers on the next tick.

The loop acts only while ``authority(now_ms)`` returns an epoch (the lease holder's fencing epoch);
otherwise it gathers and filters but neither commits nor sends.

Other threads (the API server) may read :attr:`ControlLoop.live_decisions` and
:meth:`ControlLoop.signals_of`: both dicts are built anew each tick and replaced by one assignment,
never mutated after, so a reader sees one tick's complete view.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from controlplane.core import breaker, gpu_memory, reconcile, signals
from controlplane.core.reconcile import LiveDecision
from controlplane.domain import commands as c
from controlplane.domain.errors import ControlPlaneError, StaleEpoch, TemporaryError
from controlplane.domain.ids import ClusterId, DeploymentId, InstanceId
from controlplane.domain.instances import SERVING_STATES, Instance, InstanceEvent, InstanceState
from controlplane.domain.observations import (
    InstanceReport,
    InstanceSample,
    Observations,
)
from controlplane.domain.demand import Forecast
from controlplane.domain.state import ApplyResult, ControlState
from controlplane.forecast.recorder import DemandRecorder
from controlplane.forecast.service import Forecaster
from controlplane.ports import (
    AdapterCommand,
    ClusterAdapter,
    Fence,
    FenceIssuer,
    ObservationSource,
    Replicator,
)

ACTION_OF_EVENT = {
    InstanceEvent.WAKE: "wake",
    InstanceEvent.SLEEP: "sleep",
    InstanceEvent.DRAIN: "drain",
    InstanceEvent.CANCEL: "cancel",
}
MAX_PENDING_FAILURES = 10_000
"""Bound on remembered undelivered commands (further ones are not remembered)."""
RETRY_WINDOW_MS = 600_000
"""An undelivered sleep/drain/cancel is re-sent (same request id) for at most this long."""
REPORT_REPLAY_MS = 120_000
"""How far back a new holder reads the adapters' lifecycle reports (their ring buffers keep ~2 min)."""
log = structlog.get_logger("controlplane.loop")
__all__ = ["ACTION_OF_EVENT", "ControlLoop", "FencedOut", "LiveDecision", "LoopStatistics", "TickReport"]

RETRIED_ACTIONS = ("sleep", "drain", "cancel")
"""Actions re-sent until delivered. A failed create or wake is not: ``facts`` declares the
instance lost instead, and the plan replaces it."""
MAX_HELD_REPORTS = 10_000
"""Bound on lifecycle reports kept from ticks in which this loop did not act (oldest dropped first)."""


@dataclass(frozen=True, slots=True)
class TickReport:
    at_ms: int
    acted: bool
    plan: reconcile.Plan | None
    facts: int
    sent: int
    send_failures: int


@dataclass(frozen=True, slots=True)
class FencedOut:
    """A cluster whose adapter answered this holder's fence with a higher epoch."""

    cluster_id: ClusterId
    epoch: int
    """The epoch this holder sent."""
    adapter_epoch: int
    """The higher one the adapter holds."""
    since_ms: int


@dataclass(frozen=True, slots=True)
class LoopStatistics:
    ticks: int
    commits: int
    commands_sent: int
    send_failures: int
    stale_rejections: int
    replayed_epochs: int
    """Epochs for which the filters were rebuilt from the adapters' recent samples."""


class ControlLoop:
    def __init__(
        self,
        replicator: Replicator,
        adapter: ClusterAdapter,
        source: ObservationSource,
        *,
        rng: random.Random,
        authority: Callable[[int], int | None] = lambda now_ms: 1,
        config: reconcile.ReconcileConfig | None = None,
        holder: str = "",
        act_delay_s: float = 0.0,
        signer: FenceIssuer | None = None,
        forecaster: Forecaster | None = None,
    ) -> None:
        """``forecaster``: demand forecasts for the decisions (docs/forecasting.md); with one, this
        loop also records the replicated demand history they learn from. None: reactive only."""
        self._forecaster = forecaster
        self._recorder = DemandRecorder() if forecaster is not None else None
        self._holder = holder
        self._signer = signer
        """Signs (epoch, holder) with the coordinators' fence key; None: unsigned (dev adapters only)."""
        self.fenced_out: dict[ClusterId, FencedOut] = {}
        """Clusters whose adapter holds a higher epoch than this holder's: nothing is sent to them
        (their bare fence is still sent every tick, so a reset adapter is commanded again). Replaced
        whole on every change, never mutated, so another thread reads a consistent view."""
        self._act_delay_s = act_delay_s
        """Fault injection for process tests: a pause between the lease check and the first fence."""
        self._replicator = replicator
        self._adapter = adapter
        self._source = source
        self._rng = rng
        self._authority = authority
        self._cfg = config or reconcile.ReconcileConfig()
        self._filters: dict[DeploymentId, signals.SignalMemory] = {}
        self._failures: list[reconcile.SendFailure] = []
        self._undelivered: dict[str, tuple[AdapterCommand, int]] = {}
        """request id -> (command, first failure ms): re-sent while its cluster's breaker allows."""
        self._seq = 0
        """Fence sequence: every fence and command sent gets the next one."""
        self._requests = 0
        """Request-id counter: never reused, even for commands built but not sent."""
        self._stats = {
            "ticks": 0, "commits": 0, "commands_sent": 0, "send_failures": 0, "stale_rejections": 0, "replayed_epochs": 0,
        }
        self.stale_answers: dict[ClusterId, int] = {}
        """Cluster -> stale-epoch answers its adapter gave this loop (the metric's counter)."""
        self._epoch_seen: int | None = None
        self._replayed_reports: list[InstanceReport] = []
        self._held_reports: list[InstanceReport] = []
        """Lifecycle reports gathered in ticks where this loop did not act (at most
        ``REPORT_REPLAY_MS`` old, ``MAX_HELD_REPORTS``): handed to the next acting tick's ``facts``.
        The gather consumes them, and the adapters' ring buffers are replayed only at a new epoch, so
        a holder whose authority lapsed and came back with the *same* epoch (a renewal that came
        late on a starved machine, a Raft step-down and re-election that adopts its own lease)
        would otherwise lose every report of the gap for good: a ``drained`` left the instance
        Draining, a ``start_warmup`` left it Pending (docs/reliability.md, "Convergence failures
        beside CPU burners")."""
        self._seen: dict[InstanceId, int] = {}
        """Instance -> latest batch (its time) that named it by a sample or a report. Soft, kept by
        the lease holder only, and started afresh at each new epoch (``reconcile.unreported``)."""
        self._delivery: dict[ClusterId, reconcile.Delivery] = {}
        """Cluster -> its adapter's current run of batches, as this holder has seen it."""
        self.last_signals: dict[DeploymentId, signals.FilteredSignals | None] = {}
        """The filtered signals of the latest tick (replaced whole each tick)."""
        self._memory_notes: tuple[str, ...] = ()
        """The latest tick's notes on placements the GPU memory limited (logged when they change)."""
        self.live_decisions: dict[DeploymentId, LiveDecision] = {}
        """The latest acting tick's evaluation per deployment; empty while this loop does not act
        (replaced whole each tick)."""

    def statistics(self) -> LoopStatistics:
        return LoopStatistics(**self._stats)

    def signals_of(self, deployment_id: DeploymentId) -> signals.FilteredSignals | None:
        """The latest filtered signals of a deployment (None: unknown deployment or no data yet).
        Safe to call from another thread."""
        return self.last_signals.get(deployment_id)

    def adapter_links(self, now_ms: int) -> dict[ClusterId, tuple[bool, int]]:
        """Per cluster whose adapter this loop has heard from: (delivering now, since when: the
        start of the current run of batches, else the latest batch). Safe to call from another
        thread (a copy of the mapping is read; its values are frozen)."""
        fresh = self._cfg.adapter_fresh_ms
        out = {}
        for cid, d in dict(self._delivery).items():
            connected = now_ms - d.last_ms <= fresh
            out[cid] = (connected, d.since_ms if connected else d.last_ms)
        return out

    def tick(self, now_ms: int) -> TickReport:
        self._stats["ticks"] += 1
        epoch = self._authority(now_ms)
        if epoch is not None and self._act_delay_s > 0:
            time.sleep(self._act_delay_s)  # fault injection only (0 in production)
        answered: list[ClusterId] = []
        if epoch is not None and not self._fence(epoch, now_ms, answered):
            epoch = None  # a newer epoch exists somewhere: do not act
        if epoch is not None and epoch != self._epoch_seen:
            self._epoch_seen = epoch
            self._seen, self._delivery = {}, {}  # a new holder's "last seen" clocks start now
            self._replay_recent(now_ms)
        obs = self._source.gather(now_ms)  # gather (after fencing: the state read is post-fence)
        if epoch is not None:
            self._track(self._replicator.state, obs, answered, now_ms)  # before the replayed reports join
        if self._replayed_reports:
            obs = dataclasses.replace(obs, reports=tuple(self._replayed_reports) + obs.reports)
            self._replayed_reports = []
        if epoch is None:
            self._hold(obs.reports, now_ms)
        elif self._held_reports:
            held, self._held_reports = self._held_reports, []
            fresh = [rep for rep in held if rep.at_ms >= now_ms - REPORT_REPLAY_MS]
            merged = sorted(fresh + list(obs.reports), key=lambda rep: rep.at_ms)
            obs = dataclasses.replace(obs, reports=tuple(merged))
        state = self._replicator.state
        filtered, loads = self._filter(state, obs, now_ms)
        if epoch is None:
            self.live_decisions = {}
            if self.fenced_out:
                self.fenced_out = {}  # not acting: this node commands no adapter at all
            return TickReport(now_ms, False, None, 0, 0, 0)
        facts = reconcile.facts(state, obs, self._failures, now_ms, self._cfg, self._rng,
                                seen=self._seen, delivery=self._delivery)
        failures, self._failures = self._failures, []
        if any(isinstance(f, c.TransitionInstance) and f.event is InstanceEvent.LOST and f.at_ms == now_ms for f in facts):
            self._log_unreported(state, facts, now_ms)
        try:
            self._commit(facts, now_ms)
        except TemporaryError:
            # Not committed (a commit timeout on a loaded machine, leadership lost): what the facts
            # were made of must not be consumed with them, or a ``drained``, a ``start_warmup`` or a
            # failed create (whose instance then waits out ``pending_timeout_ms``) is lost for good.
            # An unknown outcome that did commit is harmless: replayed reports older than the state
            # and transitions it no longer allows change nothing.
            self._hold(obs.reports, now_ms)
            self._failures = (failures + self._failures)[:MAX_PENDING_FAILURES]
            raise
        state = self._replicator.state  # a replicated state may be a copy: read it again
        forecasts = self._forecasts(state, now_ms)
        gpu = gpu_memory.fresh_reports(obs.gpu_memory, now_ms)  # soft state, like the forecasts
        plan = reconcile.plan(state, filtered, loads, now_ms, self._cfg, forecasts, gpu)  # decide
        self._log_memory_notes(plan)
        self.live_decisions = reconcile.live_decisions(plan, state, filtered, now_ms)  # before the commit
        before = {cmd.instance_id: state.instances.get(cmd.instance_id) for cmd in plan.commands
                  if isinstance(cmd, c.TransitionInstance)}
        committed = plan.commands
        if self._recorder is not None:
            closed = self._recorder.observe(plan.decisions, now_ms)
            if closed is not None:
                committed = committed + (closed,)  # last: the adapter commands zip with plan.commands
        result = self._commit(committed, now_ms)  # commit, then act
        outgoing = self._retries(state, now_ms) + self._adapter_commands(plan.commands, result, before, epoch)
        sent, failed = self._send(outgoing, epoch, now_ms)
        return TickReport(now_ms, True, plan, len(facts), sent, failed)

    def _forecasts(self, state: ControlState, now_ms: int) -> Mapping[DeploymentId, Forecast] | None:
        """This tick's forecasts (None without a forecaster). A forecaster that raises costs this
        tick its forecasts, never the tick: the decisions are then reactive."""
        if self._forecaster is None:
            return None
        try:
            return self._forecaster.forecasts(state, now_ms)
        except Exception as exc:
            log.warning("forecast_failed", error=f"{type(exc).__name__}: {exc}")
            return None

    def _log_memory_notes(self, plan: reconcile.Plan) -> None:
        """Log the placements the reported GPU memory limited, once per change (not every tick)."""
        notes = tuple(n for n in plan.notes if "GPU memory" in n)
        if notes != self._memory_notes:
            self._memory_notes = notes
            for note in notes:
                log.info("placement_gpu_memory", note=note)

    def _hold(self, reports: Sequence[InstanceReport], now_ms: int) -> None:
        """Keep the reports of a tick that does not act (or whose facts did not commit) for the next
        one that does (bounded)."""
        if not reports and not self._held_reports:
            return
        horizon = now_ms - REPORT_REPLAY_MS
        held = [rep for rep in self._held_reports if rep.at_ms >= horizon] + list(reports)
        self._held_reports = held[-MAX_HELD_REPORTS:]

    def _replay_recent(self, now_ms: int) -> None:
        """A new holder rebuilds its signal filters from the adapters' recent samples (their ring
        buffers), so that a failover keeps the damping history. Followers that gathered all along
        already have it: ``signals.update`` ignores samples older than what a filter holds.

        The lifecycle reports of that window are handed to this tick's ``facts`` too: a follower
        drops the reports it gathers, and the previous holder may have died before committing them
        (a ``warmed`` lost that way would strand an instance in Warming). ``facts`` ignores reports
        older than the instance's current state and transitions the table does not allow, so the
        ones already committed change nothing."""
        recent = getattr(self._source, "recent", None)
        if recent is None:
            return
        window = max((d.policy.stable_window_ms for d in self._replicator.state.deployments.values()), default=0)
        state = self._replicator.state
        horizon = max(window, REPORT_REPLAY_MS)
        for obs in recent(now_ms - horizon):
            if obs.at_ms >= now_ms - window:
                self._filter(state, obs, obs.at_ms)
            self._replayed_reports.extend(obs.reports)
        self._stats["replayed_epochs"] += 1

    def _track(self, state: ControlState, obs: Observations, answered: Sequence[ClusterId], now_ms: int) -> None:
        """Record which instances this gather names and which clusters' adapters are delivering.

        A sample or report naming an instance is a batch from its cluster at that time (a held
        sample keeps its batch's time). A cluster none of whose instances is named this tick still
        counts as delivering when its adapter answered this tick's fence *and* its observation
        stream is connected (``source.connected``, a cluster -> bool mapping, when the source has
        one) *and* its latest batch was not marked ``observe_failed`` (``source.observe_failing``):
        that is how a cluster whose instances all vanished is seen to be empty rather than
        unreachable or unobservable. Reports replayed by a new holder are not counted: they are old."""
        fresh = self._cfg.adapter_fresh_ms
        latest: dict[ClusterId, int] = {}
        instances, seen = state.instances, self._seen
        for named in (obs.samples, obs.reports):
            for o in named:
                inst = instances.get(o.instance_id)
                if inst is None:
                    continue
                at = min(o.at_ms, now_ms)
                if at > seen.get(inst.id, at - 1):
                    seen[inst.id] = at
                if at > latest.get(inst.cluster, at - 1):
                    latest[inst.cluster] = at
        connected = getattr(self._source, "connected", None)
        failing = getattr(self._source, "observe_failing", None)
        failing = failing if isinstance(failing, Mapping) else {}
        if isinstance(connected, Mapping):
            for cid in answered:
                # an empty batch from a backend that could not observe (its API down) says nothing
                if connected.get(cid, False) and not failing.get(cid, False):
                    latest[cid] = now_ms
        for cid, at in latest.items():
            if now_ms - at > fresh:
                continue  # an old batch (a held sample near its end): not evidence of delivery now
            d = self._delivery.get(cid)
            if d is None or at - d.last_ms > fresh:
                self._delivery[cid] = reconcile.Delivery(at, at)  # a new run: clocks restart here
            elif at > d.last_ms:
                self._delivery[cid] = reconcile.Delivery(d.since_ms, at)
        if len(seen) > len(instances):  # instances left the state: forget them
            self._seen = {k: v for k, v in seen.items() if k in instances}

    def _log_unreported(self, state: ControlState, facts: Sequence[c.Command], now_ms: int) -> None:
        lost = {f.instance_id for f in facts if isinstance(f, c.TransitionInstance) and f.event is InstanceEvent.LOST}
        for inst, unseen_ms in reconcile.unreported(state, self._seen, self._delivery, now_ms, self._cfg):
            if inst.id in lost:
                log.warning("instance_unreported", instance=inst.id, cluster=inst.cluster, state=inst.state.value,
                            unreported_ms=unseen_ms,
                            reason=f"no longer reported by its adapter for {unseen_ms} ms while the adapter delivers "
                                   f"batches: declared lost")

    def _fence(self, epoch: int, now_ms: int, answered: list[ClusterId] | None = None) -> bool:
        """Send a bare fence with ``epoch`` to every cluster's adapter (adapters that support it).

        A new lease holder does this before anything else, so that commands of older epochs are
        refused before it reads the state it acts on; the holder repeats it every tick so adapters
        learn a new epoch at once. An adapter that answers with a higher epoch is *fenced out*: this
        loop sends it nothing more (a condition, a metric and one error line name it) while every
        other cluster goes on: one adapter, poisoned or ahead, must never stall the others. It stays
        fenced out until it accepts a fence again (an operator reset its epoch file, or this node's
        epoch grew past it). Returns True (kept for callers: the tick always goes on).
        """
        fence = getattr(self._adapter, "fence", None)
        if fence is None:
            return True
        clusters = self._replicator.state.clusters
        if any(cid not in clusters for cid in self.fenced_out):
            self.fenced_out = {k: v for k, v in self.fenced_out.items() if k in clusters}
        for cid in sorted(clusters):
            self._seq += 1
            try:
                fence(cid, self._token(epoch), now_ms)
                if answered is not None:
                    answered.append(cid)
                self._fenced_in(cid, epoch)
            except StaleEpoch as exc:
                self._stats["stale_rejections"] += 1
                self._fenced_off(cid, epoch, exc, now_ms)
            except TemporaryError:
                self._stats["send_failures"] += 1  # that cluster's commands will fail and feed its breaker
        return True

    def _token(self, epoch: int) -> Fence:
        if self._signer is None:
            return Fence(epoch, self._seq, self._holder)
        sig = self._signer.sign(epoch, self._holder)
        return Fence(epoch, self._seq, self._holder, sig.signature, sig.key_id)

    def _fenced_off(self, cid: ClusterId, epoch: int, exc: StaleEpoch, now_ms: int) -> None:
        self.stale_answers = {**self.stale_answers, cid: self.stale_answers.get(cid, 0) + 1}
        prev = self.fenced_out.get(cid)
        if prev is not None and prev.epoch == epoch and prev.adapter_epoch == exc.highest:
            return  # already raised and logged for these two epochs
        self.fenced_out = {**self.fenced_out, cid: FencedOut(cid, epoch, exc.highest, prev.since_ms if prev else now_ms)}
        log.error("adapter_stale_epoch", cluster=cid, epoch=epoch, adapter_epoch=exc.highest,
                  reason=(f"the adapter of cluster {cid} holds epoch {exc.highest}, above this holder's {epoch}: "
                          f"nothing is sent to it until it accepts this epoch (a newer holder exists, or its epoch file "
                          f"needs an operator's reset: docs/lease.md \"Recovery\"); the other clusters go on"))

    def _fenced_in(self, cid: ClusterId, epoch: int) -> None:
        if cid in self.fenced_out:
            was = self.fenced_out[cid]
            self.fenced_out = {k: v for k, v in self.fenced_out.items() if k != cid}
            log.warning("adapter_epoch_accepted", cluster=cid, epoch=epoch, previous_adapter_epoch=was.adapter_epoch)

    def _commit(self, commands: Sequence[c.Command], now_ms: int) -> ApplyResult:
        if not commands:
            return ApplyResult(ok=True)
        self._stats["commits"] += 1
        return self._replicator.commit(commands, now_ms)

    def _filter(
        self, state: ControlState, obs: Observations, now_ms: int
    ) -> tuple[dict[DeploymentId, signals.FilteredSignals | None], dict[InstanceId, float]]:
        by_dep: dict[DeploymentId, list[InstanceSample]] = {}
        loads: dict[InstanceId, float] = {}
        for s in obs.samples:
            inst = state.instances.get(s.instance_id)
            if inst is None or inst.state not in SERVING_STATES:
                continue
            by_dep.setdefault(inst.deployment, []).append(s)
            target = state.deployments[inst.deployment].policy.target_concurrency
            loads[s.instance_id] = min(1.0, max(s.kv_usage, (s.running + s.waiting) / target))
        # an instance sampled twice in one batch (replayed) is one instance: count ids then
        duplicated = len(loads) < sum(len(v) for v in by_dep.values())
        gateway = dict(obs.gateway_waiting)
        serving: dict[DeploymentId, int] = {}
        for inst in state.instances.values():
            if inst.state in SERVING_STATES:
                serving[inst.deployment] = serving.get(inst.deployment, 0) + 1
        out: dict[DeploymentId, signals.FilteredSignals | None] = {}
        for dep_id in sorted(state.deployments):
            d = state.deployments[dep_id]
            samples = by_dep.get(dep_id, [])
            # A serving instance that sent no sample leaves the load partly unknown (no scale-down).
            sampled = len({s.instance_id for s in samples}) if duplicated else len(samples)
            unsampled = max(0, serving.get(dep_id, 0) - sampled)
            agg = signals.aggregate(samples, len(samples), gateway.get(dep_id, 0), now_ms, unsampled=unsampled)
            mem = signals.update(self._filters.get(dep_id, signals.EMPTY_SIGNALS), agg, d.policy, now_ms)
            self._filters[dep_id] = mem
            out[dep_id] = signals.filtered(mem, agg, d.policy, now_ms)
        for gone in [k for k in self._filters if k not in state.deployments]:
            del self._filters[gone]
        self.last_signals = out
        return out, loads

    def _adapter_commands(
        self, commands: Sequence[c.Command], result: ApplyResult, before: Mapping[InstanceId, Instance | None], epoch: int
    ) -> list[AdapterCommand]:
        """Adapter commands for the plan's *committed* commands, in plan order."""
        state = self._replicator.state
        outcomes = result.results or (result,) * len(commands)
        out = []
        for cmd, outcome in zip(commands, outcomes):
            if outcome.ok:
                adapter_cmd = self._adapter_command(cmd, state, before, f"e{epoch}-r{self._requests + 1}")
                if adapter_cmd is not None:
                    self._requests += 1
                    out.append(adapter_cmd)
        return out

    def _retries(self, state: ControlState, now_ms: int) -> list[AdapterCommand]:
        """Undelivered commands whose cluster's breaker lets traffic through again."""
        due = []
        for rid, (cmd, since_ms) in list(self._undelivered.items()):
            if now_ms - since_ms > RETRY_WINDOW_MS:
                del self._undelivered[rid]
                continue
            if cmd.action in UNSENT_ONLY and not _still_wanted(cmd, state):
                del self._undelivered[rid]  # replaced, cancelled or reported since: nothing to start
                continue
            rec = state.breakers.get(reconcile.cluster_key(cmd.instance.cluster))
            if rec is None or breaker.allows(rec, now_ms):
                due.append(cmd)
        return due

    def _send(self, outgoing: Sequence[AdapterCommand], epoch: int, now_ms: int) -> tuple[int, int]:
        sent = failed = 0
        for k, cmd in enumerate(outgoing):
            if self._authority(now_ms) != epoch:
                # The lease lapsed during this tick (a slow commit, a pause): stop at once. The rest
                # are committed but reached no adapter: keep them to send when this node acts again
                # (a create nobody sends would hold its instance Pending for ``pending_timeout_ms``).
                self._keep_unsent(outgoing[k:], now_ms)
                break
            cid = cmd.instance.cluster
            if cid in self.fenced_out:  # its adapter holds a higher epoch: this cluster only gets nothing
                failed += 1
                self._remember_failure(cmd, now_ms)
                continue
            self._seq += 1
            try:
                self._adapter.send(cid, cmd, self._token(epoch), now_ms)
                sent += 1
                self._undelivered.pop(cmd.request_id, None)
            except StaleEpoch as exc:  # fenced out between this tick's fence and now: that cluster only
                self._stats["stale_rejections"] += 1
                failed += 1
                self._fenced_off(cid, epoch, exc, now_ms)
                self._remember_failure(cmd, now_ms)
            except TemporaryError:
                failed += 1
                self._remember_failure(cmd, now_ms)
            except ControlPlaneError as exc:  # refused for good (NotFound, ValidationError): this command only
                failed += 1
                log.warning("command_refused", cluster=cmd.instance.cluster, instance=cmd.instance.id,
                            deployment=cmd.instance.deployment, action=cmd.action, error=str(exc))
                self._remember_failure(cmd, now_ms, refused=True)
        self._stats["commands_sent"] += sent
        self._stats["send_failures"] += failed
        return sent, failed

    def _keep_unsent(self, unsent: Sequence[AdapterCommand], now_ms: int) -> None:
        """Commands a lapsed lease kept from being sent at all: re-sent (same request id) by
        ``_retries`` once this node acts again; nothing is fed to a breaker (no adapter failed)."""
        for cmd in unsent:
            if cmd.request_id not in self._undelivered and len(self._undelivered) < MAX_PENDING_FAILURES:
                self._undelivered[cmd.request_id] = (cmd, now_ms)

    def _remember_failure(self, cmd: AdapterCommand, now_ms: int, refused: bool = False) -> None:
        if len(self._failures) < MAX_PENDING_FAILURES:
            self._failures.append(reconcile.SendFailure(cmd.instance.cluster, cmd.instance.id, cmd.action, now_ms,
                                                        refused))
        retried = not refused and cmd.action in RETRIED_ACTIONS and cmd.request_id not in self._undelivered
        if retried and len(self._undelivered) < MAX_PENDING_FAILURES:
            self._undelivered[cmd.request_id] = (cmd, now_ms)

    @staticmethod
    def _adapter_command(
        cmd: c.Command, state: ControlState, before: Mapping[InstanceId, Instance | None], rid: str
    ) -> AdapterCommand | None:
        """``rid``: a request id unique across leaders (epochs never repeat), kept across retries."""
        if isinstance(cmd, c.CreateInstance):
            inst = state.instances.get(cmd.instance_id)
            return AdapterCommand(rid, "create", inst) if inst is not None else None
        if isinstance(cmd, c.TransitionInstance) and cmd.event in ACTION_OF_EVENT:
            inst = state.instances.get(cmd.instance_id) or before.get(cmd.instance_id)
            if inst is None:
                return None
            return AdapterCommand(rid, ACTION_OF_EVENT[cmd.event], inst, cmd.drain_deadline_ms)
        return None


UNSENT_ONLY = {"create": InstanceState.PENDING, "wake": InstanceState.WARMING}
"""Actions kept for re-sending only when a lapsed lease kept them from being sent at all, with the
state their instance must still be in (a *failed* create or wake is declared lost instead)."""


def _still_wanted(cmd: AdapterCommand, state: ControlState) -> bool:
    inst = state.instances.get(cmd.instance.id)
    return inst is not None and inst.state is UNSENT_ONLY[cmd.action]
