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
killed worker raises :class:`EnvWorkerError` at once instead of hanging; an exception inside a
worker is re-raised in the parent with the worker index and the worker's traceback text (a
:class:`UserError` stays a ``UserError``). ``close`` ends and reaps every worker, also after a crash.

Scripts that use this class must guard their entry point with ``if __name__ == "__main__":``
(the ``forkserver`` and ``spawn`` start methods re-import the main module in each worker).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from embodied.errors import UserError
from envs.base import Array, ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, to_numpy

EnvFn = Callable[[], gym.Env]

#: Env vars that size the thread pools of torch/OpenMP/BLAS and of Mesa's llvmpipe/lavapipe in a
#: worker: without them every worker starts a thread per core and N workers oversubscribe the cores.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS")

#: How often a wait for a reply checks that the worker is still alive (a reply ends the wait at once).
_LIVENESS_SLICE_MS = 500
#: The pipe message that only wakes a sleeping side of the shared-memory handshake.
_WAKE = b"W"
#: Longest sleep of a waiting side between checks of the shared counters (with the fences below a
#: wake-up is never lost on x86; this bounds what a lost one costs where stores may pass loads).
_PARENT_SLICE_S = 0.02
_WORKER_MAX_SLICE_S = 0.064
#: ``select`` takes only file descriptors below FD_SETSIZE.
_SELECT_MAX_FD = 1024
#: Longest busy-wait of a worker for its next command (see :class:`CommandWaiter`).
DEFAULT_SPIN_S = 200e-6


class EnvWorkerError(RuntimeError):
    """An env worker process raised, died, or did not answer in time."""

    def __init__(self, message: str, worker_index: int, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.worker_traceback = worker_traceback


# --- shared-memory layout of one step's batch arrays ------------------------------------------------


class StepBuffers:
    """Batch arrays of one ``step`` in one shared-memory block: (N, ...) each, env-major.

    ``actions`` (N, *act_shape), ``obs[key]`` (N, *shape) for every Box key of the observation
    space, ``reward`` (N,) float32, ``terminated``/``truncated``/``success`` (N,) bool. Worker i
    writes rows ``start:end``; the parent copies whole arrays out, so no concatenation is needed.
    ``ctrl`` (P, 8) int64 holds each worker's :class:`Doorbell`, one 64-byte cache line per worker.
    """

    def __init__(self, shm: SharedMemory, layout: list[tuple[str, int, tuple[int, ...], str]], owner: bool) -> None:
        self.shm = shm
        self.layout = layout
        self.owner = owner
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=offset) for name, offset, shape, dtype in layout
        }
        self.actions = self.arrays["actions"]
        self.reward = self.arrays["reward"]
        self.terminated = self.arrays["terminated"]
        self.truncated = self.arrays["truncated"]
        self.success = self.arrays["success"]
        self.ctrl = self.arrays["ctrl"]
        self.obs = {name[4:]: arr for name, arr in self.arrays.items() if name.startswith("obs/")}

    @staticmethod
    def create(
        num_envs: int, observation_space: gym.spaces.Dict, action_space: gym.Space, num_procs: int = 1
    ) -> StepBuffers | None:
        """Allocate the block for these spaces, or None when a space has no fixed array layout."""
        fields: list[tuple[str, tuple[int, ...], np.dtype]] = [("ctrl", (num_procs, Doorbell.SLOTS), np.dtype(np.int64))]
        if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            return None
        fields.append(("actions", (num_envs, *(action_space.shape or ())), np.dtype(action_space.dtype)))
        for key, space in observation_space.spaces.items():
            if not isinstance(space, gym.spaces.Box):
                return None
            fields.append((f"obs/{key}", (num_envs, *space.shape), np.dtype(space.dtype)))
        fields += [
            ("reward", (num_envs,), np.dtype(np.float32)),
            ("terminated", (num_envs,), np.dtype(bool)),
            ("truncated", (num_envs,), np.dtype(bool)),
            ("success", (num_envs,), np.dtype(bool)),
        ]
        layout, offset = [], 0
        for name, shape, dtype in fields:
            layout.append((name, offset, shape, dtype.str))
            offset += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64  # 64-byte aligned slots
        try:
            shm = SharedMemory(create=True, size=max(offset, 64))
        except OSError as err:  # e.g. a small /dev/shm in a container: fall back to pickled steps
            warnings.warn(f"MultiprocessVecEnv: no shared memory of {offset} bytes ({err}); steps go through pipes.", stacklevel=3)
            return None
        return StepBuffers(shm, layout, owner=True)

    @staticmethod
    def attach(name: str, layout: list[tuple[str, int, tuple[int, ...], str]]) -> StepBuffers:
        return StepBuffers(SharedMemory(name=name), layout, owner=False)

    def spec(self) -> tuple[str, list[tuple[str, int, tuple[int, ...], str]]]:
        return self.shm.name, self.layout

    # worker side
    def write(self, result: StepResult, start: int, end: int) -> dict[str, Any]:
        """Write ``result`` (rows start:end) into the block; returns what did not fit (usually {})."""
        extras: dict[str, Any] = {}
        rows = {k: view[start:end] for k, view in self.obs.items()}
        if result.obs.keys() == rows.keys() and all(v.dtype == rows[k].dtype and v.shape == rows[k].shape for k, v in result.obs.items()):
            for k, v in result.obs.items():
                rows[k][...] = v
        else:
            extras["obs"] = result.obs
        self.reward[start:end] = result.reward
        self.terminated[start:end] = result.terminated
        self.truncated[start:end] = result.truncated
        info = dict(result.info)
        if "success" in info:
            self.success[start:end] = info.pop("success")
            extras["has_success"] = True
        if info:
            extras["info"] = info
        if result.final_obs is not None or result.episodes.done.any():
            extras["final_obs"] = result.final_obs
            extras["episodes"] = result.episodes
        return extras

    # parent side
    def read(self, extras: Sequence[dict[str, Any]], bounds: Sequence[tuple[int, int]]) -> StepResult:
        """The StepResult of all envs from the block (copied out) and the workers' extras."""
        has_success = False
        plain = True  # the common step: everything is in the block, no episode ended
        for ex in extras:
            if ex:
                has_success = has_success or ex.get("has_success", False)
                plain = plain and len(ex) == 1 and "has_success" in ex
        n = len(self.reward)
        if plain:
            obs = {k: v.copy() for k, v in self.obs.items()}
            final_obs = None
            episodes = _no_episodes(n, has_success)
            info = {}
        else:
            obs_rows = [self._obs_rows(ex, start, end) for ex, (start, end) in zip(extras, bounds)]
            obs = concat_obs(obs_rows) if any("obs" in ex for ex in extras) else {k: v.copy() for k, v in self.obs.items()}
            final_obs = _concat_final([ex.get("final_obs") for ex in extras], obs_rows)
            episodes = _concat_episodes(
                [ex.get("episodes") or _no_episodes(end - start, has_success) for ex, (start, end) in zip(extras, bounds)]
            )
            info = {}
            if any("info" in ex for ex in extras):
                info = _concat_info([ex.get("info", {}) for ex in extras], [end - start for start, end in bounds])
        if has_success:
            info["success"] = self.success.copy()
        return StepResult(obs, self.reward.copy(), self.terminated.copy(), self.truncated.copy(), final_obs, episodes, info)

    def _obs_rows(self, extra: dict[str, Any], start: int, end: int) -> Obs:
        return extra["obs"] if "obs" in extra else {k: v[start:end] for k, v in self.obs.items()}

    def close(self) -> None:
        self.arrays, self.obs = {}, {}
        self.actions = self.reward = self.terminated = self.truncated = self.success = self.ctrl = None  # type: ignore[assignment]
        try:
            self.shm.close()
            if self.owner:
                self.shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


def memory_fence(_lock: Any = threading.Lock()) -> None:
    """A memory barrier between this process's shared-memory stores and loads: taking and
    releasing a lock are atomic read-modify-writes, on x86 locked instructions, which no load or
    store crosses (a full fence). On weaker CPUs (ARM) they only order like acquire/release, so a
    store may still pass a later load there; the sleeps of :class:`Doorbell` are sliced, which
    bounds what such a missed wake-up costs to one slice."""
    _lock.acquire()
    _lock.release()


class Doorbell:
    """One worker's step handshake through shared memory (a row of ``StepBuffers.ctrl``).

    The parent writes the actions, then the step's sequence number into ``CMD``; the worker,
    which watches ``CMD``, steps, writes the results, the reply's kind into ``REPLY``, then the
    sequence number into ``DONE``, which the parent watches. A side that stops watching to sleep on
    the pipe first raises its ``*_ASLEEP`` flag and looks once more; the other side, after
    publishing, sends a one-byte wake-up only when that flag is up. Each side stores, fences, then
    loads (Dekker's handshake), so a wake-up cannot be missed on x86; sleeps are sliced all the
    same (see :func:`memory_fence`).

    A round trip costs two stores and a few loads instead of two pipe syscalls and two wake-ups of
    a sleeping process (tens of microseconds each on a virtual machine); the pipe stays the way
    for everything that does not fit the block (``REPLY == PIPE``) and for errors.
    """

    SLOTS = 8  # 64 bytes: one cache line per worker
    CMD, DONE, PARENT_ASLEEP, WORKER_ASLEEP, REPLY = range(5)
    #: Reply kinds: everything is in the block / and the envs report success / pickled in the pipe.
    PLAIN, SUCCESS, PIPE = 0, 1, 2

    __slots__ = ("row", "conn")

    def __init__(self, row: np.ndarray, conn: Connection) -> None:
        self.row = row
        self.conn = conn

    # parent side
    def ring(self, seq: int) -> None:
        """Post step ``seq`` (the actions are written and fenced)."""
        self.row[self.CMD] = seq

    def worker_asleep(self) -> bool:
        """After ``ring`` and a fence: whether the worker sleeps on its pipe (send it a wake-up)."""
        return bool(self.row[self.WORKER_ASLEEP])

    def done(self, seq: int) -> bool:
        return bool(self.row[self.DONE] == seq)

    def parent_sleep(self, seq: int, sleep: Callable[[float], bool], seconds: float) -> bool:
        """Sleep on the pipe (``sleep(seconds)``: whether it became readable) unless step ``seq``
        is done; whether it is done or the pipe is readable (a wake-up, a pickled reply, the end)."""
        row = self.row
        row[self.PARENT_ASLEEP] = 1
        memory_fence()
        try:
            if row[self.DONE] == seq:
                return True
            return sleep(seconds)
        finally:
            row[self.PARENT_ASLEEP] = 0

    # worker side
    def command(self) -> int:
        return int(self.row[self.CMD])

    def worker_sleep(self, last: int, poller: Any) -> bool:
        """Sleep on the pipe until a step after ``last`` is posted (True) or the pipe is readable
        (False: a pickled command, a stale wake-up, or the parent's end)."""
        row = self.row
        row[self.WORKER_ASLEEP] = 1
        memory_fence()
        slice_s = 1e-3
        try:
            while row[self.CMD] == last:
                if poller.poll(int(slice_s * 1e3)):
                    return bool(row[self.CMD] != last)
                slice_s = min(2 * slice_s, _WORKER_MAX_SLICE_S)
            return True
        finally:
            row[self.WORKER_ASLEEP] = 0

    def publish(self, seq: int, kind: int) -> None:
        """Step ``seq`` is done (its results written; a PIPE reply already sent): tell the parent."""
        row = self.row
        row[self.REPLY] = kind
        memory_fence()  # the results and REPLY before DONE
        row[self.DONE] = seq
        memory_fence()
        if kind != self.PIPE and row[self.PARENT_ASLEEP]:  # a PIPE reply wakes the parent itself
            self.conn.send_bytes(_WAKE)


def _no_episodes(n: int, has_success: bool) -> EpisodeStats:
    return EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64), np.zeros(n, bool) if has_success else None)


# --- worker side ---------------------------------------------------------------------------------


class CommandWaiter:
    """How a worker waits for its next command: spin briefly when the parent usually answers fast.

    Blocking costs a sleep and a wake-up per step (tens of microseconds each on a virtual machine,
    more when the core idles); a tight stepping loop whose parent turns a reply into the next
    command in ~20 us loses up to ~10% of its steps/s to that
    (``benchmarks/results/env_worker_spin.json``). The worker keeps the gaps between its last
    replies and the next commands; when their median is below ``max_spin_s`` it polls (the
    shared-memory doorbell and the pipe, yielding the core to any other runnable process) for up
    to twice that median before it sleeps. A parent that runs a policy between steps (gaps of
    milliseconds) never triggers the spin, so it costs nothing there. ``max_spin_s=0`` always
    sleeps at once.
    """

    def __init__(self, fileno: int, max_spin_s: float = DEFAULT_SPIN_S, window: int = 9) -> None:
        self.poller = select.poll()
        self.poller.register(fileno, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        self.max_spin_s = max_spin_s
        self.window = window
        self.gaps: list[float] = []  # seconds from a reply to the next command, the last ``window``
        self.replied_at: float | None = None
        self.spins = 0  # waits that spun (for tests and diagnostics)

    def spin_budget(self) -> float:
        """How long the next wait spins before it blocks (0: block at once)."""
        if self.max_spin_s <= 0 or len(self.gaps) < 3:
            return 0.0
        typical = sorted(self.gaps)[len(self.gaps) // 2]
        return min(self.max_spin_s, 2.0 * typical) if typical < self.max_spin_s else 0.0

    def wait(self, bell: Doorbell | None = None, last: int = 0) -> bool:
        """Return once there is something to do: True for a step posted on ``bell`` after step
        ``last``, False when the pipe is readable (a pickled command, a wake-up, or EOF)."""
        row = bell.row if bell is not None else None
        budget = self.spin_budget()
        if budget > 0 and self.replied_at is not None:
            self.spins += 1
            deadline = self.replied_at + budget
            poll = self.poller.poll
            while True:
                if row is not None and row[Doorbell.CMD] != last:
                    return True
                if poll(0):
                    return False
                if time.perf_counter() >= deadline:
                    break
                os.sched_yield()
        if bell is None:
            self.poller.poll()
            return False
        return bell.worker_sleep(last, self.poller)

    def received(self) -> None:
        """A command came (not a wake-up): keep the gap since the last reply."""
        if self.replied_at is not None:
            self.gaps.append(time.perf_counter() - self.replied_at)
            del self.gaps[: -self.window]
            self.replied_at = None

    def replied(self) -> None:
        self.replied_at = time.perf_counter()


class ReplyWaiter:
    """How the parent waits for a step's reply: sleep through most of it, spin for its end.

    A parent blocked on the pipe is woken by the worker's reply (a wake-up of tens of microseconds
    on a virtual machine, during which the worker idles too). The parent keeps the durations of
    the last steps; for the next one it sleeps until ``spin_s`` + margin before the typical
    duration (a sleeping core wakes late), then polls (yielding the core to any other runnable
    process) until the margin after it, so a reply that comes when steps usually come is seen at
    once; an earlier one wakes the sleep as before, a later one is waited for blocking. The margin
    is ``spin_s`` or ``fraction`` of the typical step, whichever is longer (a slow step varies
    more); steps shorter than twice the margin are polled for from the start. ``spin_s=0`` always
    blocks. Only used while the parent has a core its workers do not need (fewer workers than
    cores). The round trip it leaves is in ``benchmarks/results/env_worker_spin.json``
    (``round_trips``: about a quarter of the blocking one around 0-200 us steps on a 2-core VM).
    """

    def __init__(self, fileno: int, spin_s: float, fraction: float = 0.1, window: int = 9) -> None:
        self.fileno = fileno
        self.poller = select.poll()
        self.poller.register(fileno, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        self.spin_s = spin_s
        self.fraction = fraction
        self.window = window
        self.durations: list[float] = []  # seconds from sending a step to its reply, the last ``window``
        self.spins = 0  # waits that spun (for tests and diagnostics)

    def typical(self) -> float | None:
        if self.spin_s <= 0 or len(self.durations) < 3:
            return None
        return sorted(self.durations)[len(self.durations) // 2]

    def wait(
        self, sent_at: float, ready: Callable[[], bool] | None = None, sleep: Callable[[float], bool] | None = None
    ) -> None:
        """Sleep and spin as described; returns when the reply is there or the window is over
        (the caller then blocks as usual). ``ready()`` says whether the reply is there and
        ``sleep(seconds)`` sleeps until it may be (both default to the pipe being readable; the
        shared-memory path passes its :class:`Doorbell`'s)."""
        typical = self.typical()
        if typical is None:
            return
        if ready is None:
            poll = self.poller.poll

            def ready() -> bool:
                return bool(poll(0))

        margin = max(self.spin_s, self.fraction * typical)
        spin_from, spin_until = sent_at + typical - margin - self.spin_s, sent_at + typical + margin
        now = time.perf_counter()
        if now < spin_from and (sleep or self.sleep)(spin_from - now):
            return  # an early reply woke the sleep
        now = time.perf_counter()
        self.spins += 1
        while not ready() and now < spin_until:
            os.sched_yield()
            now = time.perf_counter()

    def sleep(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the reply; whether it came. ``select`` sleeps to the
        microsecond but takes only descriptors below FD_SETSIZE (1024); above, ``poll`` sleeps
        whole milliseconds, rounded down (the spin then starts up to 1 ms early)."""
        seconds = max(0.0, seconds)
        if self.fileno < _SELECT_MAX_FD:
            return bool(select.select([self.fileno], [], [], seconds)[0])
        milliseconds = int(seconds * 1e3)
        return milliseconds > 0 and bool(self.poller.poll(milliseconds))

    def replied(self, sent_at: float) -> None:
        self.durations.append(time.perf_counter() - sent_at)
        del self.durations[: -self.window]


def _worker_main(
    index: int,
    conn: Connection,
    payload: bytes,
    env_vars: dict[str, str],
    threads: int,
    cores: set[int] | None = None,
    spin_s: float = DEFAULT_SPIN_S,
) -> None:
    """Entry point of worker ``index``: build a SerialVecEnv over its shard, then serve commands."""
    # Ctrl-C reaches the whole process group; the parent handles it and closes us cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The parent's CPU affinity at construction (a forkserver started earlier may have another).
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    # Before any simulator (or torch) import: the parent's environment (a forkserver started
    # earlier may hold an older one), then the worker's thread budget.
    os.environ.update(env_vars)
    for key in THREAD_ENV_VARS:
        os.environ[key] = str(threads)
    _limit_torch_threads(threads)
    venv = None
    buffers: StepBuffers | None = None
    rows = (0, 0)
    try:
        env_fns, instructions = cloudpickle.loads(payload)
        from envs.serial import SerialVecEnv

        venv = SerialVecEnv(env_fns, instructions)
        _limit_torch_threads(threads)  # the simulator may have imported torch just now
        conn.send(("ok", (venv.observation_space, venv.action_space)))
        waiter = CommandWaiter(conn.fileno(), spin_s)
        bell: Doorbell | None = None
        last = 0  # the last step posted on the doorbell that this worker did
        while True:
            try:
                posted = waiter.wait(bell, last)
                message = b"" if posted else conn.recv_bytes()
            except (EOFError, OSError):  # the parent is gone
                break
            if message == _WAKE:  # a wake-up for a step seen already
                continue
            waiter.received()
            if posted:
                assert bell is not None and buffers is not None
                memory_fence()  # the parent's actions, written before CMD
                last = bell.command()
                kind, reply = _step_shared(venv, buffers, rows)
                if kind == Doorbell.PIPE:
                    conn.send(reply)
                bell.publish(last, kind)
                waiter.replied()
                continue
            try:
                command, arg = pickle.loads(message)
                if command == "close":
                    break
                if command == "attach":
                    (name, layout), rows = arg
                    buffers = StepBuffers.attach(name, layout)
                    bell = Doorbell(buffers.ctrl[index], conn)
                    reply = ("ok", None)
                else:
                    reply = ("ok", _run_command(venv, command, arg))
            except Exception as err:  # noqa: BLE001 - every error goes back to the parent
                reply = ("error", _describe(err))
            conn.send(reply)
            waiter.replied()
    except KeyboardInterrupt:
        pass
    except Exception as err:  # noqa: BLE001 - a failed env constructor
        try:
            conn.send(("error", _describe(err)))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if buffers is not None:
            buffers.close()
        if venv is not None:
            try:
                venv.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        try:
            conn.send(("ok", None))  # acknowledges "close"; fails harmlessly if the parent is gone
        except (BrokenPipeError, OSError):
            pass
        conn.close()


def _step_shared(venv: Any, buffers: StepBuffers, rows: tuple[int, int]) -> tuple[int, Any]:
    """One step with this worker's rows of the block: (reply kind, the reply to pickle if PIPE)."""
    start, end = rows
    try:
        extras = buffers.write(venv.step(buffers.actions[start:end].copy()), start, end)
    except Exception as err:  # noqa: BLE001 - every error goes back to the parent
        return Doorbell.PIPE, ("error", _describe(err))
    if not extras:
        return Doorbell.PLAIN, None
    if len(extras) == 1 and "has_success" in extras:
        return Doorbell.SUCCESS, None
    return Doorbell.PIPE, ("ok", extras)


def _run_command(venv: Any, command: str, arg: Any) -> Any:
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


def _limit_torch_threads(threads: int) -> None:
    torch = sys.modules.get("torch")
    if torch is None:  # not imported (yet): it will read OMP_NUM_THREADS when it is
        return
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


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
    timeout_s:    longest wait for one reply (None: wait as long as the worker is alive); a stuck
                  worker then raises :class:`EnvWorkerError`.
    start_timeout_s: longest wait for the workers to build their envs.
    shared_memory: pass ``step`` batches through shared memory (False: everything pickled).
    threads_per_worker: size of each worker's thread pools (torch, OpenMP, BLAS, llvmpipe); set
                  before the simulator is imported. 1 keeps N workers on N cores from oversubscribing.
    spin_s:       longest busy-wait of a worker for its next command when commands usually follow
                  its replies within that time (a tight stepping loop), and of the parent around
                  the typical arrival of a step's reply; 0 always blocks. Workers do not spin with
                  more workers than cores (a spinning worker would hold a core another one needs),
                  the parent only with fewer. See :class:`CommandWaiter` and :class:`ReplyWaiter`.

    Workers run on the CPU cores this process may use when it makes them (its affinity), so a
    pipeline that pins its env worker to some cores pins that worker's env processes too.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        num_procs: int,
        instructions: Sequence[str] | None = None,
        context: str = "forkserver",
        timeout_s: float | None = None,
        start_timeout_s: float | None = 600.0,
        shared_memory: bool = True,
        threads_per_worker: int = 1,
        spin_s: float = DEFAULT_SPIN_S,
    ) -> None:
        if len(env_fns) < 1:
            raise UserError("MultiprocessVecEnv needs at least one env constructor.")
        if num_procs < 1:
            raise UserError(f"env.num_procs must be >= 1, got {num_procs}.")
        if spin_s < 0:
            raise UserError(f"env.worker_spin_us must be >= 0, got {spin_s * 1e6:g}.")
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
        self._pollers: list[select.poll] = []
        self._buffers: StepBuffers | None = None
        ctx = mp.get_context(context)
        env_vars = dict(os.environ)
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        num_cores = len(cores) if cores is not None else os.cpu_count() or 1
        if self.num_procs > num_cores:
            spin_s = 0.0  # more workers than cores: a spinning worker would hold a core another one needs
        self.spin_s = spin_s
        # The parent spins for replies only with a core to itself (fewer workers than cores).
        self.reply_spin_s = spin_s if self.num_procs < num_cores else 0.0
        self._reply_waiters: list[ReplyWaiter] = []
        self._sent_at: float | None = None  # when the step in flight was sent
        self._bells: list[Doorbell] = []  # the workers' shared-memory handshakes (with the block)
        self._seq = 0  # the last step posted on the doorbells
        self._piped: list[bytes | None] = []  # a step's reply read from the pipe while sleeping
        try:
            for i, (start, end) in enumerate(self.bounds):
                shard_instr = self._instructions[start:end] if self._instructions is not None else None
                payload = cloudpickle.dumps((list(env_fns[start:end]), shard_instr))
                parent_conn, child_conn = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(i, child_conn, payload, env_vars, threads_per_worker, cores, spin_s),
                    name=f"EnvWorker-{i}",
                    daemon=True,
                )
                proc.start()
                child_conn.close()
                self._conns.append(parent_conn)
                self._procs.append(proc)
                poller = select.poll()  # one per pipe: cheaper than Connection.poll's selector per call
                poller.register(parent_conn.fileno(), select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
                self._pollers.append(poller)
                self._reply_waiters.append(ReplyWaiter(parent_conn.fileno(), self.reply_spin_s))
            spaces = self._gather("start", timeout_s=start_timeout_s)
            self.observation_space, self.action_space = spaces[0]
            if shared_memory:
                self._buffers = StepBuffers.create(self.num_envs, self.observation_space, self.action_space, self.num_procs)
            if self._buffers is not None:
                self._waiting = "attach"
                self._send_all("attach", [(self._buffers.spec(), bounds) for bounds in self.bounds])
                self._finish("attach")
                self._bells = [Doorbell(self._buffers.ctrl[i], conn) for i, conn in enumerate(self._conns)]
                self._piped = [None] * self.num_procs
        except BaseException:
            self.close(timeout_s=2.0)
            raise

    # --- messaging -------------------------------------------------------------------------------
    def _send_all(self, command: str, args: Sequence[Any]) -> None:
        for i, (conn, arg) in enumerate(zip(self._conns, args)):
            self._send_bytes(i, command, pickle.dumps((command, arg), protocol=pickle.HIGHEST_PROTOCOL))

    def _send_bytes(self, i: int, command: str, message: bytes) -> None:
        try:
            self._conns[i].send_bytes(message)
        except (BrokenPipeError, OSError):
            self._broken(self._dead(i, command))

    def _gather(self, command: str, timeout_s: float | None = None) -> list[Any]:
        """One reply per worker, in worker order; raises after draining every live worker.

        A step's replies (``step``: pickled through the pipe; ``step_shared``: the extras of the
        step posted on the doorbells, see :class:`Doorbell`) are waited for with each worker's
        :class:`ReplyWaiter`."""
        replies: list[Any] = [None] * len(self._conns)
        failure: Exception | None = None
        shared = command == "step_shared"
        name = "step" if shared else command
        sent_at = self._sent_at if name == "step" else None
        seq = self._seq
        for i in range(len(self._conns)):
            waiter = self._reply_waiters[i]
            if sent_at is not None:
                waiter.wait(sent_at, **(self._doorbell_hooks(i, seq) if shared else {}))
            status, value = self._recv_shared(i, seq) if shared else self._recv(i, command, timeout_s)
            if sent_at is not None:
                waiter.replied(sent_at)
            if status == "ok":
                replies[i] = value
            elif failure is None:
                failure = self._worker_failure(i, name, value)
        if failure is not None:
            raise failure
        return replies

    def _doorbell_hooks(self, i: int, seq: int) -> dict[str, Callable[..., bool]]:
        """How :meth:`ReplyWaiter.wait` sees and sleeps for worker ``i``'s step ``seq`` on its doorbell."""
        bell = self._bells[i]
        return {"ready": lambda: bell.done(seq), "sleep": lambda seconds: self._sleep_shared(i, seq, seconds)}

    def _recv_shared(self, i: int, seq: int) -> tuple[str, Any]:
        """Worker ``i``'s reply to step ``seq`` of the doorbell: from the block, or pickled from
        the pipe (REPLY == PIPE, which the worker may send before DONE)."""
        bell = self._bells[i]
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while not bell.done(seq) and self._piped[i] is None:
            if not self._sleep_shared(i, seq, _PARENT_SLICE_S):
                self._check_alive(i, "step", self.timeout_s, deadline)
        message, self._piped[i] = self._piped[i], None
        if message is not None:
            return pickle.loads(message)
        memory_fence()  # the worker's results, written before DONE
        kind = bell.row[Doorbell.REPLY]
        if kind == Doorbell.PIPE:
            return self._recv(i, "step", self.timeout_s)
        return "ok", ({"has_success": True} if kind == Doorbell.SUCCESS else {})

    def _sleep_shared(self, i: int, seq: int, seconds: float) -> bool:
        """Sleep up to ``seconds`` for worker ``i``'s step ``seq``; whether it is done or its
        reply came through the pipe (kept in ``_piped``). Wake-ups left from earlier steps (the
        worker saw the parent asleep, the parent saw DONE before the wake-up came) are read and
        slept through."""
        bell, sleep = self._bells[i], self._reply_waiters[i].sleep
        until = time.perf_counter() + seconds
        while bell.parent_sleep(seq, sleep, until - time.perf_counter()):
            if bell.done(seq):
                return True
            message = self._read(i, "step")  # readable: a wake-up, a pickled reply, or EOF (raises)
            if message != _WAKE:
                self._piped[i] = message
                return True
            if time.perf_counter() >= until:
                break
        return False

    def _recv(self, i: int, command: str, timeout_s: float | None) -> tuple[str, Any]:
        # Wait on the pipe in slices (a reply ends the wait at once) and check between slices that
        # the worker is alive; a dead worker usually shows at once as EOF on its pipe.
        poller = self._pollers[i]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            while not poller.poll(_LIVENESS_SLICE_MS):
                self._check_alive(i, command, timeout_s, deadline)
            message = self._read(i, command)
            if message != _WAKE:  # a wake-up of an earlier step that the parent did not sleep for
                return pickle.loads(message)

    def _read(self, i: int, command: str) -> bytes:
        try:
            return self._conns[i].recv_bytes()
        except (EOFError, OSError):
            self._broken(self._dead(i, command))
            raise  # unreachable: _broken raises

    def _check_alive(self, i: int, command: str, timeout_s: float | None, deadline: float | None) -> None:
        if not self._procs[i].is_alive() and not self._conns[i].poll():
            self._broken(self._dead(i, command))
        if deadline is not None and time.monotonic() > deadline:
            self._broken(
                EnvWorkerError(
                    f"env worker {i} ({self._describe_shard(i)}) did not answer {command!r} "
                    f"within {timeout_s} s; it may be stuck in the simulator.",
                    i,
                )
            )

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
        self._waiting = "broken"
        self.close(timeout_s=2.0)
        raise err

    def _describe_shard(self, i: int) -> str:
        start, end = self.bounds[i]
        return f"envs {start}..{end - 1}"

    def _begin(self, command: str) -> None:
        if self._closed:
            raise RuntimeError("MultiprocessVecEnv is closed (or a worker died); make a new one.")
        if self._waiting is not None:
            raise RuntimeError(f"{command} called while {self._waiting!r} is in flight; call its *_wait() first.")
        self._waiting = command

    def _finish(self, command: str) -> list[Any]:
        if self._closed:
            raise RuntimeError("MultiprocessVecEnv is closed (or a worker died); make a new one.")
        if self._waiting != command:
            raise RuntimeError(f"no {command!r} in flight to wait for (in flight: {self._waiting}).")
        try:
            return self._gather(command, self.timeout_s)
        finally:
            if not self._closed:
                self._waiting = None

    # --- async contract ----------------------------------------------------------------------------
    def step_async(self, actions: Array) -> None:
        """Send each worker its rows of ``actions`` (N, *act_shape) and return at once."""
        actions = to_numpy(actions)
        act_shape = (self.num_envs, *(self.action_space.shape or ()))
        if tuple(actions.shape) != act_shape:
            raise UserError(
                f"step expects actions of shape (num_envs, *action_shape) = {act_shape}, got {tuple(actions.shape)}; "
                f"the env's action space is {self.action_space}."
            )
        buffers = self._buffers
        self._sent_at = time.perf_counter()
        if buffers is not None and actions.shape == buffers.actions.shape and actions.dtype == buffers.actions.dtype:
            self._begin("step_shared")
            buffers.actions[...] = actions
            self._seq = seq = self._seq + 1
            memory_fence()  # the actions before the command
            for bell in self._bells:
                bell.ring(seq)
            memory_fence()  # the command before the look at the workers' sleep flags
            for i, bell in enumerate(self._bells):
                if bell.worker_asleep():
                    self._send_bytes(i, "step", _WAKE)
        else:  # an unexpected dtype or shape goes pickled, so the envs see exactly what was given
            self._begin("step")
            self._send_all("step", [actions[start:end] for start, end in self.bounds])

    def step_wait(self) -> StepResult:
        """The :class:`StepResult` of the step sent by ``step_async``."""
        if self._waiting == "step_shared":
            assert self._buffers is not None
            return self._buffers.read(self._finish("step_shared"), self.bounds)
        return concat_step_results(self._finish("step"))

    def chunk_step_async(self, actions: Array) -> None:
        """Send each worker its rows of the chunk ``actions`` (N, C, *act_shape) and return at once."""
        actions = to_numpy(self.check_chunk(actions))
        self._begin("chunk_step")
        self._send_all("chunk_step", [actions[start:end] for start, end in self.bounds])

    def chunk_step_wait(self) -> ChunkStepResult:
        """The :class:`ChunkStepResult` of the chunk sent by ``chunk_step_async``."""
        return concat_chunk_results(self._finish("chunk_step"))

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
        """``env.<name>(*args, **kwargs)`` on every single env; picklable results in env order."""
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
        """Ask every worker to close its envs, then reap it (terminate, then kill, after ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        polite = self._waiting is None  # with replies outstanding (or a dead peer) do not wait long
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    conn.send_bytes(pickle.dumps(("close", None)))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + (timeout_s if polite else min(timeout_s, 1.0))
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        for conn in self._conns:
            conn.close()
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None
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
    return _concat_results(StepResult, shards, [len(s.reward) for s in shards])


def concat_chunk_results(shards: Sequence[ChunkStepResult]) -> ChunkStepResult:
    """One ChunkStepResult of all envs from the shard results, in shard order."""
    return _concat_results(ChunkStepResult, shards, [len(s.rewards) for s in shards])


def _concat_results(cls: type, shards: Sequence[Any], sizes: list[int]) -> Any:
    """Concatenate every field of per-shard results along the env axis."""
    if len(shards) == 1:
        return shards[0]
    obs = [s.obs for s in shards]
    special = {
        "obs": lambda: concat_obs(obs),
        "final_obs": lambda: _concat_final([s.final_obs for s in shards], obs),
        "episodes": lambda: _concat_episodes([s.episodes for s in shards]),
        "info": lambda: _concat_info([s.info for s in shards], sizes),
    }
    return cls(**{
        f.name: special[f.name]() if f.name in special else np.concatenate([getattr(s, f.name) for s in shards])
        for f in dataclasses.fields(cls)
    })
