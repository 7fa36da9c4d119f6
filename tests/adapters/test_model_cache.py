"""The node-local model cache as the adapters report it: the Kubernetes backend reading the cache
DaemonSet's per-node ConfigMaps from the strict fake apiserver, the wire carrying it, the engine drivers' sleep levels and
DeepSpeed-MII's refusal to sleep."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from adapters.deepspeed_mii import MiiDriver
from adapters.kubernetes import KubernetesBackend, KubernetesConfig, WorkloadConfig
from adapters.model_cache import MODELS_KEY, NODE_LABEL, ModelCacheConfig, cached_models
from adapters.simulated import SimulatedBackend, SimulatedConfig
from adapters.vllm import VllmDriver
from adapters.wire import batch_of, observations_of
from controlplane.domain.errors import ValidationError
from controlplane.domain.ids import ClusterId
from controlplane.domain.observations import Observations
from controlplane.domain.start_tiers import VLLM_SLEEP_LEVEL
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.vllm_server import FakeVllmServer

pytestmark = pytest.mark.timeout(60)
NS = "serving"
NODE = {NODE_LABEL: "node"}


def node(*models: str) -> dict[str, str]:
    """A per-node ConfigMap's data listing ``models``."""
    return {"node": "n", MODELS_KEY: "".join(f"{m}\n" for m in models)}


@pytest.mark.parametrize(("nodes", "models"), [
    ([], ()),
    ([node("b", "a")], ("a", "b")),
    ([node("a", "b"), node("a")], ("a",)),  # only what every cache node holds
    ([node("a"), node()], ()),  # a node still downloading
    ([{MODELS_KEY: "a\n  \n-bad\nb c\n"}], ("a",)),  # blank and invalid lines are skipped
    ([None], ()),
])  # fmt: skip
def test_cached_models(nodes: list, models: tuple[str, ...]) -> None:
    assert cached_models(nodes) == models


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def fake() -> Iterator[FakeKubeApiServer]:
    server = FakeKubeApiServer(seed=1).start()
    server.add_workload("Deployment", NS, "web")
    try:
        yield server
    finally:
        server.stop()


def backend(fake: FakeKubeApiServer, clock: Clock, cache: ModelCacheConfig | None) -> KubernetesBackend:
    cfg = KubernetesConfig(workloads=[WorkloadConfig(deployment="chat", namespace=NS, kind="Deployment", name="web",
                                                     engine="vllm", port=8000)],
                           request_timeout_s=5, watch_timeout_s=2, model_cache=cache)
    api = k8s.ApiClient(k8s.Configuration(host=fake.host))
    return KubernetesBackend(cfg, api, rng=random.Random(1), clock_ms=clock, cluster_id="gpu-a").start()


def test_kubernetes_backend_reports_what_every_cache_node_holds(fake: FakeKubeApiServer) -> None:
    fake.put_configmap(NS, "model-cache-n1", node("llama3-8b-h100", "llama3-70b-h100x4"), NODE)
    fake.put_configmap(NS, "model-cache-n2", node("llama3-8b-h100"), NODE)
    fake.put_configmap(NS, "other", node(), {"app": "x"})  # not a cache node's: not counted
    clock = Clock()
    b = backend(fake, clock, ModelCacheConfig(namespace=NS, refresh_s=30))
    try:
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("llama3-8b-h100",)),)
        fake.put_configmap(NS, "model-cache-n2", node("llama3-8b-h100", "llama3-70b-h100x4"), NODE)
        clock.ms += 29_000
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("llama3-8b-h100",)),)  # not due yet
        clock.ms += 1_000
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("llama3-70b-h100x4", "llama3-8b-h100")),)
        clock.ms += 30_000
        fake.delete_configmap(NS, "model-cache-n1")  # its node left: the cache is what n2 holds
        fake.put_configmap(NS, "model-cache-n2", node("llama3-70b-h100x4"), NODE)
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("llama3-70b-h100x4",)),)
        lists = [p for m, p, _ in fake.requests if m == "GET" and "/configmaps" in p]
        assert len(lists) == 3 and all(p.startswith(f"/api/v1/namespaces/{NS}/configmaps?") for p in lists)
        assert all("labelSelector=controlplane.io/model-cache%3Dnode" in p for p in lists), lists
    finally:
        b.close()


def test_a_failed_node_list_keeps_the_last_answer(fake: FakeKubeApiServer) -> None:
    fake.put_configmap(NS, "model-cache-n1", node("m"), NODE)
    clock = Clock()
    b = backend(fake, clock, ModelCacheConfig(namespace=NS, refresh_s=1))
    try:
        fake.fail_next(403, path_contains="/configmaps")
        assert b.observe(clock.ms).model_caches == ()  # nothing known yet: nothing reported
        clock.ms += 1_000
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("m",)),)
        fake.fail_next(500, path_contains="/configmaps")
        fake.put_configmap(NS, "model-cache-n1", node(), NODE)
        clock.ms += 1_000
        assert b.observe(clock.ms).model_caches == (("gpu-a", ("m",)),)  # kept
        clock.ms += 1_000
        assert b.observe(clock.ms).model_caches == (("gpu-a", ()),)  # the model is gone
    finally:
        b.close()


def test_without_the_model_cache_section_nothing_is_reported(fake: FakeKubeApiServer) -> None:
    fake.put_configmap(NS, "model-cache-n1", node("m"), NODE)
    clock = Clock()
    b = backend(fake, clock, None)
    try:
        assert b.observe(clock.ms).model_caches == ()
        assert not any("/configmaps" in p for _, p, _ in fake.requests)
    finally:
        b.close()


def test_the_wire_carries_the_cluster_own_cache_only() -> None:
    obs = Observations(5, model_caches=((ClusterId("other"), ("x",)), (ClusterId("gpu-a"), ("a", "b"))))
    batch = batch_of("gpu-a", 1, "s", obs)
    assert list(batch.model_cache.models) == ["a", "b"]
    assert observations_of(batch).model_caches == (("gpu-a", ("a", "b")),)
    empty = batch_of("gpu-a", 2, "s", Observations(5, model_caches=((ClusterId("gpu-a"), ()),)))
    assert empty.HasField("model_cache") and observations_of(empty).model_caches == (("gpu-a", ()),)
    silent = batch_of("gpu-a", 3, "s", Observations(5))
    assert not silent.HasField("model_cache") and observations_of(silent).model_caches == ()


def test_the_simulated_backend_reports_its_cache() -> None:
    cfg = SimulatedConfig.model_validate({"deployments": [{"deployment": "chat"}], "model_cache": ["llama3-8b-h100"]})
    b = SimulatedBackend("gpu-s", cfg, clock_ms=lambda: 0)
    assert b.observe(0).model_caches == (("gpu-s", ("llama3-8b-h100",)),)
    with pytest.raises(Exception, match="unknown model profile 'nope'"):
        SimulatedConfig.model_validate({"deployments": [{"deployment": "chat"}], "model_cache": ["nope"]})


@pytest.mark.parametrize("level", [1, 2])
def test_vllm_sleeps_at_the_level_asked(level: int) -> None:
    server = FakeVllmServer(model_name="m", dev_mode=True).start()
    try:
        driver = VllmDriver(server.base_url, timeout_s=1.0, sleep_level=level)
        driver.warm_down()
        assert server.sleep_level == level
        driver.warm_up()
        assert server.sleep_level is None
    finally:
        server.stop()


def test_vllm_sleeps_at_the_product_level_by_default() -> None:
    server = FakeVllmServer(model_name="m", dev_mode=True).start()
    try:
        VllmDriver(server.base_url, timeout_s=1.0).warm_down()
        assert server.sleep_level == VLLM_SLEEP_LEVEL == 1
    finally:
        server.stop()


def test_deepspeed_mii_refuses_to_sleep_or_wake() -> None:
    with pytest.raises(ValidationError, match="deepspeed-mii has no sleep mode"):
        MiiDriver("http://127.0.0.1:1/mii/m", "127.0.0.1:1", 1.0).warm_down()
    with pytest.raises(ValidationError, match="no sleep mode"):
        MiiDriver("http://127.0.0.1:1/mii/m", "127.0.0.1:1", 1.0).warm_up()
