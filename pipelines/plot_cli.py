"""``embodied plot RUN_DIR [--out FILE] [--metric KEY ...]``: a run's learning curve as a picture.

Reads the run dir (``metrics.jsonl``, ``summary.json``, ``config.yaml``) and draws each metric
against wall time, train points and evaluations (:mod:`embodied.learning_curve`): by default the
success rate, or the episode return for an env without one. Writes ``RUN_DIR/learning_curve.png``
and the points it drew as ``RUN_DIR/learning_curve.json``; ``--out FILE`` writes the picture
there instead (``.png``, ``.svg`` or ``.pdf``) and the JSON beside it.

    embodied plot runs/maniskill_pushcube_ppo-20261124-101500
    embodied plot RUN_DIR --out curve.png --metric success_rate episode_return
    embodied plot RUN_DIR --metric losses/pg            # any key of metrics.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from embodied.errors import UserError
from pipelines.cli import register_command

#: the picture's name in the run dir (its points beside it, ``.json``)
DEFAULT_NAME = "learning_curve.png"
#: the formats ``--out`` may name (matplotlib draws by the suffix)
FORMATS = (".png", ".svg", ".pdf")


def output_paths(run_dir: Path, out: Path | None) -> tuple[Path, Path]:
    """The picture and the JSON of its points: in ``run_dir`` by default, at ``out`` (a file, or a
    folder to hold :data:`DEFAULT_NAME`) when given, the JSON beside the picture."""
    png = run_dir / DEFAULT_NAME if out is None else out / DEFAULT_NAME if out.is_dir() else out
    if png.suffix.lower() not in FORMATS:
        raise UserError(f"--out {out}: the picture's file must end in {', '.join(FORMATS)} (its points go beside it as .json).")
    return png, png.with_suffix(".json")


def cmd_plot(args: list[str]) -> int:
    # matplotlib loads with the command that draws, not with every `embodied` command
    from embodied.learning_curve import SUCCESS_TARGET, curve, default_metric, default_title, plot, require_run_dir

    parser = argparse.ArgumentParser(prog="embodied plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run dir `embodied train` wrote")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help=f"the picture (.png, .svg, .pdf; default RUN_DIR/{DEFAULT_NAME}); its points beside it as .json")
    parser.add_argument("--metric", nargs="+", default=None, metavar="KEY",
                        help="what to draw, a panel each: a name the run logged as train/KEY and eval/KEY (success_rate, "
                             "episode_return) or any key of metrics.jsonl (default: success_rate, else episode_return)")
    parser.add_argument("--target", type=float, default=None,
                        help=f"draw this value as a dashed line (default {SUCCESS_TARGET} for success_rate, else none)")
    parser.add_argument("--title", default=None, help="default: the run's env, observations and algorithm")
    ns = parser.parse_args(args)
    require_run_dir(ns.run_dir)
    png, points = output_paths(ns.run_dir, ns.out)
    metrics = ns.metric or [default_metric(ns.run_dir)]
    curves = [curve(ns.run_dir, m, ns.target if ns.target is not None else SUCCESS_TARGET if m == "success_rate" else None)
              for m in metrics]
    title = ns.title or default_title(curves[0], os.cpu_count() or 1, metrics)
    plot(curves, png, title)
    run_level = ("summary", "run", "eval_deterministic", "eval_episodes")
    data = {"run_dir": str(ns.run_dir), **{k: curves[0][k] for k in run_level},
            "curves": [{k: v for k, v in c.items() if k not in run_level} for c in curves], "png": png.name}
    points.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {png} and {points}")
    return 0


register_command("plot", cmd_plot, "plot a run's learning curve: embodied plot RUN_DIR [--out FILE] [--metric KEY ...]")
