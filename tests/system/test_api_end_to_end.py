"""Acceptance, end to end: a real local group (`controlplane up --nodes 3`: three coordinator
processes with TLS and an admin token, three simulated-backend adapters) driven only through
`tenantctl` subprocesses, as a platform team would.

* apply a file with two tenants (different priorities) and a deployment each; every object is
  visible on every node (one tenantctl context per node) with identical resource versions;
* `tenantctl watch -o json` sees the new deployments' instances go Pending -> Warming -> Ready and
  the planner's DECIDED events; SIGKILL the Raft leader mid-watch: the watch resumes on another
  node after the last revision it printed, without losing or repeating an event (checked against
  a survivor's retained events), the deployments keep changing state, and writes still work;
* isolation: a token scoped to one tenant lists only its deployments, gets and deletes of the other
  tenant's are NOT_FOUND (exit 1) and change nothing; no token / a revoked token -> UNAUTHENTICATED;
* bad files (YAML syntax, unknown field, wrong type): file, object and field named, exit 1, nothing
  changed in the group.

`controlplane up` keeps the group running when one of its children dies (it reports the death on
stderr), so the leader is killed under the running `up`, as a user would; the SIGTERM at the end
stops it and everything it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.waiting import alive, wait_until

UP = [sys.executable, "-m", "controlplane.cli.main", "up"]
TENANTCTL = [sys.executable, "-m", "controlplane.cli.tenantctl"]
CALL_TIMEOUT_S = 30

TEAMS = """\
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: team-a}
spec:
  priority: 200
  quota: {h100: 8}
---
apiVersion: controlplane.io/v1
kind: Tenant
metadata: {name: team-b}
spec:
  priority: 50
  quota: {h100: 4}
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat-a}
spec:
  tenant: team-a
  engine: vllm
  model: llama3-8b-h100
  pool: h100
  min_replicas: 1
  max_replicas: 4
  warm_pool: 0
---
apiVersion: controlplane.io/v1
kind: Deployment
metadata: {name: chat-b}
spec:
  tenant: team-b
  engine: vllm
  model: llama3-8b-h100
  pool: h100
  min_replicas: 1
  max_replicas: 2
  warm_pool: 0
"""
OURS = {"chat-a": "team-a", "chat-b": "team-b"}


# --------------------------------------------------------------------------------------------------
# the group and tenantctl
# --------------------------------------------------------------------------------------------------


@dataclass
class Result:
    argv: list[str]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"tenantctl {' '.join(self.argv)} -> {self.rc}\nstdout: {self.out}\nstderr: {self.err}"


@dataclass
class Group:
    root: Path
    listing: dict
    config: Path
    """`up`'s tenantctl configuration: context local, every endpoint, the admin token."""
    nodes_config: Path
    """One context per coordinator (named by node id, one endpoint each), admin token."""
    up: subprocess.Popen
    killed: set[str] = field(default_factory=set)

    @property
    def node_ids(self) -> list[str]:
        return [n["node_id"] for n in self.listing["nodes"]]

    def endpoint(self, node_id: str) -> str:
        return next(n["api_address"] for n in self.listing["nodes"] if n["node_id"] == node_id)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTCTL_")}
        env.update(TENANTCTL_CONFIG=str(self.config), HOME=str(self.root), NO_COLOR="1", COLUMNS="200", **extra)
        return env

    def ctl(self, *argv: str, stdin: str | None = None, **env: str) -> Result:
        res = subprocess.run(TENANTCTL + list(argv), check=False, capture_output=True, text=True, input=stdin,
                             timeout=CALL_TIMEOUT_S, env=self.env(**env))
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
        return Result(list(argv), res.returncode, res.stdout, res.stderr)

    def ok(self, *argv: str, **env: str) -> Result:
        res = self.ctl(*argv, **env)
        assert res.rc == 0, str(res)
        return res

    def per_node(self, kind: str) -> dict[str, list[dict]]:
        """`get KIND -o json` on every live node, by node id (each node answers from its replica)."""
        live = [n for n in self.node_ids if n not in self.killed]
        argv = ["--config", str(self.nodes_config)]
        argv += ["--all-contexts"] if not self.killed else []
        if self.killed:  # --all-contexts would report the dead node: one call per live node
            return {n: self.ok(*argv, "--context", n, "get", kind, "-o", "json").json()["items"] for n in live}
        data = self.ok(*argv, "get", kind, "-o", "json").json()
        assert data["kind"] == "ContextLists"
        return {c["context"]: c["items"] for c in data["contexts"]}

    def status(self) -> list[dict]:
        res = self.ctl("--timeout", "2", "status", "-o", "json")
        return json.loads(res.out) if res.out.strip() else []

    def leader(self) -> dict | None:
        """The node that is Raft leader and lease holder according to every live node, once they agree."""
        nodes = [n for n in self.status() if n.get("reachable")]
        if len(nodes) != len(self.node_ids) - len(self.killed):
            return None
        leaders = [n for n in nodes if n["role"] == "leader" and n["lease"]["holder"] == n["node_id"]
                   and n["lease"]["remaining_ms"] > 0]
        if len(leaders) != 1 or any(n["leader_id"] != leaders[0]["node_id"] for n in nodes):
            return None
        return leaders[0]


def write_node_contexts(root: Path, config: Path, listing: dict) -> Path:
    cfg = yaml.safe_load(config.read_text())
    local = cfg["contexts"][0]
    cfg["contexts"] = [dict(local, name=n["node_id"], endpoints=[n["api_address"]]) for n in listing["nodes"]]
    cfg["current-context"] = listing["nodes"][0]["node_id"]
    path = root / "per-node.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    root = tmp_path_factory.mktemp("up")
    # --no-restart: the killed leader stays down (the watch must resume on a survivor; `up`'s own
    # restarts are tested in tests/system/test_up_supervise.py).
    up = subprocess.Popen(UP + ["--nodes", "3", "--json", "--dir", str(root), "--no-restart"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    listing: dict = {"nodes": [], "adapters": []}
    try:
        listing = json.loads(up.stdout.readline())  # type: ignore[union-attr]
        config = Path(listing["tenantctl_config"])
        g = Group(root, listing, config, write_node_contexts(root, config, listing), up)
        # The lease holder registers the admin token after its election: until then UNAUTHENTICATED.
        wait_until(g.leader, 30.0, "one leader and lease holder that every node agrees on", 0.3)
        yield g
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(20)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait(5)
        for child in listing["nodes"] + listing["adapters"]:  # only if `up` could not stop them
            if alive(child["pid"]):
                os.kill(child["pid"], signal.SIGKILL)
    assert not any(alive(c["pid"]) for c in listing["nodes"] + listing["adapters"])


class Watch:
    """`tenantctl watch -o json` as a subprocess: its stdout lines (events) and stderr lines (notices)."""

    def __init__(self, g: Group, *argv: str) -> None:
        # SIGINT as a terminal's Ctrl-C: a child inherits an *ignored* SIGINT (a test run started in
        # the background of a non-interactive shell has it ignored, and Python then never raises
        # KeyboardInterrupt), so the child starts with the default disposition. PYTHONFAULTHANDLER:
        # if it ever ignores Ctrl-C anyway, stop() aborts it and its stderr shows where it was.
        self.proc = subprocess.Popen(TENANTCTL + list(argv) + ["watch", "-o", "json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=g.env(PYTHONFAULTHANDLER="1"),
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.events: list[dict] = []
        self.notices: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream: Any, is_out: bool) -> None:
        for line in stream:
            with self._lock:
                if is_out:
                    self.events.append(json.loads(line))
                else:
                    self.notices.append(line.rstrip("\n"))

    def snapshot(self) -> tuple[list[dict], list[str]]:
        with self._lock:
            return list(self.events), list(self.notices)

    def find(self, pred: Any) -> list[dict]:
        return [e for e in self.snapshot()[0] if pred(e)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack first
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        for t in self._threads:
            t.join(5)


def spec_view(items: list[dict]) -> dict[str, Any]:
    """What a write changes (name -> metadata and spec), not the live status."""
    return {o["metadata"]["name"]: {"metadata": o["metadata"], "spec": o["spec"]} for o in items}


def identity(e: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in e.items() if k != "served_by"))


# --------------------------------------------------------------------------------------------------
# the tests (in file order: the first one leaves the group with two coordinators)
# --------------------------------------------------------------------------------------------------


def test_apply_everywhere_watch_transitions_and_survive_a_leader_kill(group: Group) -> None:
    g = group
    leader = g.leader()
    assert leader is not None
    others = [n for n in g.node_ids if n != leader["node_id"]]
    # The watch starts on the leader (then the others), so killing the leader breaks its stream.
    watch = Watch(g, "--endpoint", ",".join(g.endpoint(n) for n in [leader["node_id"], *others]))
    try:
        # Connected once it prints (the demo deployment changes state every few seconds); the watch
        # starts "from now", so apply only then.
        wait_until(lambda: watch.snapshot()[0] or watch.proc.poll() is not None, 20.0, "the watch's first event", 0.1)
        assert watch.proc.poll() is None, watch.snapshot()[1]
        teams = g.root / "teams.yaml"
        teams.write_text(TEAMS)
        applied = g.ok("apply", "-f", str(teams))
        assert applied.out.split("\n")[:4] == ["tenant/team-a created", "tenant/team-b created",
                                               "deployment/chat-a created", "deployment/chat-b created"]

        # Every object on every node, at the same resource version.
        def everywhere(kind: str, names: set[str]) -> dict[str, dict]:
            views = {node: spec_view(items) for node, items in g.per_node(kind).items()}
            if not all(names <= set(v) for v in views.values()):
                return {}
            first = views[g.node_ids[0]]
            assert all({n: v[n] for n in names} == {n: first[n] for n in names} for v in views.values()), views
            return first

        tenants = wait_until(lambda: everywhere("tenants", {"team-a", "team-b"}), 10.0, "the tenants on every node", 0.2)
        assert tenants["team-a"]["spec"]["priority"] == 200 and tenants["team-b"]["spec"]["priority"] == 50
        deps = wait_until(lambda: everywhere("deployments", set(OURS)), 10.0, "the deployments on every node", 0.2)
        assert {n: deps[n]["spec"]["tenant"] for n in OURS} == OURS
        versions = [tenants["team-a"], tenants["team-b"], deps["chat-a"], deps["chat-b"]]
        revs = [o["metadata"]["resourceVersion"] for o in versions]
        assert revs == sorted(revs) and len(set(revs)) == 4  # applied in order, one revision each

        # The watch: ADDED events, the planner's decisions, and each new instance warming up.
        def lifecycle(dep: str) -> bool:
            ev = watch.find(lambda e: e.get("deployment") == dep)
            steps = {(e.get("from_state", ""), e["to_state"]) for e in ev if e["type"] == "TRANSITION"}
            return (any(e["type"] == "DECIDED" and e["replicas"] >= 1 for e in ev)
                    and {("", "Pending"), ("Pending", "Warming"), ("Warming", "Ready")} <= steps)

        for dep in OURS:
            wait_until(lambda dep=dep: lifecycle(dep), 30.0, f"{dep}: DECIDED and Pending -> Warming -> Ready", 0.2)
        added = {(e["kind"], e["name"]): e["revision"] for e in watch.find(lambda e: e["type"] == "ADDED")}
        assert {("Tenant", "team-a"), ("Tenant", "team-b"), ("Deployment", "chat-a"), ("Deployment", "chat-b")} <= set(added)
        assert [added[("Tenant", "team-a")], added[("Tenant", "team-b")], added[("Deployment", "chat-a")],
                added[("Deployment", "chat-b")]] == revs  # event revision == resource version
        assert {e["served_by"] for e in watch.snapshot()[0]} == {leader["node_id"]}

        # Kill the leader mid-watch, under the running `up` (which reports it and keeps the rest).
        killed_at = max(e["revision"] for e in watch.snapshot()[0])
        os.kill(leader["pid"], signal.SIGKILL)
        g.killed.add(leader["node_id"])
        wait_until(lambda: not alive(leader["pid"]) or _reaped(leader["pid"]), 5.0, "the leader to die")

        def resumed_changes() -> list[dict]:
            return watch.find(lambda e: e["served_by"] != leader["node_id"] and e.get("deployment") in OURS
                              and e["type"] in ("TRANSITION", "DECIDED"))

        # The deployments keep changing state (the simulated load), seen through another node.
        wait_until(resumed_changes, 45.0, "our deployments' transitions or decisions after the leader died", 0.2)
        assert g.up.poll() is None, "`controlplane up` must keep the surviving nodes running"
        new_leader = wait_until(g.leader, 20.0, "a new leader among the survivors", 0.3)
        assert new_leader["node_id"] in others

        events, notices = watch.snapshot()
        resumes = [line for line in notices if "resuming after revision" in line]
        assert resumes and g.endpoint(leader["node_id"]) in resumes[0], notices
        resumed_after = int(resumes[0].rsplit("revision", 1)[1].split()[0].strip(" ;)"))
        before = [e for e in events if e["served_by"] == leader["node_id"]]
        after = [e for e in events if e["served_by"] != leader["node_id"]]
        assert events == before + after  # one switch, from the dead leader to one survivor
        assert {e["served_by"] for e in after} == {others[0]}
        # It resumes after the last revision it delivered completely (a revision may hold several
        # events, so that can be the one before the last event printed; or a later bookmark's).
        assert resumed_after >= before[-1]["revision"] - 1 and resumed_after >= killed_at - 1
        assert after[0]["revision"] > resumed_after
        # No event lost, none repeated: exactly the survivor's retained events over the same span.
        revs_seen = [e["revision"] for e in events]
        assert revs_seen == sorted(revs_seen)
        first, last = revs_seen[0], revs_seen[-1]
        survivor = g.ok("--endpoint", g.endpoint(others[0]), "events", "--since", str(first - 1), "-o", "json").json()
        expected = [identity(e) for e in survivor if e["revision"] <= last]
        assert [identity(e) for e in events] == expected
        print(f"watch: {len(before)} events from {leader['node_id']} up to revision {before[-1]['revision']}, "
              f"resumed after {resumed_after} on {others[0]}: {len(after)} events up to {last}")

        # Writes work through the survivors (the dead endpoint is still in the context).
        more = g.root / "more.yaml"
        more.write_text(TEAMS.replace("max_replicas: 2", "max_replicas: 3"))
        out = g.ok("apply", "-f", str(more)).out
        assert "deployment/chat-b configured" in out
        wait_until(lambda: all(spec_view(items).get("chat-b", {}).get("spec", {}).get("max_replicas") == 3
                               for items in g.per_node("deployments").values()),
                   10.0, "the update on both survivors", 0.2)
        wait_until(lambda: watch.find(lambda e: e["type"] == "MODIFIED" and e["name"] == "chat-b"), 10.0,
                   "the watch to report the update")
    finally:
        watch.stop()
    assert watch.proc.returncode in (0, 130, -signal.SIGINT), "\n".join(watch.snapshot()[1])


def _reaped(pid: int) -> bool:
    """A killed coordinator stays a zombie while `up` (its parent) is paused: dead all the same."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_a_tenant_token_sees_and_changes_only_its_tenant(group: Group) -> None:
    g = group
    teams = g.root / "teams.yaml"
    teams.write_text(TEAMS)
    g.ok("apply", "-f", str(teams))  # idempotent; makes this test independent of the first
    token = g.ok("token", "create", "--tenant", "team-a").out.strip()
    assert token.startswith("cp_") and len(token.splitlines()) == 1

    # The token is replicated: a follower that has not applied it yet would refuse it for a moment.
    mine = wait_until(lambda: (r := g.ctl("get", "deployments", "-o", "json", TENANTCTL_TOKEN=token)).rc == 0 and r,
                      5.0, "the new token to be accepted", 0.1)
    assert {o["metadata"]["name"] for o in mine.json()["items"]} == {"chat-a"}
    assert g.ok("--token", token, "whoami", "-o", "json").json()["tenant"] == "team-a"

    for verb in (["get", "deployment", "chat-b"], ["delete", "deployment", "chat-b"], ["describe", "deployment", "chat-b"]):
        res = g.ctl("--token", token, *verb)
        assert res.rc == 1 and "NOT_FOUND" in res.err and "'chat-b' not found" in res.err, str(res)
    res = g.ctl("--token", token, "get", "tenant", "team-b")
    assert res.rc == 1 and "NOT_FOUND" in res.err, str(res)
    chat_b = g.ok("get", "deployment", "team-b/chat-b", "-o", "json").json()  # admin: still there, not deleting
    assert chat_b["spec"]["tenant"] == "team-b" and not chat_b.get("status", {}).get("deleting"), chat_b

    # No token at all: a context with the CA and endpoints only.
    bare = yaml.safe_load(g.config.read_text())
    bare["contexts"][0].pop("token")
    no_token = g.root / "no-token.yaml"
    no_token.write_text(yaml.safe_dump(bare))
    no_token.chmod(0o600)
    res = g.ctl("--config", str(no_token), "get", "deployments")
    assert res.rc == 1 and "UNAUTHENTICATED" in res.err, str(res)

    # A revoked token is refused (on every node, once the revocation is applied there).
    token_id = token.split("_")[1]
    g.ok("token", "revoke", token_id)

    def refused() -> Result | None:
        r = g.ctl("--token", token, "get", "deployments")
        return r if r.rc == 1 and "UNAUTHENTICATED" in r.err else None

    wait_until(refused, 5.0, "the revoked token to be refused", 0.1)
    assert token_id not in {t["id"] for t in g.ok("token", "list", "-o", "json").json()["items"]}


GOOD_FIRST = "apiVersion: controlplane.io/v1\nkind: Tenant\nmetadata: {name: team-c}\nspec:\n  priority: 10\n---\n"
"""Each bad file starts with a valid new tenant (lines 1-5): it must not be created either."""
BAD_FILES = {  # name: (the second object (from line 7), what the first error line must say)
    "syntax.yaml": (("apiVersion: controlplane.io/v1\nkind: Tenant\nmetadata: {name: team-a}\n"
                    "spec:\n  priority: 10\n   quota: {h100: 1}\n"),
                    [":12", "not valid YAML", "mapping values are not allowed"]),
    "unknown.yaml": (("apiVersion: controlplane.io/v1\nkind: Tenant\nmetadata: {name: team-a}\n"
                     "spec:\n  priority: 10\n  quotas: {h100: 1}\n"),
                     [":12", "object 2 (Tenant/team-a)", "spec.quotas", "unknown field"]),
    "type.yaml": (("apiVersion: controlplane.io/v1\nkind: Deployment\nmetadata: {name: chat-a}\nspec:\n  tenant: team-a\n"
                  "  engine: vllm\n  model: llama3-8b-h100\n  pool: h100\n  max_replicas: many\n"),
                  [":15", "object 2 (Deployment/chat-a)", "spec.max_replicas", "valid integer"]),
}


def test_a_bad_file_names_file_object_and_field_and_changes_nothing(group: Group) -> None:
    g = group

    def state() -> dict:
        return {kind: spec_view(g.ok("get", kind, "-o", "json").json()["items"]) for kind in ("tenants", "deployments")}

    before = state()
    for name, (text, expected) in BAD_FILES.items():
        path = g.root / name
        path.write_text(GOOD_FIRST + text)
        res = g.ctl("apply", "-f", str(path))
        assert res.rc == 1, str(res)
        first = res.err.splitlines()[0]
        assert first.startswith(f"tenantctl: error: {path}"), str(res)
        assert all(part in first for part in expected), str(res)
        assert "nothing was sent" in res.err and res.out == "", str(res)
    after = state()
    assert "team-c" not in after["tenants"]
    assert after == before
