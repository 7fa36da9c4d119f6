"""LeaseGuard: acquires, renews and hands back the replicated lease; answers "may I act now, and with
which epoch?" (PYSYNCOBJ.md §4.2, ``raft/lease.py`` for the arithmetic and why it is safe).

One background thread per coordinator, one step every ``poll`` (at most 50 ms):

* **Not Raft leader**: do nothing. If this node held the lease, stop renewing and, with
  ``release_on_step_down``, first give up authority locally (``valid_until = 0``) and then send a
  best-effort ``ReleaseLease`` so the new Raft leader need not wait out the lease.
* **Raft leader, lease held by this node** (including one adopted after a restart or a late-committed
  acquire): renew every ``lease_renew_ms``. ``t_send`` is read *before* submitting; on success
  ``valid_until = t_send + D*(1-rho) - margin``; on a timeout or any "unknown outcome" the old (still
  safe) ``valid_until`` stays and the next attempt follows at once; a failed compare-and-set means
  the lease is lost (cleared). Each attempt is bounded by ``lease_renew_ms`` (config rule
  ``V > 2*lease_renew_ms``: one lost renewal never opens a gap).
* **Raft leader, lease free or held by another node**: send ``AcquireLease(expected_version)``
  when the holder is empty, or once no version change was observed for ``D*(1+rho) + margin``
  (:func:`raft.lease.contender_may_acquire_at_ms` from this node's ``t_obs``). The epoch is the log
  index of the acquiring entry.

Time comes only from the injected monotonic millisecond ``clock``; it must be the clock the node
stamps ``t_obs`` with (the default is the node's own ``clock_ms``), so tests can skew both at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from controlplane.config import CoordinatorConfig
from controlplane.domain.errors import ControlPlaneError, TemporaryError
from raft.lease import (
    AcquireLease,
    LeaseCommand,
    LeaseOutcome,
    LeaseRecord,
    ReleaseLease,
    RenewLease,
    contender_may_acquire_at_ms,
    holder_valid_until_ms,
)

log = logging.getLogger(__name__)

MAX_POLL_MS = 50


class LeaseNode(Protocol):
    """What the guard needs from a Raft member (``raft.node.RaftNode`` implements it)."""

    node_id: str
    cfg: CoordinatorConfig
    clock_ms: Callable[[], int]

    def is_leader(self) -> bool: ...

    def lease_view(self) -> tuple[LeaseRecord, int]: ...

    def commit_lease(self, cmd: LeaseCommand, timeout_s: float | None = None) -> LeaseOutcome: ...


@dataclass(frozen=True, slots=True)
class LeaseStatistics:
    node_id: str
    epoch: int | None
    """This node's epoch while it believes it holds the lease."""
    valid_until_ms: int
    """Exclusive end of this node's authority on the guard's clock (0: none)."""
    last_valid_until_ms: int
    """End of the latest validity this node was granted, kept after it lost or gave up the lease
    (its authority ended at or before this instant)."""
    holder: str
    """Holder in this node's applied lease record (may lag)."""
    version: int
    acquisitions: int
    renewals: int
    renew_failures: int
    """Attempts without an answer in time, or with an unknown outcome (the lease was kept)."""
    losses: int
    """Renewals refused by the compare-and-set (someone else holds the lease now)."""
    releases: int
    last_renew_latency_ms: int | None
    max_renew_latency_ms: int
    last_acquire_sent_ms: int | None
    last_acquire_t_obs_ms: int | None
    """``t_obs`` of the record the last successful acquire replaced."""
    last_acquire_allowed_ms: int | None
    """Earliest time that acquire was allowed (None when the lease was free)."""


class LeaseGuard:
    def __init__(
        self,
        node: LeaseNode,
        cfg: CoordinatorConfig | None = None,
        clock: Callable[[], int] | None = None,
        *,
        release_on_step_down: bool = True,
    ) -> None:
        self._node = node
        self._cfg = cfg or node.cfg
        self._clock = clock or node.clock_ms
        self._me = node.node_id
        self._release_on_step_down = release_on_step_down
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._valid_until = 0
        self._last_valid_until = 0
        self._next_renew = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats: dict[str, int | None] = dict(
            acquisitions=0, renewals=0, renew_failures=0, losses=0, releases=0,
            last_renew_latency_ms=None, max_renew_latency_ms=0,
            last_acquire_sent_ms=None, last_acquire_t_obs_ms=None, last_acquire_allowed_ms=None,
        )

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("LeaseGuard already started")
        self._thread = threading.Thread(target=self._run, name=f"lease-guard-{self._me}", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = False, timeout_s: float = 5.0) -> None:
        """Stop the thread; with ``release``, give up authority and hand the lease back (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if release:
            self._give_up(send_release=True)

    # --- answers (any thread) -----------------------------------------------------------------------

    def authority(self, now_ms: int) -> int | None:
        """The fencing epoch while this node may act, else None. ``now_ms`` should come from the
        guard's clock; the later of it and the guard's own reading is used, so a foreign clock can
        only shorten the authority, never extend it."""
        now = max(now_ms, self._clock())
        with self._lock:
            epoch, valid_until = self._epoch, self._valid_until
        if epoch is None or now >= valid_until:
            return None
        rec, _ = self._node.lease_view()
        if rec.holder != self._me or rec.epoch != epoch:
            return None
        return epoch

    def fence(self) -> tuple[str, int] | None:
        """``(holder, epoch)`` for a fenced commit (``RaftReplicator(fence=guard.fence)``), or None."""
        epoch = self.authority(self._clock())
        return None if epoch is None else (self._me, epoch)

    def wait_holder(self, timeout_s: float) -> int | None:
        """Wait until this node holds a valid lease; its epoch, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            epoch = self.authority(self._clock())
            if epoch is not None or time.monotonic() >= deadline:
                return epoch
            self._stop.wait(0.01)

    def statistics(self) -> LeaseStatistics:
        rec, _ = self._node.lease_view()
        with self._lock:
            return LeaseStatistics(
                node_id=self._me, epoch=self._epoch, valid_until_ms=self._valid_until,
                last_valid_until_ms=self._last_valid_until,
                holder=rec.holder, version=rec.version, **self._stats,  # type: ignore[arg-type]
            )

    # --- the loop -----------------------------------------------------------------------------------

    def _poll_ms(self) -> int:
        return max(5, min(MAX_POLL_MS, self._cfg.lease_renew_ms // 5))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("lease guard step failed on %s", self._me)
            self._stop.wait(self._sleep_ms() / 1000.0)

    def _sleep_ms(self) -> int:
        with self._lock:
            holding, next_renew = self._epoch is not None, self._next_renew
        poll = self._poll_ms()
        if not holding:
            return poll
        return max(1, min(poll, next_renew - self._clock()))

    def step(self) -> None:
        """One decision (public so tests can drive the guard without its thread)."""
        rec, t_obs = self._node.lease_view()
        with self._lock:
            epoch = self._epoch
        if epoch is not None and (rec.holder != self._me or rec.epoch != epoch):
            self._lost(f"lease now held by {rec.holder or 'nobody'} at epoch {rec.epoch}")
            epoch = None
        if not self._node.is_leader():
            if epoch is not None:
                self._give_up(send_release=self._release_on_step_down)
            return
        if rec.holder == self._me:
            if epoch is None:
                with self._lock:  # adopt: our acquire committed late, or we restarted as holder
                    self._epoch, self._next_renew = rec.epoch, 0
            if self._clock() >= self._next_renew:
                self._renew(rec.epoch)
            return
        now = self._clock()
        allowed = None
        if rec.holder:
            allowed = contender_may_acquire_at_ms(t_obs, rec.duration_ms, self._cfg.drift_rho, self._cfg.lease_margin_ms)
            if now < allowed:
                return
        self._acquire(rec, t_obs, allowed)

    def _renew(self, epoch: int) -> None:
        t_send = self._clock()
        with self._lock:
            self._next_renew = t_send + self._cfg.lease_renew_ms
        try:
            out = self._node.commit_lease(RenewLease(self._me, epoch), self._cfg.lease_renew_ms / 1000.0)
        except TemporaryError as exc:
            self._count("renew_failures")
            log.debug("renew of epoch %d on %s: %s", epoch, self._me, exc)
            return
        latency = self._clock() - t_send
        with self._lock:
            self._stats["last_renew_latency_ms"] = latency
            self._stats["max_renew_latency_ms"] = max(int(self._stats["max_renew_latency_ms"] or 0), latency)
            if out.ok and self._epoch == epoch:
                self._stats["renewals"] = int(self._stats["renewals"] or 0) + 1
                valid = holder_valid_until_ms(t_send, out.record.duration_ms, self._cfg.drift_rho, self._cfg.lease_margin_ms)
                self._valid_until = max(self._valid_until, valid)
                self._last_valid_until = max(self._last_valid_until, valid)
                return
        if not out.ok:
            with self._lock:
                self._stats["losses"] = int(self._stats["losses"] or 0) + 1
            self._lost(out.reason)

    def _acquire(self, rec: LeaseRecord, t_obs: int, allowed: int | None) -> None:
        t_send = self._clock()
        cmd = AcquireLease(self._me, rec.version, self._cfg.lease_duration_ms)
        try:
            out = self._node.commit_lease(cmd, self._cfg.commit_timeout_ms / 1000.0)
        except ControlPlaneError as exc:
            log.debug("acquire on %s: %s", self._me, exc)
            return
        if not out.ok:
            return  # the compare-and-set lost: the view was stale or someone renewed meanwhile
        valid = holder_valid_until_ms(t_send, out.record.duration_ms, self._cfg.drift_rho, self._cfg.lease_margin_ms)
        with self._lock:
            self._epoch = out.record.epoch
            self._valid_until = valid
            self._last_valid_until = max(self._last_valid_until, valid)
            self._next_renew = t_send + self._cfg.lease_renew_ms
            self._stats["acquisitions"] = int(self._stats["acquisitions"] or 0) + 1
            self._stats["last_acquire_sent_ms"] = t_send
            self._stats["last_acquire_t_obs_ms"] = t_obs
            self._stats["last_acquire_allowed_ms"] = allowed
        log.info("%s acquired the lease: epoch %d", self._me, out.record.epoch)

    def _lost(self, why: str) -> None:
        with self._lock:
            had = self._epoch
            self._epoch, self._valid_until = None, 0
        if had is not None:
            log.warning("%s lost the lease (epoch %d): %s", self._me, had, why)

    def _give_up(self, *, send_release: bool) -> None:
        """Stop acting first, then (optionally) hand the lease back."""
        with self._lock:
            epoch = self._epoch
            self._epoch, self._valid_until = None, 0
        if epoch is None or not send_release:
            return
        try:
            out = self._node.commit_lease(ReleaseLease(self._me, epoch), self._cfg.lease_renew_ms / 1000.0)
        except ControlPlaneError as exc:
            log.info("%s: release of epoch %d not confirmed: %s", self._me, epoch, exc)
            return
        if out.ok:
            self._count("releases")

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] = int(self._stats[key] or 0) + 1
