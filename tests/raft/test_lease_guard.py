"""LeaseGuard against a fake node and a fake clock: no threads, no sleeps, every step narrated."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.config import CoordinatorConfig
from controlplane.domain.errors import CommitTimeout, ControlPlaneError, LeadershipLost, NotLeader
from controlplane.runtime.lease_guard import LeaseGuard
from raft.lease import AcquireLease, LeaseCommand, LeaseOutcome, LeaseRecord, RenewLease, apply_lease
from tests.support.raft_pki import raft_tls

D, RENEW, MARGIN, RHO = 1200, 250, 100, 0.01
V = int(D * (1 - RHO)) - MARGIN  # 1088
WAIT = D + int(D * RHO + 0.999) + MARGIN  # 1312: contender wait


@dataclass
class Clock:
    now: int = 10_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Log:
    """The replicated lease as every fake node sees it (applied instantly, in order)."""

    clock: Clock
    rec: LeaseRecord = field(default_factory=LeaseRecord)
    index: int = 10
    t_obs: int = 0

    def apply(self, cmd: LeaseCommand) -> LeaseOutcome:
        self.index += 1
        out = apply_lease(self.rec, cmd, self.index)
        if out.ok:
            self.rec, self.t_obs = out.record, self.clock()
        return out


class FakeNode:
    def __init__(self, node_id: str, cfg: CoordinatorConfig, log: Log) -> None:
        self.node_id = node_id
        self.cfg = cfg
        self.clock_ms = log.clock
        self.log = log
        self.leader = True
        self.fail: ControlPlaneError | None = None
        """Raise this instead of committing."""
        self.fail_after_commit: ControlPlaneError | None = None
        """Commit, then raise this (the answer was lost: unknown outcome)."""
        self.sent: list[LeaseCommand] = []
        self.before_apply: list[LeaseCommand] = []
        """Commands applied by others just before ours."""

    def is_leader(self) -> bool:
        return self.leader

    def lease_view(self) -> tuple[LeaseRecord, int]:
        return self.log.rec, self.log.t_obs

    def commit_lease(self, cmd: LeaseCommand, timeout_s: float | None = None) -> LeaseOutcome:
        self.sent.append(cmd)
        if self.fail is not None:
            raise self.fail
        for other in self.before_apply:
            self.log.apply(other)
        self.before_apply = []
        out = self.log.apply(cmd)
        if self.fail_after_commit is not None:
            raise self.fail_after_commit
        return out


@pytest.fixture
def cfg(tmp_path: Path) -> CoordinatorConfig:
    return CoordinatorConfig(
        node_id="coord-a", zone="az-1", raft_address="127.0.0.1:7001", api_address="127.0.0.1:8001",
        data_dir=tmp_path, password="0123456789abcdef", raft_tls=raft_tls(tmp_path, "coord-a"), lease_duration_ms=D, lease_renew_ms=RENEW,
        lease_margin_ms=MARGIN, drift_rho=RHO,
    )


def setup(cfg: CoordinatorConfig) -> tuple[Clock, Log, FakeNode, LeaseGuard]:
    clock = Clock()
    log = Log(clock)
    node = FakeNode("coord-a", cfg, log)
    return clock, log, node, LeaseGuard(node)


def test_free_lease_is_acquired_at_once_and_epoch_is_the_index(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    assert node.sent == [AcquireLease("coord-a", 0, D)]
    assert log.rec.holder == "coord-a" and log.rec.epoch == 11  # the log index of the acquire entry
    assert guard.authority(clock.now) == 11
    assert guard.fence() == ("coord-a", 11)
    assert guard.statistics().valid_until_ms == 10_000 + V
    clock.now += V - 1
    assert guard.authority(clock.now) == 11
    clock.now += 1
    assert guard.authority(clock.now) is None  # exclusive end


def test_only_the_raft_leader_contends(cfg: CoordinatorConfig) -> None:
    _, _, node, guard = setup(cfg)
    node.leader = False
    guard.step()
    assert node.sent == []


def test_contender_waits_d_rho_margin_after_the_last_observed_change(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    log.apply(AcquireLease("coord-b", 0, D))  # b holds it; observed now
    t_obs = clock.now
    clock.now = t_obs + WAIT - 1
    guard.step()
    assert node.sent == []
    clock.now = t_obs + WAIT
    guard.step()
    assert node.sent == [AcquireLease("coord-a", 1, D)]
    st = guard.statistics()
    assert st.epoch == log.rec.epoch and st.last_acquire_allowed_ms == t_obs + WAIT
    assert st.last_acquire_t_obs_ms == t_obs


def test_a_renewal_racing_the_acquire_wins_the_cas(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    b = log.apply(AcquireLease("coord-b", 0, D))
    clock.now += WAIT
    node.before_apply = [RenewLease("coord-b", b.record.epoch)]  # b's renewal is ordered first
    guard.step()
    assert log.rec.holder == "coord-b"
    assert guard.authority(clock.now) is None


def test_renews_every_period_from_the_send_time(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    clock.now += RENEW - 1
    guard.step()
    assert len(node.sent) == 1  # not due yet
    clock.now += 1
    t_send = clock.now
    guard.step()
    assert node.sent[-1] == RenewLease("coord-a", 11)
    assert guard.statistics().valid_until_ms == t_send + V
    assert guard.statistics().renewals == 1 and log.rec.version == 2


def test_renewal_without_answer_keeps_the_old_validity(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    valid = guard.statistics().valid_until_ms
    for exc in (CommitTimeout("t"), LeadershipLost("l"), NotLeader("n")):
        clock.now += RENEW
        node.fail = exc
        guard.step()
        assert guard.statistics().valid_until_ms == valid
    assert guard.statistics().renew_failures == 3
    clock.now = valid - 1
    assert guard.authority(clock.now) == 11
    clock.now = valid
    assert guard.authority(clock.now) is None
    node.fail = None
    clock.now += 5
    guard.step()  # still the holder in the record: the renewal goes through and authority returns
    assert guard.authority(clock.now) == 11


def test_committed_renewal_with_lost_answer_does_not_extend(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    valid = guard.statistics().valid_until_ms
    clock.now += RENEW
    node.fail_after_commit = CommitTimeout("answer lost")
    guard.step()
    assert log.rec.version == 2 and guard.statistics().valid_until_ms == valid


def test_lease_taken_by_another_clears_authority(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    clock.now += RENEW
    node.before_apply = [AcquireLease("coord-b", log.rec.version, D)]  # e.g. we stalled for a long time
    guard.step()
    assert guard.authority(clock.now) is None
    assert guard.statistics().losses == 1 and guard.statistics().epoch is None


def test_step_down_gives_up_first_then_releases(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    guard.step()
    node.leader = False
    guard.step()
    assert guard.authority(clock.now) is None
    assert log.rec.holder == "" and guard.statistics().releases == 1


def test_step_down_without_release(cfg: CoordinatorConfig) -> None:
    clock = Clock()
    log = Log(clock)
    node = FakeNode("coord-a", cfg, log)
    guard = LeaseGuard(node, release_on_step_down=False)
    guard.step()
    node.leader = False
    guard.step()
    assert guard.authority(clock.now) is None and log.rec.holder == "coord-a"
    assert guard.statistics().last_valid_until_ms == 10_000 + V  # kept after giving up


def test_holder_after_restart_adopts_its_epoch_by_renewing(cfg: CoordinatorConfig) -> None:
    clock, log, node, guard = setup(cfg)
    log.apply(AcquireLease("coord-a", 0, D))  # written by this node's previous incarnation
    assert guard.authority(clock.now) is None  # no validity before a renewal of our own
    guard.step()
    assert node.sent == [RenewLease("coord-a", 11)]
    assert guard.authority(clock.now) == 11


def test_a_foreign_clock_can_only_shorten_authority(cfg: CoordinatorConfig) -> None:
    clock, _, _, guard = setup(cfg)
    guard.step()
    assert guard.authority(0) == 11  # the guard's own clock is used when now_ms lags
    assert guard.authority(clock.now + V) is None  # a later now_ms counts
