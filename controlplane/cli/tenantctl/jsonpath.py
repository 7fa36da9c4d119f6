"""kubectl's JSONPath templates for ``get -o jsonpath=TEMPLATE`` and ``--sort-by=PATH``.

kubectl does not use standard JSONPath: it has its own template language (k8s.io/client-go
util/jsonpath) whose expressions sit in braces inside literal text, with ``range``/``end`` loops
and string literals. That template layer is the point of the feature, and no Python library
implements it, while the path subset inside the braces is small; both live here (no dependency)::

    {.items[*].metadata.name}
    {range .items[*]}{.metadata.name}{"\\t"}{.spec.tenant}{"\\n"}{end}
    {.items[?(@.spec.pool=="h100")].metadata.name}
    {..name}   {.items[0]}   {.items[-1:]}   {.metadata.labels['example.com/team']}

Paths: ``.field``, ``['field']``, ``[N]`` (negative from the end), ``[A:B]``, ``[*]`` / ``.*``,
``..field`` (recursive), ``[?(@.path OP literal)]`` with ``== != < <= > >=`` (or ``[?(@.path)]`` for
presence), ``$`` or ``@`` as the root. A missing key matches nothing (kubectl's ``get`` allows
missing keys). Several matches of one expression are joined by a space; strings print as they are,
``true``/``false`` and numbers as JSON, maps and lists as JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class JsonPathError(ValueError):
    """A template or path that cannot be parsed: the message says where."""


@dataclass(frozen=True)
class Step:
    op: str
    """``field``, ``recursive``, ``index``, ``slice``, ``wild`` or ``filter``."""
    arg: Any = None


_FIELD_RE = re.compile(r"[A-Za-z0-9_\-/]+")
_NUM_RE = re.compile(r"-?\d+")
_FILTER_RE = re.compile(r"\?\(\s*@(?P<path>[^=!<>)]*?)\s*(?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<lit>.+?))?\s*\)")


def parse_path(text: str) -> list[Step]:
    """The steps of one path (``.items[*].metadata.name``; braces around it are allowed)."""
    src = text.strip()
    if src.startswith("{") and src.endswith("}"):
        src = src[1:-1].strip()
    if src[:1] in ("$", "@"):
        src = src[1:]
    if src and src[0] not in ".[":
        src = "." + src  # kubectl's relaxed form: metadata.name
    steps: list[Step] = []
    i = 0
    while i < len(src):
        ch = src[i]
        if src.startswith("..", i):
            m = _FIELD_RE.match(src, i + 2)
            if m is None:
                raise JsonPathError(f"{text!r}: expected a field name after '..' at {i + 2}")
            steps.append(Step("recursive", m.group()))
            i = m.end()
        elif ch == ".":
            if src.startswith(".*", i):
                steps.append(Step("wild"))
                i += 2
                continue
            m = _FIELD_RE.match(src, i + 1)
            if m is None:
                raise JsonPathError(f"{text!r}: expected a field name after '.' at {i + 1}")
            steps.append(Step("field", m.group()))
            i = m.end()
        elif ch == "[":
            close = _closing_bracket(src, i, text)
            steps.append(_bracket(src[i + 1:close].strip(), text))
            i = close + 1
        else:
            raise JsonPathError(f"{text!r}: unexpected {ch!r} at {i}")
    return steps


def _closing_bracket(src: str, start: int, text: str) -> int:
    quote = ""
    depth = 0
    for j in range(start, len(src)):
        c = src[j]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j
    raise JsonPathError(f"{text!r}: unclosed '[' at {start}")


def _bracket(inner: str, text: str) -> Step:
    if inner == "*":
        return Step("wild")
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
        return Step("field", inner[1:-1])
    if _NUM_RE.fullmatch(inner):
        return Step("index", int(inner))
    if ":" in inner:
        parts = [p.strip() for p in inner.split(":")]
        if len(parts) in (2, 3) and all(not p or _NUM_RE.fullmatch(p) for p in parts):
            return Step("slice", tuple(int(p) if p else None for p in parts))
    if inner.startswith("?"):
        m = _FILTER_RE.fullmatch(inner)
        if m is None:
            raise JsonPathError(f"{text!r}: bad filter [{inner}] (use [?(@.path==\"value\")])")
        lit = m.group("lit")
        return Step("filter", (parse_path(m.group("path") or "."), m.group("op"), _literal(lit, text) if lit else None))
    raise JsonPathError(f"{text!r}: bad subscript [{inner}]")


def _literal(text: str, where: str) -> Any:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    try:
        return json.loads(t)
    except ValueError:
        raise JsonPathError(f"{where!r}: bad literal {t!r} in a filter (quote strings)") from None


def find(steps: list[Step], data: Any) -> list[Any]:
    """Every value ``steps`` reach from ``data`` (in document order)."""
    nodes = [data]
    for step in steps:
        nodes = [v for n in nodes for v in _apply(step, n)]
    return nodes


def _apply(step: Step, node: Any) -> list[Any]:
    if step.op == "field":
        return [node[step.arg]] if isinstance(node, dict) and step.arg in node else []
    if step.op == "wild":
        return list(node.values()) if isinstance(node, dict) else list(node) if isinstance(node, list) else []
    if step.op == "index":
        if isinstance(node, list) and -len(node) <= step.arg < len(node):
            return [node[step.arg]]
        return []
    if step.op == "slice":
        return list(node[slice(*step.arg)]) if isinstance(node, list) else []
    if step.op == "recursive":
        out: list[Any] = []
        _descend(node, step.arg, out)
        return out
    path, op, lit = step.arg
    items = node if isinstance(node, list) else [node]
    return [i for i in items if _test(find(path, i), op, lit)]


def _descend(node: Any, name: str, out: list[Any]) -> None:
    if isinstance(node, dict):
        if name in node:
            out.append(node[name])
        for v in node.values():
            _descend(v, name, out)
    elif isinstance(node, list):
        for v in node:
            _descend(v, name, out)


def _test(found: list[Any], op: str | None, lit: Any) -> bool:
    if op is None:
        return bool(found)
    if not found:
        return op == "!="
    v = found[0]
    try:
        return {"==": v == lit, "!=": v != lit, "<": v < lit, "<=": v <= lit, ">": v > lit, ">=": v >= lit}[op]
    except TypeError:
        return False


# --------------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------------


def parse_template(text: str) -> list[Any]:
    """The nodes of a template: ``("text", s)``, ``("path", steps)``, ``("range", steps, body)``."""
    if "{" not in text:  # kubectl's relaxed form: jsonpath=.items[*].metadata.name
        text = "{" + text + "}"
    tokens = _template_tokens(text)
    body, rest = _nodes(tokens, text, top=True)
    assert not rest
    return body


def _template_tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        j = text.find("{", i)
        if j < 0:
            out.append(("text", text[i:]))
            break
        if j > i:
            out.append(("text", text[i:j]))
        k = j + 1
        quote = ""
        while k < len(text) and (quote or text[k] != "}"):
            if quote and text[k] == "\\":
                k += 1
            elif text[k] == quote:
                quote = ""
            elif not quote and text[k] in "'\"":
                quote = text[k]
            k += 1
        if k >= len(text):
            raise JsonPathError(f"{text!r}: unclosed '{{' at {j}")
        out.append(("expr", text[j + 1:k].strip()))
        i = k + 1
    return out


def _nodes(tokens: list[tuple[str, str]], text: str, top: bool) -> tuple[list[Any], list[tuple[str, str]]]:
    body: list[Any] = []
    while tokens:
        kind, value = tokens[0]
        tokens = tokens[1:]
        if kind == "text":
            body.append(("text", value))
        elif value == "end":
            if top:
                raise JsonPathError(f"{text!r}: {{end}} without {{range}}")
            return body, tokens
        elif value.startswith("range ") or value.startswith("range\t"):
            inner, tokens = _nodes(tokens, text, top=False)
            body.append(("range", parse_path(value[6:]), inner))
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            body.append(("text", _unescape(value[1:-1])))
        elif not value:
            raise JsonPathError(f"{text!r}: empty expression {{}}")
        else:
            body.append(("path", parse_path(value)))
    if not top:
        raise JsonPathError(f"{text!r}: {{range}} without {{end}}")
    return body, tokens


def _unescape(s: str) -> str:
    return s.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r").replace('\\"', '"').replace("\\\\", "\\")


def text_of(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":")) if isinstance(v, (dict, list)) else json.dumps(v)


def execute(template: list[Any], data: Any) -> str:
    out: list[str] = []
    for node in template:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "path":
            out.append(" ".join(text_of(v) for v in find(node[1], data)))
        else:
            found = find(node[1], data)
            if len(found) == 1 and isinstance(found[0], list):  # {range .items}: its elements
                found = found[0]
            for item in found:
                out.append(execute(node[2], item))
    return "".join(out)


def render(template_text: str, data: Any) -> str:
    """``template_text`` evaluated against ``data``; raises :class:`JsonPathError`."""
    return execute(parse_template(template_text), data)
