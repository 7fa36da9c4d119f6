"""Service processes (coordinator, adapter) log one JSON object per line on stderr, including what
modules log through the standard library (the lease guard, the Raft node, pysyncobj)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import pytest
import structlog

from controlplane.cli import logs


@pytest.fixture
def service_logging(capsys: pytest.CaptureFixture[str]):
    """Configures service logging inside the test (so it writes to capsys' stderr), then restores."""
    root = logging.getLogger()
    saved_handlers, saved_level, saved_config = root.handlers[:], root.level, structlog.get_config()
    try:
        yield capsys
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        structlog.configure(**saved_config)


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_stdlib_records_become_json_lines(service_logging) -> None:
    logs.service_logging()
    logging.getLogger("controlplane.runtime.lease_guard").warning("lost the lease at epoch %d", 7)
    logging.getLogger("raft.node").debug("below INFO: dropped")
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logging.getLogger("raft.node").exception("apply failed")
    first, second = lines(service_logging)
    assert first["event"] == "lost the lease at epoch 7"
    assert (first["level"], first["logger"]) == ("warning", "controlplane.runtime.lease_guard")
    assert first["timestamp"].endswith("Z")
    assert (second["event"], second["level"]) == ("apply failed", "error")
    assert "ZeroDivisionError: division by zero" in second["exception"]


def test_structlog_events_keep_their_json_shape(service_logging) -> None:
    logs.service_logging()
    structlog.get_logger().info("tick_slow", took_ms=12)
    (event,) = lines(service_logging)
    assert (event["event"], event["took_ms"], event["level"]) == ("tick_slow", 12, "info")


def test_records_before_logging_is_set_up_come_out_first_with_their_own_time(service_logging) -> None:
    early = logs.buffer_early_logs()  # a coordinator: Raft starts (and logs) before structlog is imported
    logging.getLogger("raft.node").info("storage opened")
    logging.getLogger("raft.node").debug("below INFO: dropped")
    (held,) = early.buffer
    logs.service_logging(early)
    logging.getLogger("controlplane.runtime.lease_guard").info("acquired the lease: epoch %d", 1)
    first, second = lines(service_logging)
    assert (first["event"], first["logger"], first["level"]) == ("storage opened", "raft.node", "info")
    stamp = datetime.fromtimestamp(held.created, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    assert first["timestamp"] == stamp  # when it was logged, not when it was written
    assert second["event"] == "acquired the lease: epoch 1"
    assert logging.getLogger().handlers[0] is not early
