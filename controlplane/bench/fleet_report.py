"""``controlplane bench fleet``'s human outputs: ``report.md`` tables and the PNG plots.

Everything is rendered from ``results.json``'s dictionary (plus, for the GPU timeline plot, the
per-second series the workers return), so the report never disagrees with the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.domain.errors import ControlPlaneError

COLORS = {"controlplane": "#d62728", "hpa+k8s": "#1f77b4", "kpa+k8s": "#2ca02c", "dynamo-throughput": "#ff7f0e",
          "dynamo-load": "#8c564b", "static": "#7f7f7f", "oracle": "#9467bd"}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2%}"


def _num(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def totals_table(results: Mapping[str, Any]) -> str:
    rows = ["| policy | SLO attainment | TTFT p50 ms | TTFT p99 ms | GPU-hours | preemptions | preemption success "
            "| loops | warm-pool hit rate | reversals | dropped | pool never exceeded |",
            "|" + "---|" * 12]
    for e in results["policies"]:
        if not e["available"]:
            rows.append(f"| {e['policy']} | unavailable: {e['reason']} |" + " |" * 10)
            continue
        t = e["total"]
        ok = e["invariants"]["pool_never_exceeded"]["ok"]
        rows.append(f"| {e['policy']} | {_pct(t['slo_attainment'])} | {_num(t['ttft_ms']['p50'])} "
                    f"| {_num(t['ttft_ms']['p99'])} "
                    f"| {t['gpu_hours']:.2f} | {t['preemptions']} | {_pct(t['preemption_success'])} ({t['claims']} claims) "
                    f"| {t['preemption_loops']} | {_pct(t['warm_hit_rate'])} | {t['scale_reversals']} | {t['dropped']} "
                    f"| {'yes' if ok else '**no**'} |")
    return "\n".join(rows)


def tenants_table(results: Mapping[str, Any]) -> str:
    rows = ["| policy | tenant (priority) | SLO attainment | TTFT p50 ms | TTFT p99 ms | GPU-hours | preempted "
            "| preemption success | below quota while asking s | starved s | asking s | dropped |",
            "|" + "---|" * 12]
    for e in results["policies"]:
        if not e["available"]:
            continue
        for name, t in sorted(e["tenants"].items(), key=lambda kv: (-kv[1]["priority"], kv[0])):
            rows.append(f"| {e['policy']} | {name} ({t['priority']}) | {_pct(t['slo_attainment'])} "
                        f"| {_num(t['ttft_ms']['p50'])} | {_num(t['ttft_ms']['p99'])} | {t['gpu_hours']:.2f} "
                        f"| {t['preempted_replicas']} | {_pct(t['preemption_success'])} ({t['claims']}) "
                        f"| {_num(t['below_quota_while_asking_s'], ',.1f')} | {_num(t['starved_below_quota_s'], ',.1f')} "
                        f"| {_num(t['asking_s'], ',.1f')} | {t['dropped']} |")
    return "\n".join(rows)


def deployments_table(results: Mapping[str, Any]) -> str:
    rows = ["| policy | deployment | tenant | SLO attainment | GPU-hours | bursts (unreached) | burst to capacity p50 s "
            "| p99 s | lag p99 s | scale-ups | warm hit rate | preempted | reversals |", "|" + "---|" * 13]
    for e in results["policies"]:
        if not e["available"]:
            continue
        for name, d in e["deployments"].items():
            btc = d["burst_to_capacity_s"]
            rows.append(f"| {e['policy']} | {name} | {d['tenant']} | {_pct(d['slo_attainment'])} | {d['gpu_hours']:.2f} "
                        f"| {d['bursts']} ({d['bursts_unreached']}) | {_num(btc['p50'], ',.1f')} | {_num(btc['p99'], ',.1f')} "
                        f"| {_num(d['burst_lag_s']['p99'], ',.1f')} "
                        f"| {d['scale_ups']} | {_pct(d['warm_hit_rate'])} | {d['preempted_replicas']} "
                        f"| {d['scale_reversals']} |")
    return "\n".join(rows)


def targets_lines(results: Mapping[str, Any]) -> list[str]:
    t = results["targets"]
    if not t:
        return ["Targets: not evaluated (`controlplane` was not run)."]
    a, g, p, lo, st = (t["top_tenant_attainment"], t["gpu_hours_vs_baselines"], t["preemption_success"],
                       t["preemption_loops"], t["no_tenant_starved"])
    base = ", ".join(f"{k} {_pct(v)}" for k, v in a["baselines"].items()) or "none ran"
    comp = ", ".join(f"{k} {v:.2f}" for k, v in g["compared"].items()) or "no baseline reached it"
    lines = [
        f"* Highest-priority tenant `{t['top_tenant']}` attainment >= 99 % and >= every baseline's: {_pct(a['ours'])} "
        f"(baselines: {base}): {_mark(a['met'])}",
        f"* Total GPU-hours <= every baseline reaching the same top-tenant attainment: {g['ours']:.2f} ({comp}): "
        f"{_mark(g['met'])}",
        f"* Preemption success >= 99.3 %: {_pct(p['ours'])} over {p['claims']} claims: {_mark(p['met'])}",
        f"* 0 preemption loops: {lo['ours']}: {_mark(lo['met'])}",
        "* No tenant starved below its quota: "
        + (", ".join(f"{k} {v:,.1f} s" for k, v in st["starved_s"].items()) or "none") + f": {_mark(st['met'])}",
    ]
    if t["baselines_missing"]:
        lines.append(f"* Provisional: baselines not run here ({', '.join(t['baselines_missing'])}); the comparisons "
                     "cover only the baselines listed.")
    return lines


def invariants_lines(results: Mapping[str, Any]) -> list[str]:
    lines = []
    for e in results["policies"]:
        if not e["available"]:
            continue
        inv = e["invariants"]
        pool = inv["pool_never_exceeded"]
        starved = inv["no_tenant_starved_below_quota"]
        pool_text = "yes" if pool["ok"] else f"**no**, {pool['violating_ticks']} ticks, first {pool['first']}"
        starved_text = "yes" if starved["ok"] else f"**no**: {starved['starved_s']}"
        lines.append(f"* {e['policy']}: pool never exceeded: {pool_text}; no tenant starved: {starved_text}; "
                     f"preemption loops: {len(inv['no_preemption_loops']['loops'])}")
    return lines


def markdown(results: Mapping[str, Any]) -> str:
    f = results["fleet"]
    pools = ", ".join(f"{k} {v} GPUs" for k, v in f["pools"].items())
    head = [f"# Fleet benchmark: {f['name']} ({f['source']})", "",
            f"Seed {results['seed']}" + (f", first {f['limit_s']:g} s" if f["limit_s"] else "") + f"; pools: {pools}; "
            f"tenants: " + ", ".join(f"{t['id']} (priority {t['priority']})" for t in f["tenants"]) + ". "
            "Definitions: docs/fleet-bench.md.", ""]
    if f.get("shortfall") is not None:
        head += ["Pool shortfall at the peaks: `" + json.dumps(f["shortfall"], sort_keys=True) + "`.", ""]
    return "\n".join(head + [
        "## Per policy", "", totals_table(results), "",
        "## Per tenant", "", tenants_table(results), "",
        "## Per deployment", "", deployments_table(results), "",
        "## Targets (controlplane)", "", *targets_lines(results), "",
        "## Invariants", "", *invariants_lines(results), "",
    ])


def plots(results: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [e for e in results["policies"] if e["available"]]
    tenants = [t["id"] for t in results["fleet"]["tenants"]]
    capacity = sum(results["fleet"]["pools"].values())
    written = []
    fig, axes = plt.subplots(max(1, len(ran)), 1, figsize=(11, 2.2 * max(1, len(ran)) + 0.6), sharex=True, squeeze=False)
    for ax, e in zip(axes[:, 0], ran):
        tl = runs[e["policy"]]["timeline"]
        ax.stackplot(tl["t_s"], [tl["gpus_by_tenant"][t] for t in tenants], labels=tenants, step="post", alpha=0.85)
        ax.axhline(capacity, color="black", lw=0.8, ls="--", label="pool")
        ax.set_ylabel("GPUs")
        ax.set_title(e["policy"], fontsize=9, loc="left")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=len(tenants) + 1)
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.suptitle(f"{results['fleet']['name']}: GPUs held by tenant (all pools)", fontsize=10)
    fig.tight_layout()
    written.append(_save(fig, out / "gpus_by_tenant.png", plt))

    fig, axes = plt.subplots(1, len(tenants), figsize=(4.5 * len(tenants), 4), squeeze=False)
    for ax, t in zip(axes[0], tenants):
        for e in ran:
            row = e["tenants"][t]
            if row["slo_attainment"] is None:
                continue
            ax.scatter(row["gpu_hours"], row["slo_attainment"] * 100, color=COLORS.get(e["policy"]), s=36)
            ax.annotate(e["policy"], (row["gpu_hours"], row["slo_attainment"] * 100), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel("SLO attainment (%)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    written.append(_save(fig, out / "attainment_vs_gpu_hours.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    try:
        fig.savefig(path, dpi=90, metadata={"Software": None})
    except OSError as exc:
        raise ControlPlaneError(f"--out: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path
