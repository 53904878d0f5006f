"""Token-policy decoding with and without a key/value cache (``policy.kwargs.kv_cache``).

The M2Flow workload's VLA-shaped policy (``benchmarks/m2flow_rgb.yaml``: 128x128 rgb + state,
64 patch tokens, 8 action tokens decoded one by one) acts on random observations of the env's
shapes: without the cache each of the 8 tokens re-runs the whole prefix through the decoder, with
it the prefix runs once and each token is one position. Medians of timed calls after a warm-up,
per batch size and torch thread count; the same weights in both, and the greedy actions of the
two are checked equal before timing.

    python -m benchmarks.token_decoding [--repeats 7]

Writes ``benchmarks/results/token_decoding.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks.common import add_output_args, result_path, save_result
from embodied.config import apply_overrides
from pipelines.config import EmbodiedConfig
from pipelines.recipes import load_recipe
from policies.registry import build_policy

HERE = Path(__file__).parent
#: The env's shapes in the M2Flow workload (ManiSkill PushCube, rgb 128 + state, pd_joint_delta_pos).
OBS_SPACE = gym.spaces.Dict({
    "rgb": gym.spaces.Box(0, 255, (128, 128, 3), np.uint8),
    "state": gym.spaces.Box(-np.inf, np.inf, (25,), np.float32),
})
ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)


def time_act(policy: Any, obs: dict[str, torch.Tensor], repeats: int) -> float:
    with torch.no_grad():
        for _ in range(2):
            policy.act(obs)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            policy.act(obs)
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    add_output_args(parser, "token_decoding")
    args = parser.parse_args(argv)
    _, data = load_recipe(str(HERE / "m2flow_rgb.yaml"))
    cfg = apply_overrides(EmbodiedConfig, data, [])
    policies = {}
    for cache in (0, 1):
        torch.manual_seed(0)
        policy_cfg = apply_overrides(EmbodiedConfig, data, [f"policy.kwargs.kv_cache={cache}"]).policy
        policies[cache] = build_policy(policy_cfg, OBS_SPACE, ACTION_SPACE).eval()
    policies[1].load_state_dict(policies[0].state_dict())
    rows = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for batch in (2, 4, 8):
                gen = torch.Generator().manual_seed(batch)
                obs = {"rgb": torch.randint(0, 256, (batch, 128, 128, 3), dtype=torch.uint8, generator=gen),
                       "state": torch.randn(batch, 25, generator=gen)}
                with torch.no_grad():
                    same = torch.equal(policies[0].act(obs, deterministic=True).actions,
                                       policies[1].act(obs, deterministic=True).actions)
                if not same:
                    raise SystemExit("kv_cache=1 decoded other greedy actions than kv_cache=0: not the same function")
                plain, cached = time_act(policies[0], obs, args.repeats), time_act(policies[1], obs, args.repeats)
                rows.append({"threads": threads, "batch": batch, "no_cache_ms": 1e3 * plain, "kv_cache_ms": 1e3 * cached,
                             "speedup": plain / cached})
                print(f"  {threads} thread(s), batch {batch}: no cache {1e3 * plain:7.1f} ms, kv cache {1e3 * cached:6.1f} ms "
                      f"({plain / cached:.1f}x)", flush=True)
    finally:
        torch.set_num_threads(before)
    result = {
        "policy": {"name": cfg.policy.name, "kwargs": cfg.policy.kwargs, "action_tokens": policies[0].num_action_tokens,
                   "obs_tokens": policies[0].num_obs_tokens},
        "rows": rows,
    }
    save_result(result_path("token_decoding", args), "token_decoding", argv, result)
    return result


if __name__ == "__main__":
    main()
