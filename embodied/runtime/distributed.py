"""Data-parallel ranks of one worker group: a torch.distributed process group among them, and
the :class:`DataParallel` seam an algorithm's update trains through.

    # on rank 0: a rendezvous store on a socket it bound itself (no port race), kept alive
    rendezvous = Rendezvous(node_address())                   # .address -> (host, port)
    # on every rank, concurrently (the driver passes the address):
    join_process_group(host, port, rank, world_size, backend="gloo", timeout_s=120)
    parallel = DataParallel.build("ddp", policy)             # or "fsdp"; SINGLE for one rank
    algorithm.update(policy, optimizer, batch, lr, parallel=parallel)

Every rank holds the same samples; each forwards and backwards only its block of every
minibatch (:meth:`DataParallel.shard`), with the minibatch's own loss denominators, and the
gradients are **summed** over the ranks (not averaged): N ranks take the optimizer step one rank
would take on the whole minibatch, up to float summation order.

* ``ddp``: torch's ``DistributedDataParallel`` around a module whose ``forward`` is the
  algorithm's loss (the policy contract's ``evaluate`` is not ``forward``), with a communication
  hook that sums. Built at the first update (broadcasting rank 0's weights) and kept until
  :meth:`DataParallel.release`, which the trainer calls before it offloads (the wrapper's
  gradient buckets would stay on the device).
* ``fsdp``: FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over the
  ranks; each ``nn.ModuleList`` entry (a transformer's blocks) is its own unit, then the policy;
  ``evaluate`` is registered as a forward method so its parameters are gathered for it. The
  policy stays sharded between updates; full weights are gathered for export and checkpoints.

Every collective is bounded by the process group's timeout (``cluster.timeout_s``): a rank that
died or hangs makes the others fail within it instead of hanging (gloo has no other deadline).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

#: Backends by device type: gloo for CPU tensors, NCCL for CUDA tensors.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def node_address() -> str:
    """The address other nodes reach this process's node at: the Ray node's IP inside a Ray
    worker (127.0.0.1 on the project's loopback-only local Ray), else 127.0.0.1."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` (``lo`` for 127.0.0.1), or None."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


class Rendezvous:
    """The store the ranks of a process group meet at, served by rank 0 on ``host``.

    The listening socket is bound here (to ``host`` only: on a local Ray nothing outside the
    machine can reach it) and handed to torch's ``TCPStore``, so no other process can take the
    port between choosing and binding it. Keep the object alive as long as the group lives."""

    def __init__(self, host: str, world_size: int, timeout_s: float) -> None:
        import torch.distributed as dist

        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((host, 0))
        self._socket.listen(max(64, 2 * world_size))
        self.port = int(self._socket.getsockname()[1])
        self.store = dist.TCPStore(host, self.port, world_size + 1, is_master=True, wait_for_workers=False,
                                   master_listen_fd=self._socket.fileno(),
                                   timeout=datetime.timedelta(seconds=timeout_s))

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


def join_process_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    """Join the default process group through the :class:`Rendezvous` at ``host:port``.

    ``timeout_s`` bounds the join and every collective after it. The transports of gloo and
    NCCL's bootstrap use the interface that holds ``host`` (loopback on a local Ray)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group")
    interface = interface_of(host)
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size + 1, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class _LossModule(nn.Module):
    """DDP wraps ``forward``: this one computes an algorithm's loss on the policy it holds."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, loss_fn: Callable[..., Any], mb: Any, counts: Any) -> Any:
        return loss_fn(self.policy, mb, counts)


class DataParallel:
    """How an update splits its minibatches over ranks and combines their gradients.

    This base class is one rank alone (:data:`SINGLE`): every method is the identity. A loop
    written against it (see ``Algorithm.update``) runs unchanged on N ranks::

        with parallel.training(policy) as model:
            for idx, real in parallel.calls(len(mb), micro_batch_size):
                with model.accumulate(last=...):
                    loss, stats = model.loss(loss_fn, mb[idx], counts)
                    loss.backward()
            parallel.all_reduce(partial_stats); parallel.clip_grad_norm(params, max_norm)
    """

    rank = 0
    world_size = 1
    strategy = "single"

    # --- splitting ---------------------------------------------------------------------------
    def shard(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """This rank's block of ``n`` rows (``tensor_split``: the first ``n % N`` ranks get one more)."""
        return torch.tensor_split(torch.arange(n, device=device), self.world_size)[self.rank]

    def calls(self, n: int, size: int | None, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, bool]]:
        """The forward calls of this rank over ``n`` rows (its block of them), in pieces of at most
        ``size`` rows: ``(indices into the n rows, real)``. Every rank makes the same number of
        calls (FSDP gathers parameters in each): a rank with too few rows repeats row 0 in calls
        that are not ``real`` (their results must weigh nothing)."""
        mine = self.shard(n, device)
        largest = -(-n // self.world_size)
        count = 1 if size is None else max(1, -(-largest // size))
        out = []
        for part in torch.tensor_split(mine, count):
            out.append((part, True) if len(part) else (torch.zeros(1, dtype=torch.long, device=device), False))
        return out

    def gather(self, local: torch.Tensor, n: int) -> torch.Tensor:
        """Every rank's ``local`` rows (its :meth:`shard` of ``n``) concatenated in rank order."""
        return local

    # --- training ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def training(self, policy: nn.Module) -> Iterator[_Trainer]:
        """The policy prepared for one update (DDP: wrapped; the wrapper is kept for the next
        update until :meth:`release`)."""
        yield _Trainer(policy, None)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks (in place where it can be)."""
        return tensor

    def clip_grad_norm(self, parameters: list[torch.Tensor], max_norm: float) -> float:
        """Clip the (already combined) gradients to ``max_norm``; their total norm before."""
        return clip_grad_norm(parameters, max_norm)

    # --- state -------------------------------------------------------------------------------
    def full_state(self, policy: nn.Module, names: set[str]) -> dict[str, torch.Tensor] | None:
        """The whole tensors ``names`` of ``policy``'s state dict (on rank 0; None elsewhere).
        A collective under FSDP: every rank must call it."""
        state = policy.state_dict()
        return {k: v.detach() for k, v in state.items() if k in names} if self.rank == 0 else None

    def optimizer_state(self, policy: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's state dict as one rank holds it (rank 0; None elsewhere). A collective
        under FSDP."""
        return optimizer.state_dict() if self.rank == 0 else None

    def load(self, policy: nn.Module, optimizer: torch.optim.Optimizer, model: dict[str, torch.Tensor],
             optimizer_state: dict[str, Any] | None) -> tuple[list[str], list[str]]:
        """Load whole tensors (and an optimizer state dict) on every rank; ``(missing, unexpected)``."""
        missing, unexpected = policy.load_state_dict(model, strict=False)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        return list(missing), list(unexpected)

    def shards_optimizer(self) -> bool:
        """Whether the optimizer must be built over parameters this strategy replaced (FSDP)."""
        return False

    def release(self) -> None:
        """Drop what the strategy holds beside the model between updates (before an offload)."""

    def describe(self) -> str:
        return f"{self.strategy} x{self.world_size}"


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` (2-norm over all gradients, scaled by
    ``max_norm / (norm + 1e-6)`` where that is below 1), returning the norm before as a float.

    Gradients on one device in one dtype (a policy's, the usual case) take three tensor ops and no
    scaling when the norm is within bounds: torch's version first groups the tensors by device and
    dtype and always multiplies, which on a small policy costs as much as the clipping itself
    (~50 against ~20 us per optimizer step on a CPU core). Anything else goes to torch's."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    first = grads[0]
    if any(g.device != first.device or g.dtype != first.dtype or g.is_sparse for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    norm = float(total)
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:  # an inf norm zeroes the gradients, a nan one leaves them: the update skips either step
        torch._foreach_mul_(grads, coef)
    return norm


SINGLE = DataParallel()
"""One rank: the update as it always ran."""


class _Trainer:
    """What the update loop calls inside :meth:`DataParallel.training`."""

    def __init__(self, policy: nn.Module, wrapped: nn.Module | None, fsdp: bool = False) -> None:
        self.policy = policy
        self.wrapped = wrapped
        self.fsdp = fsdp

    def loss(self, loss_fn: Callable[..., Any], mb: Any, counts: Any) -> Any:
        """``loss_fn(policy, mb, counts)``, through DDP's forward when wrapped."""
        if self.wrapped is not None:
            return self.wrapped(loss_fn, mb, counts)
        return loss_fn(self.policy, mb, counts)

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Around one forward and backward: gradients are combined over ranks only in the ``last``
        one of an optimizer step (the others accumulate locally)."""
        if self.fsdp:
            self.policy.set_requires_gradient_sync(last)
            yield
        elif self.wrapped is not None and not last:
            with self.wrapped.no_sync():
                yield
        else:
            yield


class _Distributed(DataParallel):
    """What DDP and FSDP share: ranks from the default process group, sums and gathers."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("data parallelism needs a process group: join_process_group() first")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def gather(self, local: torch.Tensor, n: int) -> torch.Tensor:
        import torch.distributed as dist

        sizes = [len(s) for s in torch.tensor_split(torch.arange(n), self.world_size)]
        width = max(sizes)
        padded = torch.zeros((width, *local.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: len(local)] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([p[:size] for p, size in zip(parts, sizes)])

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return tensor


def _sum_gradients(process_group, bucket):  # noqa: ANN001, ANN202 (DDP checks these annotations: none given)
    """DDP communication hook: sum a gradient bucket over the ranks (DDP's default averages)."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class DDPParallel(_Distributed):
    """Every rank holds the whole model; gradient buckets are summed during the last backward of
    each optimizer step (overlapping it). The wrapper lives from one update to the next (its
    construction broadcasts rank 0's weights) until :meth:`release` (before an offload: its
    buckets hold a gradient's worth of device memory)."""

    strategy = "ddp"

    def __init__(self) -> None:
        super().__init__()
        # An algorithm may leave a head out of its loss (GRPO on a policy with a critic): DDP must
        # then look for unused parameters (a traversal of the graph in every forward). The first
        # update looks; later ones only when it found some.
        self.find_unused = True
        self._wrapped: nn.Module | None = None

    @contextlib.contextmanager
    def training(self, policy: nn.Module) -> Iterator[_Trainer]:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = self._wrapped
        if wrapped is None or wrapped.module.policy is not policy or wrapped.find_unused_parameters != self.find_unused:
            # No buffer sync in forward: buffers (normalizers) are updated identically on every
            # rank from the same samples, and synced from rank 0 when wrapped.
            wrapped = DistributedDataParallel(_LossModule(policy), find_unused_parameters=self.find_unused,
                                              **_NO_FORWARD_BUFFER_SYNC)
            wrapped.register_comm_hook(None, _sum_gradients)
            self._wrapped = wrapped
        yield _Trainer(policy, wrapped)
        self.find_unused = any(p.grad is None for p in policy.parameters() if p.requires_grad)

    def release(self) -> None:
        self._wrapped = None


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's keyword that skips the buffer broadcast before each forward: ``forward_sync_buffers``
    (torch 2.12 and later), else ``broadcast_buffers`` (which earlier releases read for it)."""
    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}


_NO_FORWARD_BUFFER_SYNC = _no_forward_buffer_sync()


class FSDPParallel(_Distributed):
    """FSDP2: every rank holds 1/N of each parameter, gradient and optimizer state. The policy
    is sharded once (:meth:`shard_policy`), and the optimizer built over the sharded parameters."""

    strategy = "fsdp"

    def __init__(self, policy: nn.Module, device: torch.device) -> None:
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        mesh = init_device_mesh(device.type, (self.world_size,))
        for module in list(policy.modules()):
            if isinstance(module, nn.ModuleList):  # transformer blocks: gathered one at a time
                for block in module:
                    fully_shard(block, mesh=mesh)
        fully_shard(policy, mesh=mesh)
        register_fsdp_forward_method(policy, "evaluate")
        policy.set_gradient_divide_factor(1.0)  # sum over ranks, not the mean ...
        policy.set_force_sum_reduction_for_comms(True)  # ... with a plain SUM (gloo has no PREMUL_SUM)

    @contextlib.contextmanager
    def training(self, policy: nn.Module) -> Iterator[_Trainer]:
        try:
            yield _Trainer(policy, None, fsdp=True)
        finally:
            policy.set_requires_gradient_sync(True)

    def clip_grad_norm(self, parameters: list[torch.Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        full = getattr(norm, "full_tensor", None)  # a DTensor over the shards
        return float(full() if full is not None else norm)

    def full_state(self, policy: nn.Module, names: set[str]) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if k in names} if self.rank == 0 else None

    def optimizer_state(self, policy: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(policy, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _as_indexed(state, policy, optimizer) if self.rank == 0 else None

    def load(self, policy: nn.Module, optimizer: torch.optim.Optimizer, model: dict[str, torch.Tensor],
             optimizer_state: dict[str, Any] | None) -> tuple[list[str], list[str]]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=False)
        missing, unexpected = set_model_state_dict(policy, model, options=options)
        if optimizer_state is not None:
            set_optimizer_state_dict(policy, optimizer, _as_named(optimizer_state, policy, optimizer), options=options)
        return list(missing), list(unexpected)

    def shards_optimizer(self) -> bool:
        return True


def _param_names(policy: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order of its param groups."""
    name_of = {id(p): n for n, p in policy.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _as_indexed(state: dict[str, Any], policy: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name (torch's distributed form) in the form
    ``optimizer.state_dict()`` has, keyed by index: the checkpoint format of every strategy."""
    names = _param_names(policy, optimizer)
    index = {n: i for i, n in enumerate(names)}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
              for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _as_named(state: dict[str, Any], policy: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The inverse of :func:`_as_indexed`."""
    names = _param_names(policy, optimizer)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
              for g in state["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in state["state"].items()}, "param_groups": groups}


STRATEGIES: dict[str, Callable[[nn.Module, torch.device], DataParallel]] = {
    "ddp": lambda policy, device: DDPParallel(),
    "fsdp": FSDPParallel,
}
"""``workers.trainer_strategy`` -> how a process group's ranks share the model."""


def build_parallel(strategy: str, policy: nn.Module, device: torch.device) -> DataParallel:
    """The :class:`DataParallel` of ``strategy`` over this process's group: :data:`SINGLE` without
    a group. FSDP shards ``policy`` in place (build the optimizer after this)."""
    import torch.distributed as dist

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown data-parallel strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if not dist.is_initialized():
        return SINGLE
    return STRATEGIES[strategy](policy, torch.device(device))
