"""Workloads: request arrivals from a trace file (Azure LLM inference CSV format) or a generator.

Trace format (Microsoft Azure Public Dataset, "AzureLLMInferenceTrace", CC-BY-4.0)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:17:03.9799600,4808,10

Timestamps are UTC with up to 7 fractional digits; arrival times are taken relative to the first
row. Any malformed row stops the load with a :class:`TraceError` naming the file, the line and the
field, so a user's own trace fails loudly instead of being half-read.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from controlplane.domain.errors import PermanentError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MAX_TOKENS = 10_000_000
"""Sanity bound on a single request's token counts."""


class TraceError(PermanentError):
    """A trace file could not be read; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Request:
    arrival_ms: int
    prompt_tokens: int
    output_tokens: int


def _parse_timestamp(text: str) -> float:
    """Seconds since the epoch of an Azure timestamp like ``2023-11-16 18:17:03.9799600``."""
    base, _, frac = text.strip().partition(".")
    dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    return dt.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _parse_count(where: str, field: str, text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {field}: not an integer ({text!r})") from None
    if not 0 <= value <= MAX_TOKENS:
        raise TraceError(f"{where}: {field}: must be between 0 and {MAX_TOKENS}, got {value}")
    return value


def read_azure_trace(path: str | Path, *, rate_scale: float = 1.0, limit_s: float | None = None,
                     skip_s: float = 0.0) -> list[Request]:
    """Read an Azure LLM inference trace. ``skip_s`` drops the rows of its first seconds (trace time:
    the result starts ``skip_s`` into the trace, at 0); ``rate_scale`` > 1 then compresses time (more
    load); ``limit_s`` keeps only the first seconds of the result (simulated time)."""
    path = Path(path)
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise TraceError(f"rate_scale must be a finite number > 0, got {rate_scale}")
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        return list(_rows(path, handle, rate_scale, limit_s, skip_s))


def _rows(path: Path, handle, rate_scale: float, limit_s: float | None, skip_s: float = 0.0) -> Iterator[Request]:
    reader = csv.reader(handle)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(f"{path}: empty file (expected header {','.join(AZURE_COLUMNS)})") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}:1: unreadable header: {exc}") from None
    if tuple(h.strip() for h in header) != AZURE_COLUMNS:
        raise TraceError(f"{path}:1: header must be {','.join(AZURE_COLUMNS)}, got {','.join(header)!r}")
    t0: float | None = None
    prev = -math.inf
    try:
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 3:
                raise TraceError(f"{where}: expected 3 fields, got {len(row)}")
            try:
                ts = _parse_timestamp(row[0])
            except ValueError:
                raise TraceError(f"{where}: TIMESTAMP: not a timestamp ({row[0]!r})") from None
            if ts < prev:
                raise TraceError(f"{where}: TIMESTAMP: rows must be in time order ({row[0]} is earlier than the row before)")
            prev = ts
            t0 = ts if t0 is None else t0
            if ts - t0 < skip_s:
                _parse_count(where, "ContextTokens", row[1])  # a skipped row must still be well-formed
                _parse_count(where, "GeneratedTokens", row[2])
                continue
            rel_s = (ts - t0 - skip_s) / rate_scale
            if limit_s is not None and rel_s > limit_s:
                return
            yield Request(
                arrival_ms=int(round(rel_s * 1000)),
                prompt_tokens=max(1, _parse_count(where, "ContextTokens", row[1])),
                output_tokens=max(1, _parse_count(where, "GeneratedTokens", row[2])),
            )
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}:{reader.line_num}: unreadable row: {exc}") from None


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    """Bursty on/off traffic on a diurnal envelope, with log-normal token counts."""

    duration_s: float = 600.0
    base_rps: float = 4.0
    diurnal_period_s: float = 600.0
    """Period of the sinusoidal envelope (a compressed day)."""
    diurnal_amplitude: float = 0.5
    """Envelope swings between base*(1-a) and base*(1+a)."""
    burst_every_s: float = 120.0
    """Mean time between bursts (exponential)."""
    burst_duration_s: float = 20.0
    burst_factor: float = 6.0
    """Rate multiplier during a burst."""
    prompt_mean: float = 1200.0
    output_mean: float = 200.0
    burst_group: str = ""
    """Generators with the same non-empty group burst at the same times (one event hitting several
    services: their burst windows are drawn from the group's random stream, not the deployment's)."""


def generate(spec: GeneratorSpec, rng: random.Random, *, start_ms: int = 0,
             burst_rng: random.Random | None = None) -> list[Request]:
    """Draw arrivals by thinning a Poisson process against the rate envelope (Lewis-Shedler).
    ``burst_rng``: where the burst windows are drawn (default ``rng``; the runner passes the burst
    group's stream)."""
    peak = spec.base_rps * (1 + spec.diurnal_amplitude) * max(1.0, spec.burst_factor)
    bursts = _burst_windows(spec, rng if burst_rng is None else burst_rng)
    out: list[Request] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= spec.duration_s:
            return out
        rate = _rate_at(spec, bursts, t)
        if rng.random() * peak <= rate:
            out.append(
                Request(
                    arrival_ms=start_ms + int(t * 1000),
                    prompt_tokens=lognormal_int(rng, spec.prompt_mean),
                    output_tokens=lognormal_int(rng, spec.output_mean),
                )
            )


def _burst_windows(spec: GeneratorSpec, rng: random.Random) -> list[tuple[float, float]]:
    windows, t = [], 0.0
    while spec.burst_factor > 1 and spec.burst_every_s > 0:
        t += rng.expovariate(1.0 / spec.burst_every_s)
        if t >= spec.duration_s:
            break
        windows.append((t, t + spec.burst_duration_s))
        t += spec.burst_duration_s
    return windows


def _rate_at(spec: GeneratorSpec, bursts: list[tuple[float, float]], t: float) -> float:
    envelope = 1 + spec.diurnal_amplitude * math.sin(2 * math.pi * t / spec.diurnal_period_s)
    rate = spec.base_rps * envelope
    if any(a <= t < b for a, b in bursts):
        rate *= spec.burst_factor
    return rate


def lognormal_int(rng: random.Random, mean: float, sigma: float = 0.8) -> int:
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(MAX_TOKENS, int(rng.lognormvariate(mu, sigma))))
