"""Runs the hostile-input attacks (``hostile.py`` plans and judges them, ``attacks.py`` sends them).

Each attack gets a fresh group (:class:`Group`: the chaos cluster of ``cluster.py`` -- 3 real
coordinators, 2 simulated adapters, everything on 127.0.0.1 -- plus the chaos client writing a tenant
every ~0.1 s through the API), so that one attack's damage (a poisoned adapter, a deaf member) cannot
spoil the next one's verdict. The group is ready when a coordinator holds the lease and a write was
acknowledged; the attack starts ``spec.start_s`` later. After it, the client pauses and the bench
collects the global figures: the longest write gap in the attack's window, acknowledged writes
missing on a live member, objects that differ at the same resource_version across members, and
``Traceback`` in any process's stderr.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from controlplane.chaos import attacks as a
from controlplane.chaos import hostile as h
from controlplane.chaos.cluster import DEPLOYMENT, MAX_REPLICAS, ChaosCluster, Proc
from controlplane.chaos.history import JournalReader
from controlplane.chaos.node import read_json
from controlplane.chaos.runner import Client

READY_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 15.0
RESYNC_TIMEOUT_S = 20.0
TENANT_TIMEOUT_S = 20.0
START_ATTEMPTS = 2


class HostileError(Exception):
    """The bench itself could not run (the group never became ready...)."""


class Group:
    def __init__(self, root: Path, seed: int, *, tmpfs: tuple[int, int] | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.root, self.seed, self.log = root, seed, log
        self.cluster = ChaosCluster(root, 3, 2)
        self.tmpfs_dir: Path | None = None
        if tmpfs is not None:  # (member index, MiB): that member's data directory on a small tmpfs
            self.tmpfs_dir = self.data_dir(self.cluster.coords[tmpfs[0]])
            a.mount_tmpfs(self.tmpfs_dir, tmpfs[1])
        self.client: Client | None = None

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        c = self.cluster
        c.set_load("low")
        c.start_all()
        self.client = Client(c.endpoints, c.token, self.seed)
        self.client.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if (c.holder() is not None and self.client.writes.acked
                    and all(c.status(p) is not None for p in c.coords)):  # every member up, none lost at start
                return
            if any(p.popen is not None and p.popen.poll() is not None for p in c.coords + c.adapters):
                raise HostileError(f"a process exited while the group started (a port taken meanwhile?); "
                                   f"logs under {self.root}")
            time.sleep(0.1)
        raise HostileError(f"no lease holder and no acknowledged write within {READY_TIMEOUT_S:.0f}s (logs under {self.root})")

    def close(self) -> None:
        if self.client is not None:
            self.client.stopped.set()
            self.client.join(5.0)
        self.cluster.close()
        if self.tmpfs_dir is not None:
            a.unmount(self.tmpfs_dir)

    # --- members ------------------------------------------------------------------------------------
    def plan_of(self, proc: Proc) -> Any:
        return next(p for p in self.cluster.plans if p.node_id == proc.name)

    def data_dir(self, proc: Proc) -> Path:
        return Path(yaml.safe_load(self.plan_of(proc).config.read_text(encoding="utf-8"))["data_dir"])

    def pid(self, proc: Proc) -> int:
        assert proc.popen is not None
        return proc.popen.pid

    def leader(self) -> Proc | None:
        for p in self.cluster.coords:
            st = self.cluster.status(p)
            if st and st.get("role") == "leader":
                return p
        return None

    def resolve(self, target: str, rng: random.Random) -> Proc:
        coords = self.cluster.coords
        if target.isdigit():
            return coords[int(target) % len(coords)]
        if target == "dialled":  # pysyncobj: a member dials the members with a smaller address
            return min(coords, key=lambda p: self.plan_of(p).raft_address)
        leader = self.leader()
        if target == "leader" and leader is not None:
            return leader
        return rng.choice([p for p in coords if p is not leader])

    def term(self) -> int | None:
        terms = [int(st["term"]) for p in self.cluster.coords if (st := self.cluster.status(p)) and "term" in st]
        return max(terms) if terms else None

    def lease(self) -> tuple[int, str] | None:
        holder = self.cluster.holder()
        st = self.cluster.status(holder) if holder is not None else None
        return None if st is None else (int(st["epoch"]), holder.name)  # type: ignore[union-attr]

    def stop(self, proc: Proc, grace_s: float = 5.0) -> None:
        """SIGTERM (a clean stop: files flushed), SIGKILL after ``grace_s``."""
        if proc.popen is None or not proc.alive:
            return
        self.cluster.resume(proc)
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)

    def stderr(self, proc: Proc) -> Path:
        return proc.directory / "stderr.log"

    # --- the tenants of the flood attacks -----------------------------------------------------------
    def tenant_token(self, tenant: str) -> str:
        """As admin: the tenant (quota h100:1) and a token scoped to it, usable on every coordinator."""
        from controlplane.api.client import ApiClient, ApiError, Unreachable
        from controlplane.api.v1 import api_pb2
        from controlplane.chaos.isolation import tenant_msg

        c = self.cluster
        deadline = time.monotonic() + TENANT_TIMEOUT_S
        with ApiClient(c.endpoints, token=c.token, timeout_s=3.0) as client:
            token = ""
            while not token:
                try:
                    try:
                        client.call("Tenants", "CreateTenant", api_pb2.CreateTenantRequest(
                            tenant=tenant_msg(tenant, quota={"h100": 1})), idempotent=False)
                    except ApiError as exc:
                        if exc.code.name != "ALREADY_EXISTS":
                            raise
                    token = client.call("Tokens", "CreateToken", api_pb2.CreateTokenRequest(role="tenant", tenant=tenant),
                                        idempotent=False).token
                except (ApiError, Unreachable) as exc:
                    if time.monotonic() > deadline:
                        raise HostileError(f"tenant {tenant}: {exc}") from None
                    time.sleep(0.2)
        with ApiClient(c.endpoints, token=token, timeout_s=2.0) as client:
            for ep in c.endpoints:  # the token is checked against each node's replicated state
                while True:
                    try:
                        client.call("Tokens", "WhoAmI", api_pb2.WhoAmIRequest(), endpoint=ep)
                        break
                    except (ApiError, Unreachable) as exc:
                        if time.monotonic() > deadline:
                            raise HostileError(f"tenant {tenant}: its token not usable on {ep}: {exc}") from None
                        time.sleep(0.2)
        return token

    # --- the global figures -------------------------------------------------------------------------
    def views(self, procs: list[Proc]) -> dict[str, dict[str, tuple[int, str]]]:
        """Per member: tenant and deployment name -> (resource_version, spec as text), read locally."""
        from controlplane.api.client import ApiClient, ApiError, Unreachable
        from controlplane.api.v1 import api_pb2

        out: dict[str, dict[str, tuple[int, str]]] = {}
        with ApiClient(self.cluster.endpoints, token=self.cluster.token, timeout_s=3.0) as client:
            for p in procs:
                ep = self.plan_of(p).api_address
                try:
                    view = {}
                    for t in client.call("Tenants", "ListTenants", api_pb2.ListRequest(), endpoint=ep).items:
                        view[f"tenant/{t.metadata.name}"] = (t.metadata.resource_version, str(t.spec))
                    for d in client.call("Deployments", "ListDeployments", api_pb2.ListRequest(), endpoint=ep).items:
                        # names are per tenant: two tenants may both own one
                        view[f"deployment/{d.spec.tenant}/{d.metadata.name}"] = (d.metadata.resource_version, str(d.spec))
                    out[p.name] = view
                except (ApiError, Unreachable):
                    continue
        return out

    def settle(self, down: set[str]) -> list[str]:
        """Pause the client; the acknowledged writes missing on a live member after the settle wait."""
        assert self.client is not None
        self.client.pause()
        acked = set(self.client.writes.names())
        live = [p for p in self.cluster.coords if p.alive and p.name not in down]
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        missing: set[str] = set()
        while time.monotonic() < deadline:
            missing = {f"{n} on {p.name}" for p in live for n in acked - set(self.cluster.tenants(p)[1])}
            if not missing:
                break
            time.sleep(0.2)
        return sorted(missing)

    def global_obs(self, window: tuple[float, float], down: set[str]) -> dict[str, Any]:
        assert self.client is not None
        times = [t for t, _ in list(self.client.writes.acked)]
        lost = self.settle(down)
        live = [p for p in self.cluster.coords if p.alive and p.name not in down]
        procs = self.cluster.coords + self.cluster.adapters
        return {"max_commit_gap_ms": h.max_gap_ms(times, *window),
                "first_commit_ms": next(((t - window[0]) * 1000 for t in sorted(times) if t >= window[0]), None),
                "lost_writes": lost, "divergent": h.divergence(self.views(live)),
                "tracebacks": {p.name: a.count_tracebacks(self.stderr(p)) for p in procs},
                "writes": {"acked": len(times), "failed": self.client.writes.failed, "unknown": self.client.writes.unknown,
                           "errors": dict(self.client.codes)}}


# =====================================================================================================
# the attacks: each returns (attack observations, the window of the commit check, members down)
# =====================================================================================================

Outcome = tuple[dict[str, Any], tuple[float, float], set[str]]


def poisoned_fence(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    from controlplane.api.client import ApiClient
    from controlplane.api.v1 import adapter_pb2, admin_pb2

    c = g.cluster
    poisoned, other = c.adapters[int(spec.target)], c.adapters[int(spec.params["forged_scale_adapter"])]
    coords = {p.name for p in c.coords}
    t0 = time.monotonic()
    holder = c.holder() or c.coords[0]
    with ApiClient([g.plan_of(holder).api_address], token=c.token, timeout_s=2.0) as client:
        st = client.call("Admin", "Status", admin_pb2.StatusRequest())
    epoch, name, source = int(st.lease_epoch), st.lease_holder, "Admin.Status"
    if not epoch or not name:  # hidden from Status: the bench knows it anyway (the strongest attacker)
        epoch, name, source = *(g.lease() or (0, "")), "the holder's status file"
    rid = f"hostile-forged-{spec.seed}"
    scale = adapter_pb2.ScaleRequest(cluster_id=other.name, request_id=rid, deployment_id=DEPLOYMENT, replicas=0,
                                     fence=adapter_pb2.FenceToken(epoch=epoch, seq=1, holder=name))
    obs: dict[str, Any] = {"scale_code": a.adapter_call(other.config, "Scale", scale), "scale_epoch": epoch,
                           "scale_holder": name, "scale_source": source}
    fence = adapter_pb2.FenceRequest(cluster_id=poisoned.name,
                                     fence=adapter_pb2.FenceToken(epoch=h.POISON_EPOCH, seq=1, holder="hostile"))
    obs["fence_code"] = a.adapter_call(poisoned.config, "Fence", fence)
    t_load = time.monotonic()
    c.set_load("high")  # a decision every cluster's holder must still take: scale out
    obs["decided_ms"] = None
    while time.monotonic() < t_load + h.DECIDE_S:
        holder = c.holder()
        st = c.status(holder) if holder is not None else None
        if st and (st.get("desired") or {}).get(DEPLOYMENT) == MAX_REPLICAS:
            obs["decided_ms"] = round((time.monotonic() - t_load) * 1000, 1)
            break
        time.sleep(0.1)
    time.sleep(max(0.0, t0 + spec.duration_s - time.monotonic()))
    t1 = time.monotonic()
    persisted = read_json(c.root / "adapters" / f"{poisoned.name}.epoch.json", {})
    obs["persisted_epoch"] = int(persisted.get("epoch", 0)) if isinstance(persisted, dict) else None
    journal = other.directory / "journal.jsonl"
    records = JournalReader(journal).read()
    obs["scale_carried_out"] = any(r.get("k") == "cmd" and r.get("rid") == rid for r in records)
    obs["other_commands"] = sum(1 for r in records if r.get("k") == "cmd" and r.get("rid") != rid
                                and float(r.get("t", 0)) >= t_load and r.get("holder") in coords)
    return obs, (t0, t1), set()


def raft_frames(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    target = g.resolve(spec.target, rng)
    pid, p = g.pid(target), spec.params
    obs: dict[str, Any] = {"target": target.name, "rss_before_mib": a.rss_mib(pid), "term_before": g.term()}
    t0 = time.monotonic()
    flood = a.FrameFlood(g.plan_of(target).raft_address, senders=p["senders"], rate_bps=p["rate_bps"],
                         announced=p["announced"], preload=p["preload_mib"] << 20, half_bytes=p["half_frame_bytes"],
                         deadline=t0 + spec.duration_s).start()
    peak = obs["rss_before_mib"] or 0.0
    while time.monotonic() < t0 + spec.duration_s:
        peak = max(peak, a.rss_mib(pid) or 0.0)
        time.sleep(0.2)
    flood.stop()
    time.sleep(1.0)  # an election the stall started finishes
    t1 = time.monotonic()
    obs.update(rss_max_mib=max(peak, a.rss_mib(pid) or 0.0), term_after=g.term(), alive_after=target.alive,
               sent_mib=round(flood.stats.sent_bytes / 2**20, 1), dropped_by_member=flood.stats.dropped_by_peer,
               connect_errors=flood.stats.connect_errors)
    return obs, (t0, t1), set()


def fd_exhaustion(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    c = g.cluster
    target = g.resolve(spec.target, rng)
    pid, p, plan = g.pid(target), spec.params, g.plan_of(target)
    limit = (a.open_fds(pid) or 0) + p["headroom"]
    a.raise_own_fd_limit(p["max_connections"] + p["api_connections"] + 256)
    a.limit_fds(pid, limit)
    hog = a.FdHog()
    t0 = time.monotonic()
    peak = 0

    extra = 0

    def at_limit() -> bool:  # the member is out of descriptors, and a few more connections tried
        nonlocal peak, extra
        peak = max(peak, a.open_fds(pid) or 0)
        extra += peak >= limit
        return extra > 8

    end = t0 + spec.duration_s
    try:
        # Raft connections first: the member's connection caps accept and close the excess at once, so
        # they cannot exhaust it any more; then the API port (no cap of its own) takes it to its limit,
        # so the Raft listener meets EMFILE on the next dial of a peer.
        hog.open(plan.raft_address, p["max_connections"], end, stop_when=at_limit)
        hog.open(plan.api_address, p["api_connections"], end, stop_when=at_limit)
        obs: dict[str, Any] = {"target": target.name, "limit": limit, "open_connections": len(hog.socks),
                               "refused": hog.refused, "connect_timeouts": hog.timeouts}
        while time.monotonic() < end:
            at_limit()
            time.sleep(0.1)
    finally:
        hog.release()
    t_release = time.monotonic()
    obs["member_fds_peak"] = peak
    obs["reached_limit"] = peak >= limit - 1
    deadline = t_release + 3.0
    while not (ok := a.accepts(plan.raft_address)) and time.monotonic() < deadline:
        time.sleep(0.2)
    obs["reaccepts"] = ok
    t1 = time.monotonic() + 0.5
    time.sleep(0.5)
    # a quorum that needs the member: another member restarted (it must connect to the member anew)
    # while the third is paused
    others = [x for x in c.coords if x is not target]
    restarted, paused = others[0], others[1]
    c.kill(restarted)
    c.start(restarted)
    c.pause(paused)
    tq = time.monotonic()
    assert g.client is not None
    try:
        while time.monotonic() < tq + h.QUORUM_S:
            first = g.client.writes.first_ack_after(tq)
            if first is not None:
                obs["quorum_ms"] = round((first - tq) * 1000, 1)
                break
            time.sleep(0.1)
        else:
            obs["quorum_ms"] = None
    finally:
        c.resume(paused)
    obs["alive_after"] = target.alive
    return obs, (t0, t1), set()


def _variant(g: Group, variant: str, spec: h.AttackSpec, rng: random.Random) -> dict[str, Any]:
    c = g.cluster
    follower = g.resolve("follower", rng)
    log = g.stderr(follower)
    g.stop(follower)
    obs: dict[str, Any] = {"member": follower.name, "requires_notice": variant == "empty_meta"}
    try:
        obs["done"] = a.corrupt(g.data_dir(follower), variant, spec.params["garbage_seed"])
    except (OSError, ValueError) as exc:
        return {**obs, "error": f"{type(exc).__name__}: {exc}"}
    offset = log.stat().st_size if log.exists() else 0
    t_restart = time.monotonic()
    assert g.client is not None
    before = set(g.client.writes.names())
    c.start(follower)
    end = t_restart + spec.duration_s
    caught_up = False
    while time.monotonic() < end and follower.alive:
        caught_up = before <= set(c.tenants(follower)[1]) and c.status(follower) is not None
        if caught_up and time.monotonic() > t_restart + 2.0:
            break
        time.sleep(0.2)
    new = log.read_bytes()[offset:].decode("utf-8", "replace") if log.exists() else ""
    rc = follower.popen.poll() if follower.popen is not None else None
    others = [p for p in c.coords if p is not follower and p.alive]
    views = g.views([follower] + others) if rc is None else {}
    obs.update(returncode=rc, health=None if rc is not None else a.health(g.plan_of(follower).api_address),
               caught_up=caught_up, diverged=h.divergence(views) if follower.name in views else [],
               tracebacks=new.count("Traceback"), clear_line=any("journal" in ln.lower() for ln in new.splitlines()),
               log_tail=new.strip().splitlines()[-1][:300] if new.strip() else "")
    # repair: wipe its data and let it re-sync from the leader (docs/reliability.md)
    g.stop(follower)
    shutil.rmtree(g.data_dir(follower), ignore_errors=True)
    c.start(follower)
    t_fix = time.monotonic()
    names = set(g.client.writes.names())
    while time.monotonic() < t_fix + RESYNC_TIMEOUT_S:
        if names <= set(c.tenants(follower)[1]) and c.status(follower) is not None:
            obs["resynced_ms"] = round((time.monotonic() - t_fix) * 1000, 1)
            break
        time.sleep(0.2)
    else:
        obs["resynced_ms"] = None
    return obs


def journal_corruption(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    t0 = time.monotonic()
    variants = {}
    for variant in spec.params["variants"]:
        variants[variant] = _variant(g, variant, spec, rng)
        if variants[variant].get("resynced_ms") is None:  # the group is down a member for good
            break
    return {"variants": variants}, (t0, time.monotonic()), set()


def disk_full(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    target = g.cluster.coords[int(spec.target)]
    assert g.tmpfs_dir is not None and target.popen is not None
    log = g.stderr(target)
    offset = log.stat().st_size if log.exists() else 0
    t0 = time.monotonic()
    free = a.fill(g.tmpfs_dir, spec.params["tmpfs_mib"] << 20)
    obs: dict[str, Any] = {"target": target.name, "free_bytes": free, "filled": free < 64 * 1024}
    report = None
    while time.monotonic() < t0 + spec.duration_s:  # the rest go on whatever the member does
        if target.popen.poll() is None and a.health(g.plan_of(target).api_address, 0.5) == "NOT_SERVING":
            report = "NOT_SERVING"
        time.sleep(0.3)
    t1 = time.monotonic()
    new = log.read_bytes()[offset:].decode("utf-8", "replace") if log.exists() else ""
    words = ("no space", "enospc", "disk full", "disk is full")
    line = next((ln for ln in new.splitlines() if any(w in ln.lower() for w in words)), None)
    obs.update(returncode=target.popen.poll(), reported=bool(report or line), report=report or (line or "")[:200])
    (g.tmpfs_dir / "hostile.fill").unlink(missing_ok=True)
    if obs["returncode"] is not None:
        return obs, (t0, t1), {target.name}
    # space freed: a restart must bring the member back with every acknowledged write (the report of
    # a restart that read 1,984 of 3,236 tenants is what this catches); then it counts in the checks
    g.stop(target)
    g.cluster.start(target)
    assert g.client is not None
    names = set(g.client.writes.names())
    t_fix = time.monotonic()
    obs["recovered_ms"] = None
    while time.monotonic() < t_fix + h.RECOVER_S and target.alive:
        if names <= set(g.cluster.tenants(target)[1]) and g.cluster.status(target) is not None:
            obs["recovered_ms"] = round((time.monotonic() - t_fix) * 1000, 1)
            break
        time.sleep(0.2)
    return obs, (t0, t1), (set() if obs["recovered_ms"] is not None else {target.name})


def watch_flood(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    c = g.cluster
    flood_token, calm_token = g.tenant_token("flood"), g.tenant_token("calm")
    obs: dict[str, Any] = {"holder_before": g.lease()}
    t0 = time.monotonic()
    flood = a.WatchFlood(c.endpoints, flood_token, once=spec.params["once"], live=spec.params["live"],
                         deadline=t0 + spec.duration_s).start()
    status: dict[str, float | None] = {ep: 0.0 for ep in c.endpoints}
    other = None
    try:
        time.sleep(min(1.0, spec.duration_s / 4))
        for ep in c.endpoints:
            got = a.try_watch(ep, calm_token, h.WATCH_OPEN_MS / 1000)
            if other is None or got not in ("OK", "OPEN"):
                other = got
        while time.monotonic() < t0 + spec.duration_s:
            for ep in c.endpoints:
                ms = a.timed_status(ep, c.token, 2 * h.STATUS_BOUND_MS / 1000)
                prev = status[ep]
                status[ep] = None if ms is None or prev is None else max(prev, ms)
            time.sleep(0.3)
    finally:
        flood.stop()
    t1 = time.monotonic()
    obs.update(other_watch=other, status_ms=status, holder_after=g.lease(), streams_opened=flood.opened,
               flood_codes=dict(flood.codes))
    return obs, (t0, t1), set()


def object_flood(g: Group, spec: h.AttackSpec, rng: random.Random) -> Outcome:
    from controlplane.api.client import ApiClient, ApiError, Unreachable
    from controlplane.api.v1 import api_pb2
    from controlplane.chaos.isolation import deployment_msg

    c = g.cluster
    greedy, calm = g.tenant_token("greedy"), g.tenant_token("calm")
    most = int(spec.params["max_objects"])
    obs: dict[str, Any] = {"max_objects": most, "created": 0, "refused_code": None, "errors": {}}
    t0 = time.monotonic()
    end = t0 + max(spec.duration_s, most * 0.2)  # bounded in count and in time
    with ApiClient(c.endpoints, token=greedy, timeout_s=3.0) as client:
        streak = 0
        while obs["created"] < most and time.monotonic() < end and streak < 5:
            name = f"flood-{obs['created'] + sum(obs['errors'].values())}"
            try:
                client.call("Deployments", "ApplyDeployment", api_pb2.ApplyDeploymentRequest(
                    deployment=deployment_msg(name, "greedy")), idempotent=True)
                obs["created"] += 1
                streak = 0
            except ApiError as exc:
                if exc.code.name == "RESOURCE_EXHAUSTED":
                    obs["refused_code"], obs["refused_message"] = exc.code.name, exc.message[:200]
                    break
                obs["errors"][exc.code.name] = obs["errors"].get(exc.code.name, 0) + 1
                streak += 1
            except Unreachable:
                obs["errors"]["unreachable"] = obs["errors"].get("unreachable", 0) + 1
                streak += 1
    with ApiClient(c.endpoints, token=calm, timeout_s=3.0) as client:
        try:
            client.call("Deployments", "ApplyDeployment", api_pb2.ApplyDeploymentRequest(
                deployment=deployment_msg("calm-dep", "calm")), idempotent=True)
            obs["other_code"] = "OK"
        except ApiError as exc:
            obs["other_code"], obs["other_message"] = exc.code.name, exc.message[:200]
        except Unreachable:
            obs["other_code"] = "unreachable"
    t1 = time.monotonic()
    obs["seconds"] = round(t1 - t0, 1)
    return obs, (t0, t1), set()


DRIVERS: dict[str, Callable[[Group, h.AttackSpec, random.Random], Outcome]] = {
    "poisoned_fence": poisoned_fence, "raft_frames": raft_frames, "fd_exhaustion": fd_exhaustion,
    "journal_corruption": journal_corruption, "disk_full": disk_full, "watch_flood": watch_flood,
    "object_flood": object_flood,
}


def run_attack(spec: h.AttackSpec, root: Path, log: Callable[[str], None] = print) -> h.Verdict:
    """One attack on a fresh group under ``root``; its verdict (a harness failure is a failed verdict)."""
    rng = random.Random(f"{spec.seed}/{spec.kind}")
    tmpfs = (int(spec.target), int(spec.params["tmpfs_mib"])) if spec.kind == "disk_full" else None
    t_begin = time.monotonic()
    g: Group | None = None
    for attempt in range(START_ATTEMPTS):  # free ports are picked, then bound: another process may win
        try:
            g = Group(root / f"try{attempt}", spec.seed, tmpfs=tmpfs, log=log)
            g.start()
            break
        except (OSError, subprocess.SubprocessError, HostileError) as exc:
            if g is not None:
                g.close()
            g = None
            if attempt + 1 == START_ATTEMPTS:
                return h.verdict(spec.kind, {"error": f"{type(exc).__name__}: {exc}"}, {}, {"spec": spec.to_json()})
            log(f"hostile {spec.kind}: the group did not start ({exc}); a fresh one")
    assert g is not None
    try:
        time.sleep(spec.start_s)
        try:
            obs, window, down = DRIVERS[spec.kind](g, spec, rng)
        except (OSError, RuntimeError, ValueError, KeyError, HostileError) as exc:
            obs, window, down = {"error": f"{type(exc).__name__}: {exc}"}, (time.monotonic(), time.monotonic()), set()
        glob = g.global_obs(window, down)
    except HostileError as exc:
        return h.verdict(spec.kind, {"error": str(exc)}, {}, {"spec": spec.to_json()})
    finally:
        g.close()
    figures = {"spec": spec.to_json(), "attack": obs, "global": glob, "window_s": round(window[1] - window[0], 2),
               "wall_s": round(time.monotonic() - t_begin, 1)}
    return h.verdict(spec.kind, obs, glob, figures)
