"""Whole validation at the source (issue 18, point 3): domain constructors report every problem,
spec models take strict types, unknown fields get a "did you mean", and the schema's refused values
can be left out so the domain's checks still run on the rest."""

from __future__ import annotations

import pydantic
import pytest

from controlplane.domain.errors import Problems, ValidationError
from controlplane.domain.tenants import Deployment, Engine, ScalingPolicy, Slo, Tenant
from controlplane.specs import DeploymentBase, PolicySpec, TenantSpec, deployment_of, tenant_of, unknown_field, without


def problems_of(make) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as exc:
        make()
    return list(exc.value.problems)


def test_a_policy_reports_every_problem_in_field_order() -> None:
    got = problems_of(lambda: ScalingPolicy(target_concurrency=0, tolerance=5, max_step_up=-1))
    assert [f for f, _ in got] == ["policy.target_concurrency", "policy.tolerance", "policy.max_step_up"]
    assert got[2] == ("policy.max_step_up", "must be between 1 and 100000, got -1")


def test_cross_field_rules_stay_silent_when_a_field_is_already_wrong() -> None:
    # panic_window_ms is out of range: "must not exceed stable_window_ms" would only repeat it
    assert [f for f, _ in problems_of(lambda: ScalingPolicy(panic_window_ms=1))] == ["policy.panic_window_ms"]
    got = problems_of(lambda: ScalingPolicy(panic_window_ms=40_000))
    assert got == [("policy.panic_window_ms", "must not exceed stable_window_ms (30000), got 40000")]


def test_deployment_tenant_and_slo_report_every_problem() -> None:
    got = problems_of(lambda: Deployment("chat", "t", Engine.VLLM, "", "h100", 1, min_replicas=9, max_replicas=3,
                                         warm_pool=-1))
    assert [f for f, _ in got] == ["deployment.model", "deployment.min_replicas", "deployment.warm_pool"]
    assert [f for f, _ in problems_of(lambda: Tenant("t", -1, {"h100": -2}))] == ["tenant.priority", "tenant.quota.h100"]
    assert len(problems_of(lambda: Slo(0, 0))) == 2


def test_spec_conversions_join_policy_replica_and_model_problems() -> None:
    spec = DeploymentBase.model_validate({"id": "chat", "tenant": "t", "engine": "vllm", "model": "gpt-9", "pool": "h100",
                                          "min_replicas": 5, "max_replicas": 2, "policy": {"tolerance": 5}})
    got = problems_of(lambda: deployment_of(spec, "spec"))
    assert [f for f, _ in got] == ["spec.model", "spec.policy.tolerance", "spec.min_replicas"]
    tenant = TenantSpec.model_validate({"id": "t", "priority": 1, "slo": {"ttft_p99_ms": 0}, "quota": {"h100": 1}})
    assert [f for f, _ in problems_of(lambda: tenant_of(tenant))] == ["tenant.slo.ttft_p99_ms"]


def test_problems_collects_and_raises_once() -> None:
    p = Problems()
    assert p.check(lambda: None)
    assert not p.check(lambda: (_ for _ in ()).throw(ValidationError("a", "bad")))
    p.add("b", "worse")
    assert p.has("b") and not p.has("c")
    with pytest.raises(ValidationError) as exc:
        p.raise_any()
    assert (exc.value.field, str(exc.value)) == ("a", "a: bad; b: worse")
    Problems().raise_any()  # nothing found: no error


@pytest.mark.parametrize(("model", "data", "field"), [
    (DeploymentBase, {"max_replicas": True}, "max_replicas"),      # no bool for an int
    (DeploymentBase, {"max_replicas": "5"}, "max_replicas"),       # no string for a number
    (DeploymentBase, {"max_replicas": 5.0}, "max_replicas"),       # no float for an int
    (TenantSpec, {"priority": "5"}, "priority"),
    (TenantSpec, {"quota": {"h100": True}}, "quota"),
])
def test_spec_types_are_strict(model, data, field) -> None:  # type: ignore[no-untyped-def]
    base = {"id": "x", "tenant": "t", "engine": "vllm", "model": "llama3-8b-h100", "pool": "h100"} \
        if model is DeploymentBase else {"id": "x", "priority": 1}
    model.model_validate(base)
    with pytest.raises(pydantic.ValidationError) as exc:
        model.model_validate({**base, **data})
    assert [e["loc"][0] for e in exc.value.errors()] == [field]


def test_an_integer_is_a_number_where_a_fraction_is_expected() -> None:
    assert PolicySpec.model_validate({"tolerance": 0}).tolerance == 0  # type: ignore[attr-defined]
    with pytest.raises(pydantic.ValidationError):
        PolicySpec.model_validate({"tolerance": "0.1"})


def test_unknown_fields_name_the_closest_allowed_one() -> None:
    assert unknown_field(DeploymentBase, ["min_replica"]) == "unknown field (did you mean 'min_replicas'?)"
    assert unknown_field(DeploymentBase, ["policy", "tolerence"]) == "unknown field (did you mean 'tolerance'?)"
    assert unknown_field(TenantSpec, ["slo", "ttft_p99"]) == "unknown field (did you mean 'ttft_p99_ms'?)"
    assert unknown_field(TenantSpec, ["colour"]) == "unknown field"


def test_without_leaves_out_the_refused_values_only() -> None:
    data = {"a": [{"x": 1, "y": 2}], "b": {"c": 1, "d": 2}, "e": 3}
    assert without(data, [("a", 0, "x"), ("b", "c", "[key]"), ("missing", "deep")]) == {
        "a": [{"y": 2}], "b": {"d": 2}, "e": 3}
    assert data["a"][0] == {"x": 1, "y": 2}  # a copy: the document itself is untouched
