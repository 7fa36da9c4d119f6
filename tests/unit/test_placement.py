"""Placement across zones/clusters and the scale-in removal order."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.placement import (
    REMOVAL_RANK,
    Placement,
    PlacementOutcome,
    evacuating,
    pick_removals,
    place,
    removable,
    schedulable,
)
from controlplane.domain.errors import ValidationError
from controlplane.domain.instances import InitMethod, Instance, InstanceState
from controlplane.domain.tenants import Deployment, Engine
from controlplane.domain.topology import Cluster, Zone

S = InstanceState
PROPERTY = settings(max_examples=80, deadline=None)


def dep(gpus: int = 1, ident: str = "d1") -> Deployment:
    return Deployment(id=ident, tenant="t1", engine=Engine.VLLM, model="m", pool="h100", gpus_per_instance=gpus)


def cl(ident: str, zone: str) -> Cluster:
    return Cluster(id=ident, zone=zone, capacity={"h100": 64})


def inst(
    ident: str,
    zone: str = "z1",
    cluster: str = "c1",
    state: InstanceState = S.READY,
    created_ms: int = 0,
    deployment: str = "d1",
) -> Instance:
    return Instance(
        id=ident,
        deployment=deployment,
        tenant="t1",
        cluster=cluster,
        zone=zone,
        pool="h100",
        gpus=1,
        state=state,
        init_method=InitMethod.COLD,
        created_ms=created_ms,
        state_since_ms=created_ms,
    )


THREE_ZONES = [cl("a1", "za"), cl("a2", "za"), cl("b1", "zb"), cl("c1", "zc")]


# --------------------------------------------------------------------------------------------------
# place: tables


@pytest.mark.parametrize(
    ("name", "count", "free", "existing", "blocked", "expected"),
    [
        ("round robin over zones, then clusters", 6, {"a1": 8, "a2": 8, "b1": 8, "c1": 8}, [], [],
         ("a1", "b1", "c1", "a2", "b1", "c1")),
        ("most free GPUs breaks a tie", 1, {"a1": 3, "a2": 5, "b1": 1, "c1": 1}, [
            inst("x", "zb", "b1"), inst("y", "zc", "c1")], [], ("a2",)),
        ("cluster id breaks the last tie", 1, {"a1": 4, "a2": 4}, [inst("x", "zb", "b1"),
                                                                   inst("y", "zc", "c1")], [], ("a1",)),
        ("existing instances fill the emptiest zone first", 3, {"a1": 9, "a2": 9, "b1": 9, "c1": 9},
         [inst("x", "za", "a1"), inst("y", "za", "a2"), inst("w", "zb", "b1")], [], ("c1", "b1", "c1")),
        ("fewest in the cluster within a zone", 1, {"a1": 9, "a2": 1, "b1": 0, "c1": 0},
         [inst("x", "za", "a1")], [], ("a2",)),
        ("terminal and foreign instances do not count", 2, {"a1": 9, "b1": 9},
         [inst("x", "za", "a1", S.FAILED), inst("y", "za", "a1", S.TERMINATED),
          inst("z", "za", "a1", deployment="d2")], [], ("a1", "b1")),
        ("a draining instance still counts (non-terminal)", 1, {"a1": 9, "b1": 9},
         [inst("u", "za", "a1", S.DRAINING)], [], ("b1",)),
        ("blocked clusters are skipped", 3, {"a1": 9, "a2": 9, "b1": 9, "c1": 9}, [], ["b1", "c1"],
         ("a1", "a2", "a1")),
        ("capacity runs out", 5, {"a1": 2, "b1": 1}, [], [], ("a1", "b1", "a1")),
        ("missing free entry means no capacity", 2, {"a1": 1}, [], [], ("a1",)),
        ("nothing asked", 0, {"a1": 9}, [], [], ()),
    ],
)
def test_place_table(name: str, count: int, free: dict, existing: list, blocked: list, expected: tuple) -> None:
    got = place(dep(), count, THREE_ZONES, free, existing, blocked)
    assert got.clusters == expected, name
    assert got.unplaced == count - len(expected), name


@pytest.mark.parametrize(
    ("name", "count", "free", "existing", "blocked", "cached", "expected"),
    [
        ("a cached cluster wins inside the emptiest zone", 1, {"a1": 9, "a2": 9, "b1": 9, "c1": 9},
         [inst("x", "zb", "b1"), inst("y", "zc", "c1")], [], ["a2"], ("a2",)),
        ("it beats the spread over the clusters of one zone", 2, {"a1": 9, "a2": 9}, [], [], ["a2"],
         ("a2", "a2")),
        ("it never beats the zone spread", 3, {"a1": 9, "a2": 9, "b1": 9, "c1": 9}, [], [], ["b1"],
         ("b1", "a1", "c1")),
        ("nor a breaker", 1, {"a1": 9, "a2": 9}, [inst("x", "zb", "b1"), inst("y", "zc", "c1")], ["a2"], ["a2"],
         ("a1",)),
        ("nor capacity", 2, {"a1": 9, "a2": 1}, [inst("x", "zb", "b1"), inst("y", "zc", "c1")], [], ["a2"],
         ("a2", "a1")),
        ("every cluster cached: the placement without caches", 6, {"a1": 8, "a2": 8, "b1": 8, "c1": 8}, [], [],
         ["a1", "a2", "b1", "c1"], ("a1", "b1", "c1", "a2", "b1", "c1")),
    ],
)
def test_place_prefers_clusters_whose_model_cache_holds_the_model(
    name: str, count: int, free: dict, existing: list, blocked: list, cached: list, expected: tuple
) -> None:
    got = place(dep(), count, THREE_ZONES, free, existing, blocked, cached=frozenset(cached))
    assert got.clusters == expected, name


def test_gpus_per_instance_is_consumed() -> None:
    got = place(dep(gpus=4), 4, [cl("a1", "za"), cl("b1", "zb")], {"a1": 8, "b1": 7}, [], [])
    assert got.clusters == ("a1", "b1", "a1")
    assert got.unplaced == 1 and got.outcome is PlacementOutcome.NO_CAPACITY


@pytest.mark.parametrize(
    ("clusters", "free", "blocked", "outcome", "needle"),
    [
        ([], {}, [], PlacementOutcome.NO_CLUSTERS, "no clusters"),
        (THREE_ZONES, {"a1": 9, "a2": 9, "b1": 9, "c1": 9}, ["a1", "a2", "b1", "c1"], PlacementOutcome.ALL_BLOCKED,
         "all 4 clusters are blocked"),
        (THREE_ZONES, {"a1": 9}, ["a1"], PlacementOutcome.NO_CAPACITY, "none of the 3 unblocked clusters"),
        (THREE_ZONES, {}, [], PlacementOutcome.NO_CAPACITY, "no capacity"),
    ],
)
def test_place_unplaced_reasons(clusters, free, blocked, outcome, needle) -> None:
    got = place(dep(), 2, clusters, free, [], blocked)
    assert (got.clusters, got.unplaced, got.outcome) == ((), 2, outcome)
    assert needle in got.reason and "2 unplaced" in got.reason


def test_cordoned_and_draining_clusters_and_zones_get_no_new_instances() -> None:
    clusters = [
        Cluster("a1", "za", capacity={"h100": 64}, cordoned=True),
        Cluster("a2", "za", capacity={"h100": 64}, draining=True),
        cl("b1", "zb"),
        cl("c1", "zc"),
    ]
    free = {"a1": 9, "a2": 9, "b1": 9, "c1": 9}
    assert place(dep(), 4, clusters, free, [], []).clusters == ("b1", "c1", "b1", "c1")
    # A cordoned zone record takes every cluster in it out; a zone without a record is schedulable.
    got = place(dep(), 2, clusters, free, [], [], {"zc": Zone("zc", cordoned=True)})
    assert got.clusters == ("b1", "b1")
    got = place(dep(), 1, clusters, free, [], [], {"zb": Zone("zb", draining=True), "zc": Zone("zc", cordoned=True)})
    assert (got.clusters, got.outcome) == ((), PlacementOutcome.ALL_CORDONED)
    assert got.reason == "placed 0 of 1, 1 unplaced: all 4 clusters are cordoned or draining"


@pytest.mark.parametrize(
    ("blocked", "free", "outcome", "reason"),
    [
        (["b1", "c1"], {"b1": 9, "c1": 9}, PlacementOutcome.ALL_BLOCKED,
         "all 2 schedulable clusters are blocked by open breakers, 2 cordoned or draining"),
        (["b1"], {"a1": 9, "a2": 9}, PlacementOutcome.NO_CAPACITY,
         ("no capacity: none of the 1 unblocked clusters has 1 free GPUs (1 blocked by open breakers, "
         "2 cordoned or draining)")),
    ],
)
def test_unplaced_reasons_count_the_cordoned_clusters(blocked, free, outcome, reason) -> None:
    clusters = [
        Cluster("a1", "za", capacity={"h100": 64}, cordoned=True),
        cl("a2", "za"),
        cl("b1", "zb"),
        cl("c1", "zc"),
    ]
    got = place(dep(), 1, clusters, free, [], blocked, {"za": Zone("za", draining=True)})
    assert (got.outcome, got.reason) == (outcome, "placed 0 of 1, 1 unplaced: " + reason)


def test_schedulable_and_evacuating_read_the_cluster_and_its_zone_record() -> None:
    plain, cordoned, draining = cl("a1", "za"), Cluster("a1", "za", cordoned=True), Cluster("a1", "za", draining=True)
    assert [schedulable(x, {}) for x in (plain, cordoned, draining)] == [True, False, False]
    assert [evacuating(x, {}) for x in (plain, cordoned, draining)] == [False, False, True]
    assert not schedulable(plain, {"za": Zone("za", cordoned=True)}) and not evacuating(plain, {"za": Zone("za", cordoned=True)})
    assert evacuating(plain, {"za": Zone("za", draining=True)}) and schedulable(plain, {"zb": Zone("zb", draining=True)})


def test_place_all_placed_reason() -> None:
    got = place(dep(), 2, THREE_ZONES, {"a1": 9}, [], [])
    assert got == Placement(("a1", "a1"), 0, "placed 2 of 2", PlacementOutcome.PLACED)


def test_place_does_not_depend_on_cluster_order() -> None:
    free = {"a1": 3, "a2": 3, "b1": 2, "c1": 5}
    one = place(dep(), 9, THREE_ZONES, free, [], ["a2"])
    two = place(dep(), 9, list(reversed(THREE_ZONES)), free, [], frozenset({"a2"}))
    assert one == two


@pytest.mark.parametrize(
    ("count", "clusters"),
    [(-1, THREE_ZONES), (1.0, THREE_ZONES), (1, [cl("a1", "za"), cl("a1", "zb")])],
)
def test_place_validation(count, clusters) -> None:
    with pytest.raises(ValidationError):
        place(dep(), count, clusters, {}, [], [])


# --------------------------------------------------------------------------------------------------
# place: properties

ZONES = ["za", "zb", "zc", "zd"]


@st.composite
def scenarios(draw: st.DrawFn, ample: bool = False):
    n = draw(st.integers(0, 7))
    clusters = [cl(f"c{i}", draw(st.sampled_from(ZONES))) for i in range(n)]
    ids = [c.id for c in clusters]
    gpus = draw(st.integers(1, 4))
    if ample:
        free = {i: 10_000 for i in ids}
    else:  # a cluster may be missing from free_gpus (= no capacity)
        free = {i: draw(st.integers(0, 24)) for i in ids if draw(st.integers(0, 4))}
    blocked = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    existing = [
        inst(f"e{k}", zone=c.zone, cluster=c.id, state=draw(st.sampled_from(list(S))),
             deployment=draw(st.sampled_from(["d1", "d1", "d2"])))
        for k, c in enumerate(draw(st.lists(st.sampled_from(clusters), max_size=12)) if clusters else [])
    ]
    count = draw(st.integers(0, 30))
    return dep(gpus), count, clusters, free, existing, blocked


def zone_counts(d: Deployment, clusters: list[Cluster], existing: list[Instance], placed: tuple) -> dict:
    zone_of = {c.id: c.zone for c in clusters}
    counts: dict[str, int] = {}
    for i in existing:
        if i.deployment == d.id and not i.state.terminal:
            counts[i.zone] = counts.get(i.zone, 0) + 1
    for cid in placed:
        counts[zone_of[cid]] = counts.get(zone_of[cid], 0) + 1
    return counts


@PROPERTY
@given(scenarios())
def test_property_capacity_blocked_and_accounting(scenario) -> None:
    d, count, clusters, free, existing, blocked = scenario
    got = place(d, count, clusters, free, existing, blocked)
    assert len(got.clusters) + got.unplaced == count and got.unplaced >= 0
    assert not set(got.clusters) & set(blocked)
    for c in clusters:
        assert got.clusters.count(c.id) * d.gpus_per_instance <= free.get(c.id, 0)
    # greedy is maximal: something is unplaced only if no unblocked cluster has room left
    room_left = any(
        c.id not in blocked and free.get(c.id, 0) - got.clusters.count(c.id) * d.gpus_per_instance
        >= d.gpus_per_instance
        for c in clusters
    )
    assert (got.unplaced > 0) == (got.outcome is not PlacementOutcome.PLACED)
    if got.unplaced:
        assert not room_left
        expected = (
            PlacementOutcome.NO_CLUSTERS if not clusters
            else PlacementOutcome.ALL_BLOCKED if len(blocked) == len(clusters)
            else PlacementOutcome.NO_CAPACITY
        )
        assert got.outcome is expected


@PROPERTY
@given(scenarios(ample=True))
def test_property_spread_with_ample_capacity(scenario) -> None:
    d, count, clusters, free, existing, blocked = scenario
    got = place(d, count, clusters, free, existing, blocked)
    open_zones = sorted({c.zone for c in clusters if c.id not in blocked})
    if not open_zones:
        assert got.unplaced == count
        return
    assert got.unplaced == 0
    counts = zone_counts(d, clusters, existing, got.clusters)
    lowest = min(counts.get(z, 0) for z in open_zones)
    zone_of = {c.id: c.zone for c in clusters}
    for z in sorted({zone_of[c] for c in got.clusters}):
        assert counts[z] <= lowest + 1, (z, counts)
    if not [i for i in existing if i.deployment == d.id and not i.state.terminal]:
        assert max(counts.get(z, 0) for z in open_zones) - lowest <= 1


# --------------------------------------------------------------------------------------------------
# pick_removals: tables


def test_removal_order_narrated() -> None:
    instances = [
        inst("busy-old", "za", state=S.BUSY, created_ms=1),
        inst("drain", "za", state=S.DRAINING, created_ms=9),
        inst("gone", "za", state=S.FAILED, created_ms=9),
        inst("ready-b", "zb", state=S.READY, created_ms=5),
        inst("warm", "zb", state=S.WARMING, created_ms=2),
        inst("standby", "za", state=S.STANDBY, created_ms=2),
        inst("pending", "zb", state=S.PENDING, created_ms=0),
        inst("ready-a-new", "za", state=S.READY, created_ms=8),
        inst("ready-a-old", "za", state=S.READY, created_ms=3),
    ]
    loads = {"busy-old": 0.2, "ready-b": 0.1, "ready-a-new": 0.5, "ready-a-old": 0.5}
    # Not serving first: pending, warming, standby. Then za (3 serving vs 1 in zb): busy-old is the
    # least loaded there; za still has 2 vs 1: equal load, so the newest; then 1 vs 1: least loaded.
    # Draining and terminal instances are never picked.
    assert pick_removals(instances, 99, loads) == (
        "pending", "warm", "standby", "busy-old", "ready-a-new", "ready-b", "ready-a-old",
    )


@pytest.mark.parametrize(
    ("name", "instances", "loads", "count", "expected"),
    [
        ("zone with most first", [inst("a", "za"), inst("b", "zb"), inst("c", "zb")], {}, 1, ("b",)),
        ("recounted after each pick", [inst("a", "za"), inst("b", "zb"), inst("c", "zb"), inst("d", "za"),
                                       inst("e", "za")], {"a": 0.95, "d": 0.9, "e": 0.8, "b": 0.1, "c": 0.2}, 3,
         ("e", "b", "d")),
        ("least loaded", [inst("a"), inst("b"), inst("c")], {"a": 0.5, "b": 0.2, "c": 0.9}, 2, ("b", "a")),
        ("missing and NaN load count as 0", [inst("a"), inst("b")], {"a": 0.3, "b": math.nan}, 1, ("b",)),
        ("newest", [inst("a", created_ms=5), inst("b", created_ms=7), inst("c", created_ms=6)], {}, 2, ("b", "c")),
        ("id last", [inst("b"), inst("a"), inst("c")], {}, 3, ("a", "b", "c")),
        ("count above eligible", [inst("a"), inst("b", state=S.DRAINING), inst("c", state=S.TERMINATED)], {}, 5,
         ("a",)),
        ("zero", [inst("a")], {}, 0, ()),
        ("spread counted per deployment", [inst("a", "za", deployment="d2"), inst("b", "za", deployment="d2"),
                                           inst("c", "zb"), inst("d", "zb"), inst("e", "za")],
         {"a": 0.5, "b": 0.5, "c": 0.1, "d": 0.5, "e": 0.0}, 1, ("c",)),
    ],
)
def test_pick_removals_table(name: str, instances: list, loads: dict, count: int, expected: tuple) -> None:
    assert pick_removals(instances, count, loads) == expected, name


def test_pick_removals_validation() -> None:
    with pytest.raises(ValidationError):
        pick_removals([inst("a")], -1, {})
    with pytest.raises(ValidationError):
        pick_removals([inst("a", state=S.DRAINING), inst("a")], 1, {})


def test_removal_rank_covers_exactly_the_eligible_states() -> None:
    assert sorted(s.value for s in REMOVAL_RANK) == sorted(
        s.value for s in S if not s.terminal and s is not S.DRAINING
    )
    assert [REMOVAL_RANK[s] for s in (S.PENDING, S.WARMING, S.STANDBY, S.READY)] == [0, 1, 2, 3]
    assert REMOVAL_RANK[S.READY] == REMOVAL_RANK[S.BUSY]
    assert not removable(inst("a", state=S.DRAINING)) and removable(inst("b", state=S.BUSY))


# --------------------------------------------------------------------------------------------------
# pick_removals: properties


instance_lists = st.lists(
    st.builds(
        lambda zone, state, created, d: (zone, state, created, d),
        st.sampled_from(ZONES[:3]),
        st.sampled_from(list(S)),
        st.integers(0, 5),
        st.sampled_from(["d1", "d2"]),
    ),
    max_size=20,
).map(lambda rows: [inst(f"i{k}", z, state=s, created_ms=c, deployment=d) for k, (z, s, c, d) in enumerate(rows)])


def removal_key(i: Instance, remaining: list[Instance], loads: dict) -> tuple:
    zone_count = sum(1 for j in remaining if (j.deployment, j.zone) == (i.deployment, i.zone))
    return (REMOVAL_RANK[i.state], -zone_count, loads.get(i.id, 0.0), -i.created_ms, i.id)


@PROPERTY
@given(instance_lists, st.integers(0, 25), st.data())
def test_property_pick_removals_order(instances: list[Instance], count: int, data: st.DataObject) -> None:
    loads = {i.id: data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for i in instances}
    got = pick_removals(instances, count, loads)
    eligible = [i for i in instances if not i.state.terminal and i.state is not S.DRAINING]
    assert len(got) == min(count, len(eligible)) and len(set(got)) == len(got)
    by_id = {i.id: i for i in instances}
    remaining = list(eligible)
    for victim_id in got:
        victim = by_id[victim_id]
        assert victim in remaining
        best = min(remaining, key=lambda i: removal_key(i, remaining, loads))
        assert victim is best, (victim_id, best.id)
        remaining.remove(victim)
    assert pick_removals(instances, len(got) // 2, loads) == got[: len(got) // 2]
