"""Issue 18 point 7: a token is usable on every coordinator once ``token create`` returned. A
follower that does not know a well-formed token's id waits (bounded) for the entries it applies next
(``controlplane/api/token_settle.py``); tenantctl asks one other endpoint before believing an
UNAUTHENTICATED. A real three-member group, the real CLI."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest

from controlplane.api.auth import Authenticator, Unauthenticated
from controlplane.api.token_settle import TokenSettle
from controlplane.api.v1 import api_pb2
from controlplane.cli.tenantctl import run
from controlplane.domain.tokens import Role, TokenRecord
from controlplane.tokens import new_token
from tests.unit.test_api_group import members  # noqa: F401 - the three-member fixture
from tests.support.waiting import wait_until
from tests.unit.test_api_server import Api


def _raft_leader(cos):
    return next(c for c in cos if c.node.status().role == "leader")


def test_a_new_token_works_at_once_on_every_follower(members) -> None:  # noqa: F811
    cos, admin = members
    leader = _raft_leader(cos)
    creator = Api(leader.cfg.api_address, admin)
    for i in range(15):
        created = creator.tokens.CreateToken(api_pb2.CreateTokenRequest(role="admin", description=f"t{i}"), timeout=10)
        for c in cos:
            if c is leader:
                continue
            who = Api(c.cfg.api_address, created.token).tokens.WhoAmI(api_pb2.WhoAmIRequest(), timeout=10)
            assert who.token_id == created.info.id


def test_tenantctl_with_a_new_token_on_a_follower_first(members) -> None:  # noqa: F811
    cos, admin = members
    leader = _raft_leader(cos)
    order = [c.cfg.api_address for c in cos if c is not leader] + [leader.cfg.api_address]
    out, err = io.StringIO(), io.StringIO()
    code = run(["--endpoint", leader.cfg.api_address, "--token", admin, "token", "create", "--admin"],
               out=out, err=err)
    assert code == 0, err.getvalue()
    token = out.getvalue().strip()
    out, err = io.StringIO(), io.StringIO()
    code = run(["--endpoint", ",".join(order), "--token", token, "whoami"], out=out, err=err)
    assert code == 0 and "admin" in out.getvalue(), err.getvalue()


class _Node:
    def __init__(self, role: str = "follower", leader: str = "n1") -> None:
        self.role, self.leader = role, leader
        self.events = SimpleNamespace(last_revision=0, wait_after=lambda rev, t: (time.sleep(t), rev)[1])

    def status(self):
        return SimpleNamespace(role=self.role, leader_id=self.leader)


def test_settle_waits_until_the_token_arrives_and_is_bounded() -> None:
    token, tid, digest = new_token()
    tokens: dict[str, TokenRecord] = {}
    auth = Authenticator(lambda: tokens, lambda: 0, lambda: True, TokenSettle(_Node(), wait_s=5.0))
    threading.Timer(0.2, lambda: tokens.__setitem__(tid, TokenRecord(tid, digest, Role.ADMIN))).start()
    started = time.monotonic()
    assert auth.of_token(token).is_admin
    assert time.monotonic() - started < 4.0
    other, _, _ = new_token()
    quick = Authenticator(lambda: tokens, lambda: 0, lambda: True, TokenSettle(_Node(), wait_s=0.1))
    started = time.monotonic()
    with pytest.raises(Unauthenticated):
        quick.of_token(other)
    assert 0.1 <= time.monotonic() - started < 2.0
    # the leader, a replica without a leader, and garbage never wait
    for node in (_Node(role="leader"), _Node(leader="")):
        never = Authenticator(lambda: tokens, lambda: 0, lambda: True, TokenSettle(node, wait_s=30.0))
        started = time.monotonic()
        with pytest.raises(Unauthenticated):
            never.of_token(other)
        with pytest.raises(Unauthenticated):
            never.of_token("cp_garbage")
        assert time.monotonic() - started < 10.0  # far below the 30 s bound: it did not wait (slack for a busy machine)


def test_settle_lets_only_a_few_calls_wait_at_once() -> None:
    settle = TokenSettle(_Node(), wait_s=1.0, max_waiters=2)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(settle(lambda: False))) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: settle._slots._value == 0, 5.0, "both calls waiting")
    started = time.monotonic()
    assert settle(lambda: False) is False and time.monotonic() - started < 0.5  # no slot: refused at once (wait_s is 1 s)
    for t in threads:
        t.join(5)
    assert results == [False, False]
