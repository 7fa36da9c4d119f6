"""The demo's live view (controlplane/cli/demo_view.py), rendered by rich into a recording console at
100 and 200 columns: whole instance ids, every column header whole on one line, nothing cut with an
ellipsis, no line wider than the terminal, the events trimmed to the height (newest kept)."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from controlplane.cli.demo_view import (
    MIN_EVENTS,
    WIDE_COLUMNS,
    BreakerRow,
    DeploymentRow,
    EventRow,
    NodeRow,
    ViewState,
    plain_line,
    render,
    summary_table,
)

IDS = ("gold-chat-2afa9a81b3-1796234071092-0", "bronze-batch-aecce2dc82-1796234058932-12",
       "silver-embed-97c1d0e4f2-1796234062182-3")
REASON = "preempted by tenant gold (priority 200): allocation granted 4 of 7 in pool h100, quota 3 + borrowed 1"


def frame(events: int = 6) -> ViewState:
    nodes = (NodeRow("coord-a", "az-a", 4_194_301, True, "leader", 2, "coord-a", "coord-a", 1984, 2_873, 12_345),
             NodeRow("coord-b", "az-b", 4_194_302, False, note="killed"),
             NodeRow("coord-c", "az-c", 4_194_303, True, "follower", 2, "coord-a", "coord-a", 1984, 0, 12_345,
                     "restarted"))
    deps = (DeploymentRow("chat", "gold", 200, 1_000, 12, {"warming": 2, "ready": 3, "busy": 7, "draining": 1},
                          {"az-a": {"warming": 1, "busy": 3, "draining": 1}, "az-b": {"ready": 2, "busy": 2},
                           "az-c": {"warming": 1, "ready": 1, "busy": 2}}, 0, 30.3, 30.0, 151.0, 1.0, 0, 88.0),
            DeploymentRow("embed", "silver", 100, 2_000, 4, {"ready": 2, "busy": 2}, {"az-a": {"busy": 2}}, 0, 3.3,
                          4.5, 1_234.0, 0.998, 3, 76.0),
            DeploymentRow("batch", "bronze", 50, 3_000, 6, {"busy": 6}, {"az-b": {"busy": 6}}, 4, 28.7, 27.0, None,
                          None, 84, 130.0))
    evs = [EventRow(10.0 + i, "batch", f"bronze-batch-aecce2dc82-17962340{i:05d}-0", "warmed -> ready in az-c")
           for i in range(max(0, events - len(IDS) - 1))]
    evs += [EventRow(30.0 + i, i_d.split("-")[1], i_d, "create -> pending in az-b") for i, i_d in enumerate(IDS)]
    evs.append(EventRow(40.0, "batch", "decided 4", REASON))
    return ViewState(41.5, 150, "trace AzureLLMInferenceTrace_code.csv (19366 requests, 24x faster)", "coord-a",
                     1984, "failover: killed coord-b (epoch 3) at 16.6 s -> coord-a epoch 1984 after [b]1419 ms[/b]",
                     ("az-a", "az-b", "az-c"), nodes, deps,
                     (BreakerRow("cluster gpu-a1", "closed"), BreakerRow("cluster gpu-b1", "open", 2)), tuple(evs),
                     ("SIGKILL lease holder coord-b (epoch 3, pid 4194302) at 16.6 s",
                      "failover: coord-a holds the lease (epoch 1984) 1419 ms after the kill"))


def screen(state: ViewState, width: int, height: int | None = 40) -> list[str]:
    console = Console(width=width, height=height or 200, record=True, force_terminal=False, color_system=None,
                      file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the console
    console.print(render(state, width, height))
    return [line.rstrip() for line in console.export_text().splitlines()]


def header_line(lines: list[str], *headers: str) -> str:
    """The first line that holds every one of ``headers`` whole (blank or the line's end on each side),
    in this order; other cells may come between them."""
    pattern = re.compile(r".*?".join(rf"(?<!\S){re.escape(h)}(?!\S)" for h in headers))
    found = [line for line in lines if pattern.search(line)]
    assert found, f"no line with {headers} whole and in order:\n" + "\n".join(lines)
    return found[0]


@pytest.mark.parametrize("width", [100, 200])
def test_the_frame_fits_the_width_with_whole_ids_and_whole_columns(width: int) -> None:
    lines = screen(frame(), width)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width
    assert "…" not in text and "..." not in text
    for instance_id in IDS:
        assert re.search(rf"(^|\s){re.escape(instance_id)}\s", text), instance_id
    assert "decided 4" in text and "preempted by tenant gold" in text
    header_line(lines, "node", "zone", "pid", "role", "term", "raft leader", "lease@epoch", "lease left", "applied")
    header_line(lines, "deployment", "tenant", "prio", "desired", "by state", "az-a", "az-b", "az-c", "preempted")
    header_line(lines, "load/s", "offered/s", "TTFT p99 5s", "SLO", "met so far", "dropped", "GPU-s")
    for cells in (("chat", "gold", "200", "12", "W2 R3 B7 D1", "W1 B3 D1", "R2 B2", "W1 R1 B2", "0"),
                  ("embed", "silver", "100", "3.3", "4.5", "1,234 ms", "2,000 ms", "99.8 %", "3", "76"),
                  ("batch", "bronze", "50", "28.7", "27.0", "-", "3,000 ms", "-", "84", "130")):
        header_line(lines, *cells)
    assert "4194301" in text and "coord-a@1984" in text and "killed" in text and "down" in text
    assert "after 1419 ms" in text and "cluster gpu-b1 open" in " ".join(text.split())


def test_wide_terminals_get_one_deployments_table_narrow_ones_two() -> None:
    narrow, wide = screen(frame(), 100), screen(frame(), WIDE_COLUMNS)
    assert sum(line.startswith("deployment ") for line in narrow) == 2
    assert sum(line.startswith("deployment ") for line in wide) == 1
    header_line(wide, "deployment", "tenant", "prio", "desired", "by state", "az-a", "az-b", "az-c", "preempted",
                "load/s", "offered/s", "TTFT p99 5s", "SLO", "met so far", "dropped", "GPU-s")


@pytest.mark.parametrize("width,height", [(100, 40), (200, 40), (100, 35)])
def test_the_events_are_trimmed_to_the_height_newest_kept(width: int, height: int) -> None:
    state = frame(events=20)
    lines = screen(state, width, height)
    assert len(lines) <= height - 1
    text = "\n".join(lines)
    assert IDS[-1] in text and "decided 4" in text  # the newest
    if height >= 40:
        assert all(line in text for line in state.log)
    else:  # the demo's log gives way before the events go below MIN_EVENTS
        assert "─ demo ─" not in text and sum(e.subject in text for e in state.events) >= MIN_EVENTS
    assert state.events[0].subject not in text  # the oldest gave way
    assert len(screen(state, width, None)) > height  # without a height every event is shown


def test_a_frame_round_trips_through_json() -> None:
    state = frame()
    assert ViewState.from_json(state.to_json()) == state


def test_the_plain_line_names_every_deployment_with_its_ttft() -> None:
    line = plain_line(frame())
    assert line.startswith("demo: t= 41.5s | lease coord-a@1984")
    assert "chat: desired 12 serving 10 load 30.3/s TTFT p99 151 ms SLO 100.0 % preempted 0" in line
    assert "batch: desired 6 serving 6 load 28.7/s TTFT p99 - SLO - preempted 4" in line


def test_the_summary_table_fits_100_columns() -> None:
    tenant = {"priority": 200, "deployment": "chat", "requests": 12_025, "dropped": 184, "slo_ttft_ms": 1_000,
              "slo_attainment": 0.9981, "ttft_p50_ms": 22, "ttft_p99_ms": 11_180, "gpu_seconds": 738.4,
              "min_replicas": 3, "peak_serving_replicas": 12, "preempted_instances": 14}
    summary = {"workload": "built-in bursty", "duration_s": 150, "setup_s": 6.2,
               "tenants": {"gold": tenant, "silver": {**tenant, "deployment": "embed"},
                           "bronze": {**tenant, "deployment": "batch"}}}
    console = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(summary_table(summary))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(len(line) for line in lines) <= 100 and "…" not in "\n".join(lines)
    header_line(lines, "tenant", "prio", "deployment", "requests", "dropped", "SLO", "met", "p50", "p99",
                "GPU-s", "replicas", "preempted")
    header_line(lines, "silver", "200", "embed", "12025", "184", "1,000", "99.8 %", "22", "11,180", "738", "3 -> 12",
                "14")


def test_playing_back_a_missing_or_broken_recording_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from controlplane.cli.demo_view import main

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"t_s": 1}\n')
    for path in (tmp_path / "missing.jsonl", broken):
        assert main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("demo_view: error: ") and err.count("\n") == 1 and "Traceback" not in err
