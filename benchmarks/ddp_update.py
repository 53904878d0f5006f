"""PPO update throughput of 1 vs 2 data-parallel trainer ranks (DDP over gloo, CPU).

The update alone: the real ``TrainerWorker`` ranks (Ray actors, each pinned to a core of its
own, one torch thread) update on one global batch that already sits in Ray's object store, so
neither the collection nor the batch's transfer is timed, only ``TrainerWorker.update``
(advantages, epochs of minibatches, forward/backward of each rank's block, the all-reduce of the
gradients, the optimizer step). The policy is an MLP large enough that the update is
compute-bound (default 3 x 1024 hidden units for actor and critic, ~4.2M parameters, 17 MB of
gradients per all-reduce). Configurations, interleaved round by round:

* ``1 rank x 1 thread``: the baseline (one core);
* ``2 ranks x 1 thread``: data parallel, one core each (the target: >= 1.5x the baseline);
* ``1 rank x 2 threads``: torch's intra-op threads on the same two cores, for comparison.

    python -m benchmarks.ddp_update [--hidden 1024] [--layers 3] [--rounds 5] [--smoke]

Writes ``benchmarks/results/ddp_update.json`` (``--smoke``: a tiny model and one round, to check
that it runs; nothing written).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from gymnasium import spaces

from benchmarks.common import write_result
from embodied.config import apply_overrides
from embodied.rl import TrajectoryBatch
from embodied.runtime import Cluster, ClusterConfig, RankResources, WorkerGroup
from embodied.runtime.weights import state_of
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workers import Pinning, TrainerWorker

OBS_DIM = 32
OBS = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)})
ACT = spaces.Box(-1.0, 1.0, (8,), np.float32)


def config(hidden: int, layers: int, envs: int, steps: int, minibatches: int) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, [
        "env.id=Pendulum-v1", f"env.num_envs={envs}", f"algo.rollout_steps={steps}", f"algo.num_minibatches={minibatches}",
        "algo.epochs=1", f"policy.hidden_sizes={[hidden] * layers}", "cluster.timeout_s=600", "cluster.phase_timeout_s=3600",
    ])


def batch(envs: int, steps: int, seed: int = 0) -> TrajectoryBatch:
    """A random PPO batch of ``steps`` decisions of ``envs`` envs (continuous actions)."""
    rng = np.random.default_rng(seed)
    return TrajectoryBatch(
        obs={"state": rng.normal(size=(steps, envs, OBS_DIM)).astype(np.float32)},
        actions=rng.uniform(-1, 1, size=(steps, envs, 8)).astype(np.float32),
        logprobs=rng.normal(-8.0, 0.5, size=(steps, envs)).astype(np.float32),
        rewards=rng.normal(size=(steps, envs, 1)).astype(np.float32),
        terminated=rng.random((steps, envs, 1)) < 0.02,
        truncated=np.zeros((steps, envs, 1), bool),
        valid=np.ones((steps, envs, 1), bool),
        values=rng.normal(size=(steps, envs)).astype(np.float32),
        final_values=np.zeros((steps, envs), np.float32),
        last_values=rng.normal(size=(envs,)).astype(np.float32),
    ).check()


class Setup:
    """One configuration: ``ranks`` trainer ranks with ``threads`` torch threads each, rank i
    pinned to cores ``[i * threads, (i + 1) * threads)``."""

    def __init__(self, cluster: Cluster, cfg: EmbodiedConfig, ranks: int, threads: int) -> None:
        self.name = f"{ranks} rank{'s' if ranks > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        self.ranks, self.threads = ranks, threads
        pins = tuple(Pinning(tuple(range(i * threads, (i + 1) * threads)), threads) for i in range(ranks))
        threads_env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        self.group = WorkerGroup(cluster, TrainerWorker, ranks, cfg, OBS, ACT, pins, name=f"bench-{ranks}x{threads}",
                                 resources=RankResources(0.01, env_vars=threads_env))
        if ranks > 1:
            host, port = self.group.on(0).rendezvous().result()
            self.group.remote.join(host, port).wait()
        self.update_s: list[float] = []

    def update(self, batch_ref: Any, lr: float) -> float:
        t0 = time.perf_counter()
        stats = self.group.remote.update(batch_ref, lr).as_phase().wait()
        wall_s = time.perf_counter() - t0
        self.update_s.append(max(s["time/train_s"] for s in stats))  # the slowest rank's update
        return wall_s

    def weights(self) -> dict[str, Any]:
        return state_of(self.group.remote.export_weights().wait()[0])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024, help="hidden units per layer (actor and critic)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64, help="decisions per env: envs x steps samples per update")
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed updates per configuration (after one warm-up)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one round: check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.envs, args.steps, args.rounds = 64, 2, 4, 16, 1
    import ray
    import torch

    cfg = config(args.hidden, args.layers, args.envs, args.steps, args.minibatches)
    samples = args.envs * args.steps
    with Cluster(ClusterConfig(num_cpus=4, timeout_s=600, phase_timeout_s=3600)) as cluster:
        batch_ref = ray.put(batch(args.envs, args.steps))
        setups = [Setup(cluster, cfg, 1, 1), Setup(cluster, cfg, 2, 1), Setup(cluster, cfg, 1, 2)]
        for setup in setups:  # warm-up: first-call costs (allocations, DDP's first buckets)
            setup.update(batch_ref, cfg.algo.lr)
            setup.update_s.clear()
        for _ in range(args.rounds):  # interleaved: the machine's drift hits every setup alike
            for setup in setups:
                setup.update(batch_ref, cfg.algo.lr)
        reference = setups[0].weights()
        same = {s.name: max(float((s.weights()[k] - reference[k]).abs().max()) for k in reference) for s in setups[1:]}
        params = sum(v.numel() for v in reference.values())
    rows = []
    for s in setups:
        median = statistics.median(s.update_s)
        rows.append({"setup": s.name, "ranks": s.ranks, "threads": s.threads, "update_s": s.update_s,
                     "median_update_s": median, "samples_per_s": samples * cfg.algo.epochs / median})
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["speedup"] = row["samples_per_s"] / base
        print(f"{row['setup']:>18}: {row['median_update_s']:.3f} s/update, {row['samples_per_s']:8.0f} samples/s, "
              f"{row['speedup']:.2f}x")
    result = {
        "benchmark": "ddp_update",
        "model": {"hidden": [args.hidden] * args.layers, "parameters": params, "obs_dim": OBS_DIM, "action_dim": 8},
        "update": {"samples": samples, "minibatches": args.minibatches, "epochs": cfg.algo.epochs, "rounds": args.rounds},
        "torch": torch.__version__,
        "results": rows,
        "speedup_2_ranks": rows[1]["speedup"],
        "max_weight_difference_vs_1_rank": same,  # the same steps, up to float summation order
    }
    where = "(smoke run: not written)" if args.smoke else f"-> {write_result('ddp_update', result)}"
    print(f"2 ranks: {rows[1]['speedup']:.2f}x the update throughput of 1 rank {where}")
    return result


if __name__ == "__main__":
    main()
