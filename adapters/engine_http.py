"""What the engine drivers (:mod:`adapters.vllm`, :mod:`adapters.triton`, :mod:`adapters.deepspeed_mii`)
share: their typed errors, the bounded-timeout HTTP request with its translation of ``urllib``/socket
errors into :class:`~controlplane.domain.errors.Unavailable`, and the Prometheus helpers (exposition
parsing, cumulative histogram buckets, the p99 of a histogram delta between two scrapes).

Each driver module re-exports the error classes under the names it always had, so
``from adapters.vllm import EngineRejected`` keeps working. The engine name ("vLLM", "Triton",
"DeepSpeed-MII") is a parameter wherever it appears in a message.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controlplane.domain.errors import (
    PermanentError,
    TemporaryError,
    Unavailable,
    ValidationError,
)


class WarmPathUnavailable(PermanentError):
    """The server refuses the warm path (vLLM: no dev-mode sleep/wake routes; Triton: model load/unload
    outside explicit model control mode): warm starts are impossible, use cold starts.

    ``explanation`` follows ``{base_url}{route}`` in the message; ``message`` is the server's own text
    ("" when it gave none)."""

    def __init__(self, base_url: str, route: str, explanation: str, *, message: str = "") -> None:
        super().__init__(f"{base_url}{route}{explanation}: no warm path")
        self.base_url = base_url
        self.route = route
        self.message = message


class EngineRejected(ValidationError):
    """The server answered 4xx (400 ErrorResponse, Flask's 4xx): the request itself (or the URL) is
    invalid; retrying will not help. ``error_type`` is the body's error type where the engine gives one."""

    def __init__(self, field_name: str, problem: str, *, status: int, error_type: str = "") -> None:
        super().__init__(field_name, problem)
        self.status = status
        self.error_type = error_type


class MetricsMalformed(TemporaryError):
    """``/metrics`` could not be turned into a sample: ``field`` names what is wrong (``exposition``
    for an unparseable page)."""

    def __init__(self, field_name: str, problem: str, *, engine: str) -> None:
        super().__init__(f"{engine} metrics {field_name}: {problem}")
        self.field = field_name
        self.problem = problem
        self.engine = engine


class UnexpectedResponse(TemporaryError):
    """The server answered with a status or body the contract does not describe; ``status`` is the HTTP
    status when one is known."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def unreachable_reason(exc: BaseException) -> Any:
    """What to say about a failed connection: ``URLError.reason`` when there is one, else the error."""
    return getattr(exc, "reason", exc)


def count_unreachable(lock: Any, stats: Any, where: str, reason: Any) -> None:
    """Under ``lock``, count one unreachable request in a driver's statistics (``unreachable`` and
    ``last_error`` fields)."""
    with lock:
        stats.unreachable += 1
        stats.last_error = f"{where}: {reason}"


def http_request(
    engine: str,
    method: str,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    on_unreachable: Callable[[Any], None] | None = None,
) -> tuple[int, bytes, str]:
    """(status, body, content type) for any HTTP answer, reading at most ``max_bytes``.

    No answer (refused / reset / timeout / DNS) calls ``on_unreachable(reason)`` (the driver's
    statistics and log event) and raises ``Unavailable("{engine} {url} unreachable: {reason}")``.
    """
    req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(max_bytes), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(max_bytes)
        except OSError:
            body = b""
        finally:
            exc.close()
        return exc.code, body, exc.headers.get("Content-Type", "") if exc.headers else ""
    except (TimeoutError, urllib.error.URLError, OSError, ValueError) as exc:
        reason = unreachable_reason(exc)
        if on_unreachable is not None:
            on_unreachable(reason)
        raise Unavailable(f"{engine} {url} unreachable: {reason}") from exc


# -- Prometheus ---------------------------------------------------------------------------------------
def parse_exposition(body: bytes, *, engine: str) -> dict[str, list[Any]]:
    """Family name -> samples. Any parse failure becomes :class:`MetricsMalformed`."""
    try:
        text = body.decode("utf-8")
        return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise MetricsMalformed("exposition", f"unparseable Prometheus text: {exc}", engine=engine) from exc


Buckets = tuple[tuple[float, float], ...]
"""(upper bound ``le``, cumulative count) sorted by bound, +Inf last."""


def cumulative_buckets(samples: list[tuple[dict[str, str], float]]) -> Buckets | None:
    """Per-``le`` cumulative counts summed over the other labels; None when absent, NaN or without +Inf."""
    by_le: dict[float, float] = {}
    for labels, value in samples:
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            return None
        if math.isnan(value):
            return None
        by_le[le] = by_le.get(le, 0.0) + value
    if math.inf not in by_le:
        return None
    return tuple(sorted(by_le.items()))


MAX_COUNT = 2**31 - 1
"""The largest request count a sample may carry (the adapter protocol's ``int32``)."""
MAX_BYTES = 2**63 - 1
"""The largest byte count a sample may carry (``int64``)."""


def check_count(name: str, value: float, *, engine: str, limit: int = MAX_COUNT) -> int:
    """``value`` (finite, already summed) as an int in ``0..limit``, else :class:`MetricsMalformed`: an
    engine reporting a negative or impossible count is broken, and the value would not fit the wire."""
    if not 0 <= value <= limit:
        raise MetricsMalformed(name, f"{value} is out of range 0..{limit}", engine=engine)
    return int(value)


def counter_delta(previous: float, current: float) -> float:
    """Increase of a counter; one that went down (restart) counts from zero, as Prometheus' ``rate()``."""
    return current if current < previous else current - previous


def histogram_quantile_upper(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """Upper bound (in the histogram's unit) of the first bucket whose cumulative count reaches
    ``ceil(q * n)``.

    ``cumulative`` is (le, cumulative count) sorted by le with +Inf last; None when n == 0. A quantile
    in the +Inf bucket reports the largest finite bound.
    """
    total = cumulative[-1][1]
    if total <= 0:
        return None
    rank = math.ceil(q * total - 1e-9)  # guard float noise: 0.99 * 100 must be rank 99, not 100
    finite = [le for le, _ in cumulative if math.isfinite(le)]
    for le, count in cumulative:
        if count >= rank:
            return le if math.isfinite(le) else (finite[-1] if finite else math.inf)
    return None


def histogram_delta_quantile(q: float, previous: Buckets | None, current: Buckets | None) -> float | None:
    """:func:`histogram_quantile_upper` of the observations between two scrapes of one histogram.

    None when either scrape lacks the histogram. A changed bucket layout or a count that went down
    (server restart) counts from zero."""
    if previous is None or current is None:
        return None
    before = dict(previous)
    same_layout = [le for le, _ in previous] == [le for le, _ in current]
    if not same_layout or any(count < before[le] for le, count in current):
        before = {}  # bucket layout changed or histogram reset (restart): count from zero
    deltas = [(le, count - before.get(le, 0.0)) for le, count in current]
    return histogram_quantile_upper(q, deltas)
