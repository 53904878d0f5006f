"""FSDP2 on one NCCL rank: do sharded grads exist and what does clip_grad_norm_ see, per setting."""
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
dist.init_process_group("nccl", rank=0, world_size=1)
for divide, force in ((None, None), (1.0, None), (None, True), (1.0, True)):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).cuda()
    ref = [p.detach().clone() for p in m.parameters()]
    x = torch.randn(8, 4, device="cuda")
    m(x).pow(2).mean().backward()
    want = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in m.parameters()])))
    for p in m.parameters():
        p.grad = None
    fully_shard(m)
    if divide is not None:
        m.set_gradient_divide_factor(divide)
    if force is not None:
        m.set_force_sum_reduction_for_comms(force)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m(x).pow(2).mean().backward()
    params = [p for g in opt.param_groups for p in g["params"]]
    norms = [None if p.grad is None else round(float(p.grad.full_tensor().norm()), 6) for p in params]
    n = torch.nn.utils.clip_grad_norm_(params, 1e9)
    full = getattr(n, "full_tensor", None)
    print(f"divide={divide} force_sum={force}: unsharded norm {want:.6f}; sharded grad norms {norms}; "
          f"clip_grad_norm_ {float(full() if full else n):.6f} ({type(n).__name__})", flush=True)
dist.destroy_process_group()
print("torch", torch.__version__)
