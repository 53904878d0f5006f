"""The CUDA paths of scale-out (skipped without a GPU): a DDP or FSDP2-wrapped trainer rank on
NCCL takes the step a CPU rank takes; bf16 weights go from a trainer on the GPU to a rollout on the
GPU bit for bit; a rank placed by a GPU layout sees exactly its GPU; a >= 1B-parameter model
offloads and onloads."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from embodied.offload import Offloader
from embodied.runtime import Cluster, ClusterConfig, RankResources, Worker, WorkerGroup
from embodied.runtime.weights import WeightSyncer, state_of
from pipelines.layout import Layout, Machine, NodeSpec
from pipelines.onpolicy.workers import TrainerWorker
from scheduler import Plan
from tests.pipelines.test_data_parallel import ACT, OBS, config, one_rank, random_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_cluster():
    with Cluster(ClusterConfig(num_cpus=4, num_gpus=1, timeout_s=120)) as cluster:
        yield cluster


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_on_cuda_takes_the_step_of_a_cpu_rank(gpu_cluster, strategy):
    """A trainer rank on NCCL (DDP, or FSDP2's ``fully_shard``) updates as the CPU rank does."""
    cfg = config(f"workers.trainer_strategy={strategy}", "workers.trainer_device=cuda")
    batches = [random_batch(seed=1), random_batch(seed=2)]
    reference = one_rank(config(), batches)  # one rank on the CPU
    group = WorkerGroup(gpu_cluster, TrainerWorker, 1, cfg, OBS, ACT, name=f"{strategy}-cuda",
                        resources=RankResources(0.5, num_gpus=1.0))
    try:
        host, port = group.on(0).rendezvous().result()
        assert group.remote.join(host, port).result() == f"{strategy} x1"  # NCCL, one rank
        stats = [group.remote.update(b, cfg.algo.lr).result() for b in batches]
        weights = state_of(group.remote.export_weights().result())
    finally:
        group.shutdown()
    for key in ("losses/grad_norm", "losses/policy", "losses/value"):
        assert stats[-1][key] == pytest.approx(reference["stats"][-1][key], rel=1e-3, abs=1e-6), key
    for name, want in reference["weights"].items():
        torch.testing.assert_close(weights[name], want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


class _Visible(Worker):
    def devices(self) -> tuple[str | None, int, str]:
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), torch.cuda.get_device_name(0)


def test_a_gpu_layout_gives_each_rank_its_gpu(gpu_cluster):
    """A colocated plan on this machine's GPU: a rollout rank and a trainer rank share it, half a
    GPU each in Ray, and each sees exactly that GPU."""
    machine = Machine.of_nodes([NodeSpec(None, "node0", cpus=2, gpus=1)])
    plan = Plan("colocated", {"env": (1, 2), "rollout": (0,), "trainer": (0,)}, 1, None, ("trainer",), 1.0)
    layout = Layout.of(plan, machine, {"env": 1, "rollout": 1, "trainer": 1})
    ranks = [layout.ranks_of("rollout")[0], layout.ranks_of("trainer")[0]]
    assert [r.num_gpus for r in ranks] == [0.5, 0.5]
    seen = []
    for r in ranks:
        group = WorkerGroup(gpu_cluster, _Visible, 1, name="visible", resources=RankResources(0.1, r.num_gpus, r.env_vars()))
        seen.append(group.remote.devices().result())
        group.shutdown()
    assert [s[:2] for s in seen] == [("0", 1), ("0", 1)] and seen[0][2] == torch.cuda.get_device_name(0)


def test_bf16_weights_reach_a_rollout_on_the_gpu_bit_for_bit():
    torch.manual_seed(0)
    trainer = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 256)).to("cuda", torch.bfloat16)
    rollout = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 256)).to("cuda", torch.bfloat16)
    payload = WeightSyncer().export(trainer, version=3)
    assert payload.dtypes == {"bfloat16"}
    assert WeightSyncer().load(rollout, payload) == 3
    torch.cuda.synchronize()
    for (name, a), b in zip(trainer.state_dict().items(), rollout.state_dict().values()):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name


def test_a_billion_parameter_model_offloads_and_onloads():
    """~1.07B bf16 parameters (2.1 GB) and their gradients leave the GPU and come back intact."""
    layers = [nn.Linear(8192, 8192, bias=False) for _ in range(16)]  # 16 x 67M = 1.07B
    model = nn.Sequential(*layers).to("cuda", torch.bfloat16)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    probe = model[0].weight.detach()[:4, :4].clone()
    offloader = Offloader(model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = offloader.offload()
    offload_s = time.perf_counter() - t0
    assert out.bytes_moved >= 2 * 2 * 1.07e9 * 0.99  # weights and gradients, 2 bytes each
    assert torch.cuda.memory_allocated() < before - 4e9
    back = offloader.onload()
    assert torch.equal(model[0].weight.detach()[:4, :4], probe) and model[0].weight.device.type == "cuda"
    print(f"1.07B bf16 params + grads: offload {offload_s:.2f} s, onload {back.seconds:.2f} s, "
          f"{out.bytes_moved / 2**30:.1f} GiB each way")
