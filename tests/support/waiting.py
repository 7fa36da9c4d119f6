"""Bounded waiting for tests that involve real threads or processes (a watch, a gRPC stream, a Raft
group): poll a condition until it is truthy, fail with what was awaited after a deadline. Never a
fixed sleep standing in for an assertion."""

from __future__ import annotations

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
