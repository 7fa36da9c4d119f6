"""The chaos checker on hand-made histories: each property holds on a good history and fails on one
that violates it (a checker that cannot fail checks nothing). Pure: no processes, no sleeps."""

from __future__ import annotations

from controlplane.chaos import checker
from controlplane.chaos.history import JournalReader, Probe, Writes


def admit(epoch: int, holder: str, ok: bool = True) -> dict:
    return {"k": "admit", "epoch": epoch, "holder": holder, "ok": ok, "t": 0.0}


def lease(node: str, epoch: int, start: float, until: float) -> dict:
    return {"k": "lease", "node": node, "epoch": epoch, "start_ms": start, "until_ms": until}


def tr(rev: int, inst: str, frm: str, ev: str, to: str) -> dict:
    return {"k": "tr", "rev": rev, "inst": inst, "frm": frm, "ev": ev, "to": to, "dep": "chat"}


# --- stale commands -------------------------------------------------------------------------------


def test_non_decreasing_epochs_and_refusals_are_fine() -> None:
    hist = {"gpu-a": [admit(3, "a"), admit(3, "a"), admit(2, "b", ok=False), admit(7, "b"),
                      {"k": "cmd", "epoch": 7, "verb": "create", "rid": "r1"}]}
    assert checker.check_stale(hist) == []


def test_an_accepted_lower_epoch_is_a_violation() -> None:
    found = checker.check_stale({"gpu-a": [admit(7, "b"), admit(3, "a")]})
    assert [v.prop for v in found] == ["stale"] and "epoch 3" in found[0].detail


def test_an_equal_epoch_from_another_holder_is_a_violation() -> None:
    assert len(checker.check_stale({"gpu-a": [admit(7, "b"), admit(7, "c")]})) == 1


def test_a_command_carried_out_with_an_epoch_below_one_accepted_is_a_violation() -> None:
    hist = {"gpu-a": [admit(3, "a"), admit(7, "b"), {"k": "cmd", "epoch": 3, "verb": "drain", "rid": "r9"}]}
    assert [v.prop for v in checker.check_stale(hist)] == ["stale"]


def test_epochs_are_per_adapter() -> None:
    assert checker.check_stale({"gpu-a": [admit(7, "b")], "gpu-b": [admit(3, "a")]}) == []


# --- one lease holder at a time ------------------------------------------------------------------


def test_disjoint_validity_intervals_pass_and_report_the_gap() -> None:
    c = checker.LeaseChecker()
    c.feed([lease("a", 3, 0, 1000), lease("a", 3, 200, 1300), lease("b", 9, 1500, 2500)])
    violations, gap = c.check()
    assert violations == [] and gap == 200


def test_overlapping_intervals_of_two_epochs_are_a_violation() -> None:
    found = checker.check_lease({"a": [lease("a", 3, 0, 1300)], "b": [lease("b", 9, 1200, 2500)]})
    assert [v.prop for v in found] == ["lease"] and "overlap 100.0 ms" in found[0].detail


def test_one_epoch_held_by_two_nodes_is_a_violation() -> None:
    found = checker.check_lease({"a": [lease("a", 3, 0, 100)], "b": [lease("b", 3, 500, 600)]})
    assert any("held by" in v.detail for v in found)


def test_an_older_epoch_valid_after_a_newer_one_is_a_violation() -> None:
    found = checker.check_lease({"a": [lease("a", 9, 0, 100)], "b": [lease("b", 3, 500, 600)]})
    assert any("newer epoch" in v.detail for v in found)


def test_giving_up_ends_the_interval_so_an_immediate_acquire_is_fine() -> None:
    recs = [lease("a", 3, 0, 1300), {"k": "lease_end", "node": "a", "epoch": 3, "at_ms": 1100.0},
            lease("b", 9, 1150, 2500)]
    assert checker.check_lease({"x": recs}) == []
    assert len(checker.check_lease({"x": recs[:1] + recs[2:]})) == 1  # without the give-up: overlap


# --- transitions ---------------------------------------------------------------------------------


GOOD = [
    {"k": "seg", "rev": 0},
    tr(1, "i1", "", "create", "Pending"), tr(2, "i1", "Pending", "start_warmup", "Warming"),
    tr(4, "i1", "Warming", "warmed", "Ready"), tr(5, "i1", "Ready", "work", "Busy"),
    tr(7, "i1", "Busy", "drain", "Draining"), tr(9, "i1", "Draining", "drained", "Terminated"),
]


def test_a_legal_lifecycle_passes() -> None:
    assert checker.check_transitions({"a": GOOD, "b": GOOD[:4]}) == []


def test_a_transition_missing_from_the_table_is_a_violation() -> None:
    bad = GOOD[:3] + [tr(4, "i1", "Warming", "work", "Busy")]
    found = checker.check_transitions({"a": bad})
    assert [v.prop for v in found] == ["transition"] and "not in the lifecycle table" in found[0].detail


def test_a_chain_that_skips_a_state_is_a_violation_when_the_feed_covered_it() -> None:
    bad = GOOD[:3] + [tr(4, "i1", "Ready", "work", "Busy")]  # never warmed
    found = checker.check_transitions({"a": bad})
    assert any("starts from Ready" in v.detail for v in found)


def test_a_gap_in_every_feed_is_not_mistaken_for_a_skip() -> None:
    # node a saw revisions up to 2, then restarted from a snapshot at revision 3
    a = [{"k": "seg", "rev": 0}, GOOD[1], GOOD[2], {"k": "start"}, {"k": "seg", "rev": 3},
         tr(5, "i1", "Ready", "work", "Busy")]
    assert checker.check_transitions({"a": a}) == []


def test_anything_after_a_terminal_state_is_a_violation() -> None:
    bad = GOOD + [tr(11, "i1", "Terminated", "drain", "Draining")]
    assert any("terminal" in v.detail for v in checker.check_transitions({"a": bad}))


def test_replicas_that_derive_different_events_for_one_revision_diverged() -> None:
    other = GOOD[:2] + [tr(2, "i1", "Pending", "cancel", "Terminated")]
    found = checker.check_transitions({"a": GOOD, "b": other})
    assert any("revision 2" in v.detail for v in found)


# --- lost writes and convergence -----------------------------------------------------------------


def test_every_acknowledged_write_must_be_on_every_node() -> None:
    assert checker.lost_writes(["t1", "t2"], {"a": ["t1", "t2", "t3"], "b": ["t2", "t1"]}) == []
    found = checker.lost_writes(["t1", "t2"], {"a": ["t1", "t2"], "b": ["t1"]})
    assert len(found) == 1 and found[0].prop == "lost_write" and "b lacks 1" in found[0].detail


def test_convergence_needs_every_node_and_the_adapters_at_the_decision() -> None:
    assert checker.converged(3, {"a": 3, "b": 3}, 3) is None
    assert checker.converged(3, {"a": 3, "b": 2}, 3) is not None
    assert checker.converged(1, {"a": 1, "b": 1}, 2) is not None


# --- history --------------------------------------------------------------------------------------


def test_the_journal_reader_returns_new_complete_lines_and_skips_torn_ones(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    reader = JournalReader(path)
    assert reader.read() == []
    path.write_text('{"k": "a"}\n{"k": "b"')
    assert reader.read() == [{"k": "a"}]
    with open(path, "a") as f:
        f.write('}\n{"k": torn\n{"k": "c"}\n')
    assert reader.read() == [{"k": "b"}, {"k": "c"}]


def test_write_outage_is_the_longest_time_without_an_acknowledgement() -> None:
    w = Writes()
    w.acked = [(1.0, "a"), (1.2, "b"), (2.0, "c")]
    assert round(w.longest_gap_ms(1.0, 2.1)) == 800
    assert w.first_ack_after(1.1) == 1.2 and w.first_ack_after(2.5) is None


# --- tenant isolation ----------------------------------------------------------------------------

NF_A = ("NOT_FOUND", "tenant 'alpha-secret' not found")
NF_G = ("NOT_FOUND", "tenant 'ghost-secret' not found")
PD = ("PERMISSION_DENIED", "this method needs the admin role")


def probe(method: str, alpha: tuple[str, str], ghost: tuple[str, str] | None, service: str = "Tenants") -> Probe:
    return Probe(1.0, "127.0.0.1:1", service, method, alpha, ghost)


def iso(*probes: Probe) -> list[checker.Violation]:
    c = checker.IsolationChecker()
    found = c.feed(probes)
    assert c.probes == len(probes) and c.violations == found
    return found


def test_alpha_answering_like_a_missing_object_is_fine() -> None:
    c = checker.IsolationChecker()
    assert c.feed([
        probe("GetTenant", NF_A, NF_G),
        probe("UpdateTenant", PD, PD),
        probe("ListTenants", ("OK", "items { metadata { name: \"bravo\" resource_version: 4 } }"),
              ("OK", "items { metadata { name: \"bravo\" resource_version: 5 } }")),
        probe("GetDeployment", ("NOT_FOUND", "deployment 'alpha-dep-secret' not found (revision 7)"),
              ("NOT_FOUND", "deployment 'ghost-dep-secret' not found (revision 9)"), "Deployments"),
        probe("Watch", ("OK", "type: BOOKMARK"), None, "Scaling"),
    ]) == []
    assert (c.compared, c.skipped, c.answered_ok) == (4, 0, 2)


def test_failover_answers_are_not_compared_but_counted() -> None:
    c = checker.IsolationChecker()
    assert c.feed([probe("GetTenant", ("UNAVAILABLE", "no leader"), NF_G),
                   probe("GetTenant", NF_A, ("DEADLINE_EXCEEDED", "")),
                   probe("CreateTenant", ("UNAVAILABLE", "stopping"), PD)]) == []
    assert (c.compared, c.skipped) == (0, 3)


def test_a_different_code_for_alpha_than_for_a_missing_object_is_a_violation() -> None:
    [v] = iso(probe("GetTenant", ("PERMISSION_DENIED", "not yours"), NF_G))
    assert v.prop == "isolation" and "PERMISSION_DENIED" in v.detail and "NOT_FOUND" in v.detail


def test_the_same_refusal_in_other_words_is_a_violation() -> None:
    [v] = iso(probe("GetTenant", ("NOT_FOUND", "tenant 'alpha-secret' belongs to another tenant"), NF_G))
    assert "other words" in v.detail


def test_alpha_data_in_a_reply_is_a_violation() -> None:
    leak = ("OK", "items { metadata { name: \"alpha-secret\" } } items { metadata { name: \"bravo\" } }")
    found = iso(probe("ListTenants", leak, leak))
    assert found and all("alpha-secret" in v.detail for v in found)
    # an unfiltered watch showing alpha's deployment
    [v] = iso(probe("Watch", ("OK", "object { name: \"alpha-dep-secret\" }"), None, "Scaling"))
    assert "holds alpha's" in v.detail
    # a successful read of alpha's object is a leak, even if the missing one "succeeds" too
    assert iso(probe("GetTenant", ("OK", "metadata { name: \"alpha-secret\" }"), ("OK", "")))
    # alpha's name in the answer about the missing object
    assert iso(probe("GetTenant", NF_A, ("NOT_FOUND", "no 'ghost-secret' (did you mean 'alpha-secret'?)")))


def test_alpha_name_echoed_in_an_error_about_alpha_is_fine() -> None:
    assert iso(probe("GetTenant", NF_A, NF_G)) == []


def test_a_successful_mutation_of_alpha_is_a_violation() -> None:
    found = iso(probe("DeleteDeployment", ("OK", ""), ("OK", ""), "Deployments"))
    assert [v.prop for v in found] == ["isolation"] and "mutation" in found[0].detail


def test_admin_only_methods_must_be_refused_with_permission_denied() -> None:
    found = iso(probe("ListClusters", ("OK", "items {}"), ("OK", "items {}"), "Clusters"))
    assert any("admin-only" in v.detail for v in found)
    assert iso(probe("CreateToken", ("NOT_FOUND", "x"), ("NOT_FOUND", "x"), "Tokens"))
    assert iso(probe("CreateToken", ("UNAVAILABLE", "x"), PD, "Tokens")) == []


def test_unknown_or_internal_is_a_violation_even_during_failover() -> None:
    assert [v.prop for v in iso(probe("GetTenant", ("INTERNAL", "boom"), ("UNAVAILABLE", "")))] == ["isolation"]
    assert len(iso(probe("GetTenant", ("UNKNOWN", "x"), ("UNKNOWN", "x")))) == 2
    assert iso(probe("Watch", ("INTERNAL", "x"), None, "Scaling"))


def test_the_request_table_covers_every_method() -> None:
    from controlplane.chaos.isolation import every_method, probe_requests

    methods = {m for _, m in every_method()}
    assert len(methods) == 31 and set(probe_requests("a", "b")) == methods
    assert {s for s, _ in every_method()} == {"Tenants", "Deployments", "Clusters", "Scaling", "Tokens", "Admin"}
    assert checker.ADMIN_ONLY <= methods and checker.MUTATING <= methods
