"""Weight sync: tensors arrive bit for bit in their own dtype; trainable-only sends only those."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from embodied.runtime.weights import HostStaging, WeightSyncer, state_of


def model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(dtype)
    m.register_buffer("steps", torch.tensor([3, 1, 4], dtype=torch.int64))  # a non-float buffer travels too
    return m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_tensors_arrive_bit_for_bit(dtype):
    src, dst = model(dtype), model(dtype)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p))  # values bf16/fp16 would lose in any float32 round trip
    payload = WeightSyncer().export(src, version=7)
    assert payload.dtypes == {str(dtype).removeprefix("torch."), "int64"}
    assert WeightSyncer().load(dst, payload) == 7
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                                                   b.view(torch.uint8) if b.is_floating_point() else b), name


def test_payload_survives_ray_and_loads_on_the_other_side(ray_cluster):
    import ray

    src = model(torch.bfloat16)
    ref = ray.put(WeightSyncer().export(src, 1))

    @ray.remote
    def load(payload):
        dst = model(torch.bfloat16)
        WeightSyncer().load(dst, payload)
        return {k: v.view(torch.int16) for k, v in dst.state_dict().items() if v.dtype == torch.bfloat16}

    arrived = ray.get(load.remote(ref))
    for k, v in arrived.items():
        assert torch.equal(v, src.state_dict()[k].view(torch.int16)), k


def test_trainable_only_sends_the_trainable_parameters_and_buffers():
    src, dst = model(), model()
    src[0].requires_grad_(False)  # a frozen base, as under LoRA
    dst[0].requires_grad_(False)
    payload = WeightSyncer().export(src, 2)
    assert payload.trainable_only
    assert sorted(payload.names) == ["1.bias", "1.weight", "2.bias", "2.weight", "steps"]
    with torch.no_grad():
        src[2].weight.add_(1.0)
    WeightSyncer().load(dst, WeightSyncer().export(src, 3))
    assert torch.equal(dst[2].weight, src[2].weight)
    full = WeightSyncer(trainable_only=False).export(src, 3)
    assert not full.trainable_only and "0.weight" in full.names and full.nbytes > payload.nbytes


def test_a_payload_that_does_not_fit_is_refused_by_name():
    payload = WeightSyncer().export(model(), 1)
    other = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    other.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"'2.weight' is float32\[2, 8\] in the payload, float32\[3, 8\] here"):
        WeightSyncer().load(other, payload)
    with pytest.raises(ValueError, match="missing 'steps'"):
        WeightSyncer().load(model(), WeightSyncer().export(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)), 1))


def test_state_of_copies_the_tensors_out():
    src = model(torch.float16)
    state = state_of(WeightSyncer().export(src, 1))
    assert set(state) == set(src.state_dict())
    assert all(torch.equal(state[k], v) for k, v in src.state_dict().items())


def test_the_host_staging_is_reused_only_once_no_payload_views_it():
    """Device tensors are copied into one host buffer that later exports reuse: only when no array
    of the previous payload is alive (a payload never changes under its holder)."""
    cpu = {torch.device("cpu")}
    staging = HostStaging(pin=False)
    host, array = staging.take(64, cpu)
    host.fill_(7)
    held = array[8:16]  # a payload's array, still held
    host2, array2 = staging.take(32, cpu)
    assert staging.allocations == 2 and not np.shares_memory(array2, held)
    host2.fill_(1)
    assert (held == 7).all()
    del host, array, held, array2
    host3, array3 = staging.take(24, cpu)  # nothing views the buffer: reused
    assert staging.allocations == 2 and host3.data_ptr() == host2.data_ptr()
    del array3
    staging.take(100, cpu)  # larger than the buffer: a new one
    assert staging.allocations == 3


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.gpu
def test_cuda_weights_export_through_pinned_memory_kept_between_exports():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512)).to("cuda", torch.bfloat16)
    model.register_buffer("steps", torch.arange(3.0))  # a CPU buffer beside the CUDA weights: viewed in place
    syncer = WeightSyncer()
    first = syncer.export(model, version=1)
    kept = state_of(first)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    second = syncer.export(model, version=2)  # `first` is still held: a new buffer, `first` unchanged
    assert syncer.staging.allocations == 2
    assert all(same_bytes(v, w) for v, w in zip(kept.values(), state_of(first).values()))
    assert not same_bytes(kept["0.weight"], state_of(second)["0.weight"])
    del first, kept, second
    third = syncer.export(model, version=3)  # nothing views the last buffer: reused
    assert syncer.staging.allocations == 2
    weights = [a for s, a in zip(third.slots, third.arrays) if s.name != "steps"]
    assert all(torch.from_numpy(a).is_pinned() for a in weights)
    got = state_of(third)
    for name, t in model.state_dict().items():
        assert same_bytes(got[name], t.detach().cpu()), name
