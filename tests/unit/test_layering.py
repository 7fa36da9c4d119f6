"""The pure layers stay pure: an AST check of what ``controlplane/domain``, ``controlplane/core`` and
``raft/lease.py`` import.

- ``domain`` imports only pure standard-library modules and ``controlplane.domain``;
- ``core`` also imports ``controlplane.core``;
- ``raft/lease.py`` imports only pure standard-library modules.

``random`` is allowed in ``core/backoff.py`` and ``core/breaker.py`` only, and only to *type* an
injected rng: the one use of the name is ``random.Random`` inside an annotation (never a call, never
``random.random()`` or a module-level ``random.Random(...)``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PURE_STDLIB = frozenset({
    "__future__", "abc", "bisect", "collections", "collections.abc", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "math", "operator", "re", "statistics", "types", "typing",
})
"""``hashlib`` is pure in the sense that matters here (a deterministic function of its input, no I/O,
no clock): ``domain/ids.py`` derives instance-id prefixes from a SHA-256 of the deployment id."""
RANDOM_TYPING_ONLY = frozenset(
    {"controlplane/core/backoff.py", "controlplane/core/breaker.py", "controlplane/core/reconcile.py"}
)


@dataclass(frozen=True)
class Rule:
    packages: tuple[str, ...]
    """Project packages this layer may import (a package and everything below it)."""
    allow_random: bool = False


DOMAIN = Rule(("controlplane.domain",))
CORE = Rule(("controlplane.domain", "controlplane.core"))
LEASE = Rule(())


def module_name(rel_path: str) -> str:
    parts = rel_path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(rel_path: str) -> list[str]:
    parts = rel_path.removesuffix(".py").split("/")
    return parts[:-1]


def _allowed(name: str, rule: Rule) -> bool:
    if name in PURE_STDLIB:
        return True
    return any(name == p or name.startswith(p + ".") for p in rule.packages)


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node that sits inside an annotation."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _random_uses(tree: ast.AST, random_names: set[str]) -> list[str]:
    """Every use of an imported ``random`` module other than ``random.Random`` in an annotation."""
    in_annotation = _annotation_nodes(tree)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    problems = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in random_names):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.attr == "Random" and id(parent) in in_annotation:
            continue
        where = ast.unparse(parent) if isinstance(parent, ast.expr) else node.id
        problems.append(f"line {node.lineno}: uses `{where}`; only `random.Random` as an annotation is allowed")
    return problems


def violations(source: str, rel_path: str, rule: Rule) -> list[str]:
    """What ``source`` (the file at ``rel_path``, relative to the repo root) imports against ``rule``."""
    tree = ast.parse(source, filename=rel_path)
    problems: list[str] = []
    random_names: set[str] = set()
    allow_random = rule.allow_random or rel_path in RANDOM_TYPING_ONLY

    def check(name: str, line: int) -> None:
        if not _allowed(name, rule):
            problems.append(f"line {line}: imports {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "random" and allow_random:
                    random_names.add(alias.asname or "random")
                else:
                    check(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package_of(rel_path)
                up = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                if node.level - 1 > len(pkg):
                    problems.append(f"line {node.lineno}: relative import beyond the top level")
                    continue
                base = ".".join([*up, base] if base else up)
            if base == "random":
                problems.append(f"line {node.lineno}: `from random import ...`; inject a random.Random instead")
                continue
            for alias in node.names:
                # `from pkg import mod` is fine when pkg or pkg.mod is allowed.
                if not (_allowed(base, rule) or (alias.name != "*" and _allowed(f"{base}.{alias.name}", rule))):
                    problems.append(f"line {node.lineno}: imports {base}.{alias.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "__import__", "exec", "eval", "compile", "open", "print", "input", "breakpoint",
        ):
            problems.append(f"line {node.lineno}: calls {node.func.id}()")
    problems += _random_uses(tree, random_names)
    return problems


def layer_files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


DOMAIN_FILES = layer_files("controlplane/domain")
CORE_FILES = layer_files("controlplane/core")
LEASE_FILE = REPO / "raft" / "lease.py"


def cases() -> list[tuple[str, Rule]]:
    found = [(p, DOMAIN) for p in DOMAIN_FILES] + [(p, CORE) for p in CORE_FILES]
    if LEASE_FILE.exists():
        found.append((LEASE_FILE, LEASE))
    return [(p.relative_to(REPO).as_posix(), rule) for p, rule in found]


def test_layers_are_not_empty() -> None:
    """The parametrized check below must not pass by finding nothing."""
    names = {p.name for p in DOMAIN_FILES}
    assert {"__init__.py", "ids.py", "errors.py", "instances.py", "state.py"} <= names
    assert {"__init__.py", "backoff.py", "breaker.py"} <= {p.name for p in CORE_FILES}
    assert len(cases()) == len(DOMAIN_FILES) + len(CORE_FILES) + int(LEASE_FILE.exists())


@pytest.mark.parametrize(("rel_path", "rule"), cases(), ids=[c[0] for c in cases()])
def test_pure_layer_imports(rel_path: str, rule: Rule) -> None:
    source = (REPO / rel_path).read_text(encoding="utf-8")
    assert violations(source, rel_path, rule) == [], f"{rel_path} breaks the layering"


def test_raft_lease_is_checked() -> None:
    assert LEASE_FILE.exists(), "raft/lease.py must exist: it holds the pure lease arithmetic"
    assert ("raft/lease.py", LEASE) in cases()


# --- the checker itself -------------------------------------------------------------------------

GOOD_DOMAIN = """
from __future__ import annotations
import enum
import collections.abc as cabc
from collections import abc, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from controlplane.domain.ids import TenantId
from controlplane.domain import commands as c
from controlplane import domain
from . import ids
from .errors import ValidationError
"""


def test_checker_accepts_pure_modules() -> None:
    assert violations(GOOD_DOMAIN, "controlplane/domain/example.py", DOMAIN) == []
    core = "from controlplane.core.signals import observe\nfrom ..domain.ids import TenantId\nfrom .breaker import x\n"
    assert violations(core, "controlplane/core/example.py", CORE) == []


@pytest.mark.parametrize(("source", "path", "rule", "words"), [
    ("import time\n", "controlplane/domain/x.py", DOMAIN, "imports time"),
    ("import os\n", "controlplane/domain/x.py", DOMAIN, "imports os"),
    ("import os.path\n", "controlplane/core/x.py", CORE, "imports os.path"),
    ("from os import path\n", "controlplane/domain/x.py", DOMAIN, "imports os.path"),
    ("import logging\n", "controlplane/core/x.py", CORE, "imports logging"),
    ("import threading\n", "controlplane/core/x.py", CORE, "imports threading"),
    ("import pydantic\n", "controlplane/domain/x.py", DOMAIN, "imports pydantic"),
    ("from controlplane.runtime import x\n", "controlplane/domain/x.py", DOMAIN, "imports controlplane.runtime.x"),
    ("from controlplane.runtime import x\n", "controlplane/core/x.py", CORE, "imports controlplane.runtime.x"),
    ("from controlplane import runtime\n", "controlplane/core/x.py", CORE, "imports controlplane.runtime"),
    ("from controlplane import *\n", "controlplane/core/x.py", CORE, "imports controlplane.*"),
    ("import controlplane.sim.engine\n", "controlplane/core/x.py", CORE, "imports controlplane.sim.engine"),
    ("from controlplane.core import scaling\n", "controlplane/domain/x.py", DOMAIN, "controlplane.core.scaling"),
    ("from ..core import scaling\n", "controlplane/domain/x.py", DOMAIN, "controlplane.core.scaling"),
    ("from ..runtime.shell import run\n", "controlplane/core/x.py", CORE, "controlplane.runtime.shell.run"),
    ("from controlplane.domain import ids\n", "raft/lease.py", LEASE, "imports controlplane.domain.ids"),
    ("import time\n", "raft/lease.py", LEASE, "imports time"),
    ("from . import codec\n", "raft/lease.py", LEASE, "imports raft.codec"),
    ("import typing\ndef f():\n    import socket\n", "controlplane/domain/x.py", DOMAIN, "imports socket"),
    ("try:\n    import numpy\nexcept ImportError:\n    pass\n", "controlplane/core/x.py", CORE, "imports numpy"),
    ("m = __import__('os')\n", "controlplane/domain/x.py", DOMAIN, "calls __import__()"),
    ("def f():\n    print('hi')\n", "controlplane/core/x.py", CORE, "calls print()"),
    ("import random\n", "controlplane/core/scaling.py", CORE, "imports random"),
    ("import random\n", "controlplane/domain/x.py", DOMAIN, "imports random"),
    ("import random\n", "raft/lease.py", LEASE, "imports random"),
    ("from random import Random\n", "controlplane/core/backoff.py", CORE, "from random import"),
    ("import random\nJITTER = random.random()\n", "controlplane/core/backoff.py", CORE, "random.random"),
    ("import random\nRNG = random.Random(42)\n", "controlplane/core/breaker.py", CORE, "random.Random"),
    ("import random\ndef f(rng=random.Random()):\n    pass\n", "controlplane/core/breaker.py", CORE, "random.Random"),
    ("import random\ndef f(n):\n    return random.randint(0, n)\n", "controlplane/core/backoff.py", CORE, "random.randint"),
    ("import random\ndef f(rng: random.Random):\n    return isinstance(rng, random.Random)\n",
     "controlplane/core/backoff.py", CORE, "random.Random"),
    ("import random as r\nX = r.choice([1])\n", "controlplane/core/backoff.py", CORE, "r.choice"),
    ("import random\nf = random\n", "controlplane/core/backoff.py", CORE, "uses `random`"),
])
def test_checker_rejects(source: str, path: str, rule: Rule, words: str) -> None:
    problems = violations(source, path, rule)
    assert problems, f"the checker let through:\n{source}"
    assert any(words in p for p in problems), problems


def test_checker_allows_random_only_as_an_injected_rng_annotation() -> None:
    src = (
        "from __future__ import annotations\n"
        "import random\n"
        "def backoff_ms(attempt: int, rng: random.Random) -> int:\n"
        "    return rng.randint(0, attempt)\n"
        "class B:\n"
        "    rng: random.Random | None = None\n"
        "def maybe() -> random.Random | None:\n"
        "    return None\n"
    )
    assert violations(src, "controlplane/core/backoff.py", CORE) == []
    assert violations(src, "controlplane/core/breaker.py", CORE) == []
    assert any("imports random" in p for p in violations(src, "controlplane/core/placement.py", CORE))
