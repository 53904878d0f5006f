"""``MultiprocessVecEnv``: CPU simulators spread over worker processes.

Each worker process owns a contiguous shard of the envs and steps it with a
:class:`~envs.serial.SerialVecEnv`, so auto-reset, episode stats and the exact ``chunk_step``
semantics are the in-process ones. The parent sends ONE message per worker per call (the
worker's rows of the actions) and concatenates the replies back in env order:

    parent ── actions[0:k] ──▶ worker 0: SerialVecEnv(envs 0..k-1) ── StepResult ──▶ parent
           ── actions[k:N] ──▶ worker 1: SerialVecEnv(envs k..N-1) ── StepResult ──┘

``step_async`` / ``step_wait`` (and ``chunk_step_async`` / ``chunk_step_wait``) split the send
from the receive so a caller can overlap policy inference with simulation.

Robustness: every wait watches both the pipe and the process sentinel, so a killed worker raises
:class:`EnvWorkerError` at once instead of hanging; an exception inside a worker is re-raised in
the parent with the worker index and the worker's traceback text (a :class:`UserError` stays a
``UserError``). ``close`` ends and reaps every worker, also after a crash.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from embodied.errors import UserError
from envs.base import Array, ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, to_numpy

EnvFn = Callable[[], gym.Env]

#: How often a wait for a reply checks that the worker is still alive (a reply ends the wait at once).
_LIVENESS_SLICE_S = 0.5

#: Env vars that stop one worker from spawning a thread per core (2 cores shared by N workers).
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "LP_NUM_THREADS": "1"}


class EnvWorkerError(RuntimeError):
    """An env worker process raised, died, or did not answer in time."""

    def __init__(self, message: str, worker_index: int, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.worker_traceback = worker_traceback


# --- worker side ---------------------------------------------------------------------------------


def _worker_main(
    index: int, conn: Connection, parent_conn: Connection, payload: bytes, env_vars: dict[str, str]
) -> None:
    """Entry point of worker ``index``: build a SerialVecEnv over its shard, then serve commands."""
    parent_conn.close()  # only the parent's end of our own pipe was inherited (fork); not used here
    # Ctrl-C reaches the whole process group; the parent handles it and closes us cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before any simulator (or torch) import: the parent's environment (a forkserver started
    # earlier may hold an older one), then one thread per worker unless the user chose otherwise.
    os.environ.update(env_vars)
    for key, value in SINGLE_THREAD_ENV.items():
        os.environ.setdefault(key, value)
    _limit_torch_threads()
    venv = None
    try:
        env_fns, instructions = cloudpickle.loads(payload)
        from envs.serial import SerialVecEnv

        venv = SerialVecEnv(env_fns, instructions)
        _limit_torch_threads()  # the simulator may have imported torch just now
        conn.send(("ok", (venv.observation_space, venv.action_space)))
        while True:
            try:
                command, arg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if command == "close":
                venv.close()
                conn.send(("ok", None))
                break
            try:
                conn.send(("ok", _run_command(venv, command, arg)))
            except Exception as err:  # noqa: BLE001 - every error goes back to the parent
                conn.send(("error", _describe(err)))
    except KeyboardInterrupt:
        pass
    except Exception as err:  # noqa: BLE001 - a failed env constructor
        try:
            conn.send(("error", _describe(err)))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if venv is not None:
            try:
                venv.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        conn.close()


def _run_command(venv: VecEnv, command: str, arg: Any) -> Any:
    if command == "step":
        return venv.step(arg)
    if command == "chunk_step":
        return venv.chunk_step(arg)
    if command == "reset":
        return venv.reset(seed=arg)
    if command == "render":
        return venv.render()
    if command == "call":
        name, args, kwargs = arg
        return [getattr(env, name)(*args, **kwargs) for env in venv.envs]
    raise ValueError(f"unknown env worker command {command!r}")


def _limit_torch_threads() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _describe(err: BaseException) -> tuple[bool, str, str]:
    """(is_user_error, one-line summary, traceback text) of an exception; always picklable."""
    return isinstance(err, UserError), f"{type(err).__name__}: {err}", traceback.format_exc()


# --- parent side ---------------------------------------------------------------------------------


def shard_bounds(num_envs: int, num_procs: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) env ranges of ``num_procs`` shards, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_procs)
    bounds, start = [], 0
    for i in range(num_procs):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


class MultiprocessVecEnv(VecEnv):
    """``len(env_fns)`` envs spread over ``num_procs`` processes; see the module docstring.

    env_fns:      one constructor per env (pickled with cloudpickle, so closures work); each runs
                  in its worker process, which is where simulators get imported.
    num_procs:    worker processes (capped at ``len(env_fns)``); worker i steps a contiguous shard.
    instructions: optional language instruction per env.
    context:      multiprocessing start method, ``"forkserver"`` (default) or ``"spawn"``;
                  ``"fork"`` is accepted but unsafe once torch or a simulator has started threads.
    timeout_s:    longest wait for one reply (None: wait while the worker is alive); a stuck
                  worker then raises :class:`EnvWorkerError`.
    start_timeout_s: longest wait for the workers to build their envs.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        num_procs: int,
        instructions: Sequence[str] | None = None,
        context: str = "forkserver",
        timeout_s: float | None = None,
        start_timeout_s: float | None = 600.0,
    ) -> None:
        if len(env_fns) < 1:
            raise UserError("MultiprocessVecEnv needs at least one env constructor.")
        if num_procs < 1:
            raise UserError(f"env.num_procs must be >= 1, got {num_procs}.")
        if instructions is not None and len(instructions) != len(env_fns):
            raise UserError(f"got {len(instructions)} instructions for {len(env_fns)} envs.")
        self.num_envs = len(env_fns)
        self.num_procs = min(num_procs, self.num_envs)
        self.bounds = shard_bounds(self.num_envs, self.num_procs)
        self.timeout_s = timeout_s
        self._instructions = list(instructions) if instructions is not None else None
        self._closed = False
        self._waiting: str | None = None  # the command whose replies are outstanding
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        ctx = mp.get_context(context)
        env_vars = dict(os.environ)
        try:
            for i, (start, end) in enumerate(self.bounds):
                shard_instr = self._instructions[start:end] if self._instructions is not None else None
                payload = cloudpickle.dumps((list(env_fns[start:end]), shard_instr))
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(i, child_conn, parent_conn, payload, env_vars),
                    name=f"EnvWorker-{i}",
                    daemon=True,
                )
                proc.start()
                child_conn.close()
                self._conns.append(parent_conn)
                self._procs.append(proc)
            spaces = self._gather("start", timeout_s=start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.observation_space, self.action_space = spaces[0]

    # --- messaging -------------------------------------------------------------------------------
    def _send_all(self, command: str, args: Sequence[Any]) -> None:
        for i, (conn, arg) in enumerate(zip(self._conns, args)):
            try:
                conn.send((command, arg))
            except (BrokenPipeError, OSError):
                self._waiting = None
                raise self._dead(i, command) from None

    def _gather(self, command: str, timeout_s: float | None = None) -> list[Any]:
        """One reply per worker, in worker order; raises after draining every live worker.

        Replies are read in worker order with ``poll`` in short slices: a reply is taken the moment
        it arrives, a dead worker shows as EOF on its pipe (or as not alive between slices).
        """
        replies: list[Any] = [None] * len(self._conns)
        failure: Exception | None = None
        for i, conn in enumerate(self._conns):
            status, value = self._recv(i, command, timeout_s)
            if status == "ok":
                replies[i] = value
            elif failure is None:
                failure = self._worker_failure(i, command, value)
        if failure is not None:
            raise failure
        return replies

    def _recv(self, i: int, command: str, timeout_s: float | None) -> tuple[str, Any]:
        conn, proc = self._conns[i], self._procs[i]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not conn.poll(_LIVENESS_SLICE_S):
                if not proc.is_alive() and not conn.poll():
                    self._broken(self._dead(i, command))
                if deadline is not None and time.monotonic() > deadline:
                    self._broken(
                        EnvWorkerError(
                            f"env worker {i} ({self._describe_shard(i)}) did not answer {command!r} "
                            f"within {timeout_s} s; it may be stuck in the simulator.",
                            i,
                        )
                    )
            return conn.recv()
        except (EOFError, OSError):
            self._broken(self._dead(i, command))
            raise  # unreachable: _broken raises

    def _worker_failure(self, i: int, command: str, value: tuple[bool, str, str]) -> Exception:
        is_user_error, summary, tb = value
        where = f"env worker {i} ({self._describe_shard(i)}) failed in {command!r}"
        if is_user_error:
            return UserError(f"{summary.split(': ', 1)[-1]} ({where})")
        return EnvWorkerError(f"{where}: {summary}\n\nWorker traceback:\n{tb}", i, tb)

    def _dead(self, i: int, command: str) -> EnvWorkerError:
        proc = self._procs[i]
        proc.join(timeout=1.0)
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return EnvWorkerError(
            f"env worker {i} ({self._describe_shard(i)}, pid {proc.pid}) died during {command!r} "
            f"({how}). A simulator crash or the out-of-memory killer are the usual causes.",
            i,
        )

    def _broken(self, err: EnvWorkerError) -> None:
        """A worker is dead or stuck: the batch cannot continue; free everything and raise."""
        self._waiting = None
        self.close(timeout_s=2.0)
        raise err

    def _describe_shard(self, i: int) -> str:
        start, end = self.bounds[i]
        return f"envs {start}..{end - 1}"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MultiprocessVecEnv is closed (or a worker died); make a new one.")

    def _split(self, actions: np.ndarray) -> list[np.ndarray]:
        return [actions[start:end] for start, end in self.bounds]

    # --- async contract ----------------------------------------------------------------------------
    def step_async(self, actions: Array) -> None:
        """Send each worker its rows of ``actions`` (N, A) and return at once."""
        self._begin("step")
        actions = to_numpy(actions)
        if actions.shape[0] != self.num_envs:
            self._waiting = None
            raise UserError(f"step expects actions for num_envs={self.num_envs} envs, got shape {tuple(actions.shape)}.")
        self._send_all("step", self._split(actions))

    def step_wait(self) -> StepResult:
        """The :class:`StepResult` of the step sent by ``step_async``."""
        return concat_step_results(self._finish("step"))

    def chunk_step_async(self, actions: Array) -> None:
        """Send each worker its rows of the chunk ``actions`` (N, C, A) and return at once."""
        actions = to_numpy(self.check_chunk(actions))
        self._begin("chunk_step")
        self._send_all("chunk_step", self._split(actions))

    def chunk_step_wait(self) -> ChunkStepResult:
        """The :class:`ChunkStepResult` of the chunk sent by ``chunk_step_async``."""
        return concat_chunk_results(self._finish("chunk_step"))

    def _begin(self, command: str) -> None:
        self._check_open()
        if self._waiting is not None:
            raise RuntimeError(f"{command}_async called while a {self._waiting!r} is in flight; call {self._waiting}_wait() first.")
        self._waiting = command

    def _finish(self, command: str) -> list[Any]:
        self._check_open()
        if self._waiting != command:
            raise RuntimeError(f"{command}_wait called without a matching {command}_async (in flight: {self._waiting}).")
        try:
            return self._gather(command, self.timeout_s)
        finally:
            self._waiting = None

    # --- sync contract -----------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Obs:
        self._begin("reset")
        self._send_all("reset", [None if seed is None else seed + start for start, _ in self.bounds])
        return concat_obs(self._finish("reset"))

    def step(self, actions: Array) -> StepResult:
        self.step_async(actions)
        return self.step_wait()

    def chunk_step(self, actions: Array) -> ChunkStepResult:
        self.chunk_step_async(actions)
        return self.chunk_step_wait()

    def render(self) -> np.ndarray | None:
        self._begin("render")
        self._send_all("render", [None] * self.num_procs)
        frames = self._finish("render")
        if any(f is None for f in frames):
            return None
        return np.concatenate(frames)

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``env.<name>(*args, **kwargs)`` on every single env, results in env order (picklable)."""
        self._begin("call")
        self._send_all("call", [(name, args, kwargs)] * self.num_procs)
        return [value for shard in self._finish("call") for value in shard]

    @property
    def instructions(self) -> list[str] | None:
        return self._instructions

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the workers (for monitoring and tests)."""
        return [p.pid for p in self._procs]

    @property
    def processes(self) -> list[mp.process.BaseProcess]:
        return list(self._procs)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to close its envs, then reap it (terminate/kill after ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    if self._waiting is None:
                        conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        for proc in self._procs:
            proc.join(timeout=timeout_s if self._waiting is None else 0.0)
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        for conn in self._conns:
            conn.close()
        self._waiting = None

    def __del__(self) -> None:
        try:
            self.close(timeout_s=1.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# --- concatenation of shard results (pure functions, env order kept) -----------------------------


def concat_obs(shards: Sequence[Obs]) -> Obs:
    """Concatenate per-key batch arrays of consecutive shards."""
    if len(shards) == 1:
        return shards[0]
    return {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}


def _concat_final(finals: Sequence[Obs | None], obs: Sequence[Obs]) -> Obs | None:
    # Shards where no env finished fill their rows with their current obs (not meaningful),
    # exactly as SerialVecEnv does for its unfinished rows.
    if all(f is None for f in finals):
        return None
    return concat_obs([f if f is not None else o for f, o in zip(finals, obs)])


def _concat_episodes(shards: Sequence[EpisodeStats]) -> EpisodeStats:
    if len(shards) == 1:
        return shards[0]
    success = None
    if any(s.success is not None for s in shards):
        success = np.concatenate([s.success if s.success is not None else np.zeros_like(s.done) for s in shards])
    return EpisodeStats(
        done=np.concatenate([s.done for s in shards]),
        episode_return=np.concatenate([s.episode_return for s in shards]),
        length=np.concatenate([s.length for s in shards]),
        success=success,
    )


def _concat_info(infos: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    if len(infos) == 1:
        return infos[0]
    keys = {k for info in infos for k in info}
    out = {}
    for k in keys:
        parts = [to_numpy(info[k]) for info in infos if k in info]
        template = parts[0]
        out[k] = np.concatenate(
            [to_numpy(info[k]) if k in info else np.zeros((n, *template.shape[1:]), template.dtype) for info, n in zip(infos, sizes)]
        )
    return out


def concat_step_results(shards: Sequence[StepResult]) -> StepResult:
    """One StepResult of all envs from the shard results, in shard order."""
    if len(shards) == 1:
        return shards[0]
    obs = [s.obs for s in shards]
    return StepResult(
        obs=concat_obs(obs),
        reward=np.concatenate([s.reward for s in shards]),
        terminated=np.concatenate([s.terminated for s in shards]),
        truncated=np.concatenate([s.truncated for s in shards]),
        final_obs=_concat_final([s.final_obs for s in shards], obs),
        episodes=_concat_episodes([s.episodes for s in shards]),
        info=_concat_info([s.info for s in shards], [len(s.reward) for s in shards]),
    )


def concat_chunk_results(shards: Sequence[ChunkStepResult]) -> ChunkStepResult:
    """One ChunkStepResult of all envs from the shard results, in shard order."""
    if len(shards) == 1:
        return shards[0]
    obs = [s.obs for s in shards]
    return ChunkStepResult(
        obs=concat_obs(obs),
        rewards=np.concatenate([s.rewards for s in shards]),
        terminated=np.concatenate([s.terminated for s in shards]),
        truncated=np.concatenate([s.truncated for s in shards]),
        valid=np.concatenate([s.valid for s in shards]),
        final_obs=_concat_final([s.final_obs for s in shards], obs),
        episodes=_concat_episodes([s.episodes for s in shards]),
        info=_concat_info([s.info for s in shards], [len(s.rewards) for s in shards]),
    )
