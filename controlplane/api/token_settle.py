"""A token created a moment ago is usable on every coordinator once ``token create`` returned.

``CreateToken`` returns once the entry is committed and applied on the coordinator that served it;
another coordinator may apply it a heartbeat later (it learns the new commit index from the leader's
next append). A call there with the new token would be refused UNAUTHENTICATED in between. So
:class:`TokenSettle`, given to :class:`~controlplane.api.auth.Authenticator`, lets a replica that knows
a leader (and is not the leader) and does not know a well-formed token's id wait, bounded (``wait_s``), for the entries it
applies next until the id appears: the wait ends as soon as it does, or at the bound (then the
token is refused as before).

Unknown ids are what a guessing attacker sends: at most ``max_waiters`` calls wait at once (the
others are refused at once), so garbage tokens cannot hold the server's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

DEFAULT_WAIT_S = 1.0
"""Some twenty-five of the leader's appends (``append_entries_period_ms`` is 40 by default): ample on a
loaded machine too."""
DEFAULT_MAX_WAITERS = 4
_STEP_S = 0.05


class _Events(Protocol):
    @property
    def last_revision(self) -> int: ...

    def wait_after(self, revision: int, timeout_s: float) -> int: ...


class _Status(Protocol):
    leader_id: str
    role: str


class SettleNode(Protocol):
    """What the wait reads of the coordinator (``raft.node.RaftNode`` has both)."""

    @property
    def events(self) -> _Events: ...

    def status(self) -> _Status: ...


class TokenSettle:
    def __init__(self, node: SettleNode, wait_s: float = DEFAULT_WAIT_S, max_waiters: int = DEFAULT_MAX_WAITERS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node
        self._wait_s = wait_s
        self._slots = threading.BoundedSemaphore(max_waiters)
        self._clock = clock

    def __call__(self, known: Callable[[], bool]) -> bool:
        """Wait until ``known()`` (True) or the bound (False); False at once on the leader (it applied
        every entry it acknowledged), with no leader known, or with every slot taken."""
        try:
            st = self._node.status()
            if not st.leader_id or st.role == "leader":
                return False
        except Exception:  # noqa: BLE001 - a stopping node: refuse as before
            return False
        if not self._slots.acquire(blocking=False):
            return False
        try:
            events = self._node.events
            deadline = self._clock() + self._wait_s
            seen = events.last_revision
            while not known():
                left = deadline - self._clock()
                if left <= 0:
                    return False
                seen = events.wait_after(seen, min(left, _STEP_S))
            return True
        finally:
            self._slots.release()
