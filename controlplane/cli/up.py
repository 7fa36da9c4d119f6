"""``controlplane up``: a local group of real coordinator processes on 127.0.0.1, one per simulated
zone, each zone with a simulated cluster (``controlplane adapter --config`` with ``backend:
simulated``) running a demo deployment under a scripted load that bursts every two minutes, so the
deployment visibly scales out and back in. For development and the demo.

Everything lives under ``--dir`` (default: a fresh temporary folder), secured as a real group is:

* ``pki/``: a development CA and a server certificate for 127.0.0.1/localhost
  (:func:`controlplane.tls.make_dev_pki`); the coordinators' API is TLS only (``api_tls``);
* ``pki/raft/``: a Raft CA and one member certificate per coordinator (URI SAN
  ``controlplane://coordinator/<node_id>``, :func:`controlplane.tls.make_raft_pki`): the Raft links
  are mutual TLS (``raft_tls``), with the random Raft password checked inside them;
* ``admin.token``: an admin bearer token (``cp_<id>_<secret>``) that the lease holder registers
  (``admin_token_file``); ``adapter.token``: the token the adapters demand and the coordinators
  send (``auth_token_file`` / ``adapter_token_file``);
* adapter channels are mutual TLS: each coordinator has ``pki/coordinator-<node_id>.pem`` (URI SAN
  ``controlplane://coordinator/<node_id>``, ``adapter_tls``) and the adapters accept only such
  client certificates (``tls.client_ca_file``); ``fence/fence-key.pem`` is the coordinators' fence
  key (``fence_key_file``) and the adapters verify every epoch with ``fence/fence.pub.pem``
  (``fence_public_key_files``);
* one YAML configuration per coordinator and per adapter, their data and logs;
* ``tenantctl.yaml``: a tenantctl configuration (context ``local``: the endpoints, the CA, the admin
  token); ``up`` prints its path and ``export TENANTCTL_CONFIG=...``.

Files holding a secret (tokens, keys, the coordinators' configurations with the Raft password, the
tenantctl configuration) are mode 0600; ``up`` never prints a token. Ctrl-C or SIGTERM stops every
child (SIGTERM, then SIGKILL after a grace period), then removes the state folder ``up`` created
unless ``--keep`` (a ``--dir`` given is kept). A coordinator that dies is restarted, at most three
times a minute, then ``up`` prints the command to start it by hand (``--no-restart``: at once); see
:mod:`controlplane.cli.up_supervise`. ``up`` exits (and stops the adapters) only
once no coordinator has run for ``GONE_GRACE_S``: a coordinator restarted by hand from its
configuration here counts, since something listens on its addresses.
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ZONES = "abcdefghi"
STOP_GRACE_S = 5.0
MAX_NODES = 9
DEMO_TENANT = "demo"
DEMO_DEPLOYMENT = "chat"
DEMO_MODEL = "llama3-8b-h100"
CALM_RPS, BURST_RPS = 2.0, 40.0
"""Per zone: each zone's adapter offers its own traffic (its own gateway), as a per-zone router would."""
BURST_AT_S, BURST_LEN_S, CYCLE_S, CYCLES = 20, 60, 120, 30
"""Bursts start 20 s after an adapter starts and every two minutes after, for an hour."""
DEMO_POLICY = {
    "stable_window_ms": 6_000, "ewma_half_life_ms": 1_000, "panic_window_ms": 2_000, "panic_hold_ms": 3_000,
    "scale_down_stabilization_ms": 4_000, "scale_down_cooldown_ms": 1_000, "max_step_down": 4,
}


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago (bound, then released)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    zone: str
    raft_address: str
    api_address: str
    config: Path


@dataclass(frozen=True)
class LocalSecurity:
    """What :func:`make_local_security` wrote: TLS material and the two tokens (as files)."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    admin_token_file: Path
    adapter_token_file: Path
    fence_key_file: Path | None = None
    fence_public_key_file: Path | None = None

    @property
    def admin_token(self) -> str:
        return self.admin_token_file.read_text(encoding="utf-8").strip()

    def coordinator_fields(self, node_id: str | None = None) -> dict[str, object]:
        """The security part of a coordinator's configuration (``controlplane.config``); with
        ``node_id`` also its adapter client certificate (issued on first use) and the fence key."""
        out: dict[str, object] = {
            "api_tls": {"cert_file": str(self.cert_file), "key_file": str(self.key_file), "ca_file": str(self.ca_file)},
            "admin_token_file": str(self.admin_token_file),
            "adapter_token_file": str(self.adapter_token_file),
        }
        if node_id is not None:
            cert, key = self.coordinator_cert(node_id)
            out["adapter_tls"] = {"ca_file": str(self.ca_file), "cert_file": str(cert), "key_file": str(key)}
            if self.fence_key_file is not None:
                out["fence_key_file"] = str(self.fence_key_file)
        return out

    def coordinator_cert(self, node_id: str) -> tuple[Path, Path]:
        """``pki/coordinator-<node_id>.pem`` and its key (URI SAN ``controlplane://coordinator/<node_id>``)."""
        from controlplane.tls import DevPki, issue_coordinator_cert

        root = self.ca_file.parent
        cert, key = root / f"coordinator-{node_id}.pem", root / f"coordinator-{node_id}-key.pem"
        if cert.is_file() and key.is_file():
            return cert, key
        return issue_coordinator_cert(DevPki(root, self.ca_file, root / "ca-key.pem", self.cert_file, self.key_file),
                                      node_id)

    def adapter_fields(self) -> dict[str, object]:
        """The security part of an adapter's configuration (``adapters.config``): the token, mutual
        TLS accepting coordinator certificates of this CA, and the fence public key."""
        out: dict[str, object] = {
            "auth_token_file": str(self.adapter_token_file),
            "tls": {"cert_file": str(self.cert_file), "key_file": str(self.key_file), "client_ca_file": str(self.ca_file)},
        }
        if self.fence_public_key_file is not None:
            out["fence_public_key_files"] = [str(self.fence_public_key_file)]
        return out


def make_local_security(root: Path) -> LocalSecurity:
    """A development CA with a 127.0.0.1/localhost server certificate under ``root/pki``, an admin
    token in ``root/admin.token`` and an adapter token in ``root/adapter.token`` (both 0600). What a
    previous ``up`` left in ``root`` is reused (the same group restarted keeps its tokens: no second
    admin token is registered, tenantctl configurations keep working)."""
    from controlplane.domain.tokens import parse_token
    from controlplane.tls import make_dev_pki, write_secret
    from controlplane.tokens import new_token

    pki_dir = root / "pki"
    names = ("ca.pem", "server.pem", "server-key.pem")
    if not all((pki_dir / name).is_file() for name in names):
        make_dev_pki(pki_dir)
    admin, adapter = root / "admin.token", root / "adapter.token"
    if parse_token(_read_or_empty(admin)) is None:
        write_secret(admin, new_token()[0] + "\n")
    if len(_read_or_empty(adapter)) < 32:
        write_secret(adapter, secrets.token_urlsafe(32) + "\n")
    fence = _fence_key(root / "fence")
    return LocalSecurity(pki_dir / names[0], pki_dir / names[1], pki_dir / names[2], admin, adapter,
                         fence.private_key, fence.public_key)


def _fence_key(directory: Path):
    """The group's fence key pair in ``directory`` (made once, reused by a restarted ``up``)."""
    from controlplane.fencing import FenceKeyError, FenceKeyFiles, load_private_key, load_public_key, make_fence_key

    files = FenceKeyFiles(directory / "fence-key.pem", directory / "fence.pub.pem")
    try:
        load_private_key(files.private_key)
        load_public_key(files.public_key)
        return files
    except FenceKeyError:
        return make_fence_key(directory)


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def plan_group(n: int, root: Path, gpus_per_cluster: int = 8, *,
               security: LocalSecurity | None = None) -> tuple[list[NodePlan], list[dict]]:
    """Write one configuration per node; return the nodes and the adapters to start. With
    ``security`` the coordinators serve their API over TLS, register the admin token and send the
    adapter token; without it (the process tests) the API is plaintext on loopback."""
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"--nodes: must be between 1 and {MAX_NODES}, got {n}")
    from controlplane.tls import make_raft_pki

    ports = free_ports(3 * n)
    password = secrets.token_urlsafe(24)
    nodes = [
        NodePlan(f"coord-{ZONES[i]}", f"az-{ZONES[i]}", f"127.0.0.1:{ports[i]}", f"127.0.0.1:{ports[n + i]}",
                 root / f"coord-{ZONES[i]}.yaml")
        for i in range(n)
    ]
    adapters = [
        {"id": f"gpu-{ZONES[i]}1", "zone": f"az-{ZONES[i]}", "capacity": {"h100": gpus_per_cluster},
         "adapter_address": f"127.0.0.1:{ports[2 * n + i]}"}
        for i in range(n)
    ]
    raft_pki = make_raft_pki(root / "pki" / "raft", [node.node_id for node in nodes])
    for node in nodes:
        cfg = {
            "node_id": node.node_id, "zone": node.zone, "raft_address": node.raft_address,
            "api_address": node.api_address, "data_dir": str(root / node.node_id), "password": password,
            "raft_tls": raft_pki.tls_fields(node.node_id),
            "peers": [{"node_id": o.node_id, "zone": o.zone, "raft_address": o.raft_address, "api_address": o.api_address}
                      for o in nodes if o is not node],
            "clusters": adapters,
            **(security.coordinator_fields(node.node_id) if security is not None else {}),
        }
        write_private(node.config, yaml.safe_dump(cfg, sort_keys=False))
    return nodes, adapters


def write_private(path: Path, text: str) -> None:
    from controlplane.tls import write_secret

    write_secret(path, text)


def demo_load() -> list[dict[str, float]]:
    """The step schedule of the demo deployment in every zone: calm, a burst, calm, ..."""
    steps: list[dict[str, float]] = [{"at_s": 0, "rps": CALM_RPS}]
    for k in range(CYCLES):
        steps.append({"at_s": BURST_AT_S + k * CYCLE_S, "rps": BURST_RPS})
        steps.append({"at_s": BURST_AT_S + BURST_LEN_S + k * CYCLE_S, "rps": CALM_RPS})
    return steps


def add_demo(nodes: list[NodePlan], adapters: list[dict], gpus_per_cluster: int = 8) -> None:
    """Seed the demo tenant and deployment into every coordinator's configuration (one instance
    per zone at least, up to four per zone). A deployment seeded by configuration keeps the id it is
    given (one label, like a legacy id: its tenant sees it under that name, admins as
    ``demo/chat``), so the adapters simulate ``chat``; deployments created later through the API
    have ``<tenant>/<name>`` ids and get the ``default`` template."""
    n = len(adapters)
    tenant = {"id": DEMO_TENANT, "priority": 100, "quota": {"h100": gpus_per_cluster * n}}
    deployment = {"id": DEMO_DEPLOYMENT, "tenant": DEMO_TENANT, "engine": "vllm", "model": DEMO_MODEL, "pool": "h100",
                  "min_replicas": n, "max_replicas": 4 * n, "warm_pool": 0, "policy": DEMO_POLICY}
    for node in nodes:
        cfg = yaml.safe_load(node.config.read_text(encoding="utf-8"))
        cfg["tenants"], cfg["deployments"] = [tenant], [deployment]
        write_private(node.config, yaml.safe_dump(cfg, sort_keys=False))


def write_adapter_configs(root: Path, adapters: list[dict], security: LocalSecurity) -> list[Path]:
    """One simulated adapter per cluster, demanding the adapter token; returns the files."""
    out = []
    for i, a in enumerate(adapters):
        path = root / f"{a['id']}.adapter.yaml"
        cfg = {
            "cluster_id": a["id"], "listen": a["adapter_address"], "state_dir": str(root / "adapters"), "nvml": False,
            **security.adapter_fields(), "backend": "simulated",
            "simulated": {"seed": i + 1, "deployments": [{
                "deployment": DEMO_DEPLOYMENT, "model": DEMO_MODEL, "cold_start_ms": 3_000, "warm_start_ms": 500,
                "load": demo_load(),
            }], "default": {
                # deployments created later (tenantctl apply) get the same bursty load from their start
                "deployment": "*", "model": DEMO_MODEL, "cold_start_ms": 3_000, "warm_start_ms": 500,
                "load": demo_load(),
            }},
        }
        path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        out.append(path)
    return out


def write_tenantctl_config(path: Path, endpoints: list[str], security: LocalSecurity) -> Path:
    """A tenantctl configuration with one context, ``local`` (mode 0600: it holds the admin token)."""
    cfg = {
        "apiVersion": "controlplane.io/v1", "kind": "Config", "current-context": "local",
        "contexts": [{"name": "local", "region": "local", "endpoints": endpoints, "ca_file": str(security.ca_file),
                      "token": security.admin_token}],
    }
    write_private(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_up(n: int, as_json: bool, root: str | None, *, keep: bool = False, restart: bool = True) -> int:
    from controlplane.cli.up_supervise import Supervisor, finish_state

    base = Path(root) if root else Path(tempfile.mkdtemp(prefix="controlplane-up-"))
    base.mkdir(parents=True, exist_ok=True)
    security = make_local_security(base)
    nodes, adapters = plan_group(n, base, security=security)
    add_demo(nodes, adapters)
    adapter_configs = write_adapter_configs(base, adapters, security)
    tenantctl = write_tenantctl_config(base / "tenantctl.yaml", [nd.api_address for nd in nodes], security)
    children: list[subprocess.Popen] = []
    stopping = {"flag": False}
    removed_on_exit = root is None and not keep
    failed = False
    supervisor: Supervisor | None = None

    def stop(*_args: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for a, config in zip(adapters, adapter_configs):
            children.append(spawn("adapter", config, base / f"{a['id']}.log"))
        for node in nodes:
            children.append(spawn_coordinator(node, base))
        listing = [{"node_id": nd.node_id, "zone": nd.zone, "api_address": nd.api_address,
                    "raft_address": nd.raft_address, "pid": ch.pid, "config": str(nd.config)}
                   for nd, ch in zip(nodes, children[len(adapters):])]
        adapter_listing = [dict(a, pid=ch.pid, config=str(cfg)) for a, ch, cfg in zip(adapters, children, adapter_configs)]
        if as_json:
            print(json.dumps({"dir": str(base), "nodes": listing, "adapters": adapter_listing,
                              "tenantctl_config": str(tenantctl), "ca_file": str(security.ca_file),
                              "admin_token_file": str(security.admin_token_file), "removed_on_exit": removed_on_exit,
                              "demo": {"tenant": DEMO_TENANT, "deployment": DEMO_DEPLOYMENT}}), flush=True)
        else:
            print(f"controlplane: {n} coordinators on 127.0.0.1 (state in {base}); Ctrl-C stops them")
            for item in listing:
                print(f"  {item['node_id']:8} {item['zone']:6} api {item['api_address']:21} raft {item['raft_address']:21} pid {item['pid']}")
            for a in adapter_listing:
                print(f"  {a['id']:8} {a['zone']:6} adapter {a['adapter_address']:17} simulated, pid {a['pid']}")
            print(f"  demo: deployment {DEMO_DEPLOYMENT} (tenant {DEMO_TENANT}; admins name it "
                  f"{DEMO_TENANT}/{DEMO_DEPLOYMENT}): {CALM_RPS:g} requests/s per zone, "
                  f"{BURST_RPS:g}/s for {BURST_LEN_S} s from {BURST_AT_S} s after start and every {CYCLE_S} s")
            print(f"  API: TLS (CA {security.ca_file}); admin token in {security.admin_token_file}")
            print(f"  status: TENANTCTL_TOKEN=$(cat {security.admin_token_file}) controlplane status --endpoints "
                  f"{','.join(x['api_address'] for x in listing)} --ca-file {security.ca_file}")
            print(f"  tenantctl config: {tenantctl}")
            print(f"  state folder: {base} (admin token, CA key, Raft password, logs): "
                  + ("removed on exit (--keep keeps it)" if removed_on_exit else "kept on exit"))
            print(f"  export TENANTCTL_CONFIG={tenantctl}", flush=True)
        names = [a["id"] for a in adapters]
        supervisor = Supervisor(nodes, children[len(adapters):], base, lambda nd: spawn_coordinator(nd, base), CHILD_EXE,
                                restart=restart, listening=listening)
        group_gone = GoneFor(GONE_GRACE_S)
        reported: set[int] = set()
        while not stopping["flag"]:
            # A dead child is reported once and the rest keep running: killing the leader to watch the
            # group fail over is what this group is for. Only when every coordinator is gone is it over.
            if not stopping["flag"]:  # (a Ctrl-C reaches the children too: no restart then)
                supervisor.check(time.monotonic())  # restarts a coordinator that died (bounded), one line each
            for name, ch in zip(names, children):
                if ch.poll() is not None and ch.pid not in reported:
                    reported.add(ch.pid)
                    print(f"controlplane: {name} (pid {ch.pid}) exited with status {ch.returncode}; the others keep "
                          f"running (log: {base / (name + '.log')})", file=sys.stderr, flush=True)
            # A coordinator restarted by hand (``controlplane coordinator --config <dir>/coord-a.yaml``,
            # as the printed commands invite) is not our child: it counts as running while something
            # listens on its addresses, so the adapters are not stopped under it.
            if group_gone.update(any_coordinator_running(nodes, supervisor.running), time.monotonic()):
                print(f"controlplane: error: every coordinator has exited; see the logs in {base}", file=sys.stderr)
                failed = True
                return 1
            time.sleep(0.2)
        return 0
    finally:
        stop_children(children + (supervisor.spawned if supervisor is not None else []))
        finish_state(base, created=root is None, keep=keep, failed=failed)


GONE_GRACE_S = 5.0
"""``up`` stops only after no coordinator has run for this long (a restart in progress is not the end)."""


def listening(address: str, timeout_s: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (127.0.0.1 here)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def any_coordinator_running(nodes: list[NodePlan], children: list[subprocess.Popen]) -> bool:
    """One of ``up``'s own coordinator children runs, or a coordinator restarted outside ``up``
    listens on a planned node's API or Raft address."""
    if any(ch.poll() is None for ch in children):
        return True
    return any(listening(nd.api_address) or listening(nd.raft_address) for nd in nodes)


class GoneFor:
    """True once ``update(False, now)`` has held for ``grace_s`` without a ``True`` in between."""

    def __init__(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._since: float | None = None

    def update(self, running: bool, now: float) -> bool:
        if running:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= self._grace_s


CHILD_EXE = [sys.executable, "-m", "controlplane.cli.main"]


def spawn(kind: str, config: Path, log: Path) -> subprocess.Popen:
    """Start ``controlplane <kind> --config <config>`` (``coordinator`` or ``adapter``) as a child
    process, its stderr (JSON log lines) appended to ``log``."""
    with open(log, "ab") as err:
        return subprocess.Popen(CHILD_EXE + [kind, "--config", str(config)], stdout=subprocess.DEVNULL, stderr=err)


def spawn_coordinator(node: NodePlan, root: Path) -> subprocess.Popen:
    """Start (or restart: same configuration and data) one coordinator of a planned group, logging
    to ``root/<node id>.log``."""
    return spawn("coordinator", node.config, root / f"{node.node_id}.log")


def stop_children(children: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every child still running, wait ``grace_s`` in all, then SIGKILL what is left."""
    for ch in children:
        if ch.poll() is None:
            ch.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for ch in children:
        try:
            ch.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ch.kill()
            ch.wait(2.0)
