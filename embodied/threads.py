"""The environment variables that size a process's thread pools."""

from __future__ import annotations

#: Env vars that size the thread pools of torch/OpenMP/BLAS and of Mesa's llvmpipe/lavapipe in a
#: worker: without them every worker starts a thread per core and N workers oversubscribe the cores.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """The variables of :data:`THREAD_ENV_VARS`, each set to ``threads``."""
    return {k: str(threads) for k in THREAD_ENV_VARS}
