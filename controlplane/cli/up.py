"""``controlplane up``: a local group of real coordinator processes on 127.0.0.1, one per simulated
zone, each with a recording adapter for its zone's cluster. For development and the demo.

Everything lives under ``--dir`` (default: a fresh temporary folder): one YAML configuration per
node (mode 0600: it holds the generated Raft password), its Raft data directory, and each adapter's
fencing state and command record. Ctrl-C or SIGTERM stops every child (SIGTERM, then SIGKILL after
a grace period).
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


def plan_group(n: int, root: Path, gpus_per_cluster: int = 8) -> tuple[list[NodePlan], list[dict]]:
    """Write one configuration per node; return the nodes and the adapters to start."""
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"--nodes: must be between 1 and {MAX_NODES}, got {n}")
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
    for node in nodes:
        cfg = {
            "node_id": node.node_id, "zone": node.zone, "raft_address": node.raft_address,
            "api_address": node.api_address, "data_dir": str(root / node.node_id), "password": password,
            "peers": [{"node_id": o.node_id, "zone": o.zone, "raft_address": o.raft_address, "api_address": o.api_address}
                      for o in nodes if o is not node],
            "clusters": adapters,
        }
        node.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        node.config.chmod(0o600)
    return nodes, adapters


def run_up(n: int, as_json: bool, root: str | None) -> int:
    base = Path(root) if root else Path(tempfile.mkdtemp(prefix="controlplane-up-"))
    base.mkdir(parents=True, exist_ok=True)
    nodes, adapters = plan_group(n, base)
    children: list[subprocess.Popen] = []
    stopping = {"flag": False}

    def stop(*_args: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    exe = [sys.executable, "-m", "controlplane.cli.main"]
    try:
        for a in adapters:
            children.append(subprocess.Popen(
                exe + ["adapter", "--cluster", a["id"], "--listen", a["adapter_address"],
                       "--state-dir", str(base / "adapters"), "--record", str(base / "adapters" / f"{a['id']}.jsonl")],
                stdout=subprocess.DEVNULL, stderr=open(base / f"{a['id']}.log", "ab")))
        for node in nodes:
            children.append(subprocess.Popen(exe + ["coordinator", "--config", str(node.config)],
                                             stdout=subprocess.DEVNULL, stderr=open(base / f"{node.node_id}.log", "ab")))
        listing = [{"node_id": nd.node_id, "zone": nd.zone, "api_address": nd.api_address,
                    "raft_address": nd.raft_address, "pid": ch.pid, "config": str(nd.config)}
                   for nd, ch in zip(nodes, children[len(adapters):])]
        if as_json:
            print(json.dumps({"dir": str(base), "nodes": listing, "adapters": adapters}), flush=True)
        else:
            print(f"controlplane: {n} coordinators on 127.0.0.1 (state in {base}); Ctrl-C stops them")
            for item in listing:
                print(f"  {item['node_id']:8} {item['zone']:6} api {item['api_address']:21} raft {item['raft_address']:21} pid {item['pid']}")
            print(f"  status: controlplane status --endpoints {','.join(x['api_address'] for x in listing)}", flush=True)
        while not stopping["flag"]:
            dead = [ch for ch in children if ch.poll() is not None]
            if dead:
                print(f"controlplane: error: a child process exited (pid {dead[0].pid}, status {dead[0].returncode}); "
                      f"see the logs in {base}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        stop_children(children)


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
