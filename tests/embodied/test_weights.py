"""Weight sync: tensors arrive bit for bit in their own dtype; trainable-only sends only those."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embodied.runtime.weights import WeightSyncer, state_of


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
