"""Logging of the long-running services (coordinator, adapter): one JSON object per line on stderr.

``structlog`` (and, through ``structlog.dev``, ``rich`` when installed) costs about 0.1 s of CPU to
import, a third of what a coordinator imports before its Raft member can start; so it is imported
here, when logging is set up, and a coordinator sets it up right after its Raft member started
(``controlplane.cli.main._coordinator``). What the standard library logs before that (the Raft
node, the lease guard) waits in :func:`buffer_early_logs` (at most ``MAX_EARLY_RECORDS``) and comes out
first, in order, each stamped with the time it was logged (every standard-library record is: its
``created`` time, not the time it was formatted).
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from datetime import datetime, timezone
from typing import Any

MAX_EARLY_RECORDS = 10_000
"""Records kept before logging is set up; the oldest beyond this are written as bare text."""


def buffer_early_logs() -> logging.handlers.MemoryHandler:
    """Hold standard-library records at INFO and above until :func:`service_logging` writes them."""
    early = logging.handlers.MemoryHandler(MAX_EARLY_RECORDS, flushLevel=logging.CRITICAL + 1,
                                           target=logging.StreamHandler(sys.stderr), flushOnClose=False)
    root = logging.getLogger()
    root.handlers[:] = [early]
    root.setLevel(logging.INFO)
    return early


def _record_time(logger: Any, name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """``timestamp`` of a standard-library record: when it was logged (ISO 8601, UTC, ``Z``)."""
    record = event_dict.get("_record")
    if record is not None:
        at = datetime.fromtimestamp(record.created, tz=timezone.utc)
        event_dict["timestamp"] = at.isoformat().replace("+00:00", "Z")
    return event_dict


def service_logging(early: logging.handlers.MemoryHandler | None = None) -> None:
    """Long-running services log one JSON object per line on stderr (timestamped, with a level),
    what log collectors (Fluent Bit, Vector, Loki) ingest without a parser. ``early``: records held
    by :func:`buffer_early_logs`, written first."""
    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.JSONRenderer(sort_keys=True)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Modules that log through the standard library (the lease guard, the Raft node, pysyncobj)
    # come out as the same JSON lines instead of bare text (or nothing: no handler by default).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, _record_time],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(sort_keys=True)],
    ))
    if early is not None:  # the held records first, then the handler takes over (the second flush
        early.setTarget(handler)  # writes what arrived in between)
        early.flush()
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    if early is not None:
        early.flush()
        early.close()
