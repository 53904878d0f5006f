"""Spin-waiting in the multiprocess backend (``env.worker_spin_us``): paired A/B/C of the same envs
in one run, without any spin, with the workers' spin only, and with the parent's too (the default).

A worker that blocks on its pipe pays a sleep and a wake-up per step; one that spins briefly
catches a fast parent's next command at once. A parent that blocks for a step's reply pays a
wake-up too; it sleeps through the step and polls only around the step's typical duration
(:class:`~envs.multiprocess.ReplyWaiter`, only with fewer worker processes than cores). Both are
adaptive, so a parent that runs a policy between steps should see no change from the workers'
spin. Each case keeps three ``MultiprocessVecEnv`` alive and steps them in alternating short
windows for many rounds (this machine is shared and drifts; paired rounds see the same drift),
then reports medians of the per-round ratios and how often each side won:

* tight loops (random actions, no work between steps): HalfCheetah 8 and 32 envs per process,
  ManiSkill PushCube state 4 envs per process, with 1 and 2 processes;
* a 2 ms "policy" between steps (a busy loop in this process): steps/s and the workers' CPU
  seconds per step must not change, i.e. the workers' spin stays off;
* first, the round trip alone: one stand-in env that busy-waits 0, 200 or 1000 us per step, and
  what each step costs beyond that.

    python -m benchmarks.env_worker_spin [--rounds 16] [--window 0.4]

Writes ``benchmarks/results/env_worker_spin.json``.
"""

from __future__ import annotations

import os

for _key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS"):
    os.environ.setdefault(_key, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import add_output_args, result_path, save_result  # noqa: E402
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


def window(env: MultiprocessVecEnv, actions: np.ndarray, seconds: float, gap_s: float) -> tuple[float, float, float]:
    """(env steps/s, worker CPU seconds per batch step, this process's CPU seconds per batch step)
    over one window of back-to-back steps."""
    for t in range(5):  # the spin decisions look at the last few steps
        env.step(actions[t % len(actions)])
    cpu0, parent0 = sum(process_cpu_s(pid) for pid in env.pids), time.process_time()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
        if gap_s:
            busy(gap_s)
    wall = time.perf_counter() - t0
    cpu = sum(process_cpu_s(pid) for pid in env.pids) - cpu0
    return steps * env.num_envs / wall, cpu / steps, (time.process_time() - parent0) / steps


#: The variants of each case: (worker_spin_us, whether the parent polls for replies).
VARIANTS = {"off": (0, False), "workers": (SPIN_US, False), "both": (SPIN_US, True)}


def _parent_blocks(env: MultiprocessVecEnv) -> MultiprocessVecEnv:
    """The workers' spin alone: the parent blocks for every reply."""
    env.set_reply_spin(0.0)
    return env


def _make(cfg: EnvConfig, procs: int, per_proc: int, spin_us: int, parent: bool) -> MultiprocessVecEnv:
    env = make_vec_env(replace(cfg, num_envs=procs * per_proc, num_procs=procs, backend="multiprocess", worker_spin_us=spin_us))
    if not parent:
        _parent_blocks(env)
    env.reset(seed=0)
    return env


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """(median of b/a per round, share of rounds where b was faster)."""
    ratios = [y / x for x, y in zip(a, b)]
    return statistics.median(ratios), sum(r > 1 for r in ratios) / len(ratios)


def run_case(name: str, cfg: EnvConfig, procs: int, per_proc: int, gap_s: float, rounds: int, seconds: float) -> dict[str, Any]:
    envs = {}
    try:
        for variant, (spin_us, parent) in VARIANTS.items():
            envs[variant] = _make(cfg, procs, per_proc, spin_us, parent)
        space = envs["off"].action_space
        actions = np.random.default_rng(0).uniform(space.low, space.high, (16, procs * per_proc, *space.shape)).astype(np.float32)
        rate: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        parent_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        names = list(VARIANTS)
        for r in range(rounds):
            for variant in names[r % 3:] + names[: r % 3]:  # each goes first in turn
                steps_per_s, cpu_per_step, parent_per_step = window(envs[variant], actions, seconds, gap_s)
                rate[variant].append(steps_per_s)
                cpu[variant].append(cpu_per_step)
                parent_cpu[variant].append(parent_per_step)
        workers_active = envs["both"].spin_s > 0
        parent_active = envs["both"].reply_spin_s > 0
    finally:
        for env in envs.values():
            env.close()
    workers, workers_won = _paired(rate["off"], rate["workers"])
    parent, parent_won = _paired(rate["workers"], rate["both"])
    both, both_won = _paired(rate["off"], rate["both"])
    result = {
        "case": name,
        "env": cfg.id,
        "procs": procs,
        "envs_per_proc": per_proc,
        "policy_gap_s": gap_s,
        "workers_spin_active": workers_active,
        "parent_spin_active": parent_active,
        "steps_per_s": {v: statistics.median(rate[v]) for v in VARIANTS},
        "paired_ratio_workers_vs_off": workers,
        "workers_won_rounds": workers_won,
        "paired_ratio_parent_vs_workers_only": parent,
        "parent_won_rounds": parent_won,
        "paired_ratio_both_vs_off": both,
        "both_won_rounds": both_won,
        "worker_cpu_ms_per_step": {v: 1e3 * statistics.median(cpu[v]) for v in VARIANTS},
        "parent_cpu_ms_per_step": {v: 1e3 * statistics.median(parent_cpu[v]) for v in VARIANTS},
    }
    print(f"  {name:<36} off {result['steps_per_s']['off']:8.0f}/s  workers x{workers:.3f} (won {100 * workers_won:.0f}%)  "
          f"+parent x{parent:.3f} (won {100 * parent_won:.0f}%)  both x{both:.3f}  "
          f"parent cpu/step {result['parent_cpu_ms_per_step']['workers']:.3f} -> {result['parent_cpu_ms_per_step']['both']:.3f} ms",
          flush=True)
    return result


class BusyEnv(gym.Env):
    """A stand-in simulator that busy-waits ``work_s`` per step: the round trip around it is
    the backend's cost alone."""

    observation_space = gym.spaces.Box(-1, 1, (17,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (6,), np.float32)

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.obs = np.zeros(17, np.float32)

    def reset(self, *, seed=None, options=None):
        return self.obs, {}

    def step(self, action):
        busy(self.work_s)
        return self.obs, 0.0, False, False, {}


def round_trips(steps: int = 2000) -> list[dict[str, Any]]:
    """Microseconds a step costs beyond its ``work_s``, one env in one worker process, per variant."""
    rows = []
    for work_s in (0.0, 200e-6, 1e-3):
        row: dict[str, Any] = {"work_us": work_s * 1e6}
        for variant, (spin_us, parent) in VARIANTS.items():
            env = MultiprocessVecEnv([functools.partial(BusyEnv, work_s)], 1, spin_s=spin_us * 1e-6)
            if not parent:
                _parent_blocks(env)
            try:
                env.reset(seed=0)
                actions = np.zeros((1, 6), np.float32)
                n = steps if work_s < 1e-3 else steps // 2
                for _ in range(100):
                    env.step(actions)
                t0 = time.perf_counter()
                for _ in range(n):
                    env.step(actions)
                row[f"overhead_us_{variant}"] = ((time.perf_counter() - t0) / n - work_s) * 1e6
            finally:
                env.close()
        print(f"  round trip around {row['work_us']:6.0f} us of work: "
              + ", ".join(f"{v} {row[f'overhead_us_{v}']:.0f} us" for v in VARIANTS), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--window", type=float, default=0.4, help="seconds per window")
    parser.add_argument("--only", default=None, help="run only cases whose name contains this")
    add_output_args(parser, "env_worker_spin")
    args = parser.parse_args(argv)
    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    start = time.perf_counter()
    load_before = os.getloadavg()
    print(f"env spin-waits: {SPIN_US} us, off / workers only / workers and parent, {args.rounds} rounds of {args.window} s", flush=True)
    trips = round_trips()
    results = [run_case(*case, rounds=args.rounds, seconds=args.window) for case in CASES if not args.only or args.only in case[0]]
    result = {
        "spin_us": SPIN_US,
        "rounds": args.rounds,
        "window_s": args.window,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "total_s": round(time.perf_counter() - start, 1),
        "round_trips": trips,
        "cases": results,
        "notes": "Paired rounds: each round steps the three envs (no spin; the workers' spin only; workers' and parent's, "
                 "the default) for one window each, the first one rotating; paired ratios are medians over rounds of the "
                 "per-round steps/s ratios. Worker CPU per step from /proc (10 ms resolution, summed over a window); parent "
                 "CPU per step from this process's process_time (includes the busy 'policy' of the 2 ms case).",
    }
    print(f"{len(results)} case(s) in {result['total_s']:.0f} s")
    save_result(result_path("env_worker_spin", args), "env_worker_spin", argv, result)


if __name__ == "__main__":
    main()
