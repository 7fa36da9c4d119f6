"""``controlplane``: the operator CLI.

Every failure a user can cause (bad file, bad field, bad flag) ends with one line on stderr naming
the file, line or field, and a non-zero exit status; never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from contextlib import ExitStack

from controlplane.cli.version import version_line
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.profiles import PROFILES

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="controlplane", description="Scaling control plane for LLM inference fleets.")
    p.add_argument("--version", action="version", version=version_line("controlplane"),
                   help="print controlplane's version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("simulate", help="replay a scenario or a request trace in virtual time")
    src = sim.add_mutually_exclusive_group()
    src.add_argument("--scenario", metavar="FILE", help="scenario YAML (default: the built-in demo)")
    src.add_argument("--trace", metavar="FILE", help="Azure LLM inference trace CSV (single-tenant scenario)")
    sim.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    sim.add_argument("--model", default="llama3-70b-h100x4", choices=sorted(PROFILES), help="profile for --trace")
    sim.add_argument("--engine", default="vllm", choices=("vllm", "triton", "deepspeed-mii"), help="engine for --trace")
    sim.add_argument("--rate-scale", type=float, default=1.0, help="compress trace time by this factor (--trace)")
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--plot", metavar="FILE.png", help="write load, replicas by state and TTFT over time")
    sim.add_argument("--events", metavar="FILE", help="write every instance transition as a JSON line")
    bar = sim.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None, help="show a progress bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false")

    demo = sub.add_parser("demo", help="the full system on this machine: 3 coordinators, 3 simulated clusters, three "
                                       "tenants, a bursty workload, a leader kill; live view, summary and plot")
    demo.add_argument("--trace", metavar="FILE", help="Azure LLM inference trace CSV for the high-priority deployment")
    demo.add_argument("--duration-s", type=float, default=150, help="length of the workload in seconds (default 150)")
    demo.add_argument("--no-live", dest="live", action="store_false", help="plain status lines instead of the live view")
    demo.add_argument("--out", default="out", metavar="DIR", help="where demo-summary.json and demo.png go (default ./out)")
    demo.add_argument("--record-view", metavar="FILE", help="write every live-view frame as a JSON line (play it back "
                                                         "with python -m controlplane.cli.demo_view FILE)")

    coord = sub.add_parser("coordinator", help="run one coordinator (Raft member, lease, control loop, gRPC API)")
    coord.add_argument("--config", required=True, metavar="FILE", help="coordinator YAML (CONTROLPLANE_* env overrides)")

    up = sub.add_parser("up", help="start a local group of coordinators on 127.0.0.1 (Ctrl-C stops it)")
    up.add_argument("--nodes", type=int, default=3, help="coordinators, one per simulated zone (default 3)")
    up.add_argument("--dir", metavar="DIR", help="where configs and data go (default: a new temporary folder)")
    up.add_argument("--json", action="store_true", help="print the endpoints as one JSON object")
    up.add_argument("--keep", action="store_true",
                    help="keep the state folder on exit (it holds the admin token and the CA key; default: removed "
                         "unless --dir was given)")
    up.add_argument("--no-restart", dest="restart", action="store_false",
                    help="do not restart a coordinator that dies (print the command to start it by hand)")

    st = sub.add_parser("status", help="print the status of coordinators")
    st.add_argument("--endpoints", metavar="HOST:PORT,...",
                    help="API endpoints (default: the current context of $TENANTCTL_CONFIG, which `up` writes)")
    st.add_argument("--context", help="the context of the tenantctl configuration to use (without --endpoints)")
    st.add_argument("--json", action="store_true")
    st.add_argument("--timeout", type=float, default=1.0, help="per-endpoint deadline in seconds (default 1)")
    _add_client_auth(st)

    mem = sub.add_parser("members", help="add or remove a coordinator at run time (one change at a time)")
    mem.add_argument("op", choices=("add", "remove"))
    mem.add_argument("--endpoint", required=True, metavar="HOST:PORT", help="API of any member (leader hints are followed)")
    mem.add_argument("--node-id", default="")
    mem.add_argument("--raft-address", required=True, metavar="HOST:PORT")
    mem.add_argument("--api-address", default="", metavar="HOST:PORT")
    _add_client_auth(mem)

    ad = sub.add_parser("adapter", help="run a cluster adapter (Kubernetes, simulated or recording backend)",
                        description="Either --config FILE (see docs/adapters.md), or the four flags below for a "
                                    "recording adapter that only enforces fencing and logs commands (fault tests).")
    ad.add_argument("--config", metavar="FILE", help="adapter configuration (YAML)")
    ad.add_argument("--cluster")
    ad.add_argument("--listen", metavar="HOST:PORT")
    ad.add_argument("--state-dir", metavar="DIR", help="where the highest epoch is persisted")
    ad.add_argument("--record", metavar="FILE", help="accepted commands, one JSON line each")
    ad.add_argument("--auth-token-file", metavar="FILE",
                    help="bearer token coordinators must present (required unless --listen is a loopback address)")

    bench = sub.add_parser("bench", help="benchmarks on real local processes (JSON, Markdown and PNG reports)")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    br = bench_sub.add_parser("raft", help="commit latency, throughput and failover: coordinators vs bare pysyncobj")
    br.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    br.add_argument("--trials", type=int, default=20, help="failover trials per system (default 20)")
    br.add_argument("--commits", type=int, default=300, help="sequential commits, and the burst size (default 300)")
    br.add_argument("--out", default="out", metavar="DIR", help="where bench-raft.md/.json/.png go (default ./out)")
    bx = bench_sub.add_parser("reaction", help="step burst -> fenced command at the adapter: 3 coordinators + a simulated adapter")
    bx.add_argument("--bursts", type=int, default=50, help="bursts measured (default 50)")
    bx.add_argument("--deployments", type=int, default=8, help="deployments the bursts rotate over (default 8)")
    bx.add_argument("--tick-ms", type=int, default=None, help="coordinators' tick_ms (default: the configuration default)")
    bx.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    bx.add_argument("--out", default="out", metavar="DIR", help="where bench-reaction.md/.json/.png go (default ./out)")
    bt = bench_sub.add_parser("tick", help="CPU cost of one leader tick (decide + plan, no I/O) for 100..10,000 deployments")
    bt.add_argument("--deployments", type=int, action="append", metavar="N", help="fleet size, repeatable (default 100, 1000, 10000)")
    bt.add_argument("--ticks", type=int, default=None, help="timed ticks per size (default: 200 / 60 / 20)")
    bt.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    bt.add_argument("--out", default="out", metavar="DIR", help="where bench-tick.md/.json go (default ./out)")
    bp = bench_sub.add_parser("policies", help="scaling quality on traces: this policy vs HPA, KPA, static peak, oracle")
    bp.add_argument("--trace", action="append", metavar="FILE", help="Azure trace CSV, repeatable (default: the two Azure traces)")
    bp.add_argument("--out", default="out/bench-policies", metavar="DIR", help="where results.json, report.md and PNGs go")
    bp.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    bp.add_argument("--seed", type=int, default=0, help="random seed, the same for every policy (default 0)")
    bp.add_argument("--rate-scale", type=float, default=1.0, help="compress trace time by this factor")
    bp.add_argument("--limit-s", type=float, default=None, help="replay only the first seconds of each trace")
    bp.add_argument("--engine", default="vllm", choices=("vllm", "triton", "deepspeed-mii"),
                    help="engine of the deployment, its simulator defaults (default vllm; compare: bench engines)")
    be = bench_sub.add_parser("engines", help="one trace served by vLLM, Triton and DeepSpeed-MII: SLO attainment and GPU-hours")
    be.add_argument("--trace", action="append", metavar="FILE", help="Azure trace CSV, repeatable (default: the two Azure traces)")
    be.add_argument("--out", default=None, metavar="DIR", help="also write results.json there")
    be.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    be.add_argument("--seed", type=int, default=0, help="random seed, the same for every engine (default 0)")
    be.add_argument("--limit-s", type=float, default=None, help="replay only the first seconds of each trace")
    be.add_argument("--rows", default=None, metavar="A,B", help="rows to run, comma-separated (default: all)")
    bf = bench_sub.add_parser("fleet", help="tenants, models and one GPU pool: this control plane vs HPA/KPA + "
                                            "kube-scheduler, Dynamo's planner, static peak and the clairvoyant bound")
    bf.add_argument("--fleet", metavar="FILE", help="fleet file (a scenario file plus fleet fields; default: the built-in fleet)")
    bf.add_argument("--out", default="out/bench-fleet", metavar="DIR", help="where results.json, report.md and PNGs go")
    bf.add_argument("--json", action="store_true", help="print results.json on stdout")
    bf.add_argument("--seed", type=int, default=None, help="random seed, the same for every policy (default: the fleet's)")
    bf.add_argument("--limit-s", type=float, default=None, metavar="S", help="simulate only the first S seconds (CI slice)")
    bf.add_argument("--print-fleet", action="store_true", help="write the built-in fleet file to stdout and exit")
    bf.add_argument("--policies", default=None, metavar="A,B", help="policies to run, comma-separated (default: all)")
    bf.add_argument("--jobs", type=int, default=None, metavar="N", help="processes (default: min(2, CPU count))")
    fbar = bf.add_mutually_exclusive_group()
    fbar.add_argument("--progress", dest="progress", action="store_true", default=None, help="show progress bars")
    fbar.add_argument("--no-progress", dest="progress", action="store_false")
    bs = bench_sub.add_parser("soak", help="long run under steady load and periodic kill -9: memory, fds, journal growth")
    bs.add_argument("--minutes", type=float, required=True, help="length of the run in minutes (fractions allowed)")
    bs.add_argument("--out", default="out/soak", metavar="DIR", help="where soak.json, report.md and soak.png go")
    bs.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    bs.add_argument("--sample-s", type=float, default=None, help="seconds between samples (default 10; shorter runs: less)")
    bs.add_argument("--fault-every-s", type=float, default=None, help="seconds between faults (default 300)")
    bc = bench_sub.add_parser("chaos", help="randomized fault schedules (kill -9, pauses, partitions, clock jumps, slow "
                                            "disk, adapter crashes) on real processes, checked for safety")
    bc.add_argument("--runs", type=int, default=10, help="schedules to run (default 10)")
    bc.add_argument("--seed", type=int, default=1, help="seed of the first schedule; run k uses seed+k (default 1)")
    bc.add_argument("--nodes", type=int, default=3, choices=(3, 5), help="coordinators (default 3)")
    bc.add_argument("--faults", type=int, default=3, help="faults per schedule (default 3)")
    bc.add_argument("--out", default="out/chaos", metavar="DIR", help="where results.json, report.md and recovery.png go")
    bc.add_argument("--keep", action="store_true", help="keep the journals and logs (always kept after a failure)")
    bc.add_argument("--json", action="store_true", help="print the totals as JSON on stdout")
    bl = bench_sub.add_parser("stability", help="leader/lease changes, tick stalls, GC and fsync of a fresh 3-member group "
                                                "with no fault, optionally beside CPU burners and a disk writer (JSON)")
    bl.add_argument("--seconds", type=float, default=None,
                    help="measured duration (default 60; with --fresh-starts: per start, default 6)")
    bl.add_argument("--mode", default="node", choices=("node", "coordinator", "coordinator-eager"),
                    help="what each member runs: RaftNode + LeaseGuard (node, default), the whole coordinator as "
                         "`controlplane coordinator` starts it, or in the former all-imports-first order")
    bl.add_argument("--bytecode", default="compiled", choices=("compiled", "source"),
                    help="members read byte-compiled modules as an installed image does (compiled, default), or "
                         "recompile the project at every start as an editable install under PYTHONDONTWRITEBYTECODE")
    bl.add_argument("--fresh-starts", type=int, default=0, metavar="N",
                    help="N fresh starts instead of one long run: time to the first lease holder (median, max)")
    bl.add_argument("--cpu", type=int, default=0, help="CPU-burning processes beside the group (default 0)")
    bl.add_argument("--disk", action="store_true", help="also run a disk-heavy writer (fsync'ed 1 MiB blocks, <= 256 MiB)")
    bl.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a coordinator configuration field, repeatable (e.g. raft_min_timeout_ms=150)")
    bl.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")

    bh = bench_sub.add_parser("hostile", help="hostile-input attacks (poisoned fence, oversized Raft frames, fd exhaustion, "
                                              "journal corruption, full disk, watch and object floods), each with a verdict")
    bh.add_argument("--attacks", default=None, metavar="A,B", help="attacks to run, comma-separated (default: all)")
    bh.add_argument("--seed", type=int, default=1, help="seed of the attack plan (default 1)")
    bh.add_argument("--short", action="store_true", help="CI sizes: every attack in a few seconds")
    bh.add_argument("--out", default="out/hostile", metavar="DIR", help="where results.json and report.md go")
    bh.add_argument("--keep", action="store_true", help="keep the logs and data directories (always kept after a failure)")
    bh.add_argument("--json", action="store_true", help="print the results as JSON on stdout")

    sub.add_parser("token", help="create, list or revoke API tokens (as `tenantctl token`; see docs/tenantctl.md)",
                   add_help=False)
    hc = sub.add_parser("health", help="grpc.health.v1 Check of a coordinator (TLS from its config) or an adapter; "
                                       "exit 0 when SERVING (container probes)")
    from controlplane.cli.health import add_arguments as add_health_arguments

    add_health_arguments(hc)
    fk = sub.add_parser("fence-key", help="write a new Ed25519 fence key pair: the private key for the coordinators "
                                          "(fence_key_file), the public one for the adapters (fence_public_key_files)")
    fk.add_argument("--dir", required=True, metavar="DIR", help="where <name>-key.pem (0600) and <name>.pub.pem go")
    fk.add_argument("--name", default="fence", help="file name prefix (default fence)")
    ga = sub.add_parser("gpu-agent", help="node agent: publish this node's GPU memory (NVML) for the cluster adapter")
    from controlplane.cli.gpu_agent import add_arguments as add_gpu_agent_arguments

    add_gpu_agent_arguments(ga)
    pr = sub.add_parser("probe", help="read one inference engine once through its driver and print the observation")
    pr.add_argument("--engine", required=True, choices=("vllm", "triton", "deepspeed-mii"))
    pr.add_argument("--url", default=None, metavar="URL",
                    help="vLLM server, Triton HTTP port, or MII REST URL .../mii/NAME (not with --metrics-file)")
    pr.add_argument("--metrics-url", default=None, metavar="URL", help="Triton metrics port (required for triton)")
    pr.add_argument("--model", default=None, metavar="NAME", help="vLLM model_name filter; Triton model (required)")
    pr.add_argument("--grpc-address", default=None, metavar="HOST:PORT", help="MII gRPC load balancer (default URL host:50050)")
    pr.add_argument("--meter-url", default=None, metavar="URL", help="MII: the pod's mii-meter sidecar http://HOST:PORT")
    pr.add_argument("--timeout", type=float, default=5.0, help="per-request deadline in seconds (default 5)")
    pr.add_argument("--json", action="store_true", help="print the observation as JSON")
    pr.add_argument("--scrapes", type=int, default=1, metavar="N",
                    help="metrics reads --interval-s apart (default 1; 2 gives rates, TTFT and queue p99s)")
    pr.add_argument("--interval-s", type=float, default=1.0, metavar="S",
                    help="seconds between reads (default 1), also the time between --metrics-file pages")
    pr.add_argument("--metrics-file", action="append", default=None, metavar="FILE",
                    help="a captured /metrics page (repeatable, read in order) instead of a live engine; for "
                         "deepspeed-mii, its mii-meter's page")
    mm = sub.add_parser("mii-meter", help="request meter sidecar for a DeepSpeed-MII pod: forwards /mii/<name> and "
                                          "/healthz to the REST gateway, serves what it counted on /metrics")
    mm.add_argument("--listen", required=True, metavar="HOST:PORT", help="where the meter listens (:PORT = all)")
    mm.add_argument("--upstream", required=True, metavar="URL", help="MII REST gateway, e.g. http://127.0.0.1:51080")
    mm.add_argument("--timeout", type=float, default=300.0, help="deadline of one gateway exchange, s (default 300)")
    mm.add_argument("--max-request-bytes", type=int, default=1024 * 1024, help="larger bodies get 413 (default 1 MiB)")
    mm.add_argument("--max-concurrent", type=int, default=None,
                    help="requests at the gateway at once; the rest wait at the meter (default: no bound)")
    return p


CLIENT_COMMANDS = ("token", "status", "members")
"""Commands that only call coordinators: gRPC's C-core stays quiet for them (not for the services)."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        from controlplane.api.tls_errors import quiet_grpc

        quiet_grpc()  # before grpc is first imported
    if argv[:1] == ["token"]:  # the same code, flags and exit codes as ``tenantctl token``
        from controlplane.cli.tenantctl import token_main

        return token_main(argv[1:], prog="controlplane token")
    args = _parser().parse_args(argv)
    try:
        if args.command in _SERVICE_COMMANDS:
            return _SERVICE_COMMANDS[args.command](args)
        if args.command == "demo":
            from controlplane.cli.demo import run_cli as run_demo

            return run_demo(args.trace, args.duration_s, args.live, args.out, args.record_view)
        return _simulate(args)
    except ControlPlaneError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("controlplane: interrupted", file=sys.stderr)
        return 130


def _coordinator(args: argparse.Namespace) -> int:
    from controlplane.config import load_config

    cfg = load_config(args.config)
    node = start_coordinator(cfg)
    stopped = _on_signals(node.stop)
    stopped.wait()
    return 0


def start_coordinator(cfg, **hooks):  # -> controlplane.coordinator.Coordinator
    """The coordinator as ``controlplane coordinator`` starts it: Raft and the lease first
    (``controlplane.member.launch``), then JSON logging (the early records held until then) while the
    first election timer runs, then the API and the control loop. ``hooks``: ``launch``'s."""
    from controlplane.cli.logs import buffer_early_logs, service_logging
    from controlplane.member import launch

    early = buffer_early_logs()
    after = hooks.pop("after_member", None)

    def member_started(member) -> None:
        if after is not None:
            after(member)
        service_logging(early)

    return launch(cfg, after_member=member_started, **hooks)


def _up(args: argparse.Namespace) -> int:
    from controlplane.cli.up import MAX_NODES, run_up

    if not 1 <= args.nodes <= MAX_NODES:
        raise ControlPlaneError(f"--nodes: must be between 1 and {MAX_NODES}, got {args.nodes}")
    return run_up(args.nodes, args.json, args.dir, keep=args.keep, restart=args.restart)


def _status(args: argparse.Namespace) -> int:
    from controlplane.api.admin import fetch_status
    from controlplane.cli.op_status import print_status, targets

    if not (args.timeout > 0 and args.timeout < float("inf")):
        raise ControlPlaneError(f"--timeout: must be a number of seconds > 0, got {args.timeout:g}")
    endpoints, args = targets(args)
    return print_status(fetch_status(endpoints, args.timeout, _credentials(args)), args.json)


def _adapter(args: argparse.Namespace) -> int:
    from pydantic import ValidationError as PydanticValidationError

    from adapters.config import AdapterConfig, build_backend, load_adapter_config
    from adapters.service import serve_adapter
    from controlplane.config import ConfigError, first_problem

    legacy = {"--cluster": args.cluster, "--listen": args.listen, "--state-dir": args.state_dir, "--record": args.record}
    if args.config:
        given = [flag for flag, value in {**legacy, "--auth-token-file": args.auth_token_file}.items() if value]
        if given:
            raise ControlPlaneError(f"adapter: {given[0]} cannot be combined with --config (set it in the file)")
        cfg = load_adapter_config(args.config)
    else:
        missing = [flag for flag, value in legacy.items() if not value]
        if missing:
            raise ControlPlaneError(f"adapter: --config FILE, or all of {', '.join(legacy)} (missing {missing[0]})")
        try:
            cfg = AdapterConfig.model_validate({"cluster_id": args.cluster, "listen": args.listen, "state_dir": args.state_dir,
                                                "backend": "recording", "recording": {"path": args.record},
                                                "auth_token_file": args.auth_token_file})
            cfg.auth_token()
        except PydanticValidationError as exc:
            field, problem = first_problem(exc)
            flag = {"cluster_id": "--cluster", "listen": "--listen", "state_dir": "--state-dir",
                    "auth_token_file": "--auth-token-file"}.get(field, "--record")
            if field in ("tls", "tls.client_ca_file", "fence_public_key_files"):  # only --config can give these
                flag, problem = "--listen", f"{field}: {problem}; give them in a --config file"
            raise ControlPlaneError(f"adapter: {flag}: {problem}") from None
        except ConfigError as exc:
            raise ControlPlaneError(f"adapter: --auth-token-file: {str(exc).split(': ', 1)[1]}") from None
    from controlplane.cli.logs import service_logging

    service_logging()
    auth_token, tls = cfg.auth_token(), cfg.tls_pair()
    gpus = _gpu_inventory() if cfg.nvml else None
    backend = build_backend(cfg)
    server = serve_adapter(cfg.cluster_id, cfg.listen, cfg.state_dir, backend,
                           observe_interval_ms=cfg.observe_interval_ms, ring_s=cfg.ring_s, auth_token=auth_token, tls=tls,
                           client_ca=cfg.client_ca(), fence_verifier=cfg.fence_verifier(),
                           allowed_coordinators=cfg.tls.allowed_coordinators if cfg.tls is not None else None)
    stopped = _on_signals(lambda: server.stop(0.5))
    stopped.wait()
    if gpus is not None:
        gpus.close()
    return 0


def _gpu_inventory():
    """NVML on the adapter's host: one "no NVML" warning when there is no driver (samples then carry
    the engines' own GPU metrics), else one ``gpu_inventory`` event listing the GPUs."""
    import structlog

    from adapters.gpu import GpuMonitor

    monitor = GpuMonitor()
    if monitor.start():
        structlog.get_logger("adapters.gpu").info("gpu_inventory", gpus=[
            {"index": g.index, "uuid": g.uuid, "name": g.name, "total_bytes": g.total, "used_bytes": g.used}
            for g in monitor.read()])
    return monitor


def _on_signals(stop):
    """Call ``stop`` once on SIGTERM or SIGINT; returns an event set when it has run."""
    import signal
    import threading

    done = threading.Event()

    def handler(signum, frame):
        if not done.is_set():
            threading.Thread(target=lambda: (stop(), done.set()), daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return done


def _add_client_auth(parser: argparse.ArgumentParser) -> None:
    """--token (or TENANTCTL_TOKEN) and the TLS files of a call to a coordinator's API."""
    parser.add_argument("--token", help="bearer token (default: $TENANTCTL_TOKEN)")
    parser.add_argument("--ca-file", metavar="PEM", help="CA of the API's certificate (TLS); omit for plaintext loopback")
    parser.add_argument("--cert-file", metavar="PEM", help="client certificate (mutual TLS)")
    parser.add_argument("--key-file", metavar="PEM", help="its private key")
    parser.add_argument("--server-name", help="name expected in the server certificate (default: the endpoint's host)")


def _credentials(args: argparse.Namespace):  # -> controlplane.api.admin.Credentials
    import os

    from controlplane.api.admin import Credentials
    from controlplane.api.channel import check_token

    token = args.token or os.environ.get("TENANTCTL_TOKEN") or None
    return Credentials(token=check_token(token) if token else None, ca_file=args.ca_file, cert_file=args.cert_file,
                       key_file=args.key_file, server_name=args.server_name)


def _members(args: argparse.Namespace) -> int:
    from controlplane.api.admin import change_member

    if args.op == "add" and not (args.node_id and args.api_address):
        raise ControlPlaneError("members add: --node-id and --api-address are required")
    index = change_member(args.endpoint, args.op, args.node_id, args.raft_address, args.api_address,
                          creds=_credentials(args))
    print(f"{args.op} {args.node_id or args.raft_address}: committed at index {index}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.bench == "reaction":
        from controlplane.bench.reaction import run_cli as run_reaction

        return run_reaction(args.bursts, args.out, args.json, deployments=args.deployments, tick_ms=args.tick_ms)
    if args.bench == "tick":
        from controlplane.bench.tick import run_cli as run_tick

        return run_tick(args.out, args.json, args.deployments, args.ticks)
    if args.bench == "chaos":
        from controlplane.bench.chaos import run_cli as run_chaos

        return run_chaos(args.runs, args.seed, args.out, args.json, nodes=args.nodes, faults=args.faults, keep=args.keep)
    if args.bench == "hostile":
        from controlplane.bench.hostile import run_cli as run_hostile

        return run_hostile(args.attacks, args.seed, args.out, args.json, short=args.short, keep=args.keep)
    if args.bench == "soak":
        from controlplane.bench.soak import run_cli as run_soak

        return run_soak(args.minutes, args.out, args.json, sample_s=args.sample_s, fault_every_s=args.fault_every_s)
    if args.bench == "stability":
        from controlplane.bench.stability import run_cli as run_stability

        return run_stability(args.seconds, args.cpu, args.disk, args.set, args.out, mode=args.mode,
                             fresh_starts=args.fresh_starts, bytecode=args.bytecode)
    if args.bench == "fleet":
        from controlplane.bench.fleet import run_cli as run_fleet

        return run_fleet(fleet=args.fleet, out=args.out, as_json=args.json, seed=args.seed, limit_s=args.limit_s,
                         policies=args.policies, jobs=args.jobs, print_fleet=args.print_fleet, progress=args.progress)
    if args.bench == "engines":
        from controlplane.bench.engines import run_cli as run_engines

        return run_engines(args.trace, args.out, args.json, args.seed, limit_s=args.limit_s, rows=args.rows)
    if args.bench == "policies":
        from controlplane.bench.policies import run_cli as run_policies

        return run_policies(args.trace, args.out, args.json, args.seed, rate_scale=args.rate_scale, limit_s=args.limit_s,
                            engine=args.engine)
    from controlplane.bench.raft import run_cli

    return run_cli(args.trials, args.commits, args.out, args.json)


_SERVICE_COMMANDS = {"coordinator": _coordinator, "up": _up, "status": _status, "adapter": _adapter, "members": _members}
_SERVICE_COMMANDS["bench"] = _bench


def _gpu_agent(args: argparse.Namespace) -> int:
    from controlplane.cli.gpu_agent import run

    return run(args)


_SERVICE_COMMANDS["gpu-agent"] = _gpu_agent


def _probe(args: argparse.Namespace) -> int:
    from controlplane.probe import run_cli

    return run_cli(args)


_SERVICE_COMMANDS["probe"] = _probe


def _mii_meter(args: argparse.Namespace) -> int:
    from adapters.mii_meter import run_cli

    return run_cli(args.listen, args.upstream, timeout_s=args.timeout, max_request_bytes=args.max_request_bytes,
                   max_concurrent=args.max_concurrent)


_SERVICE_COMMANDS["mii-meter"] = _mii_meter


def _health(args: argparse.Namespace) -> int:
    from controlplane.cli.health import run_cli

    return run_cli(args)


_SERVICE_COMMANDS["health"] = _health


def _fence_key(args: argparse.Namespace) -> int:
    from controlplane.fencing import FenceSigner, make_fence_key

    if not args.name or "/" in args.name:
        raise ControlPlaneError(f"fence-key: --name: must be a plain file name prefix, got {args.name!r}")
    files = make_fence_key(args.dir, args.name)
    print(f"private key (coordinators' fence_key_file, keep secret): {files.private_key}")
    print(f"public key (adapters' fence_public_key_files): {files.public_key}")
    print(f"key id: {FenceSigner.from_file(files.private_key).key_id}")
    return 0


_SERVICE_COMMANDS["fence-key"] = _fence_key


def _simulate(args: argparse.Namespace) -> int:
    from controlplane.sim import runner
    from controlplane.sim.report import progress_bar, render_table, write_plot

    if args.plot and not args.plot.lower().endswith(".png"):
        raise ControlPlaneError(f"--plot: {args.plot!r} must end in .png")
    if args.rate_scale <= 0:
        raise ControlPlaneError(f"--rate-scale: must be > 0, got {args.rate_scale}")
    if args.trace:
        scenario = runner.trace_scenario(args.trace, model=args.model, engine=args.engine,
                                         rate_scale=args.rate_scale, seed=args.seed or 0)
    elif args.scenario:
        scenario = runner.load_scenario(args.scenario)
    else:
        scenario = runner.builtin_scenario("demo")
    seed = args.seed if args.seed is not None else scenario.spec.seed
    show = sys.stderr.isatty() if args.progress is None else args.progress
    with ExitStack() as stack:
        logger = _event_logger(stack, args.events)
        progress = stack.enter_context(progress_bar(show, scenario.spec.name))
        result = runner.run(scenario, seed, progress=progress, logger=logger)
    if args.plot:
        write_plot(result, args.plot)
    if args.json:
        print(runner.to_json(result))
    else:
        render_table(result)
    return 0


def _event_logger(stack: ExitStack, path: str | None):
    """Transitions as JSON lines in ``path``; without a path they are counted but not printed."""
    import structlog

    if path is None:
        return structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        handle = stack.enter_context(open(path, "w", encoding="utf-8"))
    except OSError as exc:
        raise ControlPlaneError(f"--events: cannot write {path}: {exc.strerror}") from None
    return structlog.wrap_logger(
        structlog.PrintLogger(handle),
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer(sort_keys=True)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )


if __name__ == "__main__":
    sys.exit(main())
