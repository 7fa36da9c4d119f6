"""``controlplane``: the operator CLI.

Every failure a user can cause (bad file, bad field, bad flag) ends with one line on stderr naming
the file, line or field, and a non-zero exit status; never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from contextlib import ExitStack

import structlog

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.profiles import PROFILES

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="controlplane", description="Scaling control plane for LLM inference fleets.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("simulate", help="replay a scenario or a request trace in virtual time")
    src = sim.add_mutually_exclusive_group()
    src.add_argument("--scenario", metavar="FILE", help="scenario YAML (default: the built-in demo)")
    src.add_argument("--trace", metavar="FILE", help="Azure LLM inference trace CSV (single-tenant scenario)")
    sim.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    sim.add_argument("--model", default="llama3-70b-h100x4", choices=sorted(PROFILES), help="profile for --trace")
    sim.add_argument("--engine", default="vllm", choices=("vllm", "triton", "deepspeed-mii"), help="engine for --trace")
    sim.add_argument("--rate-scale", type=float, default=1.0, help="compress trace time by this factor (--trace)")
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--plot", metavar="FILE.png", help="write load, replicas by state and TTFT over time")
    sim.add_argument("--events", metavar="FILE", help="write every instance transition as a JSON line")
    bar = sim.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None, help="show a progress bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false")

    sub.add_parser("demo", help="run the built-in multi-tenant demo scenario and print its summary")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _simulate(argparse.Namespace(
                scenario=None, trace=None, seed=None, json=False, plot=None, events=None, progress=None,
                model=None, engine=None, rate_scale=1.0,
            ))
        return _simulate(args)
    except ControlPlaneError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("controlplane: interrupted", file=sys.stderr)
        return 130


def _simulate(args: argparse.Namespace) -> int:
    from controlplane.sim import runner
    from controlplane.sim.report import progress_bar, render_table, write_plot

    if args.plot and not args.plot.lower().endswith(".png"):
        raise ControlPlaneError(f"--plot: {args.plot!r} must end in .png")
    if args.rate_scale <= 0:
        raise ControlPlaneError(f"--rate-scale: must be > 0, got {args.rate_scale}")
    if args.trace:
        scenario = runner.trace_scenario(args.trace, model=args.model, engine=args.engine,
                                         rate_scale=args.rate_scale, seed=args.seed or 0)
    elif args.scenario:
        scenario = runner.load_scenario(args.scenario)
    else:
        scenario = runner.builtin_scenario("demo")
    seed = args.seed if args.seed is not None else scenario.spec.seed
    show = sys.stderr.isatty() if args.progress is None else args.progress
    with ExitStack() as stack:
        logger = _event_logger(stack, args.events)
        progress = stack.enter_context(progress_bar(show, scenario.spec.name))
        result = runner.run(scenario, seed, progress=progress, logger=logger)
    if args.plot:
        write_plot(result, args.plot)
    if args.json:
        print(runner.to_json(result))
    else:
        render_table(result)
    return 0


def _event_logger(stack: ExitStack, path: str | None):
    """Transitions as JSON lines in ``path``; without a path they are counted but not printed."""
    if path is None:
        return structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        handle = stack.enter_context(open(path, "w", encoding="utf-8"))
    except OSError as exc:
        raise ControlPlaneError(f"--events: cannot write {path}: {exc.strerror}") from None
    return structlog.wrap_logger(
        structlog.PrintLogger(handle),
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer(sort_keys=True)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )


if __name__ == "__main__":
    sys.exit(main())
