"""``MultiprocessVecEnv``: CPU simulators spread over worker processes.

Each worker process owns a contiguous shard of the envs and steps it with a
:class:`~envs.serial.SerialVecEnv`, so auto-reset, episode stats and the exact ``chunk_step``
semantics are the in-process ones. The parent sends ONE message per worker per call and puts the
replies back together in env order:

    parent ── step ──▶ worker 0: SerialVecEnv(envs 0..k-1) ──▶ rows 0..k-1 of the batch
           ── step ──▶ worker 1: SerialVecEnv(envs k..N-1) ──▶ rows k..N-1 of the batch

Transport: ``step`` (the hot path) passes actions, observations, rewards, dones and success
through one shared-memory block laid out as the batch arrays, and signals through it too: the
parent bumps a worker's command counter, the worker bumps its done counter (see
:class:`Doorbell`). The pipe carries a step only when a side sleeps (a one-byte wake-up) or when
the reply does not fit the layout (final observations, finished-episode stats, unexpected keys or
dtypes, errors: pickled). ``reset``, ``chunk_step`` (one message per chunk, so already
amortised) and ``render`` travel pickled through the pipe.

``step_async`` / ``step_wait`` (and ``chunk_step_async`` / ``chunk_step_wait``) split the send
from the receive so a caller can overlap policy inference with simulation.

Robustness: every wait polls the pipe in short slices and checks the process between them, so a
killed worker raises :class:`EnvWorkerError` at once instead of hanging, and a worker that does
not answer within ``timeout_s`` (``env.timeout_s``) raises :class:`EnvWorkerTimeout` after
writing its Python stack to its log; an exception inside a worker is re-raised in the parent
naming the env process and, for the env's own failure, the env id, index and seed, with the
worker's traceback text (a :class:`UserError` stays a ``UserError``). Workers check every step
for NaN/inf (``nonfinite``). Env processes die with their forkserver (so with the process that
made them), even while stuck. ``close`` ends and reaps every worker, also after a crash.

Scripts that use this class must guard their entry point with ``if __name__ == "__main__":``
(the ``forkserver`` and ``spawn`` start methods re-import the main module in each worker).

Modules, one job each:

* :mod:`envs.multiprocess.vec_env`: :class:`MultiprocessVecEnv`, the parent side (starts the
  workers, sends commands, gathers and checks replies, ``close``), :class:`EnvWorkerError`,
  :class:`HandshakeStats` (``handshake_stats()``) and :func:`shard_bounds`.
* :mod:`envs.multiprocess.worker`: the worker process's entry point and main loop (its setup,
  the shared-memory step, the pickled commands, errors sent back).
* :mod:`envs.multiprocess.buffers`: :class:`StepBuffers`, the shared-memory block of one step.
* :mod:`envs.multiprocess.doorbell`: the handshake (:class:`Doorbell`, :func:`memory_fence`) and
  how each side waits (:class:`CommandWaiter` in a worker, :class:`ReplyWaiter` in the parent).
* :mod:`envs.multiprocess.concat`: putting the shards' results back together in env order
  (:func:`concat_obs`, :func:`concat_step_results`, :func:`concat_chunk_results`).
"""

from envs.multiprocess.buffers import StepBuffers
from envs.multiprocess.concat import concat_chunk_results, concat_obs, concat_step_results
from envs.multiprocess.doorbell import DEFAULT_SPIN_S, WAKE, CommandWaiter, Doorbell, ReplyWaiter, memory_fence
from envs.multiprocess.vec_env import EnvFn, EnvWorkerError, EnvWorkerTimeout, HandshakeStats, MultiprocessVecEnv, shard_bounds

__all__ = [
    "DEFAULT_SPIN_S",
    "WAKE",
    "CommandWaiter",
    "Doorbell",
    "EnvFn",
    "EnvWorkerError",
    "EnvWorkerTimeout",
    "HandshakeStats",
    "MultiprocessVecEnv",
    "ReplyWaiter",
    "StepBuffers",
    "concat_chunk_results",
    "concat_obs",
    "concat_step_results",
    "memory_fence",
    "shard_bounds",
]
