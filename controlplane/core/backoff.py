"""Exponential backoff with "equal jitter", drawn from an injected, seeded rng (anti-avalanche).

The ``attempt``-th retry (0-based) waits a delay drawn from the *ceiling*

    d = min(cap_ms, base_ms * 2**attempt)

with equal jitter: half of it is fixed and the other half uniform,

    delay = d // 2 + rng.randint(0, d - d // 2)          so  d // 2 <= delay <= d <= cap_ms

The fixed half guarantees that the delays keep growing (plain "full jitter" may draw 0 and retry at
once); the random half spreads the retries of many callers that failed together over time, so they
do not come back as one synchronized storm.

Huge attempts never build huge numbers: once ``2**attempt`` exceeds ``cap_ms`` the ceiling is
``cap_ms`` whatever ``base_ms`` is (``base_ms >= 1``), so the shift is skipped (:func:`ceiling_ms`).

The random source is always a parameter: the same seed gives the same schedule, which is what makes
a simulation replayable and lets the proposer of a replicated command draw the jitter once (the
followers replay the drawn value, never the draw). Exactly one ``rng.randint`` call is made per delay.
"""

from __future__ import annotations

import random

MAX_SCHEDULE_LEN = 1_024
"""Most delays :func:`backoff_schedule` returns in one call (a named limit on every retry series)."""


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def ceiling_ms(attempt: int, base_ms: int, cap_ms: int) -> int:
    """``min(cap_ms, base_ms * 2**attempt)`` without building a huge integer for a huge attempt.

    Raises :class:`ValueError` for a negative or non-integer argument, or when ``base_ms > cap_ms``.
    """
    _check_int("attempt", attempt)
    _check_int("base_ms", base_ms)
    _check_int("cap_ms", cap_ms)
    if base_ms > cap_ms:
        raise ValueError(f"base_ms ({base_ms}) must not exceed cap_ms ({cap_ms})")
    if base_ms == 0:
        return 0
    # base_ms >= 1, so base_ms * 2**attempt >= 2**attempt > cap_ms once attempt >= cap_ms.bit_length().
    if attempt >= cap_ms.bit_length():
        return cap_ms
    return min(cap_ms, base_ms << attempt)


def backoff_bounds(attempt: int, base_ms: int, cap_ms: int) -> tuple[int, int]:
    """The inclusive range ``(d // 2, d)`` that :func:`backoff_ms` draws from, ``d`` the ceiling."""
    d = ceiling_ms(attempt, base_ms, cap_ms)
    return d // 2, d


def backoff_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random) -> int:
    """Delay before retry number ``attempt`` (0-based): equal jitter below ``min(cap, base * 2**attempt)``.

    Raises :class:`ValueError` for a negative or non-integer argument, or when ``base_ms > cap_ms``.
    """
    d = ceiling_ms(attempt, base_ms, cap_ms)
    half = d // 2
    return half + rng.randint(0, d - half)


def backoff_schedule(attempts: int, base_ms: int, cap_ms: int, rng: random.Random) -> tuple[int, ...]:
    """The delays of attempts ``0 .. attempts - 1``, drawn in order from ``rng``.

    ``attempts`` is limited to :data:`MAX_SCHEDULE_LEN`; a longer series raises :class:`ValueError`.
    """
    _check_int("attempts", attempts)
    if attempts > MAX_SCHEDULE_LEN:
        raise ValueError(f"attempts must be at most {MAX_SCHEDULE_LEN}, got {attempts}")
    return tuple(backoff_ms(a, base_ms, cap_ms, rng) for a in range(attempts))
