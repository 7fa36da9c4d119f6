"""Labels on API objects and label selectors, with Kubernetes' syntax and meaning.

A label is a ``key: value`` pair of strings on a Tenant, Deployment, Cluster or Zone
(``metadata.labels``), kept in the replicated state with the object. A key is ``[prefix/]name``: the
name at most 63 characters of ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``, the optional prefix a
DNS subdomain (lower-case labels joined by dots, at most 253 characters). A value is empty or
follows the name rule. An object holds at most :data:`MAX_LABELS` labels.

A selector (``tenantctl get deployments -l team=search,tier!=batch``) is a comma-separated list of
requirements, all of which must hold::

    key=value  key==value  key!=value  key  !key  key in (a,b)  key notin (a,b)

``key!=value`` and ``notin`` also match objects without the key (as in Kubernetes). Pure functions:
:func:`labels_problem` says why a map is not valid labels, :func:`parse_selector` raises
:class:`ValidationError` naming the selector, and :meth:`Selector.matches` evaluates one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.errors import ValidationError, clip

MAX_LABELS = 64
MAX_NAME = 63
MAX_PREFIX = 253
MAX_SELECTOR_CHARS = 4096
"""Longest selector accepted (a request field; far more than any real selector)."""

_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _name_problem(text: str, what: str) -> str | None:
    if len(text) > MAX_NAME:
        return f"{what} must be at most {MAX_NAME} characters, got {len(text)}"
    if not _NAME_RE.fullmatch(text):
        return (f"{what} {clip(text)} is not valid: use letters, digits, '-', '_' and '.', starting and ending "
                "with a letter or digit")
    return None


def key_problem(key: object) -> str | None:
    """Why ``key`` is not a label key (``[prefix/]name``), or None."""
    if not isinstance(key, str):
        return f"a label key must be a string, got {type(key).__name__}"
    if not key:
        return "a label key must not be empty"
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix or len(prefix) > MAX_PREFIX or not _PREFIX_RE.fullmatch(prefix):
            return (f"the prefix of label key {clip(key)} must be a DNS subdomain (lower-case letters, digits, "
                    f"'-' and '.', at most {MAX_PREFIX} characters)")
        if not name:
            return f"label key {clip(key)} has an empty name after its prefix"
    return _name_problem(name, "a label key's name" if not slash else f"the name of label key {clip(key)}")


def value_problem(value: object) -> str | None:
    """Why ``value`` is not a label value (empty, or like a key's name), or None."""
    if not isinstance(value, str):
        return f"a label value must be a string, got {type(value).__name__}"
    if value == "":
        return None
    return _name_problem(value, "a label value")


def labels_problem(labels: object) -> tuple[str, str] | None:
    """``(key, problem)`` of the first invalid entry of ``labels`` (``key`` empty for the map as a
    whole), or None when it is a valid label map."""
    if not isinstance(labels, Mapping):
        return "", f"must be a mapping of strings, got {type(labels).__name__}"
    if len(labels) > MAX_LABELS:
        return "", f"at most {MAX_LABELS} labels per object, got {len(labels)}"
    for k, v in labels.items():
        problem = key_problem(k) or value_problem(v)
        if problem:
            return str(k), problem
    return None


def check_labels(field_name: str, labels: object) -> None:
    """Raise :class:`ValidationError` (``<field_name>.<key>``) for an invalid label map."""
    found = labels_problem(labels)
    if found:
        key, problem = found
        raise ValidationError(f"{field_name}.{key}" if key else field_name, problem)


# --------------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!`` (does not exist)."""
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        return not has or labels[self.key] not in self.values  # != and notin


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


EVERYTHING = Selector()

_PUNCT = frozenset({"(", ")", ",", "=", "==", "!=", "!"})
_TOKEN_RE = re.compile(r"\s*(\(|\)|,|!=|==|=|!|[^\s(),!=]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # only trailing blanks are left
            if text[pos:].strip():
                raise ValueError(f"unexpected {clip(text[pos:])}")
            break
        out.append(m.group(1))
        pos = m.end()
    return out


def parse_selector(text: str, field_name: str = "label_selector") -> Selector:
    """The selector ``text`` stands for (an empty text selects everything); raises
    :class:`ValidationError` naming ``field_name``, the selector and the problem."""
    if not isinstance(text, str):
        raise ValidationError(field_name, f"must be a string, got {type(text).__name__}")
    if len(text) > MAX_SELECTOR_CHARS:
        raise ValidationError(field_name, f"must be at most {MAX_SELECTOR_CHARS} characters, got {len(text)}")
    if not text.strip():
        return EVERYTHING
    try:
        return Selector(tuple(_parse(_tokens(text))))
    except ValueError as exc:
        raise ValidationError(field_name, f"{clip(text, 80)} is not a valid label selector: {exc}") from None


def _parse(tokens: list[str]) -> list[Requirement]:
    reqs: list[Requirement] = []
    i = 0

    def need(what: str) -> str:
        if i >= len(tokens):
            raise ValueError(f"expected {what} at the end")
        return tokens[i]

    while True:
        negate = need("a requirement") == "!"
        if negate:
            i += 1
        key = need("a key")
        problem = key_problem(key) if key not in _PUNCT else f"expected a key, got {key!r}"
        if problem:
            raise ValueError(problem)
        i += 1
        nxt = tokens[i] if i < len(tokens) else ","
        if negate:
            if nxt != ",":
                raise ValueError(f"'!{key}' takes no operator or value, got {nxt!r}")
            reqs.append(Requirement(key, "!"))
        elif nxt == ",":
            reqs.append(Requirement(key, "exists"))
        elif nxt in ("=", "==", "!="):
            i += 1
            value = tokens[i] if i < len(tokens) and tokens[i] not in _PUNCT else ""
            if value:
                i += 1
            problem = value_problem(value)
            if problem:
                raise ValueError(problem)
            reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
        elif nxt in ("in", "notin"):
            i += 1
            if need("'('") != "(":
                raise ValueError(f"expected '(' after {nxt!r}, got {tokens[i]!r}")
            i += 1
            values: list[str] = []
            while True:
                tok = need("a value or ')'")
                if tok == ")" and not values:
                    raise ValueError(f"'{key} {nxt} ()' needs at least one value")
                if tok in _PUNCT:
                    raise ValueError(f"expected a value, got {tok!r}")
                problem = value_problem(tok)
                if problem:
                    raise ValueError(problem)
                values.append(tok)
                i += 1
                sep = need("',' or ')'")
                i += 1
                if sep == ")":
                    break
                if sep != ",":
                    raise ValueError(f"expected ',' or ')', got {sep!r}")
            reqs.append(Requirement(key, nxt, tuple(values)))
        else:
            raise ValueError(f"unknown operator {nxt!r} after {key!r} (use =, ==, !=, in, notin)")
        if i >= len(tokens):
            return reqs
        if tokens[i] != ",":
            raise ValueError(f"expected ',' between requirements, got {tokens[i]!r}")
        i += 1
