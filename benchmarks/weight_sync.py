"""Weight sync: time and bytes per sync of a ~100M-parameter policy, trainer -> a rollout worker.

Side by side in one run, each sync measured end to end (export in the trainer's process, Ray's
object store, load into the model in a rollout actor's process):

* ``numpy_state_dict``: what the runtime did before the WeightSyncer: every tensor of the state
  dict converted to a numpy array (float32 only: numpy has no bfloat16), then
  ``torch.as_tensor(np.array(v))`` and ``load_state_dict`` on the other side;
* ``syncer_full_fp32`` / ``syncer_full_bf16``: :class:`embodied.runtime.weights.WeightSyncer`, one
  byte buffer per dtype, copied in place;
* ``syncer_trainable_only``: the same model with a frozen base and LoRA-style adapters (rank 16 on
  every linear layer, ~3% of the weights): only the adapters travel.

    python -m benchmarks.weight_sync [--params-m 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.common import add_output_args, result_path, save_result
from embodied.runtime import Cluster, ClusterConfig
from embodied.runtime.weights import WeightSyncer


class Adapter(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (LoRA's shape)."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.T @ self.b.T


def build(params_m: int, dtype: torch.dtype, lora_rank: int | None = None, seed: int = 0) -> nn.Module:
    """An MLP stack of ~``params_m`` million parameters (width 1024, blocks of 1024 -> 4096 -> 1024)."""
    torch.manual_seed(seed)
    width, hidden = 1024, 4096
    blocks = max(1, round(params_m * 1e6 / (2 * width * hidden)))
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, hidden), nn.Linear(hidden, width)]
    if lora_rank is not None:
        layers = [Adapter(layer, lora_rank) for layer in layers]  # type: ignore[arg-type]
    return nn.Sequential(*layers).to(dtype)


class Rollout:
    """A rollout worker's side: a model of the same architecture, loaded from each payload."""

    def __init__(self, params_m: int, dtype_name: str, lora_rank: int | None) -> None:
        torch.set_num_threads(1)
        self.model = build(params_m, getattr(torch, dtype_name), lora_rank, seed=1)
        self.syncer = WeightSyncer()

    def load_syncer(self, payload: Any) -> float:
        t0 = time.perf_counter()
        self.syncer.load(self.model, payload)
        return time.perf_counter() - t0

    def load_numpy(self, payload: dict[str, np.ndarray]) -> float:
        t0 = time.perf_counter()
        self.model.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in payload.items()})
        return time.perf_counter() - t0

    def checksum(self) -> float:
        return float(sum(p.float().sum() for p in self.model.state_dict().values()))


def measure(variant: str, params_m: int, repeats: int) -> dict[str, Any]:
    import ray

    dtype_name = "bfloat16" if variant.endswith("bf16") else "float32"
    lora = 16 if variant == "syncer_trainable_only" else None
    model = build(params_m, getattr(torch, dtype_name), lora)
    remote = ray.remote(num_cpus=1)(Rollout).remote(params_m, dtype_name, lora)
    syncer = WeightSyncer()
    times, export_s, load_s, nbytes = [], [], [], 0
    for _ in range(repeats + 1):  # the first sync warms up the object store and the actor
        t0 = time.perf_counter()
        if variant == "numpy_state_dict":
            payload: Any = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
            nbytes = sum(a.nbytes for a in payload.values())
            t1 = time.perf_counter()
            loaded = ray.get(remote.load_numpy.remote(payload))
        else:
            payload = syncer.export(model, version=1)
            nbytes = payload.nbytes
            t1 = time.perf_counter()
            loaded = ray.get(remote.load_syncer.remote(payload))
        times.append(time.perf_counter() - t0)
        export_s.append(t1 - t0)
        load_s.append(loaded)
    ok = ray.get(remote.checksum.remote())
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "dtype": dtype_name, "params": total, "trainable_params": trainable, "bytes_per_sync": nbytes,
        "sync_s": statistics.median(times[1:]), "export_s": statistics.median(export_s[1:]),
        "load_s": statistics.median(load_s[1:]), "sync_all_s": times[1:], "rollout_checksum": ok,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params-m", type=int, default=100, help="model size in millions of parameters")
    parser.add_argument("--repeats", type=int, default=5)
    add_output_args(parser, "weight_sync")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    variants = ("numpy_state_dict", "syncer_full_fp32", "syncer_full_bf16", "syncer_trainable_only")
    results = {}
    with Cluster(ClusterConfig(num_cpus=2)):
        for v in variants:
            results[v] = measure(v, args.params_m, args.repeats)
            r = results[v]
            print(f"{v:24s} {r['bytes_per_sync'] / 2**20:8.1f} MiB  {r['sync_s'] * 1e3:8.1f} ms/sync "
                  f"(export {r['export_s'] * 1e3:.1f} ms, load {r['load_s'] * 1e3:.1f} ms)", flush=True)
    base = results["numpy_state_dict"]["sync_s"]
    summary = {v: {"speedup_vs_numpy": base / r["sync_s"], "bytes_vs_numpy": r["bytes_per_sync"] / results["numpy_state_dict"]["bytes_per_sync"]}
               for v, r in results.items()}
    result = {"params_m": args.params_m, "results": results, "summary": summary}
    save_result(result_path("weight_sync", args), "weight_sync", argv, result)
    return result


if __name__ == "__main__":
    main()
