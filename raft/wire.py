"""The Raft transport's wire format: length-prefixed frames carrying a strict, pickle-free encoding
of pysyncobj's message dicts, checked against a schema per message type.

pysyncobj's own transport pickles every message (``pickle.loads`` of whatever arrives once the Fernet
layer accepts it). Here nothing on the wire is ever unpickled: a message is a tree of ``None``,
``bool``, 64-bit ``int``, ``bytes``, ``str``, ``list``, ``tuple`` and ``dict`` with ``str`` keys, encoded
with one tag byte per value. Decoding allocates nothing the frame does not already pay for (every
element costs at least one byte, so counts are bounded by the frame length) and is bounded in depth.

Which values pysyncobj 0.3.17 puts in its messages (``syncobj.py``), and therefore the schema below:

* ``request_vote``: term, last_log_index, last_log_term (ints); ``response_vote``: term;
  ``timeout_now``: term.
* ``append_entries``: term, commit_index; then either ``prevLogIdx``/``prevLogTerm`` with ``entries``
  (a list of ``(command bytes, index, term)`` tuples) or with ``transmission`` (``start``/``process``/
  ``finish``) and ``data`` (a chunk of one large entry), or ``serialized``: ``None`` or
  ``(chunk bytes, is_first, is_last)`` of a snapshot transfer.
* ``next_node_idx``: next_node_idx (int), reset, success (bools).
* ``apply_command``: command (bytes), optional request_id; ``apply_command_response``: request_id and
  either error or log_idx/log_term (ints).

Membership changes travel as log entries (``command`` bytes), not as messages of their own.

A frame is ``u32 big-endian length`` + payload; length 0 is a keep-alive ping (no payload).
"""

from __future__ import annotations

import io
import pickle  # nosec B403 - only for entry_pickle_problem's no-globals check
import struct
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">I")
HEADER_BYTES = HEADER.size
MAX_DEPTH = 4
"""Deepest nesting pysyncobj uses: message dict -> entries list -> entry tuple -> bytes."""
INT64 = struct.Struct(">q")
COUNT = struct.Struct(">I")

_NONE, _FALSE, _TRUE, _INT, _BYTES, _STR, _LIST, _TUPLE, _DICT = range(9)


class WireError(ValueError):
    """A frame or message that does not follow the format (the message says what and where)."""


# --- values -----------------------------------------------------------------------------------------


def encode(value: object) -> bytes:
    """Encode one value tree; raises :class:`WireError` for a type outside the format."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: object, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    if value is None:
        out.append(_NONE)
    elif value is True or value is False:
        out.append(_TRUE if value else _FALSE)
    elif type(value) is int:
        if not -(1 << 63) <= value < (1 << 63):
            raise WireError(f"integer {value} does not fit in 64 bits")
        out.append(_INT)
        out += INT64.pack(value)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out.append(_BYTES)
        out += COUNT.pack(len(raw))
        out += raw
    elif type(value) is str:
        raw = value.encode("utf-8")
        out.append(_STR)
        out += COUNT.pack(len(raw))
        out += raw
    elif type(value) in (list, tuple):
        seq: list[Any] | tuple[Any, ...] = value  # type: ignore[assignment]
        out.append(_LIST if type(value) is list else _TUPLE)
        out += COUNT.pack(len(seq))
        for item in seq:
            _encode(item, out, depth + 1)
    elif type(value) is dict:
        out.append(_DICT)
        out += COUNT.pack(len(value))
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(f"dict key {key!r} is not a str")
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    else:
        raise WireError(f"type {type(value).__name__} is not part of the wire format")


def decode(data: bytes) -> object:
    """Decode one value tree that must fill ``data`` exactly; raises :class:`WireError`."""
    view = memoryview(data)
    value, pos = _decode(view, 0, 0)
    if pos != len(view):
        raise WireError(f"{len(view) - pos} trailing bytes after the value")
    return value


def _need(view: memoryview, pos: int, n: int) -> None:
    if pos + n > len(view):
        raise WireError(f"truncated at byte {pos}: {n} more bytes announced, {len(view) - pos} left")


def _decode(view: memoryview, pos: int, depth: int) -> tuple[object, int]:
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH} at byte {pos}")
    _need(view, pos, 1)
    tag = view[pos]
    pos += 1
    if tag == _NONE:
        return None, pos
    if tag in (_FALSE, _TRUE):
        return tag == _TRUE, pos
    if tag == _INT:
        _need(view, pos, 8)
        return INT64.unpack_from(view, pos)[0], pos + 8
    if tag in (_BYTES, _STR, _LIST, _TUPLE, _DICT):
        _need(view, pos, 4)
        n = COUNT.unpack_from(view, pos)[0]
        pos += 4
        if tag in (_BYTES, _STR):
            _need(view, pos, n)
            raw = bytes(view[pos:pos + n])
            if tag == _BYTES:
                return raw, pos + n
            try:
                return raw.decode("utf-8"), pos + n
            except UnicodeDecodeError as exc:
                raise WireError(f"string at byte {pos} is not UTF-8") from exc
        _need(view, pos, n)  # every element takes at least one byte: counts cannot exceed the frame
        if tag == _DICT:
            out: dict[str, object] = {}
            for _ in range(n):
                key, pos = _decode(view, pos, depth + 1)
                if type(key) is not str:
                    raise WireError(f"dict key before byte {pos} is not a str")
                out[key], pos = _decode(view, pos, depth + 1)
            return out, pos
        items = []
        for _ in range(n):
            item, pos = _decode(view, pos, depth + 1)
            items.append(item)
        return (items if tag == _LIST else tuple(items)), pos
    raise WireError(f"unknown tag {tag} at byte {pos - 1}")


# --- pysyncobj message schema -----------------------------------------------------------------------


def _is_int(v: object) -> bool:
    return type(v) is int


def _is_bool(v: object) -> bool:
    return type(v) is bool


def _is_bytes(v: object) -> bool:
    return type(v) is bytes


def _is_entries(v: object) -> bool:
    return type(v) is list and all(
        type(e) is tuple and len(e) == 3 and type(e[0]) is bytes and type(e[1]) is int and type(e[2]) is int
        for e in v
    )


def _is_transmission(v: object) -> bool:
    return v in ("start", "process", "finish")


def _is_serialized(v: object) -> bool:
    return v is None or (
        type(v) is tuple and len(v) == 3 and type(v[0]) is bytes and type(v[1]) is bool and type(v[2]) is bool
    )


Check = Callable[[object], bool]
_SCHEMA: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    # type: (required keys, optional keys)
    "request_vote": ({"term": _is_int, "last_log_index": _is_int, "last_log_term": _is_int}, {}),
    "response_vote": ({"term": _is_int}, {}),
    "timeout_now": ({"term": _is_int}, {}),
    "append_entries": (
        {"term": _is_int, "commit_index": _is_int},
        {"entries": _is_entries, "prevLogIdx": _is_int, "prevLogTerm": _is_int, "transmission": _is_transmission,
         "data": _is_bytes, "serialized": _is_serialized},
    ),
    "next_node_idx": ({"next_node_idx": _is_int, "reset": _is_bool, "success": _is_bool}, {}),
    "apply_command": ({"command": _is_bytes}, {"request_id": _is_int}),
    "apply_command_response": ({"request_id": _is_int}, {"error": _is_int, "log_idx": _is_int, "log_term": _is_int}),
}


def message_problem(message: object) -> str | None:
    """Why ``message`` is not a pysyncobj message this transport delivers (None: it is one)."""
    if type(message) is not dict:
        return f"a message must be a dict, got {type(message).__name__}"
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in _SCHEMA:
        return f"unknown message type {kind!r}"
    required, optional = _SCHEMA[kind]
    for key, check in required.items():
        if key not in message:
            return f"{kind}: missing {key!r}"
        if not check(message[key]):
            return f"{kind}: bad value for {key!r}"
    for key, value in message.items():
        if key == "type" or key in required:
            continue
        check = optional.get(key)
        if check is None:
            return f"{kind}: unexpected key {key!r}"
        if not check(value):
            return f"{kind}: bad value for {key!r}"
    if kind == "append_entries":
        has_prev = "prevLogIdx" in message and "prevLogTerm" in message
        if ("prevLogIdx" in message) != ("prevLogTerm" in message):
            return "append_entries: prevLogIdx and prevLogTerm go together"
        if ("transmission" in message) != ("data" in message) or ("transmission" in message and not has_prev):
            return "append_entries: transmission needs data, prevLogIdx and prevLogTerm"
        if has_prev and "serialized" in message:
            return "append_entries: serialized (snapshot) excludes prevLogIdx"
    return None


def decode_message(payload: bytes) -> dict[str, object]:
    """Decode and schema-check one pysyncobj message; raises :class:`WireError`."""
    message = decode(payload)
    problem = message_problem(message)
    if problem is not None:
        raise WireError(problem)
    assert isinstance(message, dict)
    return message


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


PING = HEADER.pack(0)


# --- pysyncobj's one pickle: a large entry sent in chunks -------------------------------------------


class _EntryUnpickler(pickle.Unpickler):
    """Refuses every global except the one protocol-2 pickles of ``bytes`` need (``_codecs.encode``,
    replaced by a latin-1-only stand-in), so no pickle can name a class or call a function."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _latin1(text: object, encoding: object = "latin1") -> bytes:
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("only latin-1 text may become bytes")
    return text.encode("latin1")


def entry_pickle_problem(data: bytes) -> str | None:
    """pysyncobj sends a log entry larger than its batch size as chunks of ``pickle.dumps(entry)``
    and unpickles their concatenation itself. The transport checks that concatenation first: it must
    be exactly an entry tuple ``(bytes, int, int)``, built without any global (None: it is)."""
    try:
        value = _EntryUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a hostile pickle is a refusal
        return f"chunked entry is not a plain pickle: {type(exc).__name__}: {str(exc)[:80]}"
    if not (type(value) is tuple and len(value) == 3 and type(value[0]) is bytes
            and type(value[1]) is int and type(value[2]) is int):
        return "chunked entry is not a (bytes, int, int) tuple"
    return None
