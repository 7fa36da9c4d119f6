"""Lease and fencing arithmetic (pure: no clock, no I/O; times are monotonic milliseconds passed in).

Raft leadership is never the authority to act; a replicated lease record is. The record is
``(holder, epoch, version, duration_ms)``:

* ``acquire(node, expected_version)`` is a compare-and-set on ``version``; it sets ``epoch`` to the
  Raft log index of the acquiring entry (strictly increasing) and bumps ``version``.
* ``renew(node, epoch)`` succeeds only for the current holder and epoch; it bumps ``version``.
* ``release(node, epoch)`` hands the lease back voluntarily.

Timing, with ``D`` the duration, ``rho`` the bound on clock-rate drift and ``margin`` a safety margin:

* The **holder** is valid until ``t_send + D*(1 - rho) - margin``, where ``t_send`` is its own
  monotonic time when it *sent* its last successful renewal.
* A **contender** may send ``acquire`` only after it has observed no version change for
  ``D*(1 + rho) + margin`` on its own monotonic clock (``t_obs`` = when it applied the last change).

Why that is safe: the contender observes version ``v`` after the holder sent the renewal that
created it, so in real time ``t_obs >= t_send``. The holder stops acting by real time
``t_send + D - margin'`` (its clock runs at most ``rho`` fast); the contender's acquire is not sent
before real time ``t_obs + D`` (its clock runs at most ``rho`` slow). A renewal racing the acquire is
ordered by the log and one of them fails the CAS. The one assumption is the drift bound; no wall
clocks are compared across nodes. Details: ``docs/lease.md`` and ``shared/design/PYSYNCOBJ.md`` §4.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_DURATION_MS = 3_000
DEFAULT_RHO = 0.01
DEFAULT_MARGIN_MS = 100


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The replicated lease. ``holder`` is empty when nobody holds it."""

    holder: str = ""
    epoch: int = 0
    version: int = 0
    duration_ms: int = DEFAULT_DURATION_MS


@dataclass(frozen=True, slots=True)
class LeaseOutcome:
    ok: bool
    record: LeaseRecord
    reason: str


def acquire(rec: LeaseRecord, node: str, expected_version: int, log_index: int, duration_ms: int) -> LeaseOutcome:
    """Compare-and-set acquisition; ``log_index`` is the index of the entry being applied."""
    if not node:
        return LeaseOutcome(False, rec, "acquire: node must not be empty")
    if rec.version != expected_version:
        return LeaseOutcome(False, rec, f"acquire: version is {rec.version}, expected {expected_version}")
    if log_index <= rec.epoch:
        return LeaseOutcome(False, rec, f"acquire: log index {log_index} does not exceed epoch {rec.epoch}")
    if duration_ms <= 0:
        return LeaseOutcome(False, rec, f"acquire: duration must be > 0, got {duration_ms}")
    new = LeaseRecord(holder=node, epoch=log_index, version=rec.version + 1, duration_ms=duration_ms)
    return LeaseOutcome(True, new, f"acquired by {node} with epoch {log_index}")


def renew(rec: LeaseRecord, node: str, epoch: int) -> LeaseOutcome:
    if rec.holder != node or rec.epoch != epoch or not node:
        return LeaseOutcome(False, rec, f"renew: lease is held by {rec.holder or 'nobody'} at epoch {rec.epoch}")
    return LeaseOutcome(True, replace(rec, version=rec.version + 1), f"renewed by {node}")


def release(rec: LeaseRecord, node: str, epoch: int) -> LeaseOutcome:
    if rec.holder != node or rec.epoch != epoch or not node:
        return LeaseOutcome(False, rec, f"release: lease is held by {rec.holder or 'nobody'} at epoch {rec.epoch}")
    return LeaseOutcome(True, replace(rec, holder="", version=rec.version + 1), f"released by {node}")


def holder_valid_until_ms(t_send_ms: int, duration_ms: int, rho: float, margin_ms: int) -> int:
    """Last monotonic instant (exclusive) at which the holder may act after a renewal sent at t_send."""
    return t_send_ms + int(duration_ms * (1.0 - rho)) - margin_ms


def contender_may_acquire_at_ms(t_obs_ms: int, duration_ms: int, rho: float, margin_ms: int) -> int:
    """Earliest monotonic instant at which a contender may send ``acquire``, having observed the
    latest version change at ``t_obs``."""
    return t_obs_ms + int(-(-duration_ms * (1.0 + rho) // 1)) + margin_ms


@dataclass(frozen=True, slots=True)
class FenceCheck:
    accepted: bool
    highest_epoch: int
    highest_holder: str
    reason: str


def check_fence(highest_epoch: int, highest_holder: str, epoch: int, holder: str) -> FenceCheck:
    """What an adapter does with a fenced command: reject lower epochs, and an equal epoch from a
    different holder (defence against a log rolled back by correlated power loss)."""
    if epoch < highest_epoch:
        return FenceCheck(False, highest_epoch, highest_holder, f"stale epoch {epoch}: highest seen is {highest_epoch}")
    if epoch == highest_epoch and highest_holder and holder != highest_holder:
        return FenceCheck(
            False, highest_epoch, highest_holder, f"epoch {epoch} already belongs to {highest_holder}, not {holder}"
        )
    return FenceCheck(True, epoch, holder, "accepted")


# --- replicated lease commands (applied by raft/fsm.py, encoded by raft/codec.py) -----------------


@dataclass(frozen=True, slots=True)
class AcquireLease:
    node: str
    expected_version: int
    duration_ms: int


@dataclass(frozen=True, slots=True)
class RenewLease:
    node: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    node: str
    epoch: int


LeaseCommand = AcquireLease | RenewLease | ReleaseLease


def apply_lease(rec: LeaseRecord, cmd: LeaseCommand, log_index: int) -> LeaseOutcome:
    """Apply a lease command at ``log_index`` (the index of the entry carrying it). Total."""
    if isinstance(cmd, AcquireLease):
        return acquire(rec, cmd.node, cmd.expected_version, log_index, cmd.duration_ms)
    if isinstance(cmd, RenewLease):
        return renew(rec, cmd.node, cmd.epoch)
    if isinstance(cmd, ReleaseLease):
        return release(rec, cmd.node, cmd.epoch)
    return LeaseOutcome(False, rec, f"unknown lease command {type(cmd).__name__}")
