"""Objects as people write them in files: the Kubernetes-style envelope of ``tenantctl apply -f``.

::

    apiVersion: controlplane.io/v1
    kind: Tenant            # Tenant | Deployment | Cluster | Zone
    metadata:
      name: team-a
      resourceVersion: 42   # optional: the write happens only at this version
    spec:
      priority: 100

A file holds YAML documents (``---``) or JSON (one object, a list of objects, or
``{"kind": "List", "items": [...]}``; YAML documents may be such Lists too). Validation is strict and
complete before anything is sent: unknown fields, wrong types, YAML syntax errors and values the
control plane would refuse are reported as one line each, naming the file (and line), the object and
the field::

    tenants.yaml:7: object 2 (Tenant/team-b): spec.quota.h100: must be >= 0, got -1

The spec models are the ones the API server validates with (:mod:`controlplane.specs`), followed by
the domain constructors, so the client refuses exactly what the server would refuse.
``status`` and the output-only ``metadata.createdMs`` / ``metadata.updatedMs`` are accepted and
ignored, so ``tenantctl get ... -o yaml`` output can be applied again.

Size caps (docs/tenantctl.md "Limits"): a file (or stdin) over :data:`MAX_MANIFEST_BYTES` is refused
before it is parsed, and a YAML document whose aliases would expand it beyond
:data:`MAX_MANIFEST_NODES` nodes (a "billion laughs"), or that nests too deeply, is refused before it
is built: a one-line problem each, never a traceback, never minutes of CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as _field
from pathlib import Path
from typing import Any

import pydantic
import yaml
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict

from controlplane.api.v1 import api_pb2
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import id_problem
from controlplane.domain.labels import labels_problem
from controlplane.domain.topology import Cluster, Zone
from controlplane.specs import (
    ClusterSpec,
    DeploymentBase,
    TenantSpec,
    ZoneSpec,
    deployment_of,
    did_you_mean,
    tenant_of,
    unknown_field,
    without,
)

API_VERSION = "controlplane.io/v1"
KINDS = ("Zone", "Cluster", "Tenant", "Deployment")
"""Every kind, in the order ``apply`` sends them (a cluster names a zone, a deployment a tenant);
``delete -f`` goes in the reverse order."""
ENVELOPE_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
METADATA_FIELDS = frozenset({"name", "labels", "resourceVersion", "createdMs", "updatedMs", "creationTimestamp",
                             "updateTimestamp"})
"""``createdMs``/``updatedMs`` (``-o json``) and ``creationTimestamp``/``updateTimestamp`` (``-o yaml``)
are output-only: accepted and ignored."""
MAX_PROBLEMS = 20
MAX_MANIFEST_BYTES = 1 << 20
"""Largest manifest file (or stdin) read: 1 MiB holds thousands of objects (one is ~300 bytes)."""
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML has it: the pure-Python one takes ~10 s of CPU per MiB."""
MAX_MANIFEST_NODES = 100_000
"""Most YAML nodes one document may stand for, every use of an alias counted in full."""


class ManifestError(Exception):
    """One or more problems, one line each (already prefixed with file, object and field)."""

    def __init__(self, problems: list[str]) -> None:
        problems = list(dict.fromkeys(problems))  # each problem once, in order
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Manifest:
    kind: str
    name: str
    resource_version: int
    spec: dict[str, Any]
    """The spec fields the file sets, validated and converted (defaults are the server's)."""
    source: str
    index: int
    """1-based position of the object in its file."""
    line: int = 0
    labels: Mapping[str, str] = _field(default_factory=dict)
    """``metadata.labels`` (validated: :mod:`controlplane.domain.labels`); a write sets them as given."""

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.name}"

    @property
    def address(self) -> str:
        """The name that Get/Delete/Explain requests give for this object: a deployment's
        ``<tenant>/<name>`` (deployment names are per tenant; a tenant principal may qualify its own)."""
        tenant = self.spec.get("tenant") if self.kind == "Deployment" else None
        return f"{tenant}/{self.name}" if tenant else self.name

    @property
    def where(self) -> str:
        line = f":{self.line}" if self.line else ""
        return f"{self.source}{line}: object {self.index} ({self.kind}/{self.name})"

    def to_proto(self) -> Any:
        """The API message (``api_pb2.Tenant``, ``Deployment``, ``Cluster`` or ``Zone``)."""
        cls = getattr(api_pb2, self.kind)
        spec_cls = getattr(api_pb2, f"{self.kind}Spec")
        spec = json_format.ParseDict(self.spec, spec_cls())
        meta = api_pb2.ObjectMeta(name=self.name, resource_version=self.resource_version, labels=dict(self.labels))
        return cls(metadata=meta, spec=spec)


# --------------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------------


@dataclass
class _Doc:
    data: Any
    node: yaml.Node | None
    line: int


def load_files(paths: Iterable[str], stdin_text: str | None = None) -> list[Manifest]:
    """Every object of every file (``-`` reads ``stdin_text``), validated; raises
    :class:`ManifestError` listing every problem (nothing is valid unless everything is)."""
    problems: list[str] = []
    out: list[Manifest] = []
    for path in paths:
        name = "<stdin>" if path == "-" else path
        if path == "-":
            text = stdin_text or ""
            if len(text.encode("utf-8", "replace")) > MAX_MANIFEST_BYTES:
                problems.append(f"<stdin>: more than {MAX_MANIFEST_BYTES} bytes: larger than a manifest may be "
                                "(split it into several files)")
                continue
        else:
            try:
                size = Path(path).stat().st_size
                if size > MAX_MANIFEST_BYTES:
                    problems.append(f"{path}: {size} bytes: larger than the {MAX_MANIFEST_BYTES}-byte limit of a "
                                    "manifest (split it into several files)")
                    continue
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                problems.append(f"{path}: cannot read: {exc.strerror or exc}")
                continue
            except UnicodeDecodeError:
                problems.append(f"{path}: not UTF-8 text")
                continue
        try:
            out.extend(parse_text(text, name))
        except ManifestError as exc:
            problems.extend(exc.problems)
    seen: dict[tuple[str, str], str] = {}
    for m in out:
        key = (m.kind, m.address)  # deployment names are per tenant
        if key in seen:
            problems.append(f"{m.where}: {m.kind}/{m.name} is also defined at {seen[key]}")
        else:
            seen[key] = m.where.split(" (")[0]
    if not out and not problems:
        problems.append(f"{', '.join('<stdin>' if p == '-' else p for p in paths)}: no objects found")
    if problems:
        raise ManifestError(problems[:MAX_PROBLEMS] + (
            [f"... and {len(problems) - MAX_PROBLEMS} more problems"] if len(problems) > MAX_PROBLEMS else []))
    return out


def parse_text(text: str, source: str) -> list[Manifest]:
    """The objects in one file's text (YAML documents or JSON)."""
    docs = _json_docs(text, source) if _looks_like_json(text, source) else _yaml_docs(text, source)
    problems: list[str] = []
    out: list[Manifest] = []
    index = 0
    for doc in docs:
        for data, node in _flatten(doc, source, problems):
            index += 1
            try:
                out.append(parse_object(data, source, index, node))
            except ManifestError as exc:
                problems.extend(exc.problems)
    if problems:
        raise ManifestError(problems)
    return out


def _looks_like_json(text: str, source: str) -> bool:
    return source.endswith(".json") or text.lstrip()[:1] in ("{", "[")


def _json_docs(text: str, source: str) -> list[_Doc]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError([f"{source}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})"]) from None
    except RecursionError:
        raise ManifestError([f"{source}: not valid JSON: nested too deeply"]) from None
    return [_Doc(data, None, 0)]


def _yaml_docs(text: str, source: str) -> list[_Doc]:
    loader = _LOADER(text)
    docs: list[_Doc] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if _expanded_nodes(node, MAX_MANIFEST_NODES) is None:
                raise ManifestError([f"{source}:{node.start_mark.line + 1}: refused: the document's aliases expand "
                                     f"it beyond {MAX_MANIFEST_NODES} nodes, or refer to themselves"])
            dup = _duplicate_key(node)
            if dup:
                raise ManifestError([f"{source}:{dup[0]}: not valid YAML: duplicate key {dup[1]!r}"])
            docs.append(_Doc(loader.construct_document(node), node, node.start_mark.line + 1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ManifestError([f"{source}{where}: not valid YAML: {problem}"]) from None
    except RecursionError:
        raise ManifestError([f"{source}: not valid YAML: nested too deeply"]) from None
    finally:
        loader.dispose()
    return docs


def _children(n: yaml.Node) -> list[yaml.Node]:
    if isinstance(n, yaml.MappingNode):
        return [x for kv in n.value for x in kv]
    if isinstance(n, yaml.SequenceNode):
        return list(n.value)
    return []


def _expanded_nodes(root: yaml.Node, limit: int) -> int | None:
    """How many nodes ``root`` stands for with every alias expanded (without expanding them: each
    shared node is sized once); None beyond ``limit`` or for an alias cycle."""
    sizes: dict[int, int] = {}
    path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            path.discard(id(n))
            total = 1 + sum(sizes[id(k)] for k in _children(n))
            if total > limit:
                return None
            sizes[id(n)] = total
            continue
        if id(n) in sizes:
            continue
        if id(n) in path:
            return None
        path.add(id(n))
        stack.append((n, True))
        stack.extend((k, False) for k in _children(n) if id(k) not in sizes)
    return sizes[id(root)]


def _duplicate_key(node: yaml.Node) -> tuple[int, str] | None:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            keys: set[str] = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in keys:
                        return k.start_mark.line + 1, k.value
                    keys.add(k.value)
                stack.append(v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return None


def _flatten(doc: _Doc, source: str, problems: list[str]) -> list[tuple[Any, yaml.Node | None]]:
    """A document is one object, a list of objects, or a ``kind: List`` with ``items``."""
    data, node = doc.data, doc.node
    if data is None:
        return []
    if isinstance(data, list):
        return [(item, _child(node, i)) for i, item in enumerate(data)]
    if isinstance(data, dict) and data.get("kind") == "List":
        extra = sorted(set(data) - {"apiVersion", "kind", "items", "metadata"})
        items = data.get("items")
        if extra or not isinstance(items, list):
            field = extra[0] if extra else "items"
            problems.append(f"{source}{_line_suffix(node, [field])}: List: {field}: "
                            + ("unknown field" if extra else "must be a list of objects"))
            return []
        items_node = _child(node, "items")
        return [(item, _child(items_node, i)) for i, item in enumerate(items)]
    return [(data, node)]


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key]
    return None


def _line_of(node: yaml.Node | None, path: Iterable[str | int]) -> int:
    """The line of the deepest node of ``path`` that exists (0 when unknown, e.g. JSON)."""
    if node is None:
        return 0
    line = node.start_mark.line + 1
    for key in path:
        child = _child(node, key)
        if child is None:
            if isinstance(node, yaml.MappingNode) and isinstance(key, str):
                for k, _v in node.value:  # the key itself, for an unknown field
                    if isinstance(k, yaml.ScalarNode) and k.value == key:
                        return k.start_mark.line + 1
            break
        node = child
        line = node.start_mark.line + 1
    return line


def _line_suffix(node: yaml.Node | None, path: Iterable[str | int]) -> str:
    line = _line_of(node, path)
    return f":{line}" if line else ""


# --------------------------------------------------------------------------------------------------
# One object
# --------------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_object(data: Any, source: str, index: int, node: yaml.Node | None = None) -> Manifest:
    """Validate one envelope; raises :class:`ManifestError` with every problem found."""
    if not isinstance(data, dict):
        raise ManifestError([(f"{source}{_line_suffix(node, [])}: object {index}: must be a mapping with apiVersion, "
                             f"kind, metadata and spec, got {type(data).__name__}")])
    kind = data.get("kind")
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    label = f"{kind if isinstance(kind, str) and kind else '?'}/{name if isinstance(name, str) and name else '?'}"
    problems: list[str] = []

    def problem(path: list[str | int], message: str) -> None:
        field = ".".join(str(p) for p in path)
        problems.append(f"{source}{_line_suffix(node, path)}: object {index} ({label}): {field}: {message}")

    for key in sorted(set(data) - ENVELOPE_FIELDS, key=str):
        problem([key], "unknown field" + (did_you_mean(key, ENVELOPE_FIELDS) or
                                          " (expected apiVersion, kind, metadata, spec)"))
    api_version = data.get("apiVersion")
    if api_version is None:
        problem(["apiVersion"], f"required ({API_VERSION})")
    elif api_version != API_VERSION:
        problem(["apiVersion"], f"must be {API_VERSION!r}, got {_short(api_version)}")
    if kind is None:
        problem(["kind"], f"required (one of {', '.join(KINDS)})")
    elif kind not in KINDS:
        hint = next((k for k in KINDS if isinstance(kind, str) and k.lower() == kind.lower().rstrip("s")), None)
        problem(["kind"], f"must be one of {', '.join(KINDS)}, got {_short(kind)}"
                + (f" (did you mean {hint!r}?)" if hint else ""))
    resource_version = 0
    if not isinstance(meta, dict):
        problem(["metadata"], "required: a mapping with name" if meta is None else
                f"must be a mapping with name, got {type(meta).__name__}")
    else:
        for key in sorted(set(meta) - METADATA_FIELDS, key=str):
            problem(["metadata", key], "unknown field" + (did_you_mean(key, METADATA_FIELDS) or
                                                          " (expected name, labels, resourceVersion)"))
        if name is None:
            problem(["metadata", "name"], "required")
        elif kind == "Deployment" and isinstance(name, str) and "/" in name:
            problem(["metadata", "name"], f"{_short(name)} is qualified: metadata.name is the name within the "
                                          "tenant (one label, e.g. 'chat'); the tenant goes in spec.tenant")
        else:
            why = id_problem(name)
            if why:
                problem(["metadata", "name"], why)
        rv = meta.get("resourceVersion", 0)
        if isinstance(rv, bool) or not isinstance(rv, int) or rv < 0:
            problem(["metadata", "resourceVersion"], f"must be an integer >= 0, got {_short(rv)}")
        else:
            resource_version = rv
        for key in ("createdMs", "updatedMs"):
            if key in meta and (isinstance(meta[key], bool) or not isinstance(meta[key], int)):
                problem(["metadata", key], f"must be an integer, got {_short(meta[key])}")
        for key in ("creationTimestamp", "updateTimestamp"):
            if key in meta and not isinstance(meta[key], str):
                problem(["metadata", key], f"must be an RFC 3339 time (it is ignored), got {_short(meta[key])}")
        labels = meta.get("labels") or {}
        found = labels_problem(labels)
        if found:
            key, why = found
            problem(["metadata", "labels", *([key] if key else [])], why)
    spec = data.get("spec")
    if spec is None and kind == "Zone":
        spec = {}
    if spec is None:
        problem(["spec"], "required" + (": at least priority" if kind == "Tenant" else ""))
    elif not isinstance(spec, dict):
        problem(["spec"], f"must be a mapping, got {type(spec).__name__}")
    elif kind in KINDS and isinstance(name, str):
        for path, message in _spec_problems(kind, name, spec):
            problem(path, message)
    status = data.get("status")
    if status is not None and not isinstance(status, dict):
        problem(["status"], f"must be a mapping (it is ignored), got {type(status).__name__}")
    if problems:
        raise ManifestError(problems)
    assert isinstance(kind, str) and isinstance(name, str) and isinstance(spec, dict)
    assert isinstance(meta, dict)
    labels = dict(sorted((meta.get("labels") or {}).items()))
    return Manifest(kind, name, resource_version, _spec_values(kind, name, spec), source, index,
                    _line_of(node, []), labels)


_MODELS: dict[str, type[BaseModel]] = {
    "Tenant": TenantSpec, "Deployment": DeploymentBase, "Cluster": ClusterSpec, "Zone": ZoneSpec,
}


def _validated(kind: str, name: str, spec: Mapping[str, Any]) -> BaseModel:
    model = _MODELS[kind]
    if kind in ("Tenant", "Deployment"):
        if "id" in spec:
            raise _Unknown(["spec", "id"])
        return model.model_validate({**spec, "id": name})
    return model.model_validate(dict(spec))


class _Unknown(Exception):
    def __init__(self, path: list[str | int]) -> None:
        self.path = path


def _spec_problems(kind: str, name: str, spec: Mapping[str, Any]) -> list[tuple[list[str | int], str]]:
    try:
        model = _validated(kind, name, spec)
    except _Unknown as exc:
        return [(exc.path, "unknown field (the name is metadata.name)")]
    except pydantic.ValidationError as exc:
        problems = [_pydantic_problem(kind, err) for err in exc.errors(include_url=False)]
        # the fields the schema accepted still get the domain's checks (all problems at once)
        pruned = without(spec, [err["loc"] for err in exc.errors(include_url=False)])
        try:
            model = _validated(kind, name, pruned)
        except (pydantic.ValidationError, _Unknown):
            return problems
        seen = {tuple(path) for path, _ in problems}
        return problems + [(path, why) for path, why in _domain_problems(kind, name, model) if tuple(path) not in seen]
    return _domain_problems(kind, name, model)


def _domain_problems(kind: str, name: str, model: Any) -> list[tuple[list[str | int], str]]:
    try:
        _domain_check(kind, name, model)
    except ValidationError as exc:
        return [(_domain_path(kind, f), problem) for f, problem in exc.problems]
    return []


def _pydantic_problem(kind: str, err: Any) -> tuple[list[str | int], str]:
    loc = list(err["loc"])
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
        return (["spec", *loc], f"invalid key: {str(err['msg']).removeprefix('Value error, ')}")
    if loc == ["id"]:
        return (["metadata", "name"], str(err["msg"]).removeprefix("Value error, "))
    if err["type"] == "extra_forbidden":
        return (["spec", *loc], unknown_field(_MODELS[kind], loc))
    if err["type"] == "missing":
        return (["spec", *loc], "required")
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if not isinstance(value, (dict, list)) and "got" not in msg:
        msg += f", got {_short(value)}"
    return (["spec", *loc], msg[:1].lower() + msg[1:])


def _domain_path(kind: str, field: str) -> list[str | int]:
    head, _, rest = field.partition(".")
    if head in ("tenant", "deployment", "cluster", "zone", "spec"):
        field = rest
    if field == "id":
        return ["metadata", "name"]
    return ["spec", *field.split(".")]


def _domain_check(kind: str, name: str, model: Any) -> None:
    if kind == "Tenant":
        tenant_of(model)
    elif kind == "Deployment":
        deployment_of(model, "spec")
    elif kind == "Cluster":
        Cluster(id=name, zone=model.zone, region=model.region, capacity=dict(model.capacity),  # type: ignore[arg-type]
                adapter_address=model.adapter_address)
    else:
        Zone(id=name, region=model.region)  # type: ignore[arg-type]


def _spec_values(kind: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The validated values of the fields the file sets (unset ones take the server's defaults)."""
    values = _validated(kind, name, spec).model_dump(exclude_unset=True)
    values.pop("id", None)
    return values


# --------------------------------------------------------------------------------------------------
# API objects -> plain data (what -o yaml / -o json print)
# --------------------------------------------------------------------------------------------------


def plain(message: Any) -> dict[str, Any]:
    """The fields a message has set, as plain Python values (int64 stays int, maps become dicts)."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                out[field.name] = {k: plain(v) for k, v in sorted(value.items())}
            else:
                out[field.name] = dict(sorted(value.items()))
        elif field.is_repeated:
            out[field.name] = [plain(v) if field.message_type is not None else v for v in value]
        elif field.message_type is not None:
            out[field.name] = plain(value)
        else:
            out[field.name] = value
    return out


def envelope(kind: str, obj: Any) -> dict[str, Any]:
    """An API object in the file format (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``)."""
    meta = obj.metadata
    metadata: dict[str, Any] = {"name": meta.name}
    if meta.resource_version:
        metadata["resourceVersion"] = meta.resource_version
    if meta.created_ms:
        metadata["createdMs"] = meta.created_ms
    if meta.updated_ms:
        metadata["updatedMs"] = meta.updated_ms
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": plain(obj.spec)}
    if obj.HasField("status"):
        out["status"] = plain(obj.status)
    return out


def list_envelope(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "List", "items": items}
