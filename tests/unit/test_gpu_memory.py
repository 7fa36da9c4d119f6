"""GPU memory in placement (controlplane/core/gpu_memory.py): memory, not the GPU count, decides
where a cluster reports a GPU held by a process that is not ours, a lost GPU, a MIG layout or GPUs
split over nodes; a cluster without a (fresh) report is placed by counting as before."""

from __future__ import annotations

import pytest

from controlplane.core import gpu_memory as gm
from controlplane.core.placement import PlacementOutcome, place
from controlplane.domain import commands as c
from controlplane.domain.ids import ClusterId, DeploymentId
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.domain.observations import GpuReport, GpuUnit
from controlplane.domain.profiles import PROFILES
from controlplane.domain.tenants import Deployment, Engine
from controlplane.domain.topology import Cluster
from tests.unit.test_reconcile import H100, T0, add, build, cluster, deployment, load, tenant

GiB = 1024**3
NEED = gm.need_bytes(PROFILES["llama3-8b-h100"])
EMPTY = 79 * GiB  # an idle 80 GB GPU as NVML reports it (a little below 80 GiB)


def dep(gpus: int = 1, model: str = "llama3-8b-h100", did: str = "chat") -> Deployment:
    return Deployment(DeploymentId(did), "acme", Engine.VLLM, model, H100, gpus)


def units(node: str, *free: int, pool: str = "", problem: str = "") -> tuple[GpuUnit, ...]:
    return tuple(GpuUnit(node, f"{node}-gpu{k}", f, 80 * GiB, pool, problem) for k, f in enumerate(free))


def report(*us: tuple[GpuUnit, ...], at_ms: int = T0) -> GpuReport:
    return GpuReport(at_ms, tuple(u for group in us for u in group))


CLUSTERS = {ClusterId("c1"): Cluster(ClusterId("c1"), "z1", capacity={H100: 8}), ClusterId("c2"): Cluster(ClusterId("c2"), "z2", capacity={H100: 8})}


def view(reports: dict[str, GpuReport], instances: tuple[Instance, ...] = ()) -> gm.MemoryView:
    return gm.MemoryView({ClusterId(k): v for k, v in reports.items()}, CLUSTERS, instances)


def test_the_need_is_vllm_share_of_the_profile_gpu_memory() -> None:
    assert NEED == int(80 * GiB * 0.9) and EMPTY >= NEED


def test_a_foreign_process_and_a_lost_gpu_take_their_units_away() -> None:
    # 4 GPUs: one idle, one with 20 GiB held by a process that is not ours, one lost, one idle.
    v = view({"c1": report(units("n1", EMPTY, EMPTY - 20 * GiB, 0, EMPTY)[:2], units("n1", 0, pool="", problem="lost")[:1],
                           (GpuUnit("n1", "n1-gpu3", EMPTY, 80 * GiB),))})
    assert v.fits(ClusterId("c1"), dep()) == 2
    assert v.fits(ClusterId("c2"), dep()) is None  # no report: counting decides
    free, why = v.cap(dep(), {ClusterId("c1"): 8, ClusterId("c2"): 8})
    assert free == {"c1": 2, "c2": 8}
    assert why["c1"].startswith("c1: GPU memory holds 2 more instance(s), the GPU count 8 (2 of 4 h100 GPUs have 72.0 GiB free")
    assert "1 lost or failing" in why["c1"]


def test_a_multi_gpu_instance_needs_its_units_on_one_node() -> None:
    v = view({"c1": report(units("n1", EMPTY, EMPTY, EMPTY, 0), units("n2", EMPTY, EMPTY, EMPTY, EMPTY - 30 * GiB))})
    d4 = dep(4, "llama3-70b-h100x4")
    assert v.fits(ClusterId("c1"), d4) == 0  # 6 fitting units, but 3 on each node
    assert v.fits(ClusterId("c1"), dep()) == 6


def test_pending_instances_claim_units_that_still_look_free() -> None:
    pending = tuple(Instance(f"p{k}", "other", "acme", "c1", "z1", H100, 1, InstanceState.PENDING, InitMethod.COLD, 0, 0)
                    for k in range(2))
    ready = Instance("r", "other", "acme", "c1", "z1", H100, 1, InstanceState.READY, InitMethod.COLD, 0, 0)
    v = view({"c1": report(units("n1", EMPTY, EMPTY, EMPTY))}, pending + (ready,))
    assert v.fits(ClusterId("c1"), dep()) == 1  # 3 fit, 2 are about to be taken; the Ready one shows already


def test_mig_devices_are_units_of_their_own_memory() -> None:
    migs = tuple(GpuUnit("n1", f"MIG-{k}", 40 * GiB, 40 * GiB) for k in range(2))
    v = view({"c1": report(migs)})
    assert v.fits(ClusterId("c1"), dep()) == 0  # an 8B instance needs 72 GiB: no 40 GB slice holds it
    small = Deployment(DeploymentId("s"), "acme", Engine.VLLM, "unknown-model", H100, 1)
    assert v.fits(ClusterId("c1"), small) == 2  # an unknown profile needs nothing but a unit that reads


def test_take_consumes_units_so_one_tick_never_overfills() -> None:
    v = view({"c1": report(units("n1", EMPTY, EMPTY), units("n2", EMPTY))})
    d = dep()
    v.take(ClusterId("c1"), d)
    v.take(ClusterId("c1"), d)
    assert v.fits(ClusterId("c1"), d) == 1
    v.take(ClusterId("c1"), d)
    assert v.fits(ClusterId("c1"), d) == 0


def test_pool_matching_units_without_a_pool_belong_to_the_only_pool() -> None:
    two = {ClusterId("c1"): Cluster(ClusterId("c1"), "z1", capacity={H100: 4, "a100": 4})}
    unnamed = gm.MemoryView({ClusterId("c1"): report(units("n1", EMPTY))}, two, ())
    assert not unnamed.covers(ClusterId("c1"), H100)  # two pools: an unnamed unit is nobody's: count
    named = gm.MemoryView({ClusterId("c1"): report(units("n1", EMPTY, pool="a100"))}, two, ())
    assert named.covers(ClusterId("c1"), "a100") and not named.covers(ClusterId("c1"), H100)


def test_fresh_reports_drop_old_ones() -> None:
    got = gm.fresh_reports([(ClusterId("c1"), GpuReport(T0 - 30_001)), (ClusterId("c2"), GpuReport(T0 - 30_000))], T0)
    assert list(got) == ["c2"]


def test_placement_memory_not_the_gpu_count_decides() -> None:
    # c1 has more free GPUs by count (8 vs 2) but every one of its GPUs is held by a foreign process.
    v = view({"c1": report(units("n1", *([EMPTY - 40 * GiB] * 8))), "c2": report(units("n2", EMPTY, EMPTY))})
    d = dep()
    counted = {ClusterId("c1"): 8, ClusterId("c2"): 2}
    assert place(d, 1, list(CLUSTERS.values()), counted, [], set()).clusters == ("c1",)  # counting alone
    free, why = v.cap(d, counted)
    got = place(d, 3, list(CLUSTERS.values()), free, [], set(), memory_limited=why)
    assert got.clusters == ("c2", "c2") and got.unplaced == 1
    assert got.outcome is PlacementOutcome.NO_GPU_MEMORY
    assert "GPU memory: c1: GPU memory holds 0 more instance(s), the GPU count 8 (0 of 8 h100 GPUs" in got.reason


# --------------------------------------------------------------------------------------------------
# plan(): the report passed in like the forecasts


def state_two_clusters() -> object:
    return build(cluster("c1", "z1", 4), cluster("c2", "z2", 4), tenant(), deployment(min_replicas=1))


def creates(p: object) -> list[str]:
    return [x.cluster_id for x in p.commands if isinstance(x, c.CreateInstance)]  # type: ignore[attr-defined]


def test_plan_without_reports_counts_gpus() -> None:
    from controlplane.core import reconcile as r

    state = state_two_clusters()
    p = r.plan(state, {"chat": load(144)}, {}, T0, r.ReconcileConfig())  # type: ignore[arg-type]
    assert sorted(creates(p)) == ["c1", "c1", "c1", "c2", "c2", "c2"]


def test_plan_places_only_where_memory_holds_and_explains_it() -> None:
    from controlplane.core import reconcile as r

    state = state_two_clusters()
    # c1: one GPU leaked by a foreign process, one lost, two fine; c2 reports nothing (counting).
    gpu = {ClusterId("c1"): report(units("n1", EMPTY, 10 * GiB, EMPTY), units("n1b", 0, problem="lost"))}
    p = r.plan(state, {"chat": load(144)}, {}, T0, r.ReconcileConfig(), None, gpu)  # type: ignore[arg-type]
    assert sorted(creates(p)) == ["c1", "c1", "c2", "c2", "c2", "c2"]
    assert len(p.notes) == 1 and p.notes[0].startswith("chat: placed around short GPU memory: c1: GPU memory holds 2")
    live = r.live_decisions(p, state, {}, T0)  # type: ignore[arg-type]
    assert "GPU memory holds 2 more instance(s)" in live[DeploymentId("chat")].message


def test_plan_with_no_memory_anywhere_places_nothing_and_says_why() -> None:
    from controlplane.core import reconcile as r

    state = state_two_clusters()
    add(state, "chat-old", "c1")  # a Ready instance of ours: its GPU shows used in the report too
    full = {ClusterId("c1"): report(units("n1", 2 * GiB, 30 * GiB, 30 * GiB, 30 * GiB)),
            ClusterId("c2"): report(units("n2", 30 * GiB, 30 * GiB, 30 * GiB, 30 * GiB))}
    p = r.plan(state, {"chat": load(144)}, {}, T0, r.ReconcileConfig(), None, full)  # type: ignore[arg-type]
    assert creates(p) == []
    (note,) = p.notes
    assert note.startswith("chat: 5 of 5 new instances not placed") and "GPU memory: c1: GPU memory holds 0" in note
    assert "c2: GPU memory holds 0 more instance(s), the GPU count 4" in note


@pytest.mark.parametrize("free", [EMPTY, NEED])
def test_exactly_the_need_fits(free: int) -> None:
    assert view({"c1": report(units("n1", free))}).fits(ClusterId("c1"), dep()) == 1
    assert view({"c1": report(units("n1", free - (free - NEED) - 1))}).fits(ClusterId("c1"), dep()) == 0


# --------------------------------------------------------------------------------------------------
# the loop: the gathered report reaches plan while fresh, and is logged once per change


def test_the_loop_passes_fresh_reports_to_placement_and_logs_memory_notes_once() -> None:
    from structlog.testing import capture_logs

    from controlplane.domain.observations import Observations
    from tests.unit.test_loop import rig, setup

    rg = rig(setup(clusters=(("c1", "z1", 4),), min_replicas=2))
    leaked = report(units("n1", EMPTY, 5 * GiB, 5 * GiB, 5 * GiB), at_ms=T0)
    rg.source.script[T0] = Observations(T0, gpu_memory=((ClusterId("c1"), leaked),))
    with capture_logs() as logs:
        rep = rg.loop.tick(T0)
    assert rep.plan is not None and creates(rep.plan) == ["c1"]  # count says 2, memory holds 1
    assert [e["event"] for e in logs if e["event"] == "placement_gpu_memory"] == ["placement_gpu_memory"]
    # The next tick's report is too old (a silent adapter): counting decides again.
    t1 = T0 + gm.REPORT_MAX_AGE_MS + 1
    rg.source.script[t1] = Observations(t1, gpu_memory=((ClusterId("c1"), leaked),))
    rep = rg.loop.tick(t1)
    assert rep.plan is not None and creates(rep.plan) == ["c1"]  # the second replica, by counting


def test_a_cap_that_still_holds_every_wanted_instance_says_nothing() -> None:
    v = view({"c1": report(units("n1", EMPTY, EMPTY, 0))})
    free, why = v.cap(dep(), {ClusterId("c1"): 8}, count=2)
    assert free == {"c1": 2} and why == {}  # memory holds the 2 wanted: nothing to explain
    assert set(v.cap(dep(), {ClusterId("c1"): 8}, count=3)[1]) == {"c1"}
