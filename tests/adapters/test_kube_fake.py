"""The fake apiserver (tests/fakes/kube_apiserver.py) against the real ``kubernetes`` 37.0.2 client:
the contract rules of CONTRACTS.md section 4 that the Kubernetes backend relies on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException, ConflictException

from tests.fakes.base import http_call
from tests.fakes.kube_apiserver import FakeKubeApiServer

pytestmark = pytest.mark.timeout(30)
NS = "serving"


@pytest.fixture
def fake() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeKubeApiServer) -> Iterator[k8s.ApiClient]:
    client = k8s.ApiClient(k8s.Configuration(host=fake.host))
    yield client
    client.close()


def test_scale_status_always_present_and_put_precondition(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web", replicas=0)
    apps = k8s.AppsV1Api(api)
    scale = apps.read_namespaced_deployment_scale("web", NS)
    assert scale.status.replicas == 0 and scale.status.selector == "app=web"
    new = apps.replace_namespaced_deployment_scale("web", NS, k8s.V1Scale(
        metadata=k8s.V1ObjectMeta(name="web", resource_version=scale.metadata.resource_version),
        spec=k8s.V1ScaleSpec(replicas=2)))
    assert new.spec.replicas == 2 and new.status.replicas == 2
    assert fake.requests[-1][2] == ""  # replace sends no Content-Type: read as JSON
    with pytest.raises(ConflictException) as err:
        apps.replace_namespaced_deployment_scale("web", NS, k8s.V1Scale(
            metadata=k8s.V1ObjectMeta(name="web", resource_version=scale.metadata.resource_version),
            spec=k8s.V1ScaleSpec(replicas=3)))
    assert err.value.status == 409 and err.value.reason == "Conflict"
    body = json.loads(err.value.body)
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'Operation cannot be fulfilled on deployments.apps "web": the object has been modified; '
                               "please apply your changes to the latest version and try again",
                    "reason": "Conflict", "details": {"name": "web", "group": "apps", "kind": "deployments"},
                    "code": 409}


def test_statefulset_scale_and_ordinals(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("StatefulSet", NS, "db", replicas=3)
    assert sorted(fake.pod_names(NS)) == ["db-0", "db-1", "db-2"]
    apps = k8s.AppsV1Api(api)
    scale = apps.read_namespaced_stateful_set_scale("db", NS)
    apps.replace_namespaced_stateful_set_scale("db", NS, k8s.V1Scale(
        metadata=k8s.V1ObjectMeta(name="db", resource_version=scale.metadata.resource_version),
        spec=k8s.V1ScaleSpec(replicas=1)))
    assert fake.pod_names(NS) == ["db-0"]


def test_not_found_status(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        k8s.AppsV1Api(api).read_namespaced_deployment("x", NS)
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'deployments.apps "x" not found'


def test_patch_content_types_and_conditional_patch(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web")
    apps = k8s.AppsV1Api(api)
    d = apps.patch_namespaced_deployment("web", NS, {"metadata": {"annotations": {"a": "1"}}})
    assert fake.requests[-1][2] == "application/strategic-merge-patch+json"
    d = apps.patch_namespaced_deployment("web", NS, {"metadata": {"annotations": {"b": "2", "a": None}}},
                                         _content_type="application/merge-patch+json")
    assert d.metadata.annotations == {"b": "2"}
    d = apps.patch_namespaced_deployment("web", NS, [{"op": "test", "path": "/metadata/annotations/b", "value": "2"},
                                                     {"op": "add", "path": "/metadata/annotations/c", "value": "3"},
                                                     {"op": "remove", "path": "/metadata/annotations/b"}])
    assert fake.requests[-1][2] == "application/json-patch+json"
    assert d.metadata.annotations == {"c": "3"}
    stale = {"metadata": {"resourceVersion": "1", "annotations": {"d": "4"}}}
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment("web", NS, stale, _content_type="application/merge-patch+json")
    assert err.value.status == 409
    fresh = {"metadata": {"resourceVersion": d.metadata.resource_version, "annotations": {"d": "4"}}}
    assert apps.patch_namespaced_deployment("web", NS, fresh).metadata.annotations == {"c": "3", "d": "4"}
    # the client refuses to send an unknown type itself, so speak HTTP directly
    status, body, _ = http_call(f"{fake.host}/apis/apps/v1/namespaces/{NS}/deployments/web", "PATCH",
                                b'{"metadata":{}}', "application/xml")
    assert status == 415 and json.loads(body)["reason"] == "UnsupportedMediaType"


def test_pod_deletion_cost_must_be_int32(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web", replicas=1)
    pod = fake.pod_names(NS)[0]
    core = k8s.CoreV1Api(api)
    cost = "controller.kubernetes.io/pod-deletion-cost"
    core.patch_namespaced_pod(pod, NS, {"metadata": {"annotations": {cost: "-2147483648"}}})
    for bad in ("abc", "2147483648", "1.5"):
        with pytest.raises(ApiException) as err:
            core.patch_namespaced_pod(pod, NS, {"metadata": {"annotations": {cost: bad}}})
        assert err.value.status == 422 and json.loads(err.value.body)["reason"] == "Invalid"


def test_deployment_shrink_honours_deletion_cost(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web", replicas=3)
    oldest, *_ = fake.pod_names(NS)
    for name in fake.pod_names(NS):
        fake.set_pod_ready(NS, name)
    k8s.CoreV1Api(api).patch_namespaced_pod(oldest, NS, {"metadata": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "-5"}}})
    apps = k8s.AppsV1Api(api)
    rv = apps.read_namespaced_deployment_scale("web", NS).metadata.resource_version
    apps.replace_namespaced_deployment_scale("web", NS, k8s.V1Scale(
        metadata=k8s.V1ObjectMeta(name="web", resource_version=rv), spec=k8s.V1ScaleSpec(replicas=2)))
    assert oldest not in fake.pod_names(NS) and len(fake.pod_names(NS)) == 2


def test_list_watch_and_410(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web", replicas=1)
    fake.add_workload("Deployment", NS, "other", replicas=1)
    core = k8s.CoreV1Api(api)
    listed = core.list_namespaced_pod(NS, label_selector="app=web")
    assert len(listed.items) == 1
    fake.set_pod_ready(NS, listed.items[0].metadata.name)
    events = list(k8s_watch.Watch().stream(core.list_namespaced_pod, NS, label_selector="app=web",
                                           resource_version=listed.metadata.resource_version, timeout_seconds=1))
    assert [(e["type"], e["object"].status.phase) for e in events] == [("MODIFIED", "Running")]
    fake.compact()
    with pytest.raises(ApiException) as err:
        list(k8s_watch.Watch().stream(core.list_namespaced_pod, NS, label_selector="app=web",
                                      resource_version=listed.metadata.resource_version, timeout_seconds=1))
    assert err.value.status == 410


def test_lease_microtime_is_strict(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    coord = k8s.CoordinationV1Api(api)
    whole_second = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ApiException) as err:  # the client serialises this as "2026-01-01T00:00:00+00:00"
        coord.create_namespaced_lease(NS, k8s.V1Lease(metadata=k8s.V1ObjectMeta(name="l"),
                                                      spec=k8s.V1LeaseSpec(holder_identity="a", renew_time=whole_second)))
    assert err.value.status == 400
    lease = coord.create_namespaced_lease(NS, k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name="l"),
        spec=k8s.V1LeaseSpec(holder_identity="a", renew_time=datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC))))
    with pytest.raises(ApiException) as err:
        coord.create_namespaced_lease(NS, k8s.V1Lease(metadata=k8s.V1ObjectMeta(name="l")))
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert json.loads(err.value.body)["reason"] == "AlreadyExists"
    # PATCH keeps a dict body verbatim: the strftime form with 6 digits and Z is accepted
    coord.patch_namespaced_lease("l", NS, {"spec": {"renewTime": whole_second.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}})
    assert fake.get("leases", NS, "l")["spec"]["renewTime"] == "2026-01-01T00:00:00.000000Z"
    with pytest.raises(ApiException) as err:
        coord.patch_namespaced_lease("l", NS, {"spec": {"renewTime": "2026-01-01T00:00:00Z"}})
    assert err.value.status == 400
    lease.spec.holder_identity = "b"
    with pytest.raises(ConflictException):  # the lease moved on since it was read
        coord.replace_namespaced_lease("l", NS, lease)


def test_fault_hooks(fake: FakeKubeApiServer, api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web")
    apps = k8s.AppsV1Api(api)
    fake.inject_conflicts(1)
    with pytest.raises(ConflictException):
        apps.patch_namespaced_deployment("web", NS, {"metadata": {"annotations": {"a": "1"}}})
    apps.patch_namespaced_deployment("web", NS, {"metadata": {"annotations": {"a": "1"}}})
    fake.fail_next(503, method="GET")
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment("web", NS)
    assert err.value.status == 503
    assert apps.read_namespaced_deployment("web", NS).metadata.annotations == {"a": "1"}


def test_delete_preconditions_template_labels_orphaning_and_endpoints(fake: FakeKubeApiServer,
                                                                       api: k8s.ApiClient) -> None:
    fake.add_workload("Deployment", NS, "web", replicas=2, template_labels={"controlplane.io/serving": "true"})
    core = k8s.CoreV1Api(api)
    a, b = fake.pod_names(NS)
    for name in (a, b):
        fake.set_pod_ready(NS, name)
    pod = core.read_namespaced_pod(a, NS)
    assert pod.metadata.labels == {"app": "web", "controlplane.io/serving": "true"}  # the template's labels
    service = {"app": "web", "controlplane.io/serving": "true"}
    assert sorted(fake.endpoints(NS, service)) == sorted([a, b])
    core.patch_namespaced_pod(a, NS, {"metadata": {"labels": {"controlplane.io/serving": "false"}}})
    assert fake.endpoints(NS, service) == [b] and len(fake.pod_names(NS)) == 2  # still owned: not in the selector
    with pytest.raises(ConflictException) as err:
        core.delete_namespaced_pod(a, NS, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid="other")))
    assert "Precondition failed: UID in precondition: other" in json.loads(err.value.body)["message"]
    core.delete_namespaced_pod(a, NS, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=pod.metadata.uid)))
    assert a not in fake.pod_names(NS) and len(fake.pod_names(NS)) == 2  # the ReplicaSet replaced it
    core.patch_namespaced_pod(b, NS, {"metadata": {"labels": {"app": "elsewhere"}}})
    assert len(fake.pods(NS, {"app": "web"})) == 2  # b left the selector: released and replaced
