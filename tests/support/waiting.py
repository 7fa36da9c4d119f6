"""Bounded waiting for tests that involve real threads or processes (a watch, a gRPC stream, a Raft
group): poll a condition until it is truthy, fail with what was awaited after a deadline. Never a
fixed sleep standing in for an assertion."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(fn: Callable[[], T], timeout_s: float = 5.0, what: str = "condition", interval_s: float = 0.01) -> T:
    """Return ``fn()``'s first truthy value; raise ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port`` now."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def wait_listening(addresses: list[str], timeout_s: float = 30.0) -> None:
    """Wait until every ``host:port`` accepts connections (a process started, like a readiness probe)."""
    for address in addresses:
        wait_until(lambda a=address: listening(a), timeout_s, f"{address} to accept connections", 0.05)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie not yet reaped counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
