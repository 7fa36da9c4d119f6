"""Tokens are never logged: a real coordinator (in-process, one Raft member, control loop running,
an adapter address that refuses connections so the adapter client logs its failures) takes API
calls with valid, created, revoked, malformed and wrong-secret tokens, and the ``controlplane
status`` CLI runs with good and bad ones, while everything is captured: structlog events rendered
as the services render them (JSON, tracebacks included), the standard ``logging`` records at DEBUG
(formatted with their exceptions), and the process's stdout and stderr at the file-descriptor level
(gRPC's C core, prints). The secret part of every token, and the adapter token, appears nowhere in
that text, and neither does any full token; the capture itself is checked to hold the events the
calls cause (``token_created``, the adapter failures), so an empty capture cannot pass.

The same property for coordinator and adapter *processes* is checked on the logs of the short soak
(tests/security/test_soak.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog

from controlplane.api.v1 import api_pb2
from controlplane.cli.main import main as cli_main
from controlplane.config import CoordinatorConfig
from controlplane.coordinator import Coordinator, topology_of
from controlplane.domain.tokens import parse_token
from controlplane.tokens import new_token
from tests.raft.cluster import cluster_configs
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api

ADAPTER_TOKEN = "adapter-secret-Zk3pQ9rT5vW7xY1bN4mC6"


@pytest.fixture
def captured_logs() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    events, records = io.StringIO(), io.StringIO()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.StackInfoRenderer(),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=True, default=repr)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(events),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(records)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield events, records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        structlog.reset_defaults()


def secret_of(token: str) -> str:
    parsed = parse_token(token)
    assert parsed is not None, token
    return parsed[1]


@pytest.mark.timeout(120)
def test_no_token_secret_reaches_any_log(tmp_path: Path, captured_logs: tuple[io.StringIO, io.StringIO],
                                         capfd: pytest.CaptureFixture[str]) -> None:
    events, records = captured_logs
    admin_token, admin_id, _ = new_token()
    (tmp_path / "admin.token").write_text(admin_token + "\n", encoding="utf-8")
    (tmp_path / "adapter.token").write_text(ADAPTER_TOKEN + "\n", encoding="utf-8")
    [raw] = cluster_configs(tmp_path, 1, admin_token_file=str(tmp_path / "admin.token"),
                            adapter_token_file=str(tmp_path / "adapter.token"),
                            clusters=[{"id": "c1", "zone": "az-0", "capacity": {"h100": 4},
                                       "adapter_address": "127.0.0.1:9"}],  # nothing listens: refused
                            tenants=[{"id": "t1", "priority": 1, "quota": {"h100": 4}}],
                            deployments=[{"id": "d1", "tenant": "t1", "engine": "vllm", "model": "llama3-8b-h100",
                                          "pool": "h100", "min_replicas": 1, "max_replicas": 2}])
    cfg = CoordinatorConfig.model_validate(raw)
    co = Coordinator(cfg, topology_of(cfg))
    secrets = {"admin": secret_of(admin_token), "adapter": ADAPTER_TOKEN}
    full_tokens = [admin_token]
    apis: list[Api] = []
    co.start()
    try:
        endpoint = cfg.api_address
        admin = Api(endpoint, admin_token)
        apis.append(admin)

        def ready() -> bool:
            try:
                return admin.tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=2).role == "admin"
            except grpc.RpcError:
                return False

        wait_until(ready, 20.0, "the bootstrap admin token")
        wait_until(lambda: co.node.state_copy().tenants, 20.0, "the configured tenant")
        tenant_tok = admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="tenant", tenant="t1"), timeout=10).token
        extra = admin.tokens.CreateToken(api_pb2.CreateTokenRequest(role="admin", description="to revoke"), timeout=10)
        admin.tokens.ListTokens(api_pb2.ListTokensRequest(), timeout=10)
        admin.tokens.RevokeToken(api_pb2.RevokeTokenRequest(id=extra.info.id), timeout=10)
        secrets |= {"tenant": secret_of(tenant_tok), "revoked": secret_of(extra.token)}
        full_tokens += [tenant_tok, extra.token]

        tenant = Api(endpoint, tenant_tok)
        apis.append(tenant)
        tenant.deployments.ListDeployments(api_pb2.ListRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as denied:
            tenant.clusters.ListClusters(api_pb2.ListRequest(), timeout=10)
        assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED

        wrong_secret = f"cp_{admin_id}_{'Q' * 43}"
        bad = [extra.token, wrong_secret, admin_token + "x", admin_token[:-1]]
        secrets |= {"wrong": "Q" * 43}
        anonymous = Api(endpoint, None)
        apis.append(anonymous)
        headers = [f"Bearer {t}" for t in bad] + [f"bearer {admin_token}x", f"Basic {admin_token}x", f"Token {admin_token}"]
        for h in headers:
            with pytest.raises(grpc.RpcError) as err:
                anonymous.tenants.ListTenants(api_pb2.ListRequest(), timeout=10, metadata=(("authorization", h),))
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert secrets["admin"] not in (err.value.details() or "")
        with pytest.raises(grpc.RpcError):
            anonymous.tenants.ListTenants(api_pb2.ListRequest(), timeout=10, metadata=(("x-token", admin_token),))

        # the CLI with a good, a revoked and a malformed token
        assert cli_main(["status", "--endpoints", endpoint, "--token", admin_token]) == 0
        cli_main(["status", "--endpoints", endpoint, "--token", extra.token])
        cli_main(["status", "--endpoints", endpoint, "--token", f"{admin_token} trailing"])
        # the adapter client has tried (and failed) to reach the adapter with its token by now
        wait_until(lambda: "127.0.0.1:9" in events.getvalue() + records.getvalue(), 20.0, "an adapter failure logged")
    finally:
        for api in apis:
            api.channel.close()
        co.stop()

    out, err = capfd.readouterr()
    text = "\n".join([events.getvalue(), records.getvalue(), out, err])
    assert "token_created" in events.getvalue() and "token_revoked" in events.getvalue(), "the capture missed events"
    for name, secret in secrets.items():
        assert secret not in text, f"the {name} token's secret was logged"
    for tok in full_tokens:
        assert tok not in text
    for line in events.getvalue().splitlines():
        json.loads(line)  # what was captured is the services' JSON lines
