"""``controlplane health``: one grpc.health.v1 ``Check`` against a coordinator or an adapter, for
container probes and for operators.

Why not Kubernetes' native ``grpc:`` probe: it speaks plaintext only, and the coordinator's API is
TLS (``api_tls``). This command speaks TLS, verifies the server certificate against a CA and checks
the name in it, so a probe that passes also proves the certificate the clients will see.

Two ways to say what to check:

* ``--config FILE``: a coordinator configuration, loaded by the real loader (``load_config``, with the
  ``CONTROLPLANE_*`` environment the probe inherits from its container). The endpoint is its
  ``api_address``, TLS is used when ``api_tls`` is set, verified against ``api_tls.ca_file`` (else
  ``client_ca_file``, else the system roots), and with ``client_ca_file`` (mutual TLS) the server's
  own certificate and key are presented as the client certificate. The probe can therefore never
  drift from the port and the name the process serves.
* ``--endpoint HOST:PORT``: plaintext unless ``--ca-file`` is given (``--cert-file``/``--key-file`` for
  mutual TLS, ``--server-name`` to check another name than the host).

Exit status: 0 when the server answers ``SERVING`` (one line on stdout), 1 when it answers anything
else or cannot be reached in ``--timeout`` seconds (one line on stderr naming the endpoint and the
gRPC status), 2 for a usage or configuration error (as every ``controlplane`` command).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from controlplane.domain.errors import ControlPlaneError

EXIT_NOT_SERVING = 1


@dataclass(frozen=True)
class Target:
    endpoint: str
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    tls: bool = False
    """TLS even without ``ca_file`` (then verified against the system roots)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", metavar="FILE", help="coordinator YAML: check its api_address with its api_tls")
    what.add_argument("--endpoint", metavar="HOST:PORT", help="check this endpoint (plaintext unless --ca-file)")
    parser.add_argument("--ca-file", metavar="PEM", help="CA of the server certificate (--endpoint only)")
    parser.add_argument("--cert-file", metavar="PEM", help="client certificate, mutual TLS (--endpoint only)")
    parser.add_argument("--key-file", metavar="PEM", help="its private key (--endpoint only)")
    parser.add_argument("--server-name", help="name expected in the server certificate (default: the endpoint's host)")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="deadline in seconds (default 3)")


def target_of(args: argparse.Namespace) -> Target:
    """Where to call and how, from the flags (or the coordinator configuration)."""
    if args.config:
        given = [f for f, v in (("--ca-file", args.ca_file), ("--cert-file", args.cert_file),
                                ("--key-file", args.key_file)) if v]
        if given:
            raise ControlPlaneError(f"health: {given[0]} cannot be combined with --config (api_tls says it)")
        from controlplane.config import load_config

        cfg = load_config(args.config)
        tls = cfg.api_tls
        if tls is None:
            return Target(cfg.api_address, server_name=args.server_name)
        mutual = tls.client_ca_file is not None
        return Target(cfg.api_address, ca_file=tls.ca_file or tls.client_ca_file,
                      cert_file=tls.cert_file if mutual else None, key_file=tls.key_file if mutual else None,
                      server_name=args.server_name, tls=True)
    if (args.cert_file is None) != (args.key_file is None):
        raise ControlPlaneError("health: --cert-file and --key-file go together")
    if args.cert_file and not args.ca_file:
        raise ControlPlaneError("health: a client certificate (--cert-file) needs --ca-file as well")
    return Target(args.endpoint, ca_file=_path(args.ca_file), cert_file=_path(args.cert_file),
                  key_file=_path(args.key_file), server_name=args.server_name, tls=args.ca_file is not None)


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def check(target: Target, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(serving, one-line description). Never raises for network problems."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from controlplane.api.channel import channel_options

    def read(p: Path | None, flag: str) -> bytes | None:
        if p is None:
            return None
        try:
            return p.read_bytes()
        except OSError as exc:
            raise ControlPlaneError(f"health: {flag}: cannot read {str(p)!r}: {exc.strerror or exc}") from None

    options = channel_options(target.server_name)
    if target.tls:
        creds = grpc.ssl_channel_credentials(root_certificates=read(target.ca_file, "ca_file"),
                                             private_key=read(target.key_file, "key_file"),
                                             certificate_chain=read(target.cert_file, "cert_file"))
        channel = grpc.secure_channel(target.endpoint, creds, options=options)
    else:
        channel = grpc.insecure_channel(target.endpoint, options=options)
    where = f"{target.endpoint}{' ' + repr(service) if service else ''}"
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        detail = " ".join(str(exc.details() if hasattr(exc, "details") else exc).split())
        status = getattr(code, "name", "ERROR")
        return False, f"{where}: {status}: {detail}" if detail else f"{where}: {status}"
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{where}: {status}"


def run_cli(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise ControlPlaneError(f"health: --timeout must be > 0, got {args.timeout}")
    serving, line = check(target_of(args), args.service, args.timeout)
    if serving:
        print(line)
        return 0
    print(f"controlplane health: {line}", file=sys.stderr)
    return EXIT_NOT_SERVING
