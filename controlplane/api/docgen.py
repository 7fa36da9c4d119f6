"""Generate the API reference in ``docs/api.md`` from the proto files' comments (``make docs``).

The proto files are the source of truth; their comments are the documentation. ``render()`` compiles
them with grpcio-tools (keeping source info), and writes one section per service (methods with
request and response types) and one table per message (fields, types, comments). The reference sits
between two markers in ``docs/api.md``; everything outside them (overview, grpcurl examples) is
hand-written. A test regenerates it and fails when the committed text is stale.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

from controlplane.api.protogen import PROTO_ROOT, REPO

DOC = REPO / "docs" / "api.md"
BEGIN = "<!-- BEGIN GENERATED REFERENCE (make docs; edit the .proto comments instead) -->"
END = "<!-- END GENERATED REFERENCE -->"
DOCUMENTED = ("controlplane/api/v1/api.proto", "controlplane/api/v1/admin.proto")

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
}
# Paths into FileDescriptorProto (descriptor.proto field numbers).
_MESSAGE, _SERVICE, _FIELD, _METHOD = 4, 6, 2, 2


def _descriptors() -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc  # a test/development dependency only

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{PROTO_ROOT}", "--include_source_info", f"--descriptor_set_out={out}",
                *(str(PROTO_ROOT / p) for p in DOCUMENTED)]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _comment(comments: dict[tuple[int, ...], str], path: tuple[int, ...]) -> str:
    return " ".join(comments.get(path, "").split())


def _type(f: descriptor_pb2.FieldDescriptorProto, maps: dict[str, tuple[str, str]]) -> str:
    name = _SCALARS.get(f.type) or f.type_name.rsplit(".", 1)[-1]
    if f.type_name in maps:
        k, v = maps[f.type_name]
        return f"map<{k}, {v}>"
    if f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {name}"
    if f.proto3_optional:
        return f"optional {name}"
    return name


def _file_section(fd: descriptor_pb2.FileDescriptorProto) -> list[str]:
    comments = {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}
    maps: dict[str, tuple[str, str]] = {}
    for m in fd.message_type:
        for nested in m.nested_type:
            if nested.options.map_entry:
                key, value = nested.field
                maps[f".{fd.package}.{m.name}.{nested.name}"] = (
                    _SCALARS.get(key.type, "?"), _SCALARS.get(value.type) or value.type_name.rsplit(".", 1)[-1])
    lines = [f"### `{fd.name}`", ""]
    for si, svc in enumerate(fd.service):
        lines += [f"#### service `{fd.package}.{svc.name}`", ""]
        about = _comment(comments, (_SERVICE, si))
        if about:
            lines += [about, ""]
        lines += ["| Method | Request | Response | Notes |", "|---|---|---|---|"]
        for mi, m in enumerate(svc.method):
            out = m.output_type.rsplit(".", 1)[-1]
            out = f"stream {out}" if m.server_streaming else out
            note = _comment(comments, (_SERVICE, si, _METHOD, mi)).replace("|", "\\|")
            lines.append(f"| `{m.name}` | `{m.input_type.rsplit('.', 1)[-1]}` | `{out}` | {note} |")
        lines.append("")
    for mi, msg in enumerate(fd.message_type):
        lines += [f"#### message `{msg.name}`", ""]
        about = _comment(comments, (_MESSAGE, mi))
        if about:
            lines += [about, ""]
        if not msg.field:
            lines += ["(no fields)", ""]
            continue
        lines += ["| Field | Type | Notes |", "|---|---|---|"]
        for fi, f in enumerate(msg.field):
            note = _comment(comments, (_MESSAGE, mi, _FIELD, fi)).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{_type(f, maps)}` | {note} |")
        lines.append("")
    return lines


def render() -> str:
    """The generated reference (without the markers)."""
    files = {fd.name: fd for fd in _descriptors().file}
    lines: list[str] = []
    for name in DOCUMENTED:
        lines += _file_section(files[name])
    return "\n".join(lines).rstrip() + "\n"


def updated(text: str, reference: str) -> str:
    """``text`` with the part between the markers replaced by ``reference``."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n\n{reference}\n{END}{tail}"


def main() -> int:
    DOC.write_text(updated(DOC.read_text(encoding="utf-8"), render()), encoding="utf-8")
    print(f"updated {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
