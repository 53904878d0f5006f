"""OpenVLA at its real size on one device: decoding, a LoRA training step, weight sync, context switch.

The model is built from openvla-7b's ``config.json`` (Prismatic DINOv2-L + SigLIP-so400m at 224 px,
Llama-2-7B: 7.54B parameters) with random weights directly on the device, in bf16: no checkpoint
can be downloaded here, and every number below depends on shapes, not on weight values. It
measures the operations the pipeline's workers run, at the model level:

* **decode**: ``OpenVLA.generate`` (7 action tokens one by one with a key/value cache, as
  OpenVLA's rollout) and ``OpenVLAOFT.parallel`` (a chunk of 8 x 7 action tokens in one
  bidirectional pass, as OpenVLA-OFT's) per batch size: seconds per call and env actions per second;
* **train**: LoRA (rank 32 on every linear layer of the Llama) with AdamW on the adapters; one
  step = the teacher-forced ``score`` pass over the 7 action tokens, a PPO-style surrogate,
  backward, optimizer step; seconds and peak device memory per batch size;
* **weight sync**: :class:`~embodied.runtime.weights.WeightSyncer` export (device -> host bytes)
  and load (host bytes -> the model in place) of the LoRA adapters (what a LoRA run sends the
  rollout) and of all bf16 weights (a full fine-tune), checked bit for bit; the first export
  allocates the syncer's pinned host buffer, the second (timed as the export) reuses it;
* **context switch**: :class:`~embodied.offload.Offloader` moves the weights, the adapters'
  gradients and AdamW state to pinned host memory and back, twice (the first cycle allocates the
  host buffers): seconds each way and device memory freed.

    python -m benchmarks.vla_real_size                          # CUDA, openvla-7b shapes, bf16
    python -m benchmarks.vla_real_size --tiny --out /tmp/v.json  # the same code on a tiny model (CPU check)

Writes ``benchmarks/results/vla_real_size.json`` (``vla_real_size_tiny.json`` with ``--tiny``; ``--out`` for
another path).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.common import add_output_args, result_path, save_result, synchronize
from embodied.offload import Offloader
from embodied.runtime.weights import WeightSyncer
from policies.vla.config import VLAConfig
from policies.vla.lora import apply_lora
from policies.vla.oft import OpenVLAOFT
from policies.vla.processor import PromptBatch
from policies.vla.sampling import Sampler, gather
from policies.vla.tiny import tiny_config

#: openvla-7b's config.json as released (text_config is the diff to LlamaConfig's defaults).
OPENVLA_7B = {
    "vision_backbone_id": "dinosiglip-vit-so-224px", "llm_backbone_id": "llama2-7b-pure",
    "use_fused_vision_backbone": True, "image_resize_strategy": "resize-naive", "pad_token_id": 32000,
    "pad_to_multiple_of": 64, "n_action_bins": 256, "torch_dtype": "bfloat16",
    "text_config": {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16", "vocab_size": 32064},
}
ACTION_DIM = 7  # OpenVLA's end-effector deltas and gripper
OFT_CHUNK = 8  # OpenVLA-OFT's LIBERO action chunk
PROMPT_TOKENS = 22  # "In: What action should the robot take to pick up the red cube?\nOut: " in Llama-2's tokenizer
GIB = 2**30


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    """Median and all samples of ``fn``'s wall time (the device synchronized around each call)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def build(config: VLAConfig, device: torch.device, dtype: torch.dtype, seed: int) -> OpenVLAOFT:
    """The model with random weights, created on ``device`` (no host copy of 7.5B parameters)."""
    torch.manual_seed(seed)
    with device:
        model = OpenVLAOFT(config, "sdpa")
    with torch.no_grad():  # parameters in ``dtype``, buffers (rotary frequencies) as built, as the loader fills them
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return model.eval().requires_grad_(False)


def inputs(config: VLAConfig, batch: int, device: torch.device, seed: int) -> tuple[torch.Tensor, PromptBatch]:
    """Random pixel values (B, 1 image, 3 * towers, S, S) and prompts of ``PROMPT_TOKENS`` ids
    after BOS, ending with the trailing-space token, as OpenVLA's processor makes them."""
    gen = torch.Generator().manual_seed(seed)
    size, channels = config.image_size, 3 * len(config.towers)
    pixels = torch.randn(batch, 1, channels, size, size, generator=gen)
    first_action = config.vocab_size - config.n_action_bins
    words = torch.randint(3, first_action, (batch, PROMPT_TOKENS - 1), generator=gen)
    lists = [[1, *row.tolist(), 3] for row in words]  # BOS, words, the trailing-space token
    return pixels.to(device), PromptBatch.from_token_lists(lists, config.pad_token_id).to(device)


def decode(model: OpenVLAOFT, config: VLAConfig, batches: list[int], repeats: int, device: torch.device) -> list[dict[str, Any]]:
    sampler = Sampler(temperature=1.0)
    rows = []
    for batch in batches:
        pixels, prompt = inputs(config, batch, device, seed=batch)
        with torch.no_grad():
            ar_s, ar_all = timed(lambda: model.generate(model.prefix(pixels), prompt, ACTION_DIM, sampler, False), device, repeats,
                                 warmup=3)
            par_s, par_all = timed(lambda: model.parallel(model.prefix(pixels), prompt, OFT_CHUNK * ACTION_DIM), device, repeats,
                                   warmup=3)
        rows.append({
            "batch": batch,
            "openvla_generate_s": ar_s, "openvla_generate_samples_s": ar_all,
            "openvla_actions_per_s": batch / ar_s,
            "oft_parallel_s": par_s, "oft_parallel_samples_s": par_all,
            "oft_actions_per_s": batch * OFT_CHUNK / par_s,
        })
        print(f"decode  B={batch:3d}: OpenVLA generate {ar_s * 1e3:8.1f} ms ({batch / ar_s:7.1f} actions/s)   "
              f"OFT parallel chunk {OFT_CHUNK} {par_s * 1e3:8.1f} ms ({batch * OFT_CHUNK / par_s:8.1f} actions/s)")
    return rows


def train_step(model: OpenVLAOFT, optimizer: torch.optim.Optimizer, config: VLAConfig, batch: int,
               device: torch.device) -> Callable[[], float]:
    pixels, prompt = inputs(config, batch, device, seed=1000 + batch)
    gen = torch.Generator().manual_seed(batch)
    first = config.vocab_size - config.n_action_bins
    tokens = torch.randint(first, config.vocab_size, (batch, ACTION_DIM), generator=gen).to(device)
    old = torch.full((batch, ACTION_DIM), -5.5, device=device)  # about log(1 / 256)
    advantages = torch.randn(batch, generator=gen).to(device)

    def step() -> float:
        logits, _ = model.score(model.prefix(pixels), prompt, tokens)
        logp = gather(torch.log_softmax(logits.float(), -1), tokens - first)
        ratio = (logp - old).exp()
        surrogate = torch.minimum(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None])
        loss = -surrogate.mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def train(model: OpenVLAOFT, config: VLAConfig, batches: list[int], repeats: int, device: torch.device,
          lora_rank: int) -> tuple[list[dict[str, Any]], torch.optim.Optimizer]:
    apply_lora(model, lora_rank, 2.0 * lora_rank, "all-linear")
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    rows = []
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            seconds, samples = timed(train_step(model, optimizer, config, batch, device), device, repeats)
        except torch.cuda.OutOfMemoryError as err:
            rows.append({"batch": batch, "error": f"out of memory: {str(err).splitlines()[0]}"})
            print(f"train   B={batch:3d}: out of memory")
            optimizer.zero_grad(set_to_none=False)
            torch.cuda.empty_cache()
            continue
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        rows.append({"batch": batch, "step_s": seconds, "step_samples_s": samples, "samples_per_s": batch / seconds,
                     "peak_device_gib": None if peak is None else peak / GIB})
        print(f"train   B={batch:3d}: LoRA r{lora_rank} step {seconds * 1e3:8.1f} ms ({batch / seconds:6.1f} samples/s)"
              + ("" if peak is None else f", peak {peak / GIB:.1f} GiB"))
    return rows, optimizer


def weight_sync(model: OpenVLAOFT, device: torch.device) -> dict[str, Any]:
    """Export, then overwrite a few of the exported tensors (a rollout holding older weights),
    then load: the load must restore them bit for bit."""
    out = {}
    for name, syncer in (("lora_adapters", WeightSyncer(trainable_only=True)), ("all_weights", WeightSyncer(trainable_only=False))):
        synchronize(device)
        t0 = time.perf_counter()
        payload = syncer.export(model, version=1)  # the first export allocates (and pins) its host buffer
        first_export_s = time.perf_counter() - t0
        del payload  # as a trainer's does once Ray's object store has it: the next export reuses the buffer
        t0 = time.perf_counter()
        payload = syncer.export(model, version=1)
        export_s = time.perf_counter() - t0
        if device.type == "cpu":  # CPU payloads are views of the weights until Ray's object store copies them
            payload = dataclasses.replace(payload, arrays=tuple(np.array(a) for a in payload.arrays))
        tensors = syncer.tensors(model)
        stale = [k for k, t in tensors.items() if t.is_floating_point()][:: max(1, len(tensors) // 8)]
        reference = {k: tensors[k].detach().clone() for k in stale}
        with torch.no_grad():
            for k in stale:
                tensors[k].add_(1.0)
        synchronize(device)
        t0 = time.perf_counter()
        syncer.load(model, payload)
        synchronize(device)
        load_s = time.perf_counter() - t0
        exact = all(torch.equal(tensors[k].detach(), v) for k, v in reference.items())
        out[name] = {"tensors": len(payload.slots), "bytes": payload.nbytes, "dtypes": sorted(payload.dtypes),
                     "first_export_s": first_export_s, "export_s": export_s, "load_s": load_s,
                     "host_buffers": syncer.staging.allocations,
                     "export_gb_per_s": payload.nbytes / export_s / 1e9, "load_gb_per_s": payload.nbytes / load_s / 1e9,
                     "checked_tensors": len(reference), "bit_exact": exact}
        print(f"sync    {name:13s}: {payload.nbytes / GIB:7.3f} GiB {sorted(payload.dtypes)}  export {export_s:6.3f} s "
              f"(first {first_export_s:6.3f} s)  "
              f"load {load_s:6.3f} s  {len(reference)} overwritten tensors restored bit for bit: {exact}")
        del payload, reference
    return out


def context_switch(model: OpenVLAOFT, optimizer: torch.optim.Optimizer, device: torch.device, cycles: int) -> list[dict[str, Any]]:
    probe = next(iter(model.parameters()))  # the offloader swaps its .data: the object stays the model's
    reference = probe.detach()[:4, :4].clone() if probe.dim() >= 2 else probe.detach()[:4].clone()
    offloader = Offloader(model, optimizer)
    rows = []
    for cycle in range(cycles):
        off = offloader.offload()
        on = offloader.onload()
        now = probe.detach()
        intact = torch.equal(now[:4, :4] if now.dim() >= 2 else now[:4], reference)
        rows.append({
            "cycle": cycle, "bytes_moved": off.bytes_moved, "what": off.what,
            "offload_s": off.seconds, "onload_s": on.seconds,
            "offload_gb_per_s": off.bytes_moved / off.seconds / 1e9, "onload_gb_per_s": on.bytes_moved / on.seconds / 1e9,
            "device_bytes_before": off.device_bytes_before, "device_bytes_offloaded": off.device_bytes_after,
            "device_bytes_freed": off.device_bytes_before - off.device_bytes_after,
            "device_bytes_onloaded": on.device_bytes_after, "host_bytes": offloader.host_bytes, "intact": intact,
        })
        freed = (off.device_bytes_before - off.device_bytes_after) / GIB
        print(f"switch  cycle {cycle}: {off.bytes_moved / GIB:6.2f} GiB out in {off.seconds:6.3f} s, back in {on.seconds:6.3f} s; "
              f"device memory freed {freed:6.2f} GiB; weights intact {intact}")
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (a CPU check of the code)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--decode-batches", type=int, nargs="+", default=None)
    parser.add_argument("--train-batches", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--cycles", type=int, default=2)
    add_output_args(parser, "vla_real_size")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = tiny_config(dtype="float32") if args.tiny else VLAConfig.from_dict(OPENVLA_7B)
    decode_batches = args.decode_batches or ([1, 2] if args.tiny else [1, 8, 32, 64])
    train_batches = args.train_batches or ([2] if args.tiny else [8, 32])

    t0 = time.perf_counter()
    model = build(config, device, dtype, seed=0)
    synchronize(device)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    parts = {name: sum(p.numel() for p in getattr(model, name).parameters())
             for name in ("vision_backbone", "projector", "language_model")}
    print(f"built {params / 1e9:.3f}B parameters ({str(dtype).removeprefix('torch.')}) on {device} in {build_s:.1f} s"
          + ("" if device.type != "cuda" else f", {allocated(device) / GIB:.1f} GiB allocated"))

    result: dict[str, Any] = {
        "model": "tiny (policies.vla.tiny defaults)" if args.tiny else "openvla-7b shapes (config.json), random weights",
        "dtype": str(dtype).removeprefix("torch."), "device": str(device),
        "parameters": params, "parameters_by_part": parts, "build_s": build_s,
        "device_bytes_weights": allocated(device),
        "prompt_tokens": PROMPT_TOKENS, "image_tokens": config.num_patches, "action_dim": ACTION_DIM, "oft_chunk": OFT_CHUNK,
    }
    result["decode"] = decode(model, config, decode_batches, args.repeats, device)
    result["train"], optimizer = train(model, config, train_batches, max(2, args.repeats // 2), device, args.lora_rank)
    result["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result["weight_sync"] = weight_sync(model, device)
    result["context_switch"] = context_switch(model, optimizer, device, args.cycles)
    save_result(result_path("vla_real_size", args, "tiny" if args.tiny else None), "vla_real_size", argv, result)
    return result


if __name__ == "__main__":
    main()
