"""raft/wire.py: the strict message encoding (no pickle) and the check of pysyncobj's one pickle."""

from __future__ import annotations

import os
import pickle

import pytest

from raft import wire

MESSAGES = [
    {"type": "request_vote", "term": 3, "last_log_index": 10, "last_log_term": 2},
    {"type": "response_vote", "term": 3},
    {"type": "timeout_now", "term": 4},
    {"type": "append_entries", "term": 3, "commit_index": 9, "entries": [(b"\x00", 1, 1), (b"cmd\xff", 2, 3)],
     "prevLogIdx": 0, "prevLogTerm": 0},
    {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 4, "prevLogTerm": 3,
     "transmission": "start", "data": b"chunk"},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (b"snapshot chunk", True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": None},
    {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True},
    {"type": "apply_command", "command": b"\x01pickled call", "request_id": 7},
    {"type": "apply_command_response", "request_id": 7, "log_idx": 12, "log_term": 3},
    {"type": "apply_command_response", "request_id": 8, "error": 4},
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: str(m["type"]))
def test_every_pysyncobj_message_round_trips_with_its_types(message: dict) -> None:
    back = wire.decode_message(wire.encode(message))
    assert back == message
    assert [type(v) for v in back.values()] == [type(v) for v in message.values()]  # tuples stay tuples


@pytest.mark.parametrize(("message", "words"), [
    ({"type": "request_vote", "term": 1}, "missing 'last_log_index'"),
    ({"type": "response_vote", "term": "1"}, "bad value for 'term'"),
    ({"type": "response_vote", "term": True}, "bad value for 'term'"),
    ({"type": "response_vote", "term": 1, "extra": 1}, "unexpected key 'extra'"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "entries": [(b"x", 1)], "prevLogIdx": 1,
      "prevLogTerm": 1}, "bad value for 'entries'"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "transmission": "start", "data": b""},
     "transmission needs"),
    ({"type": "shutdown"}, "unknown message type"),
    ([1, 2], "must be a dict"),
])
def test_messages_outside_the_schema_are_refused(message: object, words: str) -> None:
    with pytest.raises(wire.WireError, match=words):
        wire.decode_message(wire.encode(message))


def test_hostile_bytes_are_refused_not_executed(tmp_path) -> None:
    class Touch:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.mkdir, (str(tmp_path / "pwned"),))

    for data in (pickle.dumps(Touch()), pickle.dumps({"type": "response_vote", "term": 1}), b"", b"\x09",
                 b"\x04\xff\xff\xff\xff", b"\x06\xff\xff\xff\x00", b"\x03\x00", b"\x05\x00\x00\x00\x01\xff",
                 wire.encode(1) + b"\x00", b"\x06\x00\x00\x00\x01" * 10 + b"\x00"):
        with pytest.raises(wire.WireError):
            wire.decode_message(data)
    assert not (tmp_path / "pwned").exists()


def test_encoding_refuses_types_outside_the_format() -> None:
    for value in (1.5, object(), {1: 2}, 1 << 64, {"a": {1, 2}}):
        with pytest.raises(wire.WireError):
            wire.encode(value)


def test_the_chunked_entry_check_accepts_pysyncobjs_pickle_and_refuses_any_global(tmp_path) -> None:
    assert wire.entry_pickle_problem(pickle.dumps((b"\x00\xff payload", 5, 2), protocol=2)) is None
    assert wire.entry_pickle_problem(pickle.dumps((b"x", 5, 2), protocol=4)) is None

    class Touch:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.mkdir, (str(tmp_path / "pwned"),))

    assert "refused" in (wire.entry_pickle_problem(pickle.dumps((Touch(), 1, 1), protocol=2)) or "")
    assert "not a (bytes, int, int)" in (wire.entry_pickle_problem(pickle.dumps(("s", 1, 1))) or "")
    assert wire.entry_pickle_problem(b"garbage") is not None
    assert not (tmp_path / "pwned").exists()
