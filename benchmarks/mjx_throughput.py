"""MJX tasks' env steps per second through our env contract vs MJX's own jitted step, per batch size.

For each ``num_envs`` (default 1024, 4096, 16384 on a GPU; 16, 64, 256 on a CPU), in one process:

* ``raw``: :class:`~envs.adapters.mjx_adapter.MjxEnv` stepped in a loop (the jitted vmapped
  physics, reward, time limit and auto-reset; observations as torch tensors through DLPack);
* ``contract``: the same env through :class:`~envs.adapters.batched_adapter.BatchedVecEnv`
  (what ``make_vec_env`` returns for ``env.id=mjx/<Task>``: episode statistics, the NaN/inf check,
  final observations), with random actions made in torch on the device.

Rounds interleave the two; each reports its best and median round of ``--window`` seconds (the
device is synchronized before the clock is read). ``ratio`` is contract / raw (best rounds),
``ratio_paired`` the median of the per-round ratios. ``setup_s`` is building the env, which
compiles its step (tracing and XLA, or XLA's part loaded from JAX's persistent cache). On a GPU
it records JAX's peak memory on the device and torch's.

    python -m benchmarks.mjx_throughput                              # HalfCheetah; GPU: 1k, 4k, 16k envs
    python -m benchmarks.mjx_throughput --task Reacher --num-envs 16 64 256 --out /tmp/mjx.json

Writes ``benchmarks/results/mjx_throughput.json`` (``--out`` for another path).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result, synchronize
from envs.config import EnvConfig


def measure(step: Callable[[], None], num_envs: int, device: str, window_s: float, warmup: int = 2) -> float:
    """Env steps per second of ``step`` (one batched step of ``num_envs``) over ``window_s``."""
    for _ in range(warmup):
        step()
    synchronize(device)
    steps, start = 0, time.perf_counter()
    while True:
        step()
        steps += num_envs
        if time.perf_counter() - start >= window_s:
            synchronize(device)
            return steps / (time.perf_counter() - start)


def run(task: str, num_envs: int, device: str, rounds: int, window_s: float) -> dict[str, Any]:
    import torch

    from envs.adapters.batched_adapter import BatchedVecEnv
    from envs.registry import make_vec_env

    t0 = time.perf_counter()
    env = make_vec_env(EnvConfig(id=f"mjx/{task}", num_envs=num_envs, backend="batched", kwargs={"device": device}))
    assert isinstance(env, BatchedVecEnv)
    raw = env.env
    setup_s = time.perf_counter() - t0
    dev = env.device
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    low = torch.as_tensor(env.action_space.low, device=dev)
    high = torch.as_tensor(env.action_space.high, device=dev)
    actions = low + (high - low) * torch.rand((8, num_envs, len(low)), generator=gen, device=dev)  # (T, N, A)
    t = [0]

    def next_actions() -> Any:
        t[0] += 1
        return actions[t[0] % len(actions)]

    env.reset(seed=0)
    variants = {"raw": lambda: raw.step(next_actions()), "contract": lambda: env.step(next_actions())}
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for r in range(rounds):
            for name, step in variants.items():
                per_round[name].append(measure(step, num_envs, dev, window_s))
            print(f"  {num_envs} envs, round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in per_round.items()),
                  flush=True)
        memory = _memory(raw, dev)
    finally:
        env.close()
    results = []
    for name, values in per_round.items():
        row: dict[str, Any] = {"variant": name, "steps_per_s": round(max(values), 1),
                               "steps_per_s_median": round(statistics.median(values), 1)}
        if name != "raw":
            row["ratio"] = round(max(values) / max(per_round["raw"]), 3)
            row["ratio_paired"] = round(statistics.median(v / w for v, w in zip(values, per_round["raw"])), 3)
        results.append(row)
    return {"num_envs": num_envs, "device": dev, "setup_s": round(setup_s, 1), "results": results, **memory}


def _memory(raw: Any, device: str) -> dict[str, float]:
    """JAX's and torch's peak memory on a GPU device (GiB); nothing on the CPU."""
    if not device.startswith("cuda"):
        return {}
    import torch

    stats = raw.jax_device.memory_stats() or {}
    return {"jax_peak_memory_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 3),
            "torch_peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="HalfCheetah", help="an MJX task: HalfCheetah, Hopper, Reacher")
    parser.add_argument("--num-envs", type=int, nargs="+", default=None, help="default: 1024 4096 16384 (GPU), 16 64 256 (CPU)")
    parser.add_argument("--device", default="auto", help="env.kwargs.device: auto, cpu, cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per variant per round")
    add_output_args(parser, "mjx_throughput")
    args = parser.parse_args(argv)
    from envs.adapters.mjx_adapter import jax_device

    platform = jax_device(args.device).platform
    num_envs = args.num_envs or ([16, 64, 256] if platform == "cpu" else [1024, 4096, 16384])
    start = time.perf_counter()
    reports = []
    for n in num_envs:
        print(f"== mjx/{args.task}, {n} envs, {platform}", flush=True)
        reports.append(run(args.task, n, args.device, args.rounds, args.window))
    print(f"\n{'envs':>6} {'variant':<10} {'steps/s':>11} {'median':>11} {'ratio':>7} {'paired':>7} {'setup s':>8}")
    for report in reports:
        for row in report["results"]:
            print(f"{report['num_envs']:>6} {row['variant']:<10} {row['steps_per_s']:>11.0f} {row['steps_per_s_median']:>11.0f} "
                  f"{row.get('ratio', 1.0):>7.3f} {row.get('ratio_paired', 1.0):>7.3f} {report['setup_s']:>8.1f}")
    import jax

    result = {
        "task": args.task,
        "platform": platform,
        "jax": jax.__version__,
        "rounds": args.rounds,
        "window_s": args.window,
        "total_s": round(time.perf_counter() - start, 1),
        "runs": reports,
        "notes": ("raw: MjxEnv.step (jitted vmapped physics, reward, time limit, auto-reset; torch tensors through "
                  "DLPack). contract: the same env through BatchedVecEnv, what make_vec_env returns for mjx/<Task>. "
                  "ratio: contract / raw steps/s, best rounds; ratio_paired: median of per-round ratios. setup_s: "
                  "building the env, its compilation included (XLA's part from JAX's persistent cache if there)."),
    }
    print(f"\n{len(reports)} size(s) in {result['total_s']:.0f} s")
    return save_result(result_path("mjx_throughput", args), "mjx_throughput", argv, result)


if __name__ == "__main__":
    main()
