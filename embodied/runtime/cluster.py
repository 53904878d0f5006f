"""``Cluster``: where workers run. A local Ray by default, an existing Ray cluster on request,
or in-process (``backend="local"``) for debugging with breakpoints and for fast tests."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

#: Environment of every process that runs torch (Ray workers get it at start; the CLI sets it in the
#: driver before torch loads). GOMP_SPINCOUNT: after each parallel region, the OpenMP threads of
#: torch's CPU build spin ~300k iterations (milliseconds) before they sleep; between two policy calls
#: that spinning holds the cores the simulator processes need. Measured on 2 cores (PushCube, 16
#: envs in 2 processes, 3 ms of MLP inference between steps): env.step 14-15 ms with the default,
#: 7.2-7.7 ms with 3000 (as fast as with no torch work between steps), while a 3x256 MLP's
#: inference (0.08 ms) and training step (2.7 ms) keep their speed (OMP_WAIT_POLICY=PASSIVE, the
#: blunt fix, makes them 5x and 2x slower). A value the user set is kept.
TORCH_PROCESS_ENV = {"GOMP_SPINCOUNT": "3000"}


def apply_torch_process_env() -> None:
    """Set :data:`TORCH_PROCESS_ENV` in this process where the user did not (before torch loads)."""
    for key, value in TORCH_PROCESS_ENV.items():
        os.environ.setdefault(key, value)


@dataclass
class ClusterConfig:
    """Where and how workers run (``cluster.*`` keys)."""

    backend: Literal["ray", "local"] = "ray"
    """``ray``: every worker is a Ray actor (real processes). ``local``: every worker is a plain
    object in this process, each with its own thread (debugging, breakpoints, fast tests)."""
    address: str | None = None
    """Ray address to join; ``auto`` joins the cluster started with ``ray start``. None starts a
    local Ray sized to this machine."""
    num_cpus: int | None = None
    """CPUs given to a local Ray (default: all cores of this machine)."""
    num_gpus: int | None = None
    """GPUs given to a local Ray (default: all visible CUDA devices)."""
    dashboard: bool = False
    """Start Ray's dashboard (bound to 127.0.0.1 only)."""
    timeout_s: float = 600.0
    """Upper bound on any single wait for a worker call or channel message; a stuck run fails
    with an error naming the worker instead of hanging."""


class Cluster:
    """A handle on the compute the run uses. ``with Cluster(cfg) as cluster: ...`` shuts it down."""

    def __init__(self, cfg: ClusterConfig | None = None) -> None:
        self.cfg = cfg or ClusterConfig()
        self.backend = self.cfg.backend
        self._started_ray = False
        if self.backend == "ray":
            self._init_ray()

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        # Workers inherit this; keep the driver's imports (the project packages) importable.
        env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)}
        env_vars.update({k: os.environ.get(k, v) for k, v in TORCH_PROCESS_ENV.items()})
        kwargs: dict = dict(
            include_dashboard=self.cfg.dashboard,
            dashboard_host="127.0.0.1",
            logging_level=logging.WARNING,
            log_to_driver=True,
            runtime_env={"env_vars": env_vars},
        )
        if self.cfg.address is not None:
            ray.init(address=self.cfg.address, **kwargs)
        else:
            num_cpus = self.cfg.num_cpus or os.cpu_count() or 1
            num_gpus = self.cfg.num_gpus if self.cfg.num_gpus is not None else _cuda_count()
            os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
        self._started_ray = True

    @property
    def num_cpus(self) -> float:
        if self.backend == "ray":
            import ray

            return float(ray.cluster_resources().get("CPU", 1))
        return float(self.cfg.num_cpus or os.cpu_count() or 1)

    @property
    def num_gpus(self) -> float:
        if self.backend == "ray":
            import ray

            return float(ray.cluster_resources().get("GPU", 0))
        return float(self.cfg.num_gpus if self.cfg.num_gpus is not None else _cuda_count())

    def shutdown(self) -> None:
        if self.backend == "ray" and self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: no GPUs
        return 0
