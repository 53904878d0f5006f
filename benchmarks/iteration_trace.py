"""Run a recipe as planned and calibrated, printing every iteration against its prediction.

Per iteration: the decisions and samples it took (an episodic GRPO iteration ends when its
episodes do), its seconds and the prediction the run logs for it, the seconds of its simulator
calls, policy calls and update, each component's measured / profiled seconds per call under the
plan (``measured_factors``), and calibration's line once it settles. What it is for: seeing where a
prediction goes wrong, iteration by iteration (docs/benchmarks.md, "The planner's choice measured
for free, over 4 s").

At the end, how well windows of the plan the run settled on know its time
(:func:`window_spread`): the iterations after calibration (all but the first with
``plan.calibrate=0``) cut into consecutive windows of about 4, 8 and 16 s, and how far their
medians spread around the median of all. A prediction measured on one such window can hold no
closer than that to another (why calibration measures the planner's choice 16 s,
``pipelines.calibrate.CHOICE_MEASURE_S``).

    python -m benchmarks.iteration_trace cartpole_grpo plan.max_chunks=2
    python -m benchmarks.iteration_trace cartpole_ppo algo.total_env_steps=20000 --out trace.jsonl
    python -m benchmarks.iteration_trace cartpole_ppo plan.calibrate=0 algo.total_env_steps=200000 --out long.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.m2flow_sweep import FIXED
from embodied.config import apply_overrides
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.embodied import EmbodiedWorkflow
from pipelines.recipes import load_recipe
from pipelines.runner import Runner

#: the window lengths :func:`window_spread` reports, in seconds
WINDOWS_S = (4.0, 8.0, 16.0)


def window_spread(times: list[float], windows_s: tuple[float, ...] = WINDOWS_S) -> list[dict[str, Any]]:
    """How well a window of ``times`` (one plan's iterations, in the order they ran) knows their
    median: per window length (seconds, as iterations of the median's length), the consecutive
    windows' medians relative to the median of all: their spread (population standard deviation)
    and largest deviation, and each. Lengths that leave fewer than two windows are left out."""
    if not times:
        return []
    middle = statistics.median(times)
    out = []
    for seconds in windows_s:
        n = max(1, round(seconds / middle))
        windows = [times[i:i + n] for i in range(0, len(times) - n + 1, n)]
        if len(windows) < 2:
            continue
        deviations = [statistics.median(w) / middle - 1 for w in windows]
        out.append({"window_s": seconds, "iterations": n, "windows": len(windows),
                    "spread": statistics.pstdev(deviations), "largest": max(abs(d) for d in deviations),
                    "deviations": deviations})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--out", type=Path, default=None, help="also write one JSON line per iteration here")
    args = parser.parse_args(argv)
    _, data = load_recipe(args.recipe)
    cfg = apply_overrides(EmbodiedConfig, data, [*FIXED, *args.overrides])
    rows = []
    with Cluster(cfg.cluster) as cluster:
        workflow = EmbodiedWorkflow(cfg)
        runner = Runner(cfg, None, workflow)
        try:
            runner.start(cluster)
            while not runner.done():
                m = runner.step()
                runner.calibrate(m)
                trained = m.get("time/train_s") is not None
                factors = workflow.measured_factors(runner.profile, runner.layout, m) if trained and runner.profile else {}
                row = {"iteration": m["iteration"], "decisions": m.get("rollout/decisions"), "samples": m.get("charts/samples"),
                       "iteration_s": m["time/iteration_s"], "predicted_s": m.get("plan/predicted_iteration_s"),
                       "sim_s": m.get("time/sim_s"), "infer_s": m.get("time/infer_s"), "train_s": m.get("time/train_s"),
                       "factors": factors, "calibrating": bool(m.get("plan/calibrating")), "calibrated": m.get("plan/calibrated")}
                rows.append(row)
                predicted = "-" if row["predicted_s"] is None else f"{row['predicted_s']:.3f}"
                print(f"{row['iteration']:4d} decisions {row['decisions'] or 0:6.1f} samples {row['samples'] or 0:7.0f} "
                      f"took {row['iteration_s']:.3f} s predicted {predicted} | sim {row['sim_s'] or 0:.3f} infer "
                      f"{row['infer_s'] or 0:.3f} train {row['train_s'] or 0:.3f} | per call "
                      + " ".join(f"{k} {v:.2f}x" for k, v in factors.items()) + ("  (calibrating)" if row["calibrating"] else ""),
                      flush=True)
                if row["calibrated"]:
                    print(f"     {row['calibrated']}", flush=True)
        finally:
            workflow.close()
    # the settled plan's iterations: after calibration, else all but the run's first (resets, first calls)
    settled = [r["iteration_s"] for r in rows[1:] if not r["calibrating"]]
    spread = window_spread(settled)
    if spread:
        print(f"the settled plan's {len(settled)} iterations, median {statistics.median(settled):.3f} s; windows of it:")
    for w in spread:
        print(f"  {w['window_s']:4.0f} s ({w['iterations']} iterations) x {w['windows']}: medians spread "
              f"{100 * w['spread']:.1f}% around the median of all, at most {100 * w['largest']:.1f}%")
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"rows": rows, "window_spread": spread}


if __name__ == "__main__":
    main()
