"""PPO against the library users compare it with: Stable-Baselines3, side by side in one run.

Equal settings on HalfCheetah-v5: 8 envs, 256 steps per env and iteration, 10 epochs of minibatches of
64, an MLP of 64x64, normalized observations, lr 3e-4, gamma 0.99, GAE lambda 0.95, clip 0.2,
gradient clip 0.5, one torch thread. Three runs in turn, for ``--rounds`` rounds (the host's speed
drifts, so they alternate and the ratios are medians of per-round ratios):

* ``sb3``: ``stable_baselines3.PPO`` with a ``DummyVecEnv`` of 8 envs and ``VecNormalize(norm_obs)``,
  its ``learn()`` timed;
* ``embodied``: ``embodied train halfcheetah_ppo`` as a user runs it (a subprocess; Ray workers,
  the planner's plan from a warm profile cache), timed by the run's own training wall time;
* ``embodied_staleness_1``: the same with ``algo.staleness=1`` (training beside the next collection).

``--learning`` also trains each Embodied variant for ``--learning-steps`` (1M) with 3 seeds and
compares the final returns (staleness 1 must land within the seed spread of on-policy).

    pip install -e ".[compare]"          # stable-baselines3, an optional peer
    python -m benchmarks.sb3_comparison [--steps 100000] [--rounds 3] [--learning]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "HalfCheetah-v5"
#: the recipe's settings that SB3 gets too (halfcheetah_ppo.yaml holds the same)
SETTINGS = {"num_envs": 8, "n_steps": 256, "epochs": 10, "minibatch": 64, "hidden": [64, 64], "lr": 3e-4,
            "gamma": 0.99, "gae_lambda": 0.95, "clip": 0.2, "max_grad_norm": 0.5}


def run_sb3(steps: int, seed: int = 0) -> dict[str, Any]:
    """SB3's PPO for ``steps`` env steps; returns steps/s of ``learn()``."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)
    venv = VecNormalize(DummyVecEnv([lambda: gym.make(ENV_ID)] * SETTINGS["num_envs"]), norm_obs=True, norm_reward=False)
    model = PPO(
        "MlpPolicy", venv, n_steps=SETTINGS["n_steps"], batch_size=SETTINGS["minibatch"], n_epochs=SETTINGS["epochs"],
        learning_rate=SETTINGS["lr"], gamma=SETTINGS["gamma"], gae_lambda=SETTINGS["gae_lambda"],
        clip_range=SETTINGS["clip"], max_grad_norm=SETTINGS["max_grad_norm"], seed=seed, device="cpu",
        policy_kwargs={"net_arch": SETTINGS["hidden"]}, verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    seconds = time.perf_counter() - t0
    venv.close()
    return {"steps": model.num_timesteps, "seconds": seconds, "env_steps_per_s": model.num_timesteps / seconds}


def run_embodied(steps: int, staleness: int, seed: int, cache: str, run_dir: Path) -> dict[str, Any]:
    """``embodied train halfcheetah_ppo`` in a subprocess, as a user runs it; its summary."""
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "halfcheetah_ppo", f"run.dir={run_dir}", f"seed={seed}",
           f"algo.total_env_steps={steps}", f"algo.staleness={staleness}", "logging.wandb=false",
           "logging.tensorboard=false", "eval.episodes=5", "checkpoint.every=0"]
    env = {**os.environ, "EMBODIED_CACHE": cache, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    total_s = time.perf_counter() - t0
    if result.returncode != 0:
        raise RuntimeError(f"embodied train failed ({result.returncode}):\n{result.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())["plan"]  # the plan the run settled on
    return {"steps": summary["env_steps"], "seconds": summary["wall_s"], "command_s": total_s,
            "env_steps_per_s": summary["env_steps"] / summary["wall_s"], "eval_return": summary["eval/episode_return"],
            "train_return": summary["train/episode_return"],
            "plan": f"{plan['mode']}, {plan['num_chunks']} chunk(s)"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per throughput run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--learning", action="store_true", help="also compare returns after --learning-steps (3 seeds)")
    parser.add_argument("--learning-steps", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    add_output_args(parser, "sb3_comparison")
    args = parser.parse_args(argv)
    try:
        import stable_baselines3
    except ImportError:
        sys.exit('this benchmark compares with Stable-Baselines3: pip install -e ".[compare]"')
    cache = tempfile.mkdtemp(prefix="embodied-cache-")  # one profile, measured in the first round, reused
    work = Path(tempfile.mkdtemp(prefix="sb3-comparison-"))
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row = {"sb3": run_sb3(args.steps, seed=r)}
        for name, staleness in (("embodied", 0), ("embodied_staleness_1", 1)):
            row[name] = run_embodied(args.steps, staleness, r, cache, work / f"{name}-{r}")
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v['env_steps_per_s']:.0f} steps/s" + (f" ({v['plan']})" if "plan" in v else "")
                                         for k, v in row.items()), flush=True)
    ratio = {name: statistics.median(row[name]["env_steps_per_s"] / row["sb3"]["env_steps_per_s"] for row in rounds)
             for name in ("embodied", "embodied_staleness_1")}
    result: dict[str, Any] = {
        "env": ENV_ID, "settings": SETTINGS, "steps_per_run": args.steps, "sb3_version": stable_baselines3.__version__,
        "rounds": rounds,
        "median_env_steps_per_s": {name: statistics.median(row[name]["env_steps_per_s"] for row in rounds) for name in rounds[0]},
        "ratio_vs_sb3": ratio,
    }
    print(f"vs SB3 (median of per-round ratios): on-policy {ratio['embodied']:.2f}x, "
          f"staleness 1 {ratio['embodied_staleness_1']:.2f}x")
    if args.learning:
        learning: dict[str, list[float]] = {"embodied": [], "embodied_staleness_1": []}
        for seed in range(args.seeds):
            for name, staleness in (("embodied", 0), ("embodied_staleness_1", 1)):
                out = run_embodied(args.learning_steps, staleness, seed, cache, work / f"learn-{name}-{seed}")
                learning[name].append(out["eval_return"])
                print(f"  {name} seed {seed}: eval return {out['eval_return']:.0f} "
                      f"({out['env_steps_per_s']:.0f} steps/s)", flush=True)
        on = learning["embodied"]
        stale = learning["embodied_staleness_1"]
        result["learning"] = {
            "steps": args.learning_steps, "eval_returns": learning,
            "on_policy_range": [min(on), max(on)], "staleness_1_mean": statistics.mean(stale),
            # within the seed spread of on-policy, or above it
            "staleness_1_not_below_on_policy_spread": statistics.mean(stale) >= min(on),
        }
        print(f"returns after {args.learning_steps:,} steps: on-policy {on}, staleness 1 {stale}")
    save_result(result_path("sb3_comparison", args, "learning" if args.learning else None), "sb3_comparison", argv, result)
    return result


if __name__ == "__main__":
    main()
