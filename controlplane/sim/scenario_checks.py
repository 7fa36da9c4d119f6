"""Every problem of a scenario (fleet) file, not the first: the schema (pydantic reports all its
errors), duplicate ids, references (tenant, pool, cluster, deployment, model profile, the models of
a cluster's ``model_cache``), the domain's
invariants per item, and workload files that do not exist. Each is reported as
``FILE:LINE: field.path: message``, the line found from the YAML node marks
(:mod:`controlplane.sim.yamllines`).

Reference and domain checks run on the raw document, item by item, so a file with a wrong type in
one deployment still gets its unknown tenant in another reported in the same run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pydantic

from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId, PoolId
from controlplane.domain.profiles import PROFILES
from controlplane.domain.topology import Cluster
from controlplane.specs import DeploymentBase, TenantSpec, deployment_of, lenient, tenant_of, unknown_field
from controlplane.sim.scenario import (
    WORKLOAD_TAGS,
    ClusterSpec,
    FailureSpec,
    ScenarioError,
    ScenarioSpec,
    resolve_path,
)
from controlplane.sim.yamllines import line_of

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]


def problems_of(raw: dict[str, Any], base_dir: Path) -> tuple[ScenarioSpec | None, list[Problem]]:
    problems: list[Problem] = []
    spec: ScenarioSpec | None = None
    try:
        spec = ScenarioSpec.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems.extend(_pydantic_problems(exc, ()))
    problems.extend(_reference_problems(raw))
    problems.extend(_item_problems(raw, base_dir))
    return spec, problems


def raise_problems(problems: list[Problem], source: str, lines: Mapping[Loc, int]) -> NoReturn:
    seen: set[str] = set()
    out: list[tuple[int, str]] = []
    for loc, message in problems:
        line = line_of(lines, loc)
        text = f"{source}:{line}: {fmt_loc(loc)}: {message}" if line is not None else f"{source}: {fmt_loc(loc)}: {message}"
        if text not in seen:
            seen.add(text)
            out.append((line or 0, text))
    out.sort(key=lambda x: x[0])  # stable: same line keeps pydantic's order
    texts = tuple(t for _, t in out)
    raise ScenarioError("\n".join(texts), texts)


def fmt_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _clean(loc: tuple[Any, ...]) -> Loc:
    """pydantic's loc without union tags and validator names."""
    return tuple(p for p in loc if p not in WORKLOAD_TAGS and not str(p).startswith("function-"))


def _pydantic_problems(exc: pydantic.ValidationError, prefix: Loc) -> Iterator[Problem]:
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = unknown_field(ScenarioSpec, err["loc"])
        elif "got" not in msg and not isinstance(err.get("input"), (dict, list)) and "input" in err:
            msg += f", got {err['input']!r}"[:60]
        yield (*prefix, *_clean(err["loc"])), msg


_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _loc_of(field: str) -> Loc:
    """``deployments[2].policy.x`` -> ``("deployments", 2, "policy", "x")``."""
    return tuple(int(m.group(2)) if m.group(2) else m.group(1) for m in _PART.finditer(field))


def _items(raw: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    value = raw.get(key)
    return [(i, x) for i, x in enumerate(value) if isinstance(x, dict)] if isinstance(value, list) else []


def _ids(raw: dict[str, Any], key: str) -> set[str]:
    return {x["id"] for _, x in _items(raw, key) if isinstance(x.get("id"), str)}


def _reference_problems(raw: dict[str, Any]) -> Iterator[Problem]:
    for key in ("clusters", "tenants", "deployments"):
        seen: set[str] = set()
        for i, item in _items(raw, key):
            ident = item.get("id")
            if isinstance(ident, str) and ident in seen:
                yield (key, i, "id"), f"duplicate id {ident!r}"
            if isinstance(ident, str):
                seen.add(ident)
    pools = sorted({p for _, c in _items(raw, "clusters") if isinstance(c.get("capacity"), dict)
                    for p in c["capacity"] if isinstance(p, str)})
    known_pools = ", ".join(pools) or "none"
    have_clusters = isinstance(raw.get("clusters"), list)
    for i, t in _items(raw, "tenants"):
        for field in ("quota", "borrow_limit"):
            if have_clusters and isinstance(t.get(field), dict):
                for pool in t[field]:
                    if isinstance(pool, str) and pool not in pools:
                        yield ("tenants", i, field, pool), f"no cluster has pool {pool!r} (pools: {known_pools})"
    for i, cl in _items(raw, "clusters"):
        cache = cl.get("model_cache")
        listed: set[str] = set()
        for k, model in enumerate(cache if isinstance(cache, list) else ()):
            if isinstance(model, str) and model not in PROFILES:
                yield ("clusters", i, "model_cache", k), (
                    f"unknown model profile {model!r} (known: {', '.join(sorted(PROFILES))})")
            elif isinstance(model, str) and model in listed:
                yield ("clusters", i, "model_cache", k), f"model {model!r} is listed twice"
            if isinstance(model, str):
                listed.add(model)
    tenants = _ids(raw, "tenants")
    for i, d in _items(raw, "deployments"):
        tenant, pool, model = d.get("tenant"), d.get("pool"), d.get("model")
        if isinstance(raw.get("tenants"), list) and isinstance(tenant, str) and tenant not in tenants:
            yield ("deployments", i, "tenant"), f"unknown tenant {tenant!r} (tenants: {', '.join(sorted(tenants)) or 'none'})"
        if have_clusters and isinstance(pool, str) and pool not in pools:
            yield ("deployments", i, "pool"), f"no cluster has pool {pool!r} (pools: {known_pools})"
        if isinstance(model, str) and model not in PROFILES:
            yield ("deployments", i, "model"), f"unknown model profile {model!r} (known: {', '.join(sorted(PROFILES))})"
    clusters, deployments = _ids(raw, "clusters"), _ids(raw, "deployments")
    for i, f in _items(raw, "failures"):
        if have_clusters and isinstance(f.get("cluster"), str) and f["cluster"] not in clusters:
            yield ("failures", i, "cluster"), f"unknown cluster {f['cluster']!r}"
        if isinstance(f.get("deployment"), str) and f["deployment"] not in deployments:
            yield ("failures", i, "deployment"), f"unknown deployment {f['deployment']!r}"


def _item_problems(raw: dict[str, Any], base_dir: Path) -> Iterator[Problem]:
    """Domain invariants and workload files, for each item whose own schema is valid (its schema
    errors are already reported)."""
    for i, c in _items(raw, "clusters"):
        spec = _valid(ClusterSpec, c)
        if spec is not None:
            try:
                Cluster(ClusterId(spec.id), spec.zone, spec.region, {PoolId(k): v for k, v in spec.capacity.items()})
            except ValidationError as exc:
                for f, problem in exc.problems:
                    yield ("clusters", i, *_loc_of(f.removeprefix("cluster."))), problem
    for i, t in _items(raw, "tenants"):
        tspec = _valid(TenantSpec, t)
        if tspec is not None:
            try:
                tenant_of(tspec)
            except ValidationError as exc:
                for f, problem in exc.problems:
                    yield ("tenants", i, *_loc_of(f.removeprefix("tenant."))), problem
    for i, d in _items(raw, "deployments"):
        dspec = _valid(DeploymentBase, {k: v for k, v in d.items() if k != "workload"})
        if dspec is not None and dspec.model in PROFILES:  # an unknown one is a reference problem above
            try:
                deployment_of(dspec, f"deployments[{i}]")
            except ValidationError as exc:
                for f, problem in exc.problems:
                    yield _loc_of(f), problem
        if isinstance(d.get("workload"), dict):
            yield from _file_problems(i, d["workload"], base_dir)
    for i, f in _items(raw, "failures"):
        fspec = _valid(FailureSpec, f)
        if fspec is not None and fspec.end_s <= fspec.start_s:
            yield ("failures", i, "end_s"), f"must be after start_s ({fspec.start_s:g}), got {fspec.end_s:g}"


def _valid(model: type[pydantic.BaseModel], data: dict[str, Any]) -> Any:
    """The item's model, its refused values left out (their schema errors are reported already),
    so its domain checks still run: every problem in one run."""
    return lenient(model, data)


FILE_FIELDS = ("trace", "rates", "lengths_from")
"""Workload fields that name a file (``TraceWorkload.trace``, ``RateSeriesWorkload.rates`` and
``lengths_from``); checked on the raw workload, so a missing file is reported with the workload's
other problems."""


def _file_problems(i: int, workload: dict[str, Any], base_dir: Path) -> Iterator[Problem]:
    for field in FILE_FIELDS:
        text = workload.get(field)
        if not isinstance(text, str):
            continue  # absent, or a wrong type the schema reports
        loc: Loc = ("deployments", i, "workload", field)
        try:
            path = resolve_path(text, base_dir)
        except ValueError as exc:
            yield loc, str(exc)
            continue
        try:
            problem = None if path.is_file() else ("not a file" if path.exists() else "no such file")
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long
            problem = str(exc)
        if problem:
            yield loc, f"cannot open {path}: {problem}"
