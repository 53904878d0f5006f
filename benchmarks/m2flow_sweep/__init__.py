"""M2Flow's predictions against what the plans measure: the sweep, ``--trace`` and ``--learning``.

* the sweep (:mod:`.sweep`, the default): per recipe, every candidate plan of the planner's table
  measured against its prediction, the plan a run settles on against the measured best, and the
  work-conservation bound;
* ``--trace`` (:mod:`.trace`): one recipe run as planned and calibrated, every iteration printed
  against the prediction the run logs for it, and how well windows of the settled plan's
  iterations know its time (``--runs N --fresh-cache --settled-s S``: the spread of that
  prediction's error over repeated runs);
* ``--learning`` (:mod:`.learning`): the default job (or RECIPE) run twice as ``embodied train``
  runs it, from a cold profile cache and from the cache the first run refined.

    python -m benchmarks.m2flow_sweep [RECIPE ...] [key=value ...]        # the sweep (all recipes by default)
    python -m benchmarks.m2flow_sweep --quick                             # the sweep at tiny settings (~2 min)
    python -m benchmarks.m2flow_sweep RECIPE --trace [--runs N --fresh-cache --settled-s S] [--jsonl PATH]
    python -m benchmarks.m2flow_sweep [RECIPE] --learning [--iterations N]

Positional words with ``=`` are config overrides of every run; the others name recipes (or recipe
files). Results: ``benchmarks/results/m2flow_sweep[_quick|_trace|_learning][_<name>].json``.
"""

from __future__ import annotations

import argparse
from typing import Any

#: the options of one mode only, with their defaults: given to another mode they are an error
TRACE_OPTIONS = {"runs": 1, "fresh_cache": False, "settled_s": None, "jsonl": None}
SWEEP_OPTIONS = {"recipes": None, "warmup": 1, "measure_s": None, "max_iterations": None, "rounds": None,
                 "max_chunks": None, "quick": False, "reprofile": False}


def parser() -> argparse.ArgumentParser:
    """The options of every mode (each mode's own listed under its heading)."""
    from benchmarks.common import add_output_args
    from benchmarks.m2flow_sweep.sweep import QUICK_MAX_ITERATIONS, QUICK_MEASURE_S, SWEEP_MAX_ITERATIONS, SWEEP_MEASURE_S, SWEEP_ROUNDS
    from benchmarks.m2flow_sweep.trace import SETTLED_WINDOW_S

    p = argparse.ArgumentParser(prog="python -m benchmarks.m2flow_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="RECIPE | key=value", help="recipes (names or paths) and config overrides")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--trace", action="store_true", help="trace one recipe's run iteration by iteration")
    mode.add_argument("--learning", action="store_true", help="the default job (or RECIPE) from a cold, then a warm cache")
    p.add_argument("--iterations", type=int, default=None,
                   help="the sweep: timed iterations per plan (default 3; quick 1); --learning: iterations per run (default 32)")
    add_output_args(p, "m2flow_sweep")
    sweep = p.add_argument_group("the sweep")
    sweep.add_argument("--recipes", nargs="+", default=None, help="recipe names or paths (as RECIPE ...; default: all of the sweep)")
    sweep.add_argument("--warmup", type=int, default=1, help="untimed iterations per plan first")
    sweep.add_argument("--measure-s", type=float, default=None,
                       help=f"time each plan at least this many seconds (default {SWEEP_MEASURE_S}; quick {QUICK_MEASURE_S})")
    sweep.add_argument("--max-iterations", type=int, default=None,
                       help=f"at most this many timed iterations per plan (default {SWEEP_MAX_ITERATIONS}; quick {QUICK_MAX_ITERATIONS})")
    sweep.add_argument("--rounds", type=int, default=None,
                       help=f"measure every plan in this many interleaved rounds, --measure-s split between them "
                            f"(default {SWEEP_ROUNDS}; quick 1)")
    sweep.add_argument("--max-chunks", type=int, default=None, help="largest chunk count measured (default 4; quick 2)")
    sweep.add_argument("--quick", action="store_true", help="tiny settings and the two CartPole recipes: a correctness check")
    sweep.add_argument("--reprofile", action="store_true", help="measure the profiles again (do it on a quiet machine)")
    trace = p.add_argument_group("--trace")
    trace.add_argument("--runs", type=int, default=1, help="run the recipe this many times, one after another")
    trace.add_argument("--fresh-cache", action="store_true",
                       help="profile afresh in each run (a temporary $EMBODIED_CACHE each), as a first run of the recipe does")
    trace.add_argument("--settled-s", type=float, default=None,
                       help=f"stop each run once the settled plan ran this many seconds (e.g. {SETTLED_WINDOW_S:g}, the "
                            "window its prediction is judged on), past the run's end where needed; default: at the run's end")
    trace.add_argument("--jsonl", default=None, help="also write the last run's iterations here, one JSON line each")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (this process's arguments when None) and run the mode it asks for; its result."""
    from benchmarks.m2flow_sweep import learning, sweep, trace

    p = parser()
    args = p.parse_intermixed_args(argv)
    recipes = [t for t in args.targets if "=" not in t]
    args.overrides = [t for t in args.targets if "=" in t]
    mode = "trace" if args.trace else "learning" if args.learning else "sweep"
    foreign = {**(TRACE_OPTIONS if mode != "trace" else {}), **(SWEEP_OPTIONS if mode != "sweep" else {})}
    for key, default in foreign.items():
        if getattr(args, key) != default:
            p.error(f"--{key.replace('_', '-')} is not an option of {'the sweep' if mode == 'sweep' else '--' + mode}")
    if mode == "trace":
        if len(recipes) != 1:
            p.error("--trace traces one recipe: python -m benchmarks.m2flow_sweep RECIPE --trace [key=value ...]")
        if args.runs < 1:
            p.error("--runs must be at least 1")
        return trace.run(args, argv, recipes[0], args.overrides)
    if mode == "learning":
        if len(recipes) > 1:
            p.error("--learning runs one recipe (default: the default job)")
        return learning.run(args, argv, recipes[0] if recipes else learning.DEFAULT_RECIPE, args.overrides)
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be >= 1")
    args.recipes = [*(args.recipes or []), *recipes] or None
    return sweep.run(args, argv)
