"""The API's pure parts: token -> principal, request conversion and validation (field paths), the
status mapping of rejected commands, the client channel, and the coordinator's API configuration."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from controlplane.api import convert as cv
from controlplane.api.auth import (
    AUTH_FAILED,
    CatchingUp,
    Principal,
    Unauthenticated,
    authenticate,
    bearer_of,
)
from controlplane.api.channel import BearerInterceptor, check_token, open_channel
from controlplane.api.server import error_of, event_filter, rejection_error
from controlplane.api.v1 import api_pb2 as pb
from controlplane.config import ConfigError, load_config
from controlplane.domain.errors import (
    CommitTimeout,
    LeadershipLost,
    NotLeader,
    ValidationError,
)
from controlplane.domain.state import ApplyResult
from controlplane.domain.tokens import Role, TokenRecord, parse_token
from controlplane.runtime.events import ChangeEvent
from controlplane.tokens import hash_secret, new_token
from tests.raft.cluster import cluster_configs

# --- auth ----------------------------------------------------------------------------------------------


def _record(role: Role = Role.TENANT, tenant: str = "a", expires_ms: int = 0) -> tuple[str, TokenRecord]:
    token, token_id, sha = new_token()
    return token, TokenRecord(token_id, sha, role, tenant if role is Role.TENANT else "", 1, expires_ms, "t")


def test_a_valid_token_maps_to_its_principal() -> None:
    token, rec = _record()
    p = authenticate(token, {rec.id: rec}, now_ms=10)
    assert p == Principal(rec.id, Role.TENANT, "a", 0)
    assert p.sees_tenant("a") and not p.sees_tenant("b") and not p.is_admin
    assert token not in str(p) and rec.id in str(p)


@pytest.mark.parametrize("case", ["missing", "malformed", "unknown", "wrong-secret", "expired"])
def test_every_bad_token_is_the_same_unauthenticated(case: str) -> None:
    token, rec = _record(expires_ms=100)
    tokens = {rec.id: rec}
    other, _, _ = new_token()
    presented = {"missing": None, "malformed": "hello", "unknown": other,
                 "wrong-secret": f"cp_{rec.id}_{parse_token(other)[1]}", "expired": token}[case]  # type: ignore[index]
    with pytest.raises(Unauthenticated) as err:
        authenticate(presented, tokens, now_ms=100)
    assert str(err.value) == AUTH_FAILED


def test_an_unknown_token_on_a_replica_that_is_behind_is_catching_up_not_unauthenticated() -> None:
    token, rec = _record()
    other, _, _ = new_token()
    behind, current = (lambda: False), (lambda: True)
    with pytest.raises(CatchingUp):  # may simply not have reached this replica yet: retry
        authenticate(other, {rec.id: rec}, now_ms=10, caught_up=behind)
    with pytest.raises(Unauthenticated):  # a replica that is up to date does not know it: refused
        authenticate(other, {rec.id: rec}, now_ms=10, caught_up=current)
    wrong = f"cp_{rec.id}_{parse_token(other)[1]}"  # type: ignore[index]
    with pytest.raises(Unauthenticated):  # a known id with a wrong secret is refused even when behind
        authenticate(wrong, {rec.id: rec}, now_ms=10, caught_up=behind)
    with pytest.raises(Unauthenticated):  # malformed is malformed
        authenticate("hello", {}, now_ms=10, caught_up=behind)
    assert authenticate(token, {rec.id: rec}, now_ms=10, caught_up=behind).token_id == rec.id


def test_bearer_header_parsing() -> None:
    assert bearer_of((("authorization", "Bearer cp_x"),)) == "cp_x"
    assert bearer_of((("authorization", "bearer  cp_x "),)) == "cp_x"
    assert bearer_of((("authorization", "Basic abc"),)) is None
    assert bearer_of(()) is None and bearer_of(None) is None


# --- conversion and validation ---------------------------------------------------------------------------


def test_tenant_violations_name_the_request_fields() -> None:
    msg = pb.Tenant(metadata=pb.ObjectMeta(name="A"), spec=pb.TenantSpec(quota={"H100": -1}, slo=pb.Slo(max_queue_ms=5)))
    with pytest.raises(cv.InvalidArgument) as err:
        cv.tenant_from_proto(msg)
    fields = [f for f, _ in err.value.violations]
    assert fields[:2] == ["metadata.name", "spec.priority"] and "spec.quota.H100" in fields
    assert err.value.message.startswith("metadata.name: ")
    with pytest.raises(cv.InvalidArgument) as err:
        cv.tenant_from_proto(pb.Tenant(metadata=pb.ObjectMeta(name="a"), spec=pb.TenantSpec(priority=1, slo=pb.Slo(ttft_p99_ms=0))))
    assert err.value.violations == [("spec.slo.ttft_p99_ms", "must be between 1 and 3600000, got 0")]


def test_a_tenant_needs_only_a_priority() -> None:
    t = cv.tenant_from_proto(pb.Tenant(metadata=pb.ObjectMeta(name="a"), spec=pb.TenantSpec(priority=0)))
    assert (t.id, t.priority, dict(t.quota), t.slo.ttft_p99_ms) == ("a", 0, {}, 2000)


def test_deployment_violations_name_the_request_fields() -> None:
    with pytest.raises(cv.InvalidArgument) as err:
        cv.deployment_from_proto(pb.Deployment(spec=pb.DeploymentSpec(engine="nope")))
    assert [f for f, _ in err.value.violations] == ["metadata.name", "spec.tenant", "spec.engine", "spec.model", "spec.pool"]
    base = {"tenant": "a", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100"}
    with pytest.raises(cv.InvalidArgument) as err:
        cv.deployment_from_proto(pb.Deployment(metadata=pb.ObjectMeta(name="d"),
                                               spec=pb.DeploymentSpec(**base, min_replicas=5, max_replicas=2)))
    assert err.value.violations == [("spec.min_replicas", "must not exceed max_replicas (2), got 5")]
    with pytest.raises(cv.InvalidArgument) as err:
        cv.deployment_from_proto(pb.Deployment(metadata=pb.ObjectMeta(name="d"), spec=pb.DeploymentSpec(
            **base, policy=pb.ScalingPolicy(target_kv_usage=float("nan")))))
    assert err.value.violations[0][0] == "spec.policy.target_kv_usage"
    d = cv.deployment_from_proto(pb.Deployment(metadata=pb.ObjectMeta(name="d"), spec=pb.DeploymentSpec(**base)))
    assert (d.min_replicas, d.max_replicas, d.warm_pool, d.gpus_per_instance) == (1, 64, 1, 1)


def test_cluster_and_zone_validation() -> None:
    with pytest.raises(cv.InvalidArgument) as err:
        cv.cluster_from_proto(pb.Cluster(metadata=pb.ObjectMeta(name="c"), spec=pb.ClusterSpec(adapter_address="x")))
    assert [f for f, _ in err.value.violations] == ["spec.zone", "spec.adapter_address"]
    with pytest.raises(cv.InvalidArgument) as err:
        cv.zone_from_proto(pb.Zone(metadata=pb.ObjectMeta(name="z"), spec=pb.ZoneSpec(region="Bad Region")))
    assert err.value.violations[0][0] == "spec.region"


# --- status mapping ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "status", "cp_error"), [
    ("not_found", grpc.StatusCode.NOT_FOUND, ""),
    ("already_exists", grpc.StatusCode.ALREADY_EXISTS, ""),
    ("version_mismatch", grpc.StatusCode.FAILED_PRECONDITION, "version-mismatch"),
    ("conflict", grpc.StatusCode.FAILED_PRECONDITION, "conflict"),
    ("invalid", grpc.StatusCode.INVALID_ARGUMENT, ""),
    ("malformed", grpc.StatusCode.INVALID_ARGUMENT, ""),
    ("unknown", grpc.StatusCode.FAILED_PRECONDITION, ""),
])
def test_rejections_map_to_statuses(code: str, status: grpc.StatusCode, cp_error: str) -> None:
    err = rejection_error(ApplyResult(False, "tenant.priority: must be between 0 and 1000000", code=code))
    assert err.code is status and err.cp_error == cp_error and err.message
    if status is grpc.StatusCode.INVALID_ARGUMENT:
        assert err.violations == [("spec.priority", "must be between 0 and 1000000")]  # the request's field


def test_raft_failures_map_to_retryable_statuses() -> None:
    e = error_of(NotLeader("no leader", leader_hint="10.0.0.2:7001"))
    assert e.code is grpc.StatusCode.UNAVAILABLE and dict(e.trailing) == {"leader-hint": "10.0.0.2:7001"}
    e = error_of(LeadershipLost("lost"), "10.0.0.3:7001")
    assert e.code is grpc.StatusCode.UNAVAILABLE and dict(e.trailing)["cp-outcome"] == "unknown"
    e = error_of(CommitTimeout("slow"))
    assert e.code is grpc.StatusCode.DEADLINE_EXCEEDED and dict(e.trailing) == {"cp-outcome": "unknown"}
    e = error_of(ValidationError("spec.pool", "bad"))
    assert e.code is grpc.StatusCode.INVALID_ARGUMENT and e.violations == [("spec.pool", "bad")]


def test_watch_filter_scopes_tenant_principals() -> None:
    tenant_b = Principal("000000000001", Role.TENANT, "b")
    admin = Principal("000000000002", Role.ADMIN)
    ev_a = ChangeEvent(revision=1, at_ms=0, type="ADDED", kind="Deployment", name="a/da", tenant="a")
    ev_b = ChangeEvent(revision=2, at_ms=0, type="TRANSITION", kind="Instance", name="i1", tenant="b", deployment="b/db")
    ev_cluster = ChangeEvent(revision=3, at_ms=0, type="ADDED", kind="Cluster", name="c1")
    everything = pb.WatchRequest()
    assert [e.revision for e in (ev_a, ev_b, ev_cluster) if event_filter(tenant_b, everything)(e)] == [2]
    assert [e.revision for e in (ev_a, ev_b, ev_cluster) if event_filter(admin, everything)(e)] == [1, 2, 3]
    only_b = pb.WatchRequest(tenant="b", kinds=["Instance"])
    assert [e.revision for e in (ev_a, ev_b, ev_cluster) if event_filter(admin, only_b)(e)] == [2]
    for by_deployment in (pb.WatchRequest(deployment="a/da"), pb.WatchRequest(deployment="da", tenant="a")):
        assert [e.revision for e in (ev_a, ev_b, ev_cluster) if event_filter(admin, by_deployment)(e)] == [1]
    assert [e.revision for e in (ev_a, ev_b, ev_cluster) if event_filter(tenant_b, pb.WatchRequest(deployment="db"))(e)] == [2]
    # b's own "da" (none here) and a's "a/da" both match nothing for b: a free name
    assert not any(event_filter(tenant_b, pb.WatchRequest(deployment=n))(ev_a) for n in ("da", "a/da"))
    with pytest.raises(cv.InvalidArgument, match="^deployment: deployment names are per tenant: an admin names one as"):
        event_filter(admin, pb.WatchRequest(deployment="da"))
    # a tenant principal cannot widen its view with the tenant filter
    assert not event_filter(tenant_b, pb.WatchRequest(tenant="a"))(ev_a)


# --- client channel --------------------------------------------------------------------------------------------


def test_channel_checks_its_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="token"):
        check_token("cp_a b")
    with pytest.raises(ValidationError, match="ca_file: cannot read"):
        open_channel("127.0.0.1:1", ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValidationError, match="key_file"):
        open_channel("127.0.0.1:1", ca_file=tmp_path / "x", cert_file=tmp_path / "c")
    assert "cp_" not in repr(BearerInterceptor("cp_secret"))
    with open_channel("127.0.0.1:1", token="cp_abc") as ch:
        assert ch is not None


# --- configuration ----------------------------------------------------------------------------------------------


def _write(tmp_path: Path, **overrides: object) -> Path:
    import yaml

    [cfg] = cluster_configs(tmp_path, 1)
    cfg.update(overrides)
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_plaintext_api_off_loopback_needs_tls_or_api_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, api_address="10.1.2.3:7001"), env={})
    assert err.value.field == "api_tls" and "\n" not in str(err.value) and "api_insecure" in str(err.value)
    assert load_config(_write(tmp_path, api_address="10.1.2.3:7001", api_insecure=True), env={}).api_insecure
    assert load_config(_write(tmp_path, api_address="localhost:7001"), env={}).api_tls is None


def test_api_tls_files_must_be_readable(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("x")
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, api_tls={"cert_file": "cert.pem", "key_file": "nope.pem"}), env={})
    assert err.value.field == "api_tls.key_file" and "cannot read" in str(err.value)


def test_token_files_are_checked_and_relative_to_the_config(tmp_path: Path) -> None:
    token, _, _ = new_token()
    (tmp_path / "admin.token").write_text(token + "\n")
    (tmp_path / "adapter.token").write_text("s3cret-adapter-token\n")
    cfg = load_config(_write(tmp_path, admin_token_file="admin.token", adapter_token_file="adapter.token"), env={})
    assert cfg.admin_token_file == tmp_path / "admin.token"
    (tmp_path / "bad.token").write_text("not a token at all")
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, admin_token_file="bad.token"), env={})
    assert err.value.field == "admin_token_file" and "not a token at all" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, adapter_token_file="missing.token"), env={})
    assert err.value.field == "adapter_token_file" and "cannot read" in str(err.value)


def test_token_record_hash_is_of_the_secret() -> None:
    token, token_id, sha = new_token()
    parsed = parse_token(token)
    assert parsed is not None and parsed[0] == token_id and hash_secret(parsed[1]) == sha
