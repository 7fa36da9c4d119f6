"""Kubernetes API responses, fuzzed: the Kubernetes backend (adapters/kubernetes.py, the official
client) against the strict fake apiserver (tests/fakes/kube_apiserver.py), with one answer of the
apiserver replaced on its way into the client by a malformed or unexpected body.

The replacement happens below the client's deserializer (an ``ApiClient`` whose ``call_api`` swaps
the body of the chosen request), so what is tested is exactly what a broken proxy, a different
apiserver version or a hostile endpoint would make the client hand to the backend: not JSON, JSON of
the wrong shape (a list, a string, ``null``), the right object with fields missing, of the wrong type,
or with absurd values (negative or huge replicas, a selector that is a number), an error status with a
garbage body.

Whatever the answer, ``start``, ``apply`` (create), ``scale`` and ``observe`` return or raise one of
the control plane's typed errors (``ControlPlaneError``: Unavailable, ValidationError, StaleEpoch...),
never another exception; and afterwards, with the apiserver answering normally again, the backend
still works: the same command goes through, and the workload's replica count is what the commands
asked for (a rejected write leaves no partial state behind that the next command trips over).
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from adapters.backend import FenceToken, InstanceCommand, InstanceSpec, ScaleCommand
from adapters.kubernetes import KubernetesBackend, KubernetesConfig, WorkloadConfig
from controlplane.domain.errors import ControlPlaneError
from tests.conftest import long_mode
from tests.fuzz.docpaths import paths as doc_paths
from tests.fakes.kube_apiserver import FakeKubeApiServer

pytestmark = pytest.mark.timeout(240)
_SLOW = long_mode()
FUZZ = settings(max_examples=200 if _SLOW else 14, deadline=None, derandomize=not _SLOW, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
NS, DEP = "serving", "chat"
_SERIAL = itertools.count()


class MangledApiClient(k8s.ApiClient):
    """Replaces the body (and optionally the status) of the next request matching ``target``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.target: tuple[str, re.Pattern[str]] | None = None
        self.mangle: Any = None
        self.hits = 0

    def arm(self, method: str, path_regex: str, mangle: Any) -> None:
        with self.lock:
            self.target, self.mangle, self.hits = (method, re.compile(path_regex)), mangle, 0

    def disarm(self) -> None:
        with self.lock:
            self.target = None

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        resp = super().call_api(method, url, *args, **kwargs)
        with self.lock:
            hit = (self.target is not None and method == self.target[0] and "watch=" not in url
                   and self.target[1].search(url) is not None)
            if hit:
                self.target = None
                self.hits += 1
        if hit:
            resp.read()
            status, body = self.mangle(resp.status, resp.data)
            resp.status, resp.data = status, body
        return resp


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), st.text(max_size=10),
              st.sampled_from([-1, 2**31, 2**64, "3", "", "app=web", {"matchLabels": 1}])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)),
    max_leaves=6)


@st.composite
def mangles(draw: st.DrawFn) -> Any:
    """A function (status, body) -> (status, body) chosen by Hypothesis, applied to the real answer."""
    kind = draw(st.sampled_from(["field", "field", "field", "garbage", "shape", "truncate", "status"]))
    seed = draw(st.integers(0, 2**32 - 1))
    value = draw(JSONISH)
    raw = draw(st.sampled_from([b"", b"not json", b"{", b"<html>502 Bad Gateway</html>", b"\xff\xfe", b"[1,2",
                                b'{"kind":"Status","code":"x"}']))
    shape = draw(st.sampled_from([b"[]", b'"x"', b"null", b"0", b"{}", b'{"metadata": null}', b'{"status": []}',
                                  b'{"items": {}}', b'{"items": [1, "x", null]}']))
    status = draw(st.sampled_from([200, 200, 201, 204, 302, 400, 401, 403, 404, 409, 410, 422, 429, 500, 503, 999]))
    remove = draw(st.booleans())

    def apply(old_status: int, body: bytes) -> tuple[int, bytes]:
        if kind == "garbage":
            return old_status, raw
        if kind == "shape":
            return old_status, shape
        if kind == "truncate":
            return old_status, body[: random.Random(seed).randrange(0, max(1, len(body)))]
        if kind == "status":
            return status, raw if remove else body
        doc = json.loads(body)
        paths = doc_paths(doc, max_items=3)
        if not paths:
            return old_status, json.dumps(value).encode()
        path = random.Random(seed).choice(paths)
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        if remove and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(value)
        return old_status, json.dumps(doc).encode()

    apply.__doc__ = f"{kind} seed={seed} value={value!r} raw={raw!r} shape={shape!r} status={status} remove={remove}"
    return apply


TARGETS = [
    ("start", "GET", r"/deployments/web/scale"),
    ("start", "GET", r"/pods\?"),
    ("create", "GET", r"/deployments/web$"),
    ("create", "PATCH", r"/deployments/web$"),
    ("create", "PUT", r"/deployments/web/scale"),
    ("scale", "GET", r"/deployments/web"),
    ("scale", "PATCH", r"/deployments/web$"),
    ("scale", "PUT", r"/deployments/web/scale"),
    ("observe", "GET", r"/deployments/web$"),
]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubeApiServer]:
    f = FakeKubeApiServer(seed=5).start()
    yield f
    f.stop()


def fence(epoch: int) -> FenceToken:
    return FenceToken(epoch=epoch, seq=1, holder="coord-a")


def new_backend(api: MangledApiClient, name: str) -> KubernetesBackend:
    cfg = KubernetesConfig(workloads=[WorkloadConfig(deployment=DEP, namespace=NS, kind="Deployment", name=name,
                                                     engine="vllm", port=8000)],
                           conflict_backoff_ms=1, conflict_backoff_cap_ms=4, request_timeout_s=5, watch_timeout_s=1)
    return KubernetesBackend(cfg, api, driver_factory=lambda wl, pod: None, rng=random.Random(7))


def operation(backend: KubernetesBackend, op: str, k: int) -> None:
    if op in ("start",):
        backend.start()
    elif op == "create":
        backend.apply(InstanceCommand(request_id=f"c{k}", action="create",
                                      instance=InstanceSpec(instance_id=f"i-{k}", deployment_id=DEP), fence=fence(k)), 0)
    elif op == "scale":
        backend.scale(ScaleCommand(request_id=f"s{k}", deployment_id=DEP, replicas=k % 3, victims=(), fence=fence(k)), 0)
    else:
        backend.observe(0)


@FUZZ
@given(target=st.sampled_from(TARGETS), mangle=mangles())
def test_malformed_apiserver_answers_give_typed_errors_and_leave_the_backend_usable(
        fake: FakeKubeApiServer, target: tuple[str, str, str], mangle: Any) -> None:
    op, method, path = target
    name = f"web-{next(_SERIAL)}"  # a workload of its own per example
    fake.add_workload("Deployment", NS, name, replicas=0)
    api = MangledApiClient(k8s.Configuration(host=fake.host))
    backend = new_backend(api, name)
    path = path.replace("web", name)
    epoch = 1
    try:
        if op != "start":
            backend.start()
        api.arm(method, path, mangle)
        try:
            operation(backend, op, epoch)
        except ControlPlaneError as exc:
            assert str(exc).strip()
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{op} with a mangled {method} {path} ({mangle.__doc__}): {type(exc).__name__}: {exc}")
        api.disarm()
        # the apiserver answers normally again: the backend works, with a newer epoch
        epoch = 2
        operation(backend, "start", epoch)
        operation(backend, "scale", epoch)  # replicas = 2
        backend.observe(0)
        obj = fake.get("deployments", NS, name)
        assert obj is not None and obj["spec"]["replicas"] == 2, obj["spec"]
    finally:
        api.disarm()
        backend.close()
        api.close()
