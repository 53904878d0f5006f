"""Seeding of every random number generator a run uses."""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ["PYTHONHASHSEED"] = str(seed)
    import torch

    torch.manual_seed(seed)


_RNG_LOCK = threading.RLock()


class RngStream:
    """A private stream of torch's global random numbers, so a worker's sampling does not depend on
    what else ran in its process (other workers' threads on the ``local`` backend, probes, an
    evaluation) and a reference loop can reproduce it exactly.

    ``with stream:`` swaps this stream's state into torch's global CPU generator (and the CUDA
    generator of ``device``), runs the block, saves the advanced state and puts the previous state
    back. Entering is serialized process-wide, so two streams never interleave.
    """

    def __init__(self, seed: int, device: Any = None) -> None:
        import torch

        gen = torch.Generator()
        gen.manual_seed(seed)
        self._cpu = gen.get_state()
        self._seed = seed
        self._device = torch.device(device) if device is not None else None
        self._cuda = None
        self._saved: list[tuple[Any, Any]] = []

    def _uses_cuda(self) -> bool:
        return self._device is not None and self._device.type == "cuda"

    def __enter__(self) -> RngStream:
        import torch

        _RNG_LOCK.acquire()
        saved_cuda = None
        if self._uses_cuda():
            saved_cuda = torch.cuda.get_rng_state(self._device)
            if self._cuda is None:
                torch.cuda.manual_seed(self._seed)  # seeds the current device's generator
                self._cuda = torch.cuda.get_rng_state(self._device)
            torch.cuda.set_rng_state(self._cuda, self._device)
        self._saved.append((torch.get_rng_state(), saved_cuda))
        torch.set_rng_state(self._cpu)
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        try:
            self._cpu = torch.get_rng_state()
            saved_cpu, saved_cuda = self._saved.pop()
            torch.set_rng_state(saved_cpu)
            if self._uses_cuda():
                self._cuda = torch.cuda.get_rng_state(self._device)
                torch.cuda.set_rng_state(saved_cuda, self._device)
        finally:
            _RNG_LOCK.release()
