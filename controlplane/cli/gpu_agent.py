"""``controlplane gpu-agent``: the node agent that publishes this node's GPU memory for the cluster
adapter (:mod:`adapters.gpu_report`; the DaemonSet in ``deploy/base/gpu-agent/``)."""

from __future__ import annotations

import argparse
import os

from controlplane.domain.errors import ControlPlaneError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (default $NODE_NAME)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   help="where the per-node ConfigMap goes (default $POD_NAMESPACE)")
    p.add_argument("--pool", default=os.environ.get("GPU_POOL", ""),
                   help="the node's GPU pool as the coordinators name it (default $GPU_POOL; empty: the cluster's only pool)")
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between readings (default 5)")
    p.add_argument("--once", action="store_true", help="read and publish once, then exit")
    p.add_argument("--print", action="store_true", dest="print_only",
                   help="print the record as JSON instead of publishing it (no Kubernetes API needed)")


def run(args: argparse.Namespace) -> int:
    import re
    import sys
    import threading

    from adapters.gpu import GpuMonitor
    from adapters.gpu_report import ConfigMapPublisher, run_agent
    from controlplane.runtime.clock import wall_ms

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,241}[a-z0-9])?", args.node or ""):
        raise ControlPlaneError(f"gpu-agent: --node: a Kubernetes node name is required, got {args.node!r}")
    if not 0.5 <= args.interval_s <= 3600:
        raise ControlPlaneError(f"gpu-agent: --interval-s: must be between 0.5 and 3600, got {args.interval_s:g}")
    if not re.fullmatch(r"([a-z0-9][a-z0-9._-]{0,62})?", args.pool):
        raise ControlPlaneError(f"gpu-agent: --pool: not a pool name: {args.pool!r}")
    if args.print_only:
        def publish(record) -> None:
            print(record.model_dump_json(), file=sys.stdout, flush=True)
    else:
        if not args.namespace:
            raise ControlPlaneError("gpu-agent: --namespace: required to publish (or $POD_NAMESPACE)")
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        from controlplane.cli.logs import service_logging

        service_logging()
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)
        publish = ConfigMapPublisher(k8s.CoreV1Api(k8s.ApiClient(configuration)), args.namespace, args.node,
                                     os.environ.get("POD_NAME", ""), os.environ.get("POD_UID", ""))
    stop = threading.Event()
    if not args.once:
        from controlplane.cli.main import _on_signals

        _on_signals(stop.set)
    run_agent(GpuMonitor(), publish, args.node, args.pool, args.interval_s, stop, wall_ms, once=args.once)
    return 0
