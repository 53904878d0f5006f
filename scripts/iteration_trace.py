"""Run a recipe as planned and calibrated, printing every iteration against its prediction.

Per iteration: the decisions and samples it took (an episodic GRPO iteration ends when its
episodes do), its seconds and the prediction the run logs for it, the seconds of its simulator
calls, policy calls and update, each component's measured / profiled seconds per call under the
plan (``measured_factors``), and calibration's line once it settles. What it is for: seeing where a
prediction goes wrong, iteration by iteration (docs/benchmarks.md, "The planner's choice measured
for free, over 4 s").

    python scripts/iteration_trace.py cartpole_grpo plan.max_chunks=2
    python scripts/iteration_trace.py cartpole_ppo algo.total_env_steps=20000 --out trace.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embodied.config import apply_overrides
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.embodied import EmbodiedWorkflow
from pipelines.recipes import load_recipe
from pipelines.runner import Runner

#: as the sweep runs a recipe: measured as planned (no re-planning, no learning into the cache)
FIXED = ("plan.replan_threshold=0", "plan.learn=false", "logging.tensorboard=false", "logging.wandb=false")


def main(argv: list[str] | None = None) -> list[dict]:
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
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


if __name__ == "__main__":
    main()
