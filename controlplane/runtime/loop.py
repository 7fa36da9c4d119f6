"""The control loop: gather -> decide -> commit -> act, one tick at a time.

The loop owns only soft state (signal filters, undelivered-command failures); everything a new
leader needs is in the replicated state behind the :class:`~controlplane.ports.Replicator`. Each tick:

1. **gather** observations from the adapters (samples, lifecycle reports, gateway queues);
2. commit the **facts** they imply (instance transitions, breaker updates);
3. **decide** (:func:`controlplane.core.reconcile.plan`) from the replicated state and filtered signals;
4. **commit** the plan as one log entry;
5. **act**: send each *committed* instance command to its cluster's adapter with a fencing token.
   Undeliverable commands are remembered and fed to the breakers on the next tick.

The loop acts only while ``authority(now_ms)`` returns an epoch (the lease holder's fencing epoch);
otherwise it gathers and filters but neither commits nor sends.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.core import reconcile, signals
from controlplane.domain import commands as c
from controlplane.domain.errors import StaleEpoch, TemporaryError
from controlplane.domain.ids import DeploymentId, InstanceId
from controlplane.domain.instances import Instance, InstanceEvent
from controlplane.domain.observations import InstanceSample, Observations
from controlplane.domain.state import ApplyResult, ControlState
from controlplane.ports import AdapterCommand, ClusterAdapter, Fence, ObservationSource, Replicator

ACTION_OF_EVENT = {
    InstanceEvent.WAKE: "wake",
    InstanceEvent.SLEEP: "sleep",
    InstanceEvent.DRAIN: "drain",
    InstanceEvent.CANCEL: "cancel",
}
MAX_PENDING_FAILURES = 10_000
"""Bound on remembered undelivered commands (oldest dropped first)."""


@dataclass(frozen=True, slots=True)
class TickReport:
    at_ms: int
    acted: bool
    plan: reconcile.Plan | None
    facts: int
    sent: int
    send_failures: int


@dataclass(frozen=True, slots=True)
class LoopStatistics:
    ticks: int
    commits: int
    commands_sent: int
    send_failures: int
    stale_rejections: int


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
    ) -> None:
        self._replicator = replicator
        self._adapter = adapter
        self._source = source
        self._rng = rng
        self._authority = authority
        self._cfg = config or reconcile.ReconcileConfig()
        self._filters: dict[DeploymentId, signals.SignalMemory] = {}
        self._failures: list[reconcile.SendFailure] = []
        self._seq = 0
        self._stats = dict(ticks=0, commits=0, commands_sent=0, send_failures=0, stale_rejections=0)
        self.last_signals: dict[DeploymentId, signals.FilteredSignals | None] = {}

    def statistics(self) -> LoopStatistics:
        return LoopStatistics(**self._stats)

    def tick(self, now_ms: int) -> TickReport:
        self._stats["ticks"] += 1
        obs = self._source.gather(now_ms)  # gather
        epoch = self._authority(now_ms)
        state = self._replicator.state
        filtered, loads = self._filter(state, obs, now_ms)
        if epoch is None:
            return TickReport(now_ms, False, None, 0, 0, 0)
        facts = reconcile.facts(state, obs, self._failures, now_ms, self._cfg, self._rng)
        self._failures = []
        self._commit(facts, now_ms)
        plan = reconcile.plan(state, filtered, loads, now_ms, self._cfg)  # decide
        before = {cmd.instance_id: state.instances.get(cmd.instance_id) for cmd in plan.commands
                  if isinstance(cmd, c.TransitionInstance)}
        result = self._commit(plan.commands, now_ms)  # commit, then act
        sent, failed = self._act(plan.commands, result, before, epoch, now_ms)
        return TickReport(now_ms, True, plan, len(facts), sent, failed)

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
            if inst is None or not inst.state.serving:
                continue
            by_dep.setdefault(inst.deployment, []).append(s)
            target = state.deployments[inst.deployment].policy.target_concurrency
            loads[s.instance_id] = min(1.0, max(s.kv_usage, (s.running + s.waiting) / target))
        gateway = dict(obs.gateway_waiting)
        out: dict[DeploymentId, signals.FilteredSignals | None] = {}
        for dep_id in sorted(state.deployments):
            d = state.deployments[dep_id]
            samples = by_dep.get(dep_id, [])
            agg = signals.aggregate(samples, len(samples), gateway.get(dep_id, 0), now_ms)
            mem = signals.update(self._filters.get(dep_id, signals.EMPTY_SIGNALS), agg, d.policy, now_ms)
            self._filters[dep_id] = mem
            out[dep_id] = signals.filtered(mem, agg, d.policy, now_ms)
        for gone in [k for k in self._filters if k not in state.deployments]:
            del self._filters[gone]
        self.last_signals = out
        return out, loads

    def _act(
        self,
        commands: Sequence[c.Command],
        result: ApplyResult,
        before: Mapping[InstanceId, Instance | None],
        epoch: int,
        now_ms: int,
    ) -> tuple[int, int]:
        state = self._replicator.state
        sent = failed = 0
        outcomes = result.results or (result,) * len(commands)
        for cmd, outcome in zip(commands, outcomes):
            if not outcome.ok:
                continue
            adapter_cmd = self._adapter_command(cmd, state, before, epoch)
            if adapter_cmd is None:
                continue
            self._seq += 1
            try:
                self._adapter.send(adapter_cmd.instance.cluster, adapter_cmd, Fence(epoch, self._seq), now_ms)
                sent += 1
            except StaleEpoch:
                self._stats["stale_rejections"] += 1
                break  # a newer leader exists: stop acting at once
            except TemporaryError:
                failed += 1
                if len(self._failures) < MAX_PENDING_FAILURES:
                    self._failures.append(
                        reconcile.SendFailure(adapter_cmd.instance.cluster, adapter_cmd.instance.id, adapter_cmd.action, now_ms)
                    )
        self._stats["commands_sent"] += sent
        self._stats["send_failures"] += failed
        return sent, failed

    def _adapter_command(
        self, cmd: c.Command, state: ControlState, before: Mapping[InstanceId, Instance | None], epoch: int
    ) -> AdapterCommand | None:
        rid = f"e{epoch}-{self._seq + 1}"  # unique across leaders: epochs never repeat
        if isinstance(cmd, c.CreateInstance):
            inst = state.instances.get(cmd.instance_id)
            return AdapterCommand(rid, "create", inst) if inst is not None else None
        if isinstance(cmd, c.TransitionInstance) and cmd.event in ACTION_OF_EVENT:
            inst = state.instances.get(cmd.instance_id) or before.get(cmd.instance_id)
            if inst is None:
                return None
            return AdapterCommand(rid, ACTION_OF_EVENT[cmd.event], inst, cmd.drain_deadline_ms)
        return None
