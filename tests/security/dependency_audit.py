"""The dependency audit and its policy (docs/security.md, "Dependency audit").

Two sources of vulnerability data, one policy (:func:`evaluate`):

* **offline** (``python -m tests.security.dependency_audit --offline``, and the test in ``make
  test``): every installed distribution (runtime and test dependencies, the editable project left
  out) against ``advisories-pypi.json``, a committed extract of the PyPA advisory database
  (tests/security/advisories.py: the evaluation and the ``refresh`` command). Deterministic and
  without network; it covers the advisories up to the snapshot's commit date, which it reports.
* **live** (``python -m tests.security.dependency_audit [--require]``, ``make audit``):
  ``pip-audit`` (pinned in the ``test`` extra) against its vulnerability service.

The policy:

* **fail** (exit 1) on a known vulnerability that has a fixed version, unless an entry of
  ``audit-ignore.toml`` (beside this file) accepts it; the message names the package, the installed
  version, the advisory and the first fixed version (the pin in pyproject.toml to bump);
* **fail** on an ignore entry that has expired, that lacks a reason, or that expires more than
  :data:`MAX_IGNORE_DAYS` days ahead (exceptions are short-lived and re-decided);
* **report** (no failure) a vulnerability without any fixed version (nothing to bump; it is listed
  each run until a fix exists) and ignore entries that no longer match anything;
* **could not audit** (exit 3) when the vulnerability service does not answer, or when any
  dependency could not be looked up (live: ``pip-audit`` itself says "No known vulnerabilities
  found" and exits 0 when it audited nothing; offline: a distribution the snapshot was not
  extracted for). An audit that did not cover every installed dependency is never a pass; with
  ``--require`` it exits 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.security import advisories

IGNORE_FILE = Path(__file__).with_name("audit-ignore.toml")
MAX_IGNORE_DAYS = 90
TIMEOUT_S = 240
PASS, VULNERABLE, UNAVAILABLE = 0, 1, 3


@dataclass(frozen=True)
class Ignore:
    id: str
    package: str
    reason: str
    expires: dt.date


@dataclass
class Report:
    audited: int = 0
    unaudited: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    source: str = "pip-audit"
    unaudited_why: str = "the vulnerability service did not know them"

    @property
    def status(self) -> int:
        if self.failures:
            return VULNERABLE
        if self.error or self.unaudited:
            return UNAVAILABLE
        return PASS

    def text(self) -> str:
        head = f"dependency audit ({self.source}): {self.audited} dependencies audited"
        lines = [f"{head}, {len(self.unaudited)} could not be"]
        if self.error:
            lines.append(f"  could not audit: {self.error}")
        if self.unaudited:
            shown = ", ".join(self.unaudited[:8]) + (" ..." if len(self.unaudited) > 8 else "")
            lines.append(f"  not looked up ({self.unaudited_why}): {shown}")
        lines += [f"  FAIL {f}" for f in self.failures]
        lines += [f"  note {n}" for n in self.notes]
        lines.append({PASS: "  result: pass", VULNERABLE: "  result: FAIL",
                      UNAVAILABLE: "  result: could not audit (not a pass)"}[self.status])
        return "\n".join(lines)


def load_ignores(path: Path = IGNORE_FILE) -> list[Ignore]:
    """The accepted vulnerabilities; raises ValueError naming the entry for a malformed one."""
    if not path.is_file():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, e in enumerate(data.get("ignore", [])):
        where = f"{path.name}: ignore[{i}]"
        missing = [k for k in ("id", "package", "reason", "expires") if not e.get(k)]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if not isinstance(e["expires"], dt.date):
            raise ValueError(f"{where}: expires must be a date (YYYY-MM-DD)")  # noqa: TRY004 (a bad value)
        out.append(Ignore(str(e["id"]), str(e["package"]).lower(), str(e["reason"]), e["expires"]))
    return out


def evaluate(audit: dict[str, Any], ignores: list[Ignore], today: dt.date) -> Report:
    """Apply the policy to pip-audit's JSON output (pure: the tests feed it examples)."""
    r = Report()
    used: set[tuple[str, str]] = set()
    for ig in ignores:
        if ig.expires < today:
            r.failures.append(f"ignore entry {ig.id} ({ig.package}) expired on {ig.expires}: fix it or renew it")
        elif (ig.expires - today).days > MAX_IGNORE_DAYS:
            r.failures.append(f"ignore entry {ig.id} ({ig.package}) expires {ig.expires}, more than "
                              f"{MAX_IGNORE_DAYS} days ahead")
    valid = {(ig.package, ig.id): ig for ig in ignores if today <= ig.expires}
    for dep in audit.get("dependencies", []):
        name = str(dep.get("name", "?")).lower()
        reason = str(dep.get("skip_reason", ""))
        if reason:
            if "editable" not in reason:
                r.unaudited.append(f"{name} {dep.get('version') or _version_in(reason)}".strip())
            continue
        r.audited += 1
        for v in dep.get("vulns", []):
            ids = {v.get("id", "?"), *v.get("aliases", [])}
            fixes = list(v.get("fix_versions") or [])
            hit = next((valid[(name, i)] for i in ids if (name, i) in valid), None)
            label = f"{name} {dep.get('version')}: {v.get('id')}"
            if hit is not None:
                used.add((hit.package, hit.id))
                r.notes.append(f"{label} accepted until {hit.expires}: {hit.reason}")
            elif fixes:
                r.failures.append(f"{label}: fixed in {', '.join(fixes)}: bump the pin to {fixes[0]} or later")
            else:
                r.notes.append(f"{label}: no fixed version yet (reported until one exists)")
    for key, ig in valid.items():
        if key not in used:
            r.notes.append(f"ignore entry {ig.id} ({ig.package}) matches nothing any more: remove it")
    return r


def _version_in(reason: str) -> str:
    return reason.rsplit("(", 1)[1].rstrip(")") if "(" in reason else ""


def run_pip_audit(timeout_s: float = TIMEOUT_S, service: str = "pypi") -> tuple[dict[str, Any] | None, str]:
    """pip-audit's JSON for this interpreter's environment, or (None, why it did not run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        cmd = [sys.executable, "-m", "pip_audit", "--local", "--skip-editable", "--format", "json", "--progress-spinner",
               "off", "--timeout", "20", "--vulnerability-service", service, "--output", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"pip-audit did not finish within {timeout_s:.0f} s"
        except OSError as exc:
            return None, f"cannot run pip-audit: {exc}"
        if not out.is_file() or not out.read_text(encoding="utf-8").strip():
            last = (proc.stderr or proc.stdout).strip().splitlines()
            return None, f"pip-audit exited {proc.returncode}: {last[-1] if last else 'no output'}"
        return json.loads(out.read_text(encoding="utf-8")), ""


def audit(today: dt.date | None = None, service: str = "pypi") -> Report:
    data, error = run_pip_audit(service=service)
    if data is None:
        return Report(error=error)
    return evaluate(data, load_ignores(), today or dt.date.today())


def offline_audit(today: dt.date | None = None, installed: dict[str, str] | None = None,
                  snapshot: dict[str, Any] | None = None, ignores: list[Ignore] | None = None) -> Report:
    """The installed environment (or ``installed``) against the committed advisory snapshot."""
    today = today or dt.date.today()
    snap = advisories.load_snapshot() if snapshot is None else snapshot
    data = advisories.audit_data(advisories.installed_distributions() if installed is None else installed, snap)
    report = evaluate(data, load_ignores() if ignores is None else ignores, today)
    date = snap["commit_date"][:10]
    report.source = f"offline, PyPA advisory database at {snap['commit'][:12]} of {date}"
    report.unaudited_why = "not in the advisory snapshot: refresh it, tests/security/advisories.py"
    report.notes.insert(0, f"advisory snapshot {date}, {advisories.snapshot_age_days(snap, today)} days old "
                           f"({len(snap['advisories'])} advisories): advisories published after {date} are not "
                           "covered; refresh it where GitHub is reachable")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.security.dependency_audit", description=__doc__.split("\n\n")[0])
    p.add_argument("--require", action="store_true", help="exit 1 (not 3) when the audit could not run completely")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--offline", action="store_true",
                   help="audit against the committed advisory snapshot (advisories-pypi.json), not pip-audit")
    p.add_argument("--service", choices=("pypi", "osv"), default="pypi",
                   help="pip-audit's vulnerability service (osv also knows GitHub-only GHSA advisories)")
    args = p.parse_args(argv)
    report = offline_audit() if args.offline else audit(service=args.service)
    if args.json:
        print(json.dumps({"status": report.status, "source": report.source, "audited": report.audited, "unaudited": report.unaudited,
                          "failures": report.failures, "notes": report.notes, "error": report.error}, indent=1))
    else:
        print(report.text())
    if report.status == UNAVAILABLE and args.require:
        return VULNERABLE
    return report.status


if __name__ == "__main__":
    sys.exit(main())
