"""Env worker spin-wait (``env.worker_spin_us``): paired A/B of the multiprocess backend with and
without it, on the same envs in one run.

A worker that blocks on its pipe pays a sleep and a wake-up per step; one that spins briefly
catches a fast parent's next command at once. The spin is adaptive (only while commands follow
replies within the budget) so a parent that runs a policy between steps should see no change.
Each case keeps two ``MultiprocessVecEnv`` alive (spin 0 and the default) and steps them in
alternating short windows for many rounds (this machine is shared and drifts; paired rounds see
the same drift), then reports the median of the per-round ratios and how often the spin won:

* tight loops (random actions, no work between steps): HalfCheetah 8 and 32 envs per process,
  ManiSkill PushCube state 4 envs per process, with 1 and 2 processes;
* a 2 ms "policy" between steps (a busy loop in this process): steps/s and the workers' CPU
  seconds per step must not change, i.e. the spin stays off.

    python -m benchmarks.env_worker_spin [--rounds 16] [--window 0.4]

Writes ``benchmarks/results/env_worker_spin.json``.
"""

from __future__ import annotations

import os

for _key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS"):
    os.environ.setdefault(_key, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from benchmarks.env_throughput import process_cpu_s  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.multiprocess import MultiprocessVecEnv  # noqa: E402
from envs.registry import make_vec_env  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")
warnings.filterwarnings("ignore", category=DeprecationWarning)

SPIN_US = EnvConfig().worker_spin_us
CASES = [  # (name, env config, processes, envs per process, busy seconds between steps)
    ("halfcheetah 8/proc x1", EnvConfig(id="HalfCheetah-v5"), 1, 8, 0.0),
    ("halfcheetah 32/proc x1", EnvConfig(id="HalfCheetah-v5"), 1, 32, 0.0),
    ("halfcheetah 32/proc x2", EnvConfig(id="HalfCheetah-v5"), 2, 32, 0.0),
    ("pushcube state 4/proc x1", EnvConfig(id="PushCube-v1"), 1, 4, 0.0),
    ("pushcube state 4/proc x2", EnvConfig(id="PushCube-v1"), 2, 4, 0.0),
    ("halfcheetah 8/proc x1, 2 ms policy", EnvConfig(id="HalfCheetah-v5"), 1, 8, 0.002),
]


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def window(env: MultiprocessVecEnv, actions: np.ndarray, seconds: float, gap_s: float) -> tuple[float, float]:
    """(env steps/s, worker CPU seconds per batch step) over one window of back-to-back steps."""
    for t in range(5):  # the spin decision looks at the last few gaps
        env.step(actions[t % len(actions)])
    cpu0 = sum(process_cpu_s(pid) for pid in env.pids)
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
        if gap_s:
            busy(gap_s)
    wall = time.perf_counter() - t0
    cpu = sum(process_cpu_s(pid) for pid in env.pids) - cpu0
    return steps * env.num_envs / wall, cpu / steps


def run_case(name: str, cfg: EnvConfig, procs: int, per_proc: int, gap_s: float, rounds: int, seconds: float) -> dict[str, Any]:
    envs = {}
    for spin in (0, SPIN_US):
        envs[spin] = make_vec_env(replace(cfg, num_envs=procs * per_proc, num_procs=procs, backend="multiprocess", worker_spin_us=spin))
        envs[spin].reset(seed=0)
    try:
        space = envs[0].action_space
        actions = np.random.default_rng(0).uniform(space.low, space.high, (16, procs * per_proc, *space.shape)).astype(np.float32)
        rate: dict[int, list[float]] = {0: [], SPIN_US: []}
        cpu: dict[int, list[float]] = {0: [], SPIN_US: []}
        for r in range(rounds):
            order = (0, SPIN_US) if r % 2 == 0 else (SPIN_US, 0)  # neither always goes first
            for spin in order:
                steps_per_s, cpu_per_step = window(envs[spin], actions, seconds, gap_s)
                rate[spin].append(steps_per_s)
                cpu[spin].append(cpu_per_step)
    finally:
        for env in envs.values():
            env.close()
    ratios = [b / a for a, b in zip(rate[0], rate[SPIN_US])]
    result = {
        "case": name,
        "env": cfg.id,
        "procs": procs,
        "envs_per_proc": per_proc,
        "policy_gap_s": gap_s,
        "spin_active": envs[SPIN_US].spin_s > 0,
        "steps_per_s_no_spin": statistics.median(rate[0]),
        "steps_per_s_spin": statistics.median(rate[SPIN_US]),
        "paired_ratio_median": statistics.median(ratios),
        "spin_won_rounds": sum(r > 1 for r in ratios) / len(ratios),
        "worker_cpu_ms_per_step_no_spin": 1e3 * statistics.median(cpu[0]),
        "worker_cpu_ms_per_step_spin": 1e3 * statistics.median(cpu[SPIN_US]),
    }
    print(f"  {name:<36} no spin {result['steps_per_s_no_spin']:8.0f}/s  spin {result['steps_per_s_spin']:8.0f}/s  "
          f"paired x{result['paired_ratio_median']:.3f}  spin won {100 * result['spin_won_rounds']:.0f}% of rounds  "
          f"worker cpu/step {result['worker_cpu_ms_per_step_no_spin']:.3f} -> {result['worker_cpu_ms_per_step_spin']:.3f} ms",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--window", type=float, default=0.4, help="seconds per window")
    parser.add_argument("--only", default=None, help="run only cases whose name contains this")
    args = parser.parse_args()
    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    start = time.perf_counter()
    load_before = os.getloadavg()
    print(f"env worker spin: {SPIN_US} us vs 0, {args.rounds} paired rounds of {args.window} s", flush=True)
    results = [run_case(*case, rounds=args.rounds, seconds=args.window) for case in CASES if not args.only or args.only in case[0]]
    path = write_result("env_worker_spin", {
        "benchmark": "env_worker_spin",
        "command": "python -m benchmarks.env_worker_spin",
        "spin_us": SPIN_US,
        "rounds": args.rounds,
        "window_s": args.window,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "total_s": round(time.perf_counter() - start, 1),
        "cases": results,
        "notes": "Paired rounds: each round steps both envs (spin 0, then the default, order alternating) for one window; "
                 "paired_ratio_median is the median over rounds of spin/no-spin steps/s. worker CPU per step from /proc "
                 "(10 ms resolution, summed over a window).",
    })
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
