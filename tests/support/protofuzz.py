"""Hypothesis strategies for any protobuf message, derived from its descriptor.

Requests built this way exercise what a hostile or buggy client can send: every field may be unset
or set; ids are sometimes valid, sometimes near-valid (upper case, too long, empty, unicode); numbers
hit the edges of their wire type (0, -1, 2**31, 2**63-1, NaN, infinity); maps carry random keys;
nested messages recurse to a bounded depth. Nothing here knows the API's semantics, so the server's
validation is tested against inputs its authors did not think of.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

MAX_DEPTH = 4

_IDS = st.sampled_from(["a", "team-a", "team-b", "chat", "gpu-a1", "az-a", "h100", "llama3-8b-h100", "vllm",
                        "triton", "deepspeed-mii", "tenant", "admin", "Team-A", "-x", "x-", "a" * 64, "",
                        "a b", "ü", "../etc", "x\n", "0123456789ab"])
_TEXT = st.one_of(_IDS, st.text(max_size=80), st.text(alphabet="abc-", min_size=1, max_size=70))

_INT_EDGES = [0, 1, -1, 2, 8, 64, 1000, 1_000_000, 1_000_001, 2**31 - 1, -(2**31), 2**53, 2**63 - 1, -(2**63)]


def _int_strategy(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([v for v in _INT_EDGES if lo <= v <= hi]), st.integers(lo, hi))


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_INT64: _int_strategy(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: _int_strategy(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: _int_strategy(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: _int_strategy(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT64: _int_strategy(0, 2**64 - 1),
    FieldDescriptor.TYPE_UINT32: _int_strategy(0, 2**32 - 1),
    FieldDescriptor.TYPE_DOUBLE: st.one_of(st.sampled_from([0.0, -1.0, 0.5, 1.0, 1e308, float("nan"), float("inf")]),
                                           st.floats(allow_nan=True, allow_infinity=True)),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_STRING: _TEXT,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
}


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    return _SCALARS[field.type]


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED


@st.composite
def _fill(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue  # unset
        if _is_map(field):
            key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            values[field.name] = draw(st.dictionaries(_value(key_field, depth), _value(value_field, depth), max_size=3))
        elif _is_repeated(field):
            values[field.name] = draw(st.lists(_value(field, depth), max_size=3))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < MAX_DEPTH:
                values[field.name] = draw(_value(field, depth))
        else:
            values[field.name] = draw(_value(field, depth))
    return values


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random instances of the message type ``descriptor`` (built through its Python class)."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, value in values.items():
            field = descriptor.fields_by_name[name]
            if _is_map(field):
                target = getattr(msg, name)
                for k, v in value.items():
                    if isinstance(v, Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif _is_repeated(field):
                target = getattr(msg, name)
                for v in value:
                    if isinstance(v, Message):
                        target.add().CopyFrom(v)
                    else:
                        target.append(v)
            elif isinstance(value, Message):
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return _fill(descriptor, depth).map(build)


# --- near-valid requests: a valid message with one or two fields broken ---------------------------------

NASTY_STRINGS = ["", " ", "Bad_Name", "UPPER", "a" * 64, "a" * 1000, "-x", "x-", "x\n", "ü", "../etc", "a b",
                 "\x00", "tensorrt", "vllm ", "no-such-model", "root", "Gadget", "127.0.0.1:0", "localhost:99999",
                 "host:-1", ":", "0", "h100", "team-b"]
NASTY_INTS = [0, -1, -2, -(2**31), -(2**63), 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 100_001, 1_000_001]
NASTY_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, -1.0, 0.0, 1e308, 5e-324, 1e-300]
HUGE_MAP = 300
"""Entries in a "huge map" mutation."""

_RANGES = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
}


def _nasty(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """A value of ``field``'s type chosen to break validation (edges, NaN, bad ids), or a random one."""
    t = field.type
    if t in _RANGES:
        lo, hi = _RANGES[t]
        return st.one_of(st.sampled_from([v for v in NASTY_INTS if lo <= v <= hi]), _SCALARS[t])
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(NASTY_FLOATS), _SCALARS[t])
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(NASTY_STRINGS), _TEXT)
    if t == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, MAX_DEPTH - 1)
    if t == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [999])
    return _SCALARS[t]


def _paths(descriptor: Descriptor, depth: int = 0) -> list[tuple[FieldDescriptor, ...]]:
    """Every field of ``descriptor``, and those of its singular sub-messages, as paths from the root."""
    out: list[tuple[FieldDescriptor, ...]] = []
    for field in descriptor.fields:
        out.append((field,))
        if (field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field) and not _is_repeated(field)
                and depth < MAX_DEPTH):
            out += [(field, *rest) for rest in _paths(field.message_type, depth + 1)]
    return out


@st.composite
def _mutate(draw: st.DrawFn, msg: Message, path: tuple[FieldDescriptor, ...]) -> None:
    parent = msg
    for f in path[:-1]:
        parent = getattr(parent, f.name)
    field = path[-1]
    if draw(st.integers(0, 5)) == 0:  # a missing field (required ones included)
        parent.ClearField(field.name)
        return
    if _is_map(field):
        key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        target = getattr(parent, field.name)
        if draw(st.booleans()):  # one bad entry
            entries = {draw(_nasty(key_f)): draw(_nasty(value_f))}
        else:  # a huge map (valid keys, one value repeated)
            v = draw(_nasty(value_f))
            entries = {f"pool-{i}": v for i in range(HUGE_MAP)}
        for k, v in entries.items():
            if isinstance(v, Message):
                target[k].CopyFrom(v)
            else:
                target[k] = v
        return
    if _is_repeated(field):
        target = getattr(parent, field.name)
        n = draw(st.sampled_from([1, 2, HUGE_MAP]))
        values = [draw(_nasty(field)) for _ in range(min(n, 3))]
        for i in range(n):
            v = values[i % len(values)]
            if isinstance(v, Message):
                target.add().CopyFrom(v)
            else:
                target.append(v)
        return
    value = draw(_nasty(field))
    if isinstance(value, Message):
        getattr(parent, field.name).CopyFrom(value)
    else:
        setattr(parent, field.name, value)


@st.composite
def near_valid(draw: st.DrawFn, base: Message, max_mutations: int = 2) -> Message:
    """``base`` (a valid message) with one to ``max_mutations`` fields broken: cleared (a missing
    required field), set to an edge value (negative, huge, NaN, infinity, a malformed or unknown id),
    a map with a bad entry or hundreds of entries, a repeated field with bad or many items."""
    msg = type(base)()
    msg.CopyFrom(base)
    paths = _paths(base.DESCRIPTOR)
    if not paths:
        return msg
    for _ in range(draw(st.integers(1, max_mutations))):
        draw(_mutate(msg, draw(st.sampled_from(paths))))
    return msg
