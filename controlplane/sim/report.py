"""Human-facing output of a simulation: a rich progress bar, a summary table and a PNG plot."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.domain.errors import ControlPlaneError
from controlplane.sim.metrics import SimResult


@contextlib.contextmanager
def progress_bar(show: bool, name: str) -> Iterator[Callable[[int, int], None] | None]:
    """Yields a ``progress(now_ms, end_ms)`` callback drawing on stderr, or None when hidden."""
    if not show:
        yield None
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[sim]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(f"simulating {name}", total=1.0, sim="")

        def update(now_ms: int, end_ms: int) -> None:
            bar.update(task, completed=now_ms / max(1, end_ms), sim=f"{now_ms / 1000:,.0f}/{end_ms / 1000:,.0f} s simulated")

        yield update


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}" if v < 10 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render_table(result: SimResult, console: Console | None = None) -> None:
    # Off a terminal (a pipe, CI) rich assumes 80 columns; the table needs more.
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    s = result.summary
    table = Table(title=f"{s.get('scenario', 'simulation')}: {s['simulated_s']:,.0f} s simulated, seed {s['seed']}")
    for col in ("scope", "requests", "dropped", "SLO att.", "TTFT p50 ms", "p99 ms", "p99.9 ms",
                "GPU-h", "reversals", "cold", "warm", "preempted"):
        table.add_column(col, justify="left" if col == "scope" else "right")
    rows = [("total", s["total"])] + [(f"tenant {k}", v) for k, v in s["tenants"].items()]
    rows += [(f"  {k}", v) for k, v in s["deployments"].items()]
    for name, m in rows:
        att = m["slo_attainment"]
        table.add_row(
            name, _fmt(m["requests"]), _fmt(m["dropped"]), "-" if att is None else f"{att:.2%}",
            _fmt(m["ttft_ms"]["p50"]), _fmt(m["ttft_ms"]["p99"]), _fmt(m["ttft_ms"]["p999"]),
            f"{m['gpu_hours']:.2f}", _fmt(m["scale_reversals"]), _fmt(m["cold_starts"]),
            _fmt(m["warm_starts"]), _fmt(m["preemptions"]),
        )
    console.print(table)


def write_plot(result: SimResult, path: str) -> None:
    """Per deployment: arrivals/s; instances by lifecycle state with the desired count; TTFT p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    deps = list(tl.arrivals)
    fig, axes = plt.subplots(3, len(deps), figsize=(7 * len(deps), 9), sharex=True, squeeze=False)
    colors = {"Pending": "#c7c7c7", "Warming": "#ffbb78", "Ready": "#98df8a", "Busy": "#2ca02c",
              "Standby": "#aec7e8", "Draining": "#ff9896"}
    for col, d in enumerate(deps):
        ax_load, ax_rep, ax_ttft = axes[0][col], axes[1][col], axes[2][col]
        ax_load.plot(tl.t_s, tl.arrivals[d], lw=0.8, color="#1f77b4")
        ax_load.set_title(d)
        ax_load.set_ylabel("requests / s")
        ax_rep.stackplot(tl.t_s, *[tl.states[d][s] for s in colors], labels=list(colors), colors=list(colors.values()))
        ax_rep.step(tl.t_s, tl.desired[d], where="post", color="black", lw=1, label="desired")
        ax_rep.set_ylabel("instances")
        ax_rep.legend(loc="upper left", fontsize=7, ncol=4)
        xs = [t for t, v in zip(tl.t_s, tl.ttft_p99_ms[d]) if v is not None]
        ys = [v / 1000 for v in tl.ttft_p99_ms[d] if v is not None]
        ax_ttft.plot(xs, ys, lw=0.8, color="#d62728", label="TTFT p99 per second")
        ax_ttft.axhline(tl.slo_ms[d] / 1000, color="black", ls="--", lw=0.8, label="SLO")
        ax_ttft.set_yscale("log")
        ax_ttft.set_ylabel("TTFT p99 (s)")
        ax_ttft.set_xlabel("simulated time (s)")
        ax_ttft.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ControlPlaneError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
