"""Rate-series workloads: a request rate per time window (the ServeGen format) turned into seeded
request arrivals.

Format (``alibaba/ServeGen`` aggregate rates, as in ``shared/traces/servegen_*_rate_10min.csv``)::

    window_start_s,total_rate_rps
    0,212.780000
    600,179.698333

``window_start_s`` strictly increasing, rates finite and >= 0. A window lasts until the next one
starts; the last lasts as long as the one before it (600 s when the file has one row).

Arrivals are a non-homogeneous Poisson process whose rate is the series compressed in time by
``time_compression`` (C): trace second ``t`` happens at simulated second ``(t - from_s) / C``, and the
rate there is ``rate_scale x`` the file's rate. Compression speeds the envelope up, it does not raise
the rate (a 14-day series at C = 336 plays in an hour at the file's per-second rates x ``rate_scale``).
Between windows the rate is a step (``interpolation: step``, the file's meaning: an average per
window) or linear from one window start to the next (``interpolation: linear``). Each segment is drawn
exactly: exponential gaps at the segment's peak rate, each kept with probability rate/peak (thinning;
for a step every candidate is kept).

Token lengths come as (prompt, output) pairs drawn with replacement from an Azure-format trace, so
their joint distribution is the trace's, or, with no trace, from the built-in log-normal of
:func:`controlplane.sim.workload.lognormal_int`.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.sim.workload import Request, TraceError

RATE_COLUMNS = ("window_start_s", "total_rate_rps")
MAX_RATE_RPS = 1e9


@dataclass(frozen=True, slots=True)
class RateSeries:
    starts_s: tuple[float, ...]
    rates_rps: tuple[float, ...]

    def end_s(self) -> float:
        if len(self.starts_s) == 1:
            return self.starts_s[0] + 600.0
        return self.starts_s[-1] + (self.starts_s[-1] - self.starts_s[-2])


def read_rate_series(path: str | Path) -> RateSeries:
    """Read a ServeGen rate series; any malformed row raises :class:`TraceError` naming ``FILE:LINE``."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
    starts: list[float] = []
    rates: list[float] = []
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file (expected header {','.join(RATE_COLUMNS)})")
            if tuple(h.strip() for h in header) != RATE_COLUMNS:
                raise TraceError(f"{path}:1: header must be {','.join(RATE_COLUMNS)}, got {','.join(header)!r}")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != 2:
                    raise TraceError(f"{where}: expected 2 fields, got {len(row)}")
                start = _number(where, "window_start_s", row[0], 0.0, 1e12)
                rate = _number(where, "total_rate_rps", row[1], 0.0, MAX_RATE_RPS)
                if starts and start <= starts[-1]:
                    raise TraceError(f"{where}: window_start_s: must increase ({row[0].strip()} after {starts[-1]:g})")
                starts.append(start)
                rates.append(rate)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}:{reader.line_num}: unreadable row: {exc}") from None
    if not starts:
        raise TraceError(f"{path}: no rows after the header")
    return RateSeries(tuple(starts), tuple(rates))


def _number(where: str, field: str, text: str, lo: float, hi: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {field}: not a number ({text.strip()!r})") from None
    if not (math.isfinite(value) and lo <= value <= hi):
        raise TraceError(f"{where}: {field}: must be a finite number between {lo:g} and {hi:g}, got {text.strip()!r}")
    return value


@dataclass(frozen=True, slots=True)
class RatePlan:
    """The series cut to ``[from_s, to_s)`` (trace seconds) and mapped to simulated seconds."""

    segments: tuple[tuple[float, float, float, float], ...]
    """(start_s, end_s, rate at start, rate at end) in simulated seconds and requests/s."""

    def expected_requests(self) -> float:
        return sum((b - a) * (r0 + r1) / 2 for a, b, r0, r1 in self.segments)

    def duration_s(self) -> float:
        return self.segments[-1][1] if self.segments else 0.0


def plan(series: RateSeries, *, time_compression: float, rate_scale: float, from_s: float = 0.0,
         to_s: float | None = None, linear: bool = False) -> RatePlan:
    end = series.end_s() if to_s is None else min(to_s, series.end_s())
    bounds = list(series.starts_s[1:]) + [series.end_s()]
    segments = []
    for i, (a, b) in enumerate(zip(series.starts_s, bounds, strict=True)):
        lo, hi = max(a, from_s), min(b, end)
        if hi <= lo:
            continue
        r_next = series.rates_rps[i + 1] if linear and i + 1 < len(series.rates_rps) else series.rates_rps[i]

        def rate(t: float, a: float = a, b: float = b, r0: float = series.rates_rps[i], r1: float = r_next) -> float:
            return r0 + (r1 - r0) * (t - a) / (b - a)

        segments.append(((lo - from_s) / time_compression, (hi - from_s) / time_compression,
                         rate(lo) * rate_scale, rate(hi) * rate_scale))
    return RatePlan(tuple(segments))


Lengths = Callable[[random.Random], tuple[int, int]]


def lengths_from_pairs(pairs: Sequence[tuple[int, int]]) -> Lengths:
    """Draw (prompt, output) pairs uniformly with replacement (the trace's joint distribution)."""
    frozen = tuple(pairs)
    return lambda rng: frozen[rng.randrange(len(frozen))]


def arrivals(rate_plan: RatePlan, rng: random.Random, lengths: Lengths, *, start_ms: int = 0) -> list[Request]:
    """Seeded arrivals of the non-homogeneous Poisson process of ``rate_plan`` (see the module doc)."""
    out: list[Request] = []
    for a, b, r0, r1 in rate_plan.segments:
        peak = max(r0, r1)
        if peak <= 0:
            continue
        t = a
        while True:
            t += rng.expovariate(peak)
            if t >= b:
                break
            if r0 != r1 and rng.random() * peak > r0 + (r1 - r0) * (t - a) / (b - a):
                continue
            prompt, output = lengths(rng)
            out.append(Request(start_ms + int(t * 1000), prompt, output))
    return out
