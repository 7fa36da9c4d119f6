"""The offline vulnerability data of the dependency audit (docs/security.md, "Dependency audit").

``advisories-pypi.json`` (beside this file, committed) is an extract of the PyPA advisory database
(https://github.com/pypa/advisory-database, OSV format, CC-BY-4.0): every advisory of every
distribution installed in the project's environment, reduced to what the audit evaluates (id,
aliases, a one-line summary, the package, the ECOSYSTEM ranges, the explicit ``versions`` list and
the fixed versions) plus the source commit and its date. Refresh it where GitHub is reachable::

    git clone --filter=blob:none https://github.com/pypa/advisory-database /tmp/advisory-database
    .venv/bin/python -m tests.security.advisories refresh --advisory-repo /tmp/advisory-database

(``--advisory-repo`` takes a clone or a bare git directory; the extract is read from its ``HEAD``,
or ``--rev``). The evaluation follows the OSV schema: a version is affected when it is listed in
``versions`` or lies in a range, i.e. at or after an ``introduced`` event and before the next
``fixed`` event (``fixed`` itself is not affected) or at or before the next ``last_affected`` event
(inclusive); ``introduced: "0"`` is before every version. Versions are compared with
``packaging.version``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

SNAPSHOT_FILE = Path(__file__).with_name("advisories-pypi.json")
SOURCE_URL = "https://github.com/pypa/advisory-database"
SOURCE_LICENSE = "CC-BY-4.0"
FORMAT = 1


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


# --- evaluation (pure) -------------------------------------------------------------------------


def in_range(version: Version, events: list[dict[str, str]]) -> bool:
    """OSV ECOSYSTEM range semantics: the events in version order, ``introduced`` switching
    "affected" on at its version, ``fixed`` off at its version, ``last_affected`` off just after it.
    An event whose version does not parse is ignored (never silently widens a range: a range whose
    ``introduced`` does not parse affects nothing)."""
    keyed: list[tuple[Version | None, int, str]] = []
    for ev in events:
        for kind, order in (("introduced", 0), ("fixed", 1), ("last_affected", 2)):
            if kind in ev:
                raw = str(ev[kind])
                v = None if (kind == "introduced" and raw == "0") else _version(raw)
                if v is None and not (kind == "introduced" and raw == "0"):
                    continue
                keyed.append((v, order, kind))
    keyed.sort(key=lambda k: (k[0] is not None, k[0] or Version("0"), k[1]))
    affected = False
    for v, _, kind in keyed:
        if kind == "introduced":
            if v is None or version >= v:
                affected = True
        elif kind == "fixed":
            if version >= v:  # type: ignore[operator]
                affected = False
        elif version > v:  # type: ignore[operator]  # last_affected, inclusive
            affected = False
    return affected


def is_affected(version: str, advisory: dict[str, Any]) -> bool:
    v = _version(version)
    listed = advisory.get("versions", [])
    if version in listed:
        return True
    if v is None:
        return False
    if any(_version(x) == v for x in listed):
        return True
    return any(in_range(v, events) for events in advisory.get("ranges", []))


def fixes_for(version: str, advisory: dict[str, Any]) -> list[str]:
    """The advisory's fixed versions above ``version``, lowest first (the pin to bump to). Empty when
    only older branches were fixed: then there is nothing to bump to."""
    v = _version(version)
    out = {f for f in advisory.get("fixed", []) if v is None or (_version(f) or Version("0")) > v}
    return sorted(out, key=lambda f: _version(f) or Version("0"))


def installed_distributions() -> dict[str, str]:
    """{normalised name: version} of this interpreter's environment, editable installs (the project
    itself) left out; the first of duplicate names wins, as for imports."""
    out: dict[str, str] = {}
    editable: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        direct = dist.read_text("direct_url.json")
        if direct and json.loads(direct).get("dir_info", {}).get("editable"):
            editable.add(normalize(name))  # also its egg-info in the source tree, found first from there
        out.setdefault(normalize(name), dist.version)
    return {k: v for k, v in sorted(out.items()) if k not in editable}


def load_snapshot(path: Path = SNAPSHOT_FILE) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path.name}: unknown format {data.get('format')!r}")
    return data


def snapshot_age_days(snapshot: dict[str, Any], today: dt.date) -> int:
    return (today - dt.date.fromisoformat(snapshot["commit_date"][:10])).days


def audit_data(installed: dict[str, str], snapshot: dict[str, Any]) -> dict[str, Any]:
    """The audit in pip-audit's JSON shape ({"dependencies": [{name, version, vulns}]}), so that
    one policy (dependency_audit.evaluate) judges both the live and the offline audit. A
    distribution the snapshot was not extracted for is "not looked up" (never a silent pass)."""
    by_pkg: dict[str, list[dict[str, Any]]] = {}
    for adv in snapshot["advisories"]:
        by_pkg.setdefault(adv["package"], []).append(adv)
    covered = set(snapshot["packages"])
    deps = []
    for name, version in installed.items():
        if name not in covered:
            deps.append({"name": name, "version": version,
                         "skip_reason": f"not in the advisory snapshot (refresh it): {name} ({version})"})
            continue
        vulns = [{"id": a["id"], "aliases": a.get("aliases", []), "fix_versions": fixes_for(version, a),
                  "description": a.get("summary", "")}
                 for a in by_pkg.get(name, []) if is_affected(version, a)]
        deps.append({"name": name, "version": version, "vulns": vulns})
    return {"dependencies": deps}


# --- refresh -----------------------------------------------------------------------------------


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=True).stdout


def _cat_files(repo: Path, rev: str, paths: list[str]) -> Iterator[tuple[str, bytes]]:
    """Blob contents of ``paths`` at ``rev`` with one ``git cat-file --batch``."""
    if not paths:
        return
    out = _git(repo, "cat-file", "--batch", stdin="".join(f"{rev}:{p}\n" for p in paths).encode())
    pos = 0
    for p in paths:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].split()
        if header[-1] == b"missing":
            raise FileNotFoundError(f"{rev}:{p}")
        size = int(header[2])
        yield p, out[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1


def _summary(osv: dict[str, Any]) -> str:
    text = str(osv.get("summary") or "").strip() or str(osv.get("details") or "").strip()
    line = text.splitlines()[0].strip() if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


def reduce_advisory(osv: dict[str, Any], package: str) -> dict[str, Any] | None:
    """The fields the audit needs, for the affected entries of ``package`` (PyPI); None if the
    advisory is withdrawn or names no such entry."""
    if osv.get("withdrawn"):
        return None
    ranges: list[list[dict[str, str]]] = []
    versions: set[str] = set()
    fixed: set[str] = set()
    found = False
    for aff in osv.get("affected", []):
        pkg = aff.get("package", {})
        if pkg.get("ecosystem") != "PyPI" or normalize(str(pkg.get("name", ""))) != package:
            continue
        found = True
        versions.update(str(v) for v in aff.get("versions", []))
        for rng in aff.get("ranges", []):
            if rng.get("type") != "ECOSYSTEM":
                continue
            events = [{k: str(v) for k, v in ev.items() if k in ("introduced", "fixed", "last_affected")}
                      for ev in rng.get("events", [])]
            events = [ev for ev in events if ev]
            if events:
                ranges.append(events)
                fixed.update(ev["fixed"] for ev in events if "fixed" in ev)
    if not found:
        return None
    key = lambda s: (_version(s) is None, _version(s) or Version("0"), s)
    # Listed versions a range already covers change nothing: only the others are kept (small file).
    versions = {s for s in versions if (v := _version(s)) is None or not any(in_range(v, r) for r in ranges)}
    return {"id": str(osv["id"]), "aliases": sorted(str(a) for a in osv.get("aliases") or []),
            "summary": _summary(osv), "package": package, "ranges": ranges,
            "versions": sorted(versions, key=key), "fixed": sorted(fixed, key=key)}


def extract(repo: Path, packages: Iterable[str], rev: str = "HEAD", today: dt.date | None = None) -> dict[str, Any]:
    """The snapshot of ``packages`` (normalised names) from the advisory database at ``repo``."""
    import yaml  # PyYAML is a runtime dependency of the project

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    commit = _git(repo, "rev-parse", f"{rev}^{{commit}}").decode().strip()
    commit_date = _git(repo, "log", "-1", "--format=%cI", commit).decode().strip()
    wanted = sorted(set(packages))
    files: dict[str, list[str]] = {}
    for path in _git(repo, "ls-tree", "-r", "--name-only", commit, "vulns/").decode().splitlines():
        parts = path.split("/")
        if len(parts) == 3 and parts[2].endswith((".yaml", ".yml", ".json")):
            files.setdefault(normalize(parts[1]), []).append(path)
    paths = [p for name in wanted for p in files.get(name, [])]
    advisories = []
    for path, blob in _cat_files(repo, commit, paths):
        osv = json.loads(blob) if path.endswith(".json") else yaml.load(blob, Loader=loader)
        reduced = reduce_advisory(osv, normalize(path.split("/")[1]))
        if reduced is not None:
            advisories.append(reduced)
    advisories.sort(key=lambda a: (a["package"], a["id"]))
    return {"format": FORMAT, "source": SOURCE_URL, "license": SOURCE_LICENSE, "commit": commit,
            "commit_date": commit_date, "extracted": (today or dt.date.today()).isoformat(),
            "packages": wanted, "advisories": advisories}


def dump(snapshot: dict[str, Any]) -> str:
    """Compact JSON, one advisory per line (small, and reviewable as a diff)."""
    head = {k: v for k, v in snapshot.items() if k != "advisories"}
    lines = [json.dumps(a, separators=(",", ":"), ensure_ascii=False) for a in snapshot["advisories"]]
    body = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
    return body + ',"advisories":[\n' + ",\n".join(lines) + "\n]}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.security.advisories", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refresh", help=f"rewrite {SNAPSHOT_FILE.name} from a PyPA advisory-database git repository")
    r.add_argument("--advisory-repo", type=Path, required=True, help="clone or bare git dir of pypa/advisory-database")
    r.add_argument("--rev", default="HEAD")
    r.add_argument("--output", type=Path, default=SNAPSHOT_FILE)
    args = p.parse_args(argv)
    snap = extract(args.advisory_repo, installed_distributions(), args.rev)
    args.output.write_text(dump(snap), encoding="utf-8")
    print(f"{args.output}: {len(snap['advisories'])} advisories for {len(snap['packages'])} distributions, "
          f"{snap['source']} at {snap['commit'][:12]} ({snap['commit_date']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
