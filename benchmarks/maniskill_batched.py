"""ManiSkill's batched simulation (GPU) through our env contract vs ManiSkill's own vectorized loop.

For each ``num_envs`` (default 256, 1024, 4096 on CUDA), in one process, with the same task and
kwargs as our adapter (``make_vec_env`` with ``env.backend=inprocess`` on a CUDA machine):

* ``raw``: ManiSkill's ``ManiSkillVectorEnv`` (auto-reset on) stepped in a loop with random
  actions on the device, nothing of ours;
* ``contract step``: the same envs through :class:`~envs.adapters.batched_adapter.BatchedVecEnv`
  (episode returns and lengths, final observations, success, all in torch on the device);
* ``contract chunk8``: ``chunk_step`` with 8 actions per env (the masked batched chunk). Only
  valid steps count: after an episode ends inside a chunk, the simulator still steps that env
  for the rest of the chunk (masked out), about (C - 1) / 2 steps per episode.

Rounds interleave the variants; each reports its best and median round of ``--window`` seconds
(the device is synchronized before the clock is read). ``ratio`` is contract / raw (best rounds),
``ratio_paired`` the median of the per-round ratios. On CUDA it also records the simulator's GPU
memory.

    python -m benchmarks.maniskill_batched                      # CUDA: 256, 1024, 4096 envs
    python -m benchmarks.maniskill_batched --num-envs 256 2048
    python -m benchmarks.maniskill_batched --sim-backend physx_cpu --num-envs 1 --out /tmp/ms.json
        # the same code on ManiSkill's CPU simulation (one env: its CPU backend holds no more);
        # a check that the benchmark runs, not a GPU measurement

Writes ``benchmarks/results/maniskill_batched.json`` (``--out`` for another path).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result, synchronize
from envs.config import EnvConfig

warnings.filterwarnings("ignore", category=DeprecationWarning)  # ManiSkill's numpy deprecations


def measure(step: Callable[[], int], device: str, window_s: float, warmup: int = 3) -> float:
    """Env steps per second of ``step`` (which returns the env steps it did) over ``window_s``."""
    for _ in range(warmup):
        step()
    synchronize(device)
    steps, start = 0, time.perf_counter()
    while True:
        steps += step()
        if time.perf_counter() - start >= window_s:
            synchronize(device)
            return steps / (time.perf_counter() - start)


def run(env_id: str, obs_mode: str, num_envs: int, sim_backend: str, rounds: int, window_s: float) -> dict[str, Any]:
    import torch
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    from envs.adapters.batched_adapter import BatchedVecEnv
    from envs.adapters.maniskill_adapter import ManiSkillBatchedEnv, check_task, make_raw_maniskill

    check_task(env_id)
    cfg = EnvConfig(id=env_id, num_envs=num_envs, obs_mode=obs_mode, backend="inprocess")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    raw = ManiSkillVectorEnv(make_raw_maniskill(cfg, sim_backend, num_envs), num_envs, auto_reset=True, record_metrics=False)
    ours = BatchedVecEnv(ManiSkillBatchedEnv(cfg, sim_backend))
    setup_s = time.perf_counter() - t0
    device = ours.device
    act_dim = int(ours.action_space.shape[0])
    gen = torch.Generator(device=device).manual_seed(0)
    actions = torch.rand((16, num_envs, 8, act_dim), generator=gen, device=device) * 2 - 1  # (T, N, C, A)
    t = [0]

    def next_actions() -> Any:
        t[0] += 1
        return actions[t[0] % len(actions)]

    def raw_step() -> int:
        raw.step(next_actions()[:, 0])
        return num_envs

    def contract_step() -> int:
        ours.step(next_actions()[:, 0])
        return num_envs

    def contract_chunk() -> int:
        return int(ours.chunk_step(next_actions()).valid.sum())

    variants = {"raw": raw_step, "contract step": contract_step, "contract chunk8": contract_chunk}
    raw.reset(seed=0)
    ours.reset(seed=0)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for r in range(rounds):
            for name, step in variants.items():
                per_round[name].append(measure(step, device, window_s))
            print(f"  {num_envs} envs, round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in per_round.items()), flush=True)
    finally:
        raw.close()
        ours.close()
    results = []
    for name, values in per_round.items():
        row: dict[str, Any] = {"variant": name, "steps_per_s": round(max(values), 1), "steps_per_s_median": round(statistics.median(values), 1)}
        if name != "raw":
            row["ratio"] = round(max(values) / max(per_round["raw"]), 3)
            row["ratio_paired"] = round(statistics.median(v / w for v, w in zip(values, per_round["raw"])), 3)
        results.append(row)
    report: dict[str, Any] = {"num_envs": num_envs, "device": device, "setup_s": round(setup_s, 1), "results": results}
    if device.startswith("cuda"):
        report["gpu_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return report


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="PushCube-v1")
    parser.add_argument("--obs-mode", default="state", choices=["state", "rgb", "state+rgb"])
    parser.add_argument("--num-envs", type=int, nargs="+", default=None, help="default: 256 1024 4096 (1 on physx_cpu)")
    parser.add_argument("--sim-backend", default=None, help="physx_cuda (default with CUDA) or physx_cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=3.0, help="seconds per variant per round")
    add_output_args(parser, "maniskill_batched")
    args = parser.parse_args(argv)
    import torch

    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    sim_backend = args.sim_backend or ("physx_cuda" if torch.cuda.is_available() else "physx_cpu")
    num_envs = args.num_envs or ([256, 1024, 4096] if sim_backend == "physx_cuda" else [1])
    start = time.perf_counter()
    reports = []
    for n in num_envs:
        print(f"== {args.env_id} {args.obs_mode}, {n} envs, {sim_backend}", flush=True)
        reports.append(run(args.env_id, args.obs_mode, n, sim_backend, args.rounds, args.window))
    print(f"\n{'envs':>6} {'variant':<16} {'steps/s':>11} {'median':>11} {'ratio':>7} {'paired':>7}")
    for report in reports:
        for row in report["results"]:
            print(
                f"{report['num_envs']:>6} {row['variant']:<16} {row['steps_per_s']:>11.0f} {row['steps_per_s_median']:>11.0f} "
                f"{row.get('ratio', 1.0):>7.3f} {row.get('ratio_paired', 1.0):>7.3f}"
            )
    result = {
        "env_id": args.env_id,
        "obs_mode": args.obs_mode,
        "sim_backend": sim_backend,
        "rounds": args.rounds,
        "window_s": args.window,
        "total_s": round(time.perf_counter() - start, 1),
        "runs": reports,
        "notes": (
            "raw: ManiSkillVectorEnv (auto-reset) stepped with random actions on the device. contract step: the same "
            "envs through BatchedVecEnv(ManiSkillBatchedEnv), what make_vec_env returns with env.backend=inprocess on "
            "CUDA. contract chunk8: chunk_step with 8 actions per env; steps counted where valid. ratio: contract / raw "
            "steps/s, best rounds; ratio_paired: median of per-round ratios."
        ),
    }
    print(f"\n{len(reports)} size(s) in {result['total_s']:.0f} s")
    return save_result(result_path("maniskill_batched", args), "maniskill_batched", argv, result)


if __name__ == "__main__":
    main()
