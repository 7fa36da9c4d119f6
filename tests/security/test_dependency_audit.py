"""The dependency audit in the default suite (policy: tests/security/dependency_audit.py and
docs/security.md), the OSV evaluation on made-up and real advisories, and the policy on pip-audit
outputs made up for the purpose.

Nothing here skips. The installed environment is audited offline against the committed snapshot of
the PyPA advisory database (advisories-pypi.json); ``CP_AUDIT_REQUIRED=1`` (a CI that reaches a
vulnerability service) adds the live pip-audit, which must then run completely and pass."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.security import advisories as adv
from tests.security import dependency_audit as da

TODAY = dt.date(2026, 11, 29)


def live_audit_required() -> None:
    """The live pip-audit must run completely and find nothing fixable (CP_AUDIT_REQUIRED=1 only:
    where no vulnerability service is reachable it cannot pass, see docs/security.md)."""
    report = da.audit()
    print(report.text())
    assert report.status == da.PASS, report.text()


@pytest.mark.timeout(300)  # the live pip-audit, when required; the offline audit takes well under 1 s
def test_installed_dependencies_have_no_fixable_known_vulnerability() -> None:
    report = da.offline_audit()
    print(report.text())
    assert report.status == da.PASS, report.text()
    assert "days old" in report.notes[0] and "not covered" in report.notes[0]
    if os.environ.get("CP_AUDIT_REQUIRED"):
        live_audit_required()


# --- the committed snapshot --------------------------------------------------------------------


def test_the_snapshot_covers_every_installed_distribution_and_names_its_source() -> None:
    snap = adv.load_snapshot()
    assert snap["source"] == "https://github.com/pypa/advisory-database" and snap["license"] == "CC-BY-4.0"
    assert len(snap["commit"]) == 40 and dt.datetime.fromisoformat(snap["commit_date"])
    missing = sorted(set(adv.installed_distributions()) - set(snap["packages"]))
    assert not missing, f"installed but not in the advisory snapshot (refresh it, see advisories.py): {missing}"
    ids = [(a["package"], a["id"]) for a in snap["advisories"]]
    assert len(ids) == len(set(ids)) and {p for p, _ in ids} <= set(snap["packages"])
    for a in snap["advisories"]:
        assert set(a) == {"id", "aliases", "summary", "package", "ranges", "versions", "fixed"}, a["id"]
        assert a["ranges"] or a["versions"], a["id"]
    assert adv.SNAPSHOT_FILE.stat().st_size < 200_000


def test_a_known_advisory_of_the_snapshot_is_found_and_names_the_fix() -> None:
    grpc = next(a for a in adv.load_snapshot()["advisories"] if a["id"] == "PYSEC-2017-101")
    assert grpc["package"] == "grpcio" and "CVE-2017-8359" in grpc["aliases"]
    assert adv.is_affected("1.2.0", grpc) and adv.is_affected("0.3.0", grpc) and adv.is_affected("1.3.0rc1", grpc)
    assert not adv.is_affected("1.3.0", grpc) and not adv.is_affected("1.85.1", grpc)
    out = da.offline_audit(TODAY, installed={"grpcio": "1.2.0", "rich": "15.0.0"}, ignores=[])
    assert out.status == da.VULNERABLE and out.audited == 2
    assert any(f.startswith("grpcio 1.2.0: PYSEC-2017-101: fixed in 1.3.0") for f in out.failures), out.text()
    assert "bump the pin to 1.3.0 or later" in out.text()
    assert da.offline_audit(TODAY, installed={"grpcio": "1.3.0"}, ignores=[]).status == da.PASS


def test_ignores_apply_to_the_offline_audit_by_alias_and_expire() -> None:
    installed = {"grpcio": "1.2.0"}
    ok = da.Ignore("CVE-2017-8359", "grpcio", "test case", TODAY + dt.timedelta(days=10))
    accepted = da.offline_audit(TODAY, installed=installed, ignores=[ok])
    assert accepted.status == da.PASS and any("accepted until" in n for n in accepted.notes)
    expired = da.Ignore("PYSEC-2017-101", "grpcio", "test case", TODAY - dt.timedelta(days=1))
    out = da.offline_audit(TODAY, installed=installed, ignores=[expired])
    assert out.status == da.VULNERABLE and any("expired" in f for f in out.failures)
    assert any("PYSEC-2017-101: fixed in 1.3.0" in f for f in out.failures)


def test_a_distribution_missing_from_the_snapshot_is_not_a_pass() -> None:
    out = da.offline_audit(TODAY, installed={"surely-not-installed-x": "1.0"}, ignores=[])
    assert out.status == da.UNAVAILABLE and out.unaudited == ["surely-not-installed-x 1.0"]
    assert "not in the advisory snapshot" in out.text() and "not a pass" in out.text()


def test_the_snapshot_age_is_reported_not_failed() -> None:
    snap = adv.load_snapshot()
    later = dt.date.fromisoformat(snap["commit_date"][:10]) + dt.timedelta(days=1000)
    out = da.offline_audit(later, installed={"rich": "15.0.0"}, ignores=[])
    assert out.status == da.PASS and "1000 days old" in out.text()


# --- OSV semantics on made-up advisories --------------------------------------------------------


def _adv(*ranges: list[dict[str, str]], versions: list[str] | None = None, fixed: list[str] | None = None) -> dict:
    fx = fixed if fixed is not None else [e["fixed"] for r in ranges for e in r if "fixed" in e]
    return {"id": "TEST-1", "aliases": [], "summary": "", "package": "x", "ranges": list(ranges),
            "versions": versions or [], "fixed": fx}


def test_fixed_is_exclusive_and_introduced_zero_is_before_everything() -> None:
    a = _adv([{"introduced": "0"}, {"fixed": "2.0"}])
    assert adv.is_affected("0.0.1", a) and adv.is_affected("1.9.9", a) and adv.is_affected("2.0rc1", a)
    assert not adv.is_affected("2.0", a) and not adv.is_affected("2.0.0", a) and not adv.is_affected("2.0.post1", a)
    b = _adv([{"introduced": "1.5"}, {"fixed": "2.0"}])
    assert not adv.is_affected("1.4", b) and adv.is_affected("1.5", b) and adv.is_affected("1.5.0", b)
    assert adv.is_affected("1.0", _adv([{"introduced": "0"}]))  # no fix at all: every version


def test_last_affected_is_inclusive() -> None:
    a = _adv([{"introduced": "1.0"}, {"last_affected": "1.4"}])
    assert adv.is_affected("1.4", a) and adv.is_affected("1.0", a) and adv.is_affected("1.4.0", a)
    assert not adv.is_affected("1.4.1", a) and not adv.is_affected("0.9", a) and adv.fixes_for("1.4", a) == []


def test_several_ranges_and_the_fix_above_the_installed_version() -> None:
    a = _adv([{"introduced": "0"}, {"fixed": "1.2"}], [{"introduced": "2.0"}, {"fixed": "2.3"}])
    assert adv.is_affected("1.1", a) and not adv.is_affected("1.5", a) and adv.is_affected("2.1", a)
    assert not adv.is_affected("2.3", a)
    assert adv.fixes_for("1.1", a) == ["1.2", "2.3"] and adv.fixes_for("2.1", a) == ["2.3"]
    # events in one range, in any order
    assert adv.is_affected("2.1", _adv([{"fixed": "1.2"}, {"introduced": "2.0"}, {"introduced": "0"}, {"fixed": "2.3"}]))
    # only an older branch is fixed: nothing to bump to, reported, not failed
    c = _adv([{"introduced": "0"}, {"fixed": "1.2"}], [{"introduced": "2.0"}])
    assert adv.is_affected("2.5", c) and adv.fixes_for("2.5", c) == []
    out = da.evaluate(adv.audit_data({"x": "2.5"}, {"packages": ["x"], "advisories": [c]}), [], TODAY)
    assert out.status == da.PASS and "no fixed version" in out.notes[0]


def test_the_explicit_versions_list() -> None:
    a = _adv(versions=["1.5.0", "not a version"], fixed=["1.6"])
    assert adv.is_affected("1.5.0", a) and adv.is_affected("1.5", a) and adv.is_affected("not a version", a)
    assert not adv.is_affected("1.5.1", a) and not adv.is_affected("1.6", a)
    out = da.evaluate(adv.audit_data({"x": "1.5"}, {"packages": ["x"], "advisories": [a]}), [], TODAY)
    assert out.failures == ["x 1.5: TEST-1: fixed in 1.6: bump the pin to 1.6 or later"]


def test_unparseable_range_versions_never_widen_a_range() -> None:
    assert not adv.is_affected("1.0", _adv([{"introduced": "bogus"}, {"fixed": "2.0"}]))
    assert adv.is_affected("1.0", _adv([{"introduced": "0.5"}, {"fixed": "bogus"}, {"fixed": "2.0"}]))


def test_names_are_normalised_per_pep_503() -> None:
    assert adv.normalize("PyYAML") == "pyyaml" and adv.normalize("typing_extensions") == "typing-extensions"
    assert adv.normalize("boolean.py") == "boolean-py" and adv.normalize("A__b-.C") == "a-b-c"


# --- refresh, on a tiny advisory repository ------------------------------------------------------

OSV_YAML = """id: PYSEC-2099-1
summary: ''
details: |
  First line of the details.
  More text that is not kept.
aliases: [CVE-2099-1, GHSA-aaaa-bbbb-cccc]
references:
- {type: WEB, url: https://example.invalid}
affected:
- package: {name: Some_Pkg, ecosystem: PyPI, purl: pkg:pypi/some-pkg}
  ranges:
  - type: GIT
    repo: https://example.invalid/repo
    events: [{introduced: '0'}, {fixed: abcdef}]
  - type: ECOSYSTEM
    events: [{introduced: '0'}, {fixed: 1.3.0}, {introduced: 2.0.0}, {last_affected: 2.1.0}]
  versions: [1.0.0, 1.2.9, 2.1.0, 2.5.0]
"""


def test_refresh_extracts_only_what_the_audit_needs(tmp_path: Path) -> None:
    repo = tmp_path / "advisory-database"
    (repo / "vulns" / "Some_Pkg").mkdir(parents=True)
    (repo / "vulns" / "other").mkdir()
    (repo / "vulns" / "Some_Pkg" / "PYSEC-2099-1.yaml").write_text(OSV_YAML, encoding="utf-8")
    (repo / "vulns" / "Some_Pkg" / "PYSEC-2099-2.yaml").write_text(
        OSV_YAML.replace("PYSEC-2099-1", "PYSEC-2099-2") + "withdrawn: '2099-01-02T00:00:00Z'\n", encoding="utf-8")
    (repo / "vulns" / "other" / "PYSEC-2099-3.yaml").write_text(
        OSV_YAML.replace("PYSEC-2099-1", "PYSEC-2099-3").replace("Some_Pkg", "other"), encoding="utf-8")
    env = {**os.environ, "GIT_AUTHOR_DATE": "2099-01-02T03:04:05+00:00", "GIT_COMMITTER_DATE": "2099-01-02T03:04:05+00:00"}
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True, env=env)
    subprocess.run([*git, "add", "."], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "x"], check=True, env=env)
    snap = adv.extract(repo, ["some-pkg", "absent"], today=TODAY)
    assert snap["commit_date"] == "2099-01-02T03:04:05+00:00" and snap["extracted"] == "2026-11-29"
    assert snap["packages"] == ["absent", "some-pkg"] and len(snap["commit"]) == 40
    assert snap["advisories"] == [{
        "id": "PYSEC-2099-1", "aliases": ["CVE-2099-1", "GHSA-aaaa-bbbb-cccc"], "summary": "First line of the details.",
        "package": "some-pkg", "ranges": [[{"introduced": "0"}, {"fixed": "1.3.0"}, {"introduced": "2.0.0"},
                                           {"last_affected": "2.1.0"}]],
        "versions": ["2.5.0"], "fixed": ["1.3.0"]}]  # no GIT range, no references, no withdrawn advisory
    out = tmp_path / "snap.json"
    out.write_text(adv.dump(snap), encoding="utf-8")
    assert adv.load_snapshot(out) == json.loads(out.read_text(encoding="utf-8")) == snap
    a = snap["advisories"][0]
    assert [adv.is_affected(v, a) for v in ("1.2.9", "1.3.0", "2.1.0", "2.1.1", "2.5.0")] == [True, False, True, False, True]


def _dep(name: str, version: str, *vulns: dict) -> dict:
    return {"name": name, "version": version, "vulns": list(vulns)}


def _vuln(vid: str, fixes: list[str], aliases: list[str] | None = None) -> dict:
    return {"id": vid, "fix_versions": fixes, "aliases": aliases or [], "description": "..."}


def test_a_fixable_vulnerability_fails_and_names_the_pin_to_bump() -> None:
    out = da.evaluate({"dependencies": [_dep("grpcio", "1.0.0", _vuln("GHSA-1", ["1.0.1", "1.1.0"])),
                                        _dep("rich", "15.0.0")]}, [], TODAY)
    assert out.status == da.VULNERABLE and out.audited == 2
    assert out.failures == ["grpcio 1.0.0: GHSA-1: fixed in 1.0.1, 1.1.0: bump the pin to 1.0.1 or later"]


def test_an_unfixable_vulnerability_is_reported_not_failed() -> None:
    out = da.evaluate({"dependencies": [_dep("pysyncobj", "0.3.17", _vuln("PYSEC-9", []))]}, [], TODAY)
    assert out.status == da.PASS and "no fixed version" in out.notes[0]


def test_ignores_need_a_future_expiry_within_the_limit_and_match_aliases() -> None:
    deps = {"dependencies": [_dep("pyyaml", "6.0.4", _vuln("GHSA-2", ["6.0.5"], ["CVE-2026-1"]))]}
    ok = da.Ignore("CVE-2026-1", "pyyaml", "loader not used", TODAY + dt.timedelta(days=30))
    assert da.evaluate(deps, [ok], TODAY).status == da.PASS
    expired = da.Ignore("GHSA-2", "pyyaml", "x", TODAY - dt.timedelta(days=1))
    assert da.evaluate(deps, [expired], TODAY).status == da.VULNERABLE
    too_long = da.Ignore("GHSA-2", "pyyaml", "x", TODAY + dt.timedelta(days=da.MAX_IGNORE_DAYS + 1))
    assert any("more than" in f for f in da.evaluate(deps, [too_long], TODAY).failures)
    stale = da.evaluate({"dependencies": [_dep("pyyaml", "6.0.5")]}, [ok], TODAY)
    assert stale.status == da.PASS and "matches nothing" in stale.notes[0]


def test_an_audit_that_looked_nothing_up_is_never_a_pass() -> None:
    """pip-audit prints "No known vulnerabilities found" and exits 0 for this (what it does here,
    where its service answers 404 for every package)."""
    skipped = {"dependencies": [{"name": "grpcio", "skip_reason": "Dependency not found on PyPI and could not be audited: grpcio (1.85.1)"},
                                {"name": "controlplane", "skip_reason": "distribution marked as editable"}]}
    out = da.evaluate(skipped, [], TODAY)
    assert out.status == da.UNAVAILABLE and out.unaudited == ["grpcio 1.85.1"] and out.audited == 0
    assert "not a pass" in out.text()
    assert da.Report(error="pip-audit exited 1: ConnectionError").status == da.UNAVAILABLE


def test_the_ignore_file_is_valid_and_malformed_entries_are_named(tmp_path: Path) -> None:
    da.load_ignores()  # the project's own file parses
    bad = tmp_path / "ignore.toml"
    bad.write_text('[[ignore]]\nid = "GHSA-3"\npackage = "x"\nexpires = 2027-01-01\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"ignore\[0\]: missing reason"):
        da.load_ignores(bad)
