"""Offload/onload (context switching) on real torch: storage moves, exact byte counts, bitwise
round trips, training that continues exactly as without the switch, reused host buffers."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from embodied.offload import CATEGORIES, Offloader


def build(device: str = "cpu", width: int = 16, depth: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # BatchNorm brings float buffers and an int64 one (num_batches_tracked).
    hidden = [layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.Tanh())]
    model = nn.Sequential(nn.Linear(5, width), nn.BatchNorm1d(width), nn.Tanh(), *hidden, nn.Linear(width, 2))
    model = model.to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step: int, device: str = "cpu", in_dim: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, in_dim, generator=gen).to(device), torch.randn(8, 2, generator=gen).to(device)


def backward(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, device: str = "cpu") -> float:
    x, y = batch(step, device)
    optimizer.zero_grad()
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    return loss.item()


def managed(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:
    """Every tensor the offloader should move, by category (computed independently of it)."""
    return {
        "weights": list(model.parameters()),
        "grads": [p.grad for p in model.parameters() if p.grad is not None],
        "buffers": list(model.buffers()),
        "optimizer": [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)],
    }


def nbytes(tensors: dict[str, list[torch.Tensor]]) -> dict[str, int]:
    return {cat: sum(t.numel() * t.element_size() for t in ts) for cat, ts in tensors.items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def live_cuda_tensors() -> str:
    """What still holds device memory: the live CUDA tensors the garbage collector can see, and
    where the allocator's active blocks were allocated (recorded since the test began)."""
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    lines = [f"{len(found)} live CUDA tensors: " + ", ".join(f"{type(t).__name__}{tuple(t.shape)} {t.dtype}" for t in found[:20])]
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                frames = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in block.get("frames", [])
                          if "site-packages" not in f["filename"] and "/python3" not in f["filename"]]
                lines.append(f"{block['size']} bytes from {' <- '.join(frames[:4]) or '?'}")
    return "\n".join(lines[:40])


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    """Two optimizer steps and a pending backward: weights, grads, buffers and Adam state all exist."""
    model, optimizer = build()
    for step in range(2):
        backward(model, optimizer, step)
        optimizer.step()
    backward(model, optimizer, 2)
    return model, optimizer


def test_offload_moves_every_tensor_and_counts_exact_bytes() -> None:
    model, optimizer = trained()
    tensors = managed(model, optimizer)
    assert all(tensors[cat] for cat in CATEGORIES)
    ptrs = {cat: [t.data_ptr() for t in ts] for cat, ts in tensors.items()}
    values = {cat: [t.detach().clone() for t in ts] for cat, ts in tensors.items()}
    expected = nbytes(tensors)
    offloader = Offloader(model, optimizer)

    stats = offloader.offload()
    assert offloader.is_offloaded
    assert stats.what == expected
    assert stats.bytes_moved == sum(expected.values())
    assert stats.device_bytes_before == stats.bytes_moved and stats.device_bytes_after == 0
    assert stats.seconds >= 0.0
    after_offload = managed(model, optimizer)
    host_ptrs = {cat: [t.data_ptr() for t in ts] for cat, ts in after_offload.items()}
    for cat in CATEGORIES:
        assert all(a != b for a, b in zip(host_ptrs[cat], ptrs[cat])), cat  # new storage
        assert all(a is b for a, b in zip(after_offload[cat], tensors[cat])), cat  # same objects

    back = offloader.onload()
    assert not offloader.is_offloaded
    assert back.what == expected and back.bytes_moved == stats.bytes_moved
    assert back.device_bytes_before == 0 and back.device_bytes_after == back.bytes_moved
    restored = managed(model, optimizer)
    for cat in CATEGORIES:
        assert all(a is b for a, b in zip(restored[cat], tensors[cat])), cat
        assert all(t.data_ptr() != h for t, h in zip(restored[cat], host_ptrs[cat])), cat
        for t, v in zip(restored[cat], values[cat]):
            assert t.dtype == v.dtype and t.shape == v.shape and t.device == v.device
            assert torch.equal(bits(t), bits(v)), cat


def test_training_continues_exactly_as_without_the_switch() -> None:
    control, control_opt = build()
    switched, switched_opt = build()
    offloader = Offloader(switched, switched_opt)
    control_losses, switched_losses = [], []
    for step in range(6):
        control_losses.append(backward(control, control_opt, step))
        control_opt.step()
        if step == 2:  # between phases, with no gradients of the next step yet
            offloader.offload()
            offloader.onload()
        switched_losses.append(backward(switched, switched_opt, step))
        if step in (1, 4):  # gradients pending: the switch must carry them to the optimizer step
            offloader.offload()
            offloader.onload()
        switched_opt.step()
    assert switched_losses == control_losses
    for a, b in zip(control.state_dict().values(), switched.state_dict().values()):
        assert torch.equal(bits(a), bits(b))
    for a, b in zip(managed(control, control_opt)["optimizer"], managed(switched, switched_opt)["optimizer"]):
        assert torch.equal(bits(a), bits(b))


def test_second_offload_and_second_onload_are_noops() -> None:
    model, optimizer = trained()
    offloader = Offloader(model, optimizer)
    first = offloader.offload()
    ptrs = [p.data_ptr() for p in model.parameters()]
    again = offloader.offload()
    assert again.bytes_moved == 0 and again.what == dict.fromkeys(CATEGORIES, 0)
    assert again.device_bytes_before == again.device_bytes_after == first.device_bytes_after
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    offloader.onload()
    ptrs = [p.data_ptr() for p in model.parameters()]
    again = offloader.onload()
    assert again.bytes_moved == 0 and [p.data_ptr() for p in model.parameters()] == ptrs
    assert Offloader(model).onload().bytes_moved == 0  # never offloaded


def test_host_buffers_are_allocated_once_and_reused() -> None:
    model, optimizer = trained()
    offloader = Offloader(model, optimizer)
    offloader.offload()
    first = {cat: [t.data_ptr() for t in ts] for cat, ts in managed(model, optimizer).items()}
    host_bytes = offloader.host_bytes
    assert host_bytes == sum(nbytes(managed(model, optimizer)).values())
    offloader.onload()
    optimizer.step()
    backward(model, optimizer, 3)
    offloader.offload()
    second = {cat: [t.data_ptr() for t in ts] for cat, ts in managed(model, optimizer).items()}
    assert second == first
    assert offloader.host_bytes == host_bytes
    offloader.onload()
    offloader.free_host_buffers()
    assert offloader.host_bytes == 0


def test_tensors_that_appear_later_get_their_own_buffers() -> None:
    model, optimizer = build()
    offloader = Offloader(model, optimizer)
    fresh = offloader.offload()  # no gradients, no Adam state yet
    assert fresh.what["grads"] == 0 and fresh.what["optimizer"] == 0 and fresh.what["weights"] > 0
    offloader.onload()
    backward(model, optimizer, 0)
    optimizer.step()
    stats = offloader.offload()
    assert stats.what == nbytes(managed(model, optimizer))
    offloader.onload()


def test_optimizer_params_outside_the_module_move_too() -> None:
    model, _ = build()
    extra = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    before = extra.data_ptr()
    stats = Offloader(model, optimizer).offload()
    assert extra.data_ptr() != before
    assert stats.what["weights"] == sum(p.nbytes for p in model.parameters()) + extra.nbytes


def test_tensors_sharing_storage_are_refused() -> None:
    model, _ = build()
    model.register_buffer("alias", model[0].weight.data.view(-1))
    with pytest.raises(ValueError, match="share one storage"):
        Offloader(model).offload()


@pytest.mark.gpu
def test_cuda_offload_frees_device_memory() -> None:
    torch.cuda.memory._record_memory_history(max_entries=10000)  # for live_cuda_tensors() on a failure
    model, optimizer = build("cuda", width=2048, depth=1)  # 16 MiB of weights, 64 MiB with grads and Adam
    for step in range(2):
        backward(model, optimizer, step, "cuda")
        optimizer.step()
    backward(model, optimizer, 2, "cuda")
    tensors = managed(model, optimizer)
    values = {cat: [t.detach().clone().cpu() for t in ts] for cat, ts in tensors.items()}
    devices = {cat: [t.device for t in ts] for cat, ts in tensors.items()}  # Adam's step counts stay on CPU
    on_device = sum(t.nbytes for ts in tensors.values() for t in ts if t.is_cuda)
    # What stays on the device whatever the offloader does: cuBLAS's workspaces (allocated by the
    # first matmul, 2 x 32 MiB + 1 MiB on an H200 with torch 2.11) and anything else not ours.
    others = torch.cuda.memory_allocated() - on_device
    offloader = Offloader(model, optimizer)

    stats = offloader.offload()
    assert stats.what == nbytes(tensors)
    assert on_device >= 60 * 1024**2
    assert stats.device_bytes_before >= others + on_device
    # every byte of the component left: what remains is what was not ours, within the allocator's rounding
    assert stats.device_bytes_after <= others + 1024**2, live_cuda_tensors()
    assert torch.cuda.memory_allocated() == stats.device_bytes_after
    assert all(t.is_pinned() for ts in managed(model, optimizer).values() for t in ts)

    back = offloader.onload()
    assert back.device_bytes_after >= stats.device_bytes_after + on_device
    restored = managed(model, optimizer)
    for cat in CATEGORIES:
        for t, v, device in zip(restored[cat], values[cat], devices[cat]):
            assert t.device == device
            assert torch.equal(bits(t), bits(v)), cat
    optimizer.step()  # Adam keeps working on the same parameter objects, with the restored grads
    backward(model, optimizer, 3, "cuda")
    optimizer.step()
