"""Service processes (coordinator, adapter) log one JSON object per line on stderr, including what
modules log through the standard library (the lease guard, the Raft node, pysyncobj)."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from controlplane.cli.main import _service_logging


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
    _service_logging()
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
    _service_logging()
    structlog.get_logger().info("tick_slow", took_ms=12)
    (event,) = lines(service_logging)
    assert (event["event"], event["took_ms"], event["level"]) == ("tick_slow", 12, "info")
