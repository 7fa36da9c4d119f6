"""The API's per-tenant limits as pure pieces: the in-flight gate (watches and calls per tenant and in
total, the admin reserve), request shape checks, clipped echoes and bounded error trailers, the
per-tenant object limits of the replicated apply (and their codec), the configuration rules, and
tenantctl's manifest caps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api import limits as lim
from controlplane.api import manifests as mf
from controlplane.api.auth import Principal
from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import run as tenantctl_main
from controlplane.config import CoordinatorConfig
from controlplane.domain import commands as c
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant
from controlplane.domain.tokens import Role, TokenRecord
from raft import codec
from tests.raft.cluster import cluster_configs

ADMIN = Principal("a0", Role.ADMIN)
ALPHA = Principal("t1", Role.TENANT, "alpha")
BRAVO = Principal("t2", Role.TENANT, "bravo")
LIMITS = lim.CallLimits(workers=20, watches=6, watches_per_tenant=3, tenant_calls=4, calls_per_tenant=2,
                        admin_reserve=2)


# --- the gate ---------------------------------------------------------------------------------------------


def test_a_tenant_gets_its_share_of_watches_and_no_more() -> None:
    g = lim.Gate(LIMITS, "coord-1")
    assert [g.enter(ALPHA, "watch") for _ in range(3)] == [None, None, None]
    refusal = g.enter(ALPHA, "watch")
    assert refusal is not None and refusal.limit == "api_max_watches_per_tenant"
    assert "at most 3" in refusal.message and "'alpha'" in refusal.message and "once-watches included" in refusal.message
    assert g.enter(BRAVO, "watch") is None  # another tenant still watches
    g.leave(ALPHA, "watch")
    assert g.enter(ALPHA, "watch") is None  # a closed watch frees its slot


def test_tenants_together_leave_the_admin_reserve_free() -> None:
    g = lim.Gate(LIMITS)
    carol = Principal("t3", Role.TENANT, "carol")
    for p in (ALPHA, ALPHA, ALPHA, BRAVO):  # 4 = watches 6 - admin_reserve 2
        assert g.enter(p, "watch") is None
    refusal = g.enter(carol, "watch")
    assert refusal is not None and refusal.limit == "api_max_watches" and "minus api_admin_reserve 2" in refusal.message
    assert g.enter(ADMIN, "watch") is None and g.enter(ADMIN, "watch") is None  # the reserve
    refusal = g.enter(ADMIN, "watch")
    assert refusal is not None and "at most 6" in refusal.message  # the total binds admins too
    assert g.in_flight("watch") == 6 and g.in_flight("watch", "alpha") == 3


def test_admins_beyond_their_reserve_count_against_the_tenants_share() -> None:
    g = lim.Gate(LIMITS)
    for _ in range(4):
        assert g.enter(ADMIN, "watch") is None
    # admins hold 4: 2 of them are their reserve, 2 come out of the tenants' 4
    assert g.enter(ALPHA, "watch") is None and g.enter(BRAVO, "watch") is None
    assert g.enter(BRAVO, "watch") is not None


def test_calls_in_flight_per_tenant_and_for_all_tenants() -> None:
    g = lim.Gate(LIMITS)
    assert g.enter(ALPHA, "call") is None and g.enter(ALPHA, "call") is None
    refusal = g.enter(ALPHA, "call")
    assert refusal is not None and refusal.limit == "api_max_calls_per_tenant" and "at most 2" in refusal.message
    assert g.enter(BRAVO, "call") is None and g.enter(BRAVO, "call") is None
    refusal = g.enter(Principal("t3", Role.TENANT, "carol"), "call")
    assert refusal is not None and refusal.limit == "api_max_tenant_calls"
    for _ in range(50):  # admins' calls are never counted against the tenants (the reserve is in the pool size)
        assert g.enter(ADMIN, "call") is None
    g.leave(ALPHA, "call")
    assert g.enter(Principal("t3", Role.TENANT, "carol"), "call") is None


# --- request shape ----------------------------------------------------------------------------------------


def test_a_huge_quota_map_is_a_field_error_naming_the_field() -> None:
    msg = api_pb2.CreateTenantRequest(tenant=api_pb2.Tenant(
        metadata=api_pb2.ObjectMeta(name="t"), spec=api_pb2.TenantSpec(quota={f"p{i}": 1 for i in range(65)})))
    assert lim.shape_problems(msg, 64, 1024) == [("spec.quota", "must have at most 64 entries, got 65 (api_max_map_entries)")]
    assert lim.shape_problems(msg, 65, 1024) == []


def test_long_strings_are_refused_and_map_keys_are_clipped_in_the_path() -> None:
    key = "k" * 5000
    msg = api_pb2.RegisterClusterRequest(cluster=api_pb2.Cluster(
        metadata=api_pb2.ObjectMeta(name="x" * 2000), spec=api_pb2.ClusterSpec(zone="z", capacity={key: 1})))
    problems = dict(lim.shape_problems(msg, 64, 1024))
    assert problems["metadata.name"] == "must be at most 1024 bytes, got 2000 (api_max_string_bytes)"
    [keypath] = [f for f in problems if f.startswith("spec.capacity.")]
    assert len(keypath) < 80 and "(+4980 chars)" in keypath


def test_output_only_status_is_not_checked() -> None:
    msg = api_pb2.RegisterZoneRequest(zone=api_pb2.Zone(
        metadata=api_pb2.ObjectMeta(name="z"), status=api_pb2.ZoneStatus(capacity={f"p{i}": 1 for i in range(500)})))
    assert lim.shape_problems(msg, 64, 1024) == []


# --- echoes and trailers --------------------------------------------------------------------------------------


def test_clip_keeps_a_short_prefix_and_says_how_much_was_cut() -> None:
    assert lim.clip("abc") == "'abc'"
    out = lim.clip("x" * 100_000)
    assert out.startswith("'xxxx") and out.endswith("(+99960 chars)") and len(out) < 70


class _Context:
    def __init__(self) -> None:
        self.trailing: tuple = ()
        self.aborted: tuple = ()

    def set_trailing_metadata(self, md: tuple) -> None:
        self.trailing = md

    def abort(self, code, message) -> None:  # type: ignore[no-untyped-def]
        self.aborted = (code, message)
        raise RuntimeError("aborted")


@pytest.mark.parametrize("char", ["x", "\u00e9", "\U0001f600", "\x00"])
def test_error_trailers_stay_far_below_the_8_kib_metadata_limit(char: str) -> None:
    huge = char * 300_000
    ctx = _Context()
    with pytest.raises(RuntimeError):
        import grpc
        lim.abort(ctx, grpc.StatusCode.INVALID_ARGUMENT, huge, (("cp-error", huge),),
                  [(huge, huge)] * 100)
    _, message = ctx.aborted
    encoded = sum(3 if not (0x20 <= b < 0x7F) or b == 0x25 else 1 for b in message.encode())  # grpc percent-encoding
    details = dict(ctx.trailing)["grpc-status-details-bin"]
    total = encoded + len(details) * 4 // 3 + 4 + sum(len(v) for k, v in ctx.trailing if k != "grpc-status-details-bin")
    assert total < 6 * 1024, total
    status = status_pb2.Status.FromString(details)
    assert status.details  # still a BadRequest, with a count of what was left out
    assert len(message.encode()) <= lim.MAX_MESSAGE_BYTES


# --- object limits in the replicated apply ----------------------------------------------------------------


def _state() -> ControlState:
    s = ControlState()
    for t in ("alpha", "bravo"):
        assert apply(s, c.PutTenant(Tenant(t, 1))).ok
    return s


def _dep(name: str, tenant: str = "alpha") -> Deployment:
    return Deployment(name, tenant, Engine.VLLM, "llama3-8b-h100", "h100", 1)


def test_deployments_per_tenant_are_capped_in_the_apply_and_concurrent_creates_cannot_both_pass() -> None:
    s = _state()
    for i in range(3):
        assert apply(s, c.PutDeployment(_dep(f"d{i}"), c.MUST_NOT_EXIST, 0, 3)).ok
    # two creates proposed from the same view (two coordinators, both read 3 < 4): the log orders them
    r = apply(s, c.Batch((c.PutDeployment(_dep("d3"), c.MUST_NOT_EXIST, 0, 4),
                          c.PutDeployment(_dep("d4"), c.MUST_NOT_EXIST, 0, 4))))
    assert [x.ok for x in r.results] == [True, False]
    assert r.results[1].code == "limit" and "already has 4 deployments" in r.results[1].error
    assert apply(s, c.PutDeployment(_dep("d0"), c.ANY_VERSION, 0, 4)).ok  # an update is not a create
    assert apply(s, c.PutDeployment(_dep("b0", "bravo"), c.MUST_NOT_EXIST, 0, 4)).ok  # another tenant's count
    assert apply(s, c.PutDeployment(_dep("d9"), c.MUST_NOT_EXIST, 0, 0)).ok  # 0: the holder's own writes


def test_tokens_per_tenant_are_capped_in_the_apply() -> None:
    s = _state()

    def tok(i: int, tenant: str = "alpha") -> TokenRecord:
        return TokenRecord(f"{i:012x}", "0" * 64, Role.TENANT, tenant)

    assert apply(s, c.PutToken(tok(1), 2)).ok and apply(s, c.PutToken(tok(2), 2)).ok
    r = apply(s, c.PutToken(tok(3), 2))
    assert not r.ok and r.code == "limit" and "already has 2 tokens" in r.error
    assert apply(s, c.PutToken(tok(4, "bravo"), 2)).ok
    assert apply(s, c.PutToken(TokenRecord("0000000000ff", "0" * 64, Role.ADMIN), 1)).ok  # admins: no tenant


def test_the_codec_carries_the_limit_and_leaves_older_commands_byte_identical() -> None:
    plain = c.PutDeployment(_dep("d0"), c.MUST_NOT_EXIST, 5)
    assert b"max_per_tenant" not in codec.encode(plain)  # 0 is left out: the bytes of v3 commands
    assert codec.decode(codec.encode(plain)) == plain
    capped = c.PutDeployment(_dep("d0"), c.MUST_NOT_EXIST, 5, 200)
    assert b'"max_per_tenant":200' in codec.encode(capped) and codec.decode(codec.encode(capped)) == capped
    tok = c.PutToken(TokenRecord("0000000000aa", "0" * 64, Role.TENANT, "alpha"), 7)
    assert codec.decode(codec.encode(tok)) == tok


def test_a_malformed_limit_is_rejected_identically_everywhere() -> None:
    s = _state()
    r = apply(s, c.PutDeployment(_dep("d0"), c.MUST_NOT_EXIST, 0, -1))
    assert not r.ok and r.code == "invalid" and "max_per_tenant" in r.error


# --- configuration -----------------------------------------------------------------------------------------


def _cfg(tmp_path: Path, **over: object) -> CoordinatorConfig:
    [raw] = cluster_configs(tmp_path, 1)
    return CoordinatorConfig.model_validate({**raw, **over})


def test_the_limits_are_configurable_and_must_fit_the_worker_pool(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert (cfg.api_workers, cfg.api_max_watches, cfg.api_max_watches_per_tenant, cfg.api_admin_reserve) == (48, 16, 4, 4)
    assert _cfg(tmp_path, api_max_watches_per_tenant=2).api_max_watches_per_tenant == 2
    with pytest.raises(ValueError, match="api_workers"):
        _cfg(tmp_path, api_workers=20)
    with pytest.raises(ValueError, match="api_max_watches_per_tenant"):
        _cfg(tmp_path, api_max_watches_per_tenant=13)
    with pytest.raises(ValueError, match="api_max_calls_per_tenant"):
        _cfg(tmp_path, api_max_calls_per_tenant=25)


# --- tenantctl manifests ------------------------------------------------------------------------------------


BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


@pytest.mark.parametrize(("text", "problem"), [
    (BOMB, "aliases expand it beyond 100000 nodes"),
    ("a: &a [*a]\n", "refer to themselves"),
    ("[" * 100_000, "nested too deeply"),
    ("- " * 100_000 + "x\n", "nest"),  # libyaml: "exceeded maximum nesting depth"
])
def test_alias_bombs_cycles_and_deep_nesting_are_refused_quickly(text: str, problem: str) -> None:
    with pytest.raises(mf.ManifestError) as err:
        mf.parse_text(text, "m.yaml")
    assert problem in err.value.problems[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("ab:-&*[]{},\n '\"!|>#%@`?\t\x00\ufeff\u2028")), max_size=300))
def test_any_manifest_text_is_objects_or_a_manifest_error(text: str) -> None:
    try:
        mf.parse_text(text, "m.yaml")
    except mf.ManifestError as exc:
        assert exc.problems and all(isinstance(p, str) and "\n" not in p for p in exc.problems)


def _run_tenantctl(args: list[str], stdin: str = "") -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = tenantctl_main(args, out=out, err=err, stdin=io.StringIO(stdin))
    return rc, err.getvalue()


def test_tenantctl_refuses_an_oversized_manifest_before_parsing_it(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (mf.MAX_MANIFEST_BYTES + 10) + "\n")
    rc, err = _run_tenantctl(["--endpoint", "127.0.0.1:1", "--token", "t", "apply", "-f", str(big)])
    assert rc != 0 and "larger than the 1048576-byte limit of a manifest" in err and "Traceback" not in err
    rc, err = _run_tenantctl(["--endpoint", "127.0.0.1:1", "--token", "t", "apply", "-f", "-"],
                             stdin="#" * (mf.MAX_MANIFEST_BYTES + 10))
    assert rc != 0 and "<stdin>: more than 1048576 bytes" in err and "Traceback" not in err
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    rc, err = _run_tenantctl(["--endpoint", "127.0.0.1:1", "--token", "t", "apply", "-f", str(bomb)])
    assert rc != 0 and "aliases expand" in err and "nothing was sent" in err
