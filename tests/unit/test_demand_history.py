"""The replicated demand history: storage, the ``RecordDemand`` command and its failure modes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain import commands as c
from controlplane.domain.demand import BUCKET_MS, HISTORY_BUCKETS, MAX_DECI, DemandHistory, appended, to_deci
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import DeploymentId, PoolId, TenantId
from controlplane.domain.state import ControlState, apply
from controlplane.domain.tenants import Deployment, Engine, Tenant


def values(h: DemandHistory) -> list[int]:
    return [int.from_bytes(h.data[i:i + 2], "little") for i in range(0, len(h.data), 2)]


def test_to_deci_rounds_up_and_saturates() -> None:
    assert [to_deci(v) for v in (0.0, 0.01, 0.1, 2.34, -3.0, float("nan"), 1e9)] == [0, 1, 1, 24, 0, 0, MAX_DECI]


def test_appended_fills_gaps_with_zero_and_keeps_one_hour() -> None:
    h = appended(None, BUCKET_MS, 5)
    h = appended(h, 4 * BUCKET_MS, 7)
    assert (h.end_ms, values(h)) == (4 * BUCKET_MS, [5, 0, 0, 7])
    for k in range(5, HISTORY_BUCKETS + 10):
        h = appended(h, k * BUCKET_MS, k)
    assert h.buckets == HISTORY_BUCKETS
    assert values(h)[-1] == HISTORY_BUCKETS + 9 and values(h)[0] == 10


def test_a_replayed_or_older_bucket_only_raises_its_value() -> None:
    h = appended(appended(None, BUCKET_MS, 5), 2 * BUCKET_MS, 3)
    assert values(appended(h, 2 * BUCKET_MS, 1)) == [5, 3]  # a lower replay changes nothing
    assert values(appended(h, BUCKET_MS, 9)) == [9, 3]
    assert appended(h, -10 * BUCKET_MS, 9) is h  # older than what is kept


@given(st.lists(st.tuples(st.integers(1, 800), st.integers(0, MAX_DECI)), max_size=40))
def test_history_is_bounded_and_ends_at_the_newest_bucket(entries: list[tuple[int, int]]) -> None:
    h = None
    for b, v in entries:
        h = appended(h, b * BUCKET_MS, v)
    if h is not None:
        assert h.buckets <= HISTORY_BUCKETS
        assert h.end_ms == max(b for b, _ in entries) * BUCKET_MS


@pytest.mark.parametrize("kwargs, field", [
    ({"end_ms": 1}, "demand.end_ms"),
    ({"end_ms": BUCKET_MS, "data": b"\x00"}, "demand.data"),
    ({"end_ms": BUCKET_MS, "data": b"\x00\x00" * (HISTORY_BUCKETS + 1)}, "demand.data"),
])
def test_history_values_are_validated(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        DemandHistory(**kwargs)
    assert exc.value.field == field


def state_with(*names: str) -> ControlState:
    state = ControlState()
    assert apply(state, c.PutTenant(Tenant(TenantId("acme"), 1))).ok
    for n in names:
        d = Deployment(DeploymentId(n), TenantId("acme"), Engine.VLLM, "llama3-8b-h100", PoolId("h100"), 1)
        assert apply(state, c.PutDeployment(d)).ok
    return state


def test_record_demand_appends_per_deployment_and_skips_removed_ones() -> None:
    state = state_with("chat", "code")
    r = apply(state, c.RecordDemand(BUCKET_MS, ((DeploymentId("chat"), 12), (DeploymentId("gone"), 3))))
    assert r.ok
    assert values(state.demand[DeploymentId("chat")]) == [12] and DeploymentId("gone") not in state.demand
    assert apply(state, c.RemoveDeployment(DeploymentId("chat"))).ok
    assert DeploymentId("chat") not in state.demand  # the history goes with its deployment


@pytest.mark.parametrize("cmd, field", [
    (c.RecordDemand(12_345, ()), "end_ms"),
    (c.RecordDemand(-BUCKET_MS, ()), "end_ms"),
    (c.RecordDemand(BUCKET_MS, [("chat", 1)]), "entries"),  # type: ignore[arg-type]
    (c.RecordDemand(BUCKET_MS, (("chat", MAX_DECI + 1),)), "entries[0]"),
    (c.RecordDemand(BUCKET_MS, (("chat", 1), ("chat",))), "entries[1]"),  # type: ignore[arg-type]
    (c.RecordDemand(BUCKET_MS, (("chat", True),)), "entries[0]"),
])
def test_a_bad_record_is_rejected_whole_and_names_the_field(cmd: c.RecordDemand, field: str) -> None:
    state = state_with("chat")
    r = apply(state, c.RecordDemand(BUCKET_MS, (("chat", 4),)))
    assert r.ok
    before = dict(state.demand)
    r = apply(state, cmd)
    assert not r.ok and r.error.startswith(field), r.error
    assert state.demand == before  # nothing half-applied
