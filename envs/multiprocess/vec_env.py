"""``MultiprocessVecEnv``: the parent side, a :class:`~envs.base.VecEnv` over worker processes.

It starts one worker process per shard (:func:`~envs.multiprocess.worker.worker_main`), sends
each worker its rows of every command, waits for the replies (polling each pipe in slices and
checking the process between them) and puts them back together in env order. ``step`` goes
through the :class:`~envs.multiprocess.buffers.StepBuffers` block and each worker's
:class:`~envs.multiprocess.doorbell.Doorbell`; everything else travels pickled through the pipes.
The overview of the transport is in :mod:`envs.multiprocess`.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from embodied import logs
from embodied.errors import EnvError, ExitCode, UserError
from envs.base import Array, ChunkStepResult, Obs, StepResult, VecEnv, env_seeds, to_numpy
from envs.multiprocess.buffers import StepBuffers
from envs.multiprocess.concat import concat_chunk_results, concat_obs, concat_step_results
from envs.multiprocess.doorbell import DEFAULT_SPIN_S, PARENT_SLICE_S, WAKE, Doorbell, ReplyWaiter, memory_fence
from envs.multiprocess.worker import worker_main
from envs.nonfinite import check_mode

EnvFn = Callable[[], gym.Env]

#: How often a wait for a reply checks that the worker is still alive (a reply ends the wait at once).
_LIVENESS_SLICE_MS = 500
#: Shard numbers of this process's env processes, for their labels (``env-0-shard3``): unique over
#: every MultiprocessVecEnv the process makes (an env worker's chunks, a re-plan), so no two
#: processes share a log file.
_SHARD_NUMBERS = itertools.count()
#: What this process's forkserver imports before it forks env processes (see :func:`preload_in_forkserver`).
_PRELOADED: set[str] = {"__main__"}


def preload_in_forkserver(modules: Sequence[str]) -> None:
    """Have this process's forkserver import ``modules`` once, so that every env process it forks
    starts with them imported instead of importing them itself: a simulator whose import takes
    seconds (ManiSkill's, torch included) is paid once per process that makes env processes,
    not once per env process (a profile probes five shapes, an evaluation and its video make four
    processes). Takes effect when the forkserver starts (the first env process this process makes
    with the ``forkserver`` start method); later calls add nothing to a running server. Modules that
    fail to import are skipped by the server; each env process imports what it needs anyway. A
    preloaded module is imported before the worker sets its thread budget (``threads_per_worker``):
    torch's pools are sized again after the fork (the worker calls ``torch.set_num_threads``), and a
    simulator's own threads start when its env is built, in the worker."""
    if not _PRELOADED.issuperset(modules):
        _PRELOADED.update(modules)
        mp.set_forkserver_preload(sorted(_PRELOADED))


class EnvWorkerError(EnvError):
    """An env process raised, died, or did not answer in time (an :class:`EnvError`: exit code 3).

    ``worker_index`` is the process's index in its VecEnv; ``where`` holds it as ``env_process``,
    the process's ``log`` when it has one, and what the env error knew (``env_id``,
    ``env_index``, ``seed``)."""

    def __init__(self, message: str, worker_index: int, worker_traceback: str = "", where: dict[str, Any] | None = None,
                 detail: str | None = None, appendix: str = "") -> None:
        super().__init__(message, where={"env_process": worker_index, **(where or {})}, detail=detail, appendix=appendix)
        self.worker_index = worker_index
        self.worker_traceback = worker_traceback


class EnvWorkerTimeout(EnvWorkerError):
    """An env process did not answer within ``env.timeout_s`` (or started within
    ``env.start_timeout_s``): exit code 5."""

    exit_code = ExitCode.TIMEOUT
    headline = "Timed out"


def shard_bounds(num_envs: int, num_procs: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) env ranges of ``num_procs`` shards, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_procs)
    bounds, start = [], 0
    for i in range(num_procs):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


@dataclass(frozen=True)
class HandshakeStats:
    """A snapshot of how ``step`` went between the parent and its workers (tests, diagnostics).

    steps_posted:  steps the parent posted through shared memory (:class:`Doorbell` command counter;
                   0 with ``shared_memory=False``, and pickled steps are not counted).
    steps_done:    per worker, the last posted step it finished (its done counter); equal to
                   ``steps_posted`` once ``step_wait`` returned. Empty without shared memory.
    parent_asleep: per worker, whether the parent's sleep flag is up (only while it waits for a
                   reply; False between calls). Empty without shared memory.
    reply_spins:   per worker, how many reply waits the parent spent polling around the typical
                   step time (:attr:`ReplyWaiter.spins`; stays 0 while ``reply_spin_s`` is 0).
    """

    steps_posted: int
    steps_done: tuple[int, ...]
    parent_asleep: tuple[bool, ...]
    reply_spins: tuple[int, ...]


class MultiprocessVecEnv(VecEnv):
    """``len(env_fns)`` envs spread over ``num_procs`` processes; see :mod:`envs.multiprocess`.

    env_fns:      one constructor per env (pickled with cloudpickle, so closures work); each runs
                  in its worker process, which is where simulators get imported.
    num_procs:    worker processes (capped at ``len(env_fns)``); worker i steps a contiguous shard.
    instructions: optional language instruction per env.
    context:      multiprocessing start method, ``"forkserver"`` (default) or ``"spawn"``;
                  ``"fork"`` is accepted but unsafe once torch or a simulator has started threads.
                  With ``forkserver`` the kernel kills the env processes when the server (which
                  dies with this process) does, even while their simulator hangs.
    timeout_s:    longest wait for one reply (``env.timeout_s``; None: wait as long as the worker
                  is alive); a stuck worker then raises :class:`EnvWorkerTimeout`, after asking
                  it to write its Python stack to its log.
    start_timeout_s: longest wait for the workers to build their envs (``env.start_timeout_s``).
    env_id:       the env's name in error messages (default: the gymnasium id the workers see).
    nonfinite:    what a NaN/inf does, ``"error"`` or ``"drop"`` (``env.nonfinite``; checked in
                  the workers by their :class:`~envs.serial.SerialVecEnv`).
    shared_memory: pass ``step`` batches through shared memory (False: everything pickled).
    threads_per_worker: size of each worker's thread pools (torch, OpenMP, BLAS, llvmpipe); set
                  before the simulator is imported. 1 keeps N workers on N cores from oversubscribing.
    preload:      modules the forkserver imports once for all the env processes it forks (the
                  simulator's, when its import is slow; see :func:`preload_in_forkserver`); forkserver only.
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
        env_id: str | None = None,
        nonfinite: str = "error",
        preload: Sequence[str] = (),
    ) -> None:
        check_mode(nonfinite)
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
        self.env_id = env_id
        self._seeds: list[int | None] = [None] * self.num_envs  # each env's last reset seed (messages)
        self._labels: list[str] = []
        self._run_dir = os.environ.get(logs.RUN_DIR_ENV)  # where the workers write their logs (if set)
        self._instructions = list(instructions) if instructions is not None else None
        self._closed = False
        self._waiting: str | None = None  # the command whose replies are outstanding
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        self._pollers: list[select.poll] = []
        self._buffers: StepBuffers | None = None
        ctx = mp.get_context(context)
        if context == "forkserver" and preload:
            preload_in_forkserver(preload)
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
                label = logs.child_label(f"shard{next(_SHARD_NUMBERS)}")  # its process title and log label
                self._labels.append(label)
                proc = ctx.Process(
                    target=worker_main,
                    args=(i, child_conn, payload, env_vars, threads_per_worker, cores, spin_s, label, start, env_id,
                          nonfinite, context == "forkserver"),
                    name=label,
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
            self._start_timeout_s = start_timeout_s
            spaces = self._gather("start", timeout_s=start_timeout_s)
            self.observation_space, self.action_space = spaces[0]
            if shared_memory:
                self._buffers = StepBuffers.create(self.num_envs, self.observation_space, self.action_space, self.num_procs)
            if self._buffers is not None:
                self._waiting = "attach"
                self._send_all("attach", [(self._buffers.spec(), bounds) for bounds in self.bounds])
                self._finish("attach")
                self._buffers.release_name()  # every worker has it mapped: no name left to leak
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
            if not self._sleep_shared(i, seq, PARENT_SLICE_S):
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
            if message != WAKE:
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
            if message != WAKE:  # a wake-up of an earlier step that the parent did not sleep for
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
            option = "env.start_timeout_s" if command == "start" else "env.timeout_s"
            doing = "start and build its envs" if command == "start" else f"answer {command!r}"
            stack = self._dump_stack(i)
            self._broken(EnvWorkerTimeout(
                f"env process {i} ({self._describe_shard(i)}) did not {doing} within {timeout_s:g} s ({option}): an "
                f"env's {'constructor' if command == 'start' else command.replace('step_shared', 'step')} may hang "
                f"(a stuck simulator). {stack}Raise {option} if the env is just that slow.",
                i, where=self._where(i),
            ))

    def _dump_stack(self, i: int) -> str:
        """Ask worker ``i`` to write its Python stack to its log (faulthandler on SIGUSR1); the
        sentence saying where it went."""
        proc = self._procs[i]
        if proc.pid is None or not proc.is_alive() or not hasattr(signal, "SIGUSR1"):
            return ""
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except OSError:
            return ""
        time.sleep(0.2)  # the handler writes at once, from C, even while the process is stuck in C code
        log = self._log(i)
        return f"Its Python stack is at the end of {log}. " if log else ""

    def _log(self, i: int) -> str | None:
        """Worker ``i``'s log file (None without a run dir: its output goes to stderr)."""
        return str(logs.worker_log_path(self._run_dir, self._labels[i])) if self._run_dir else None

    def _where(self, i: int) -> dict[str, Any]:
        """What a failure of worker ``i`` says about where: its index, log, env id (its pid is in
        the message: ``pid`` in ``where`` is the worker rank's)."""
        where: dict[str, Any] = {"env_process": i}
        if self._log(i):
            where["log"] = self._log(i)
        if self.env_id:
            where["env_id"] = self.env_id
        return where

    def _worker_failure(self, i: int, command: str, value: tuple[str, str, str, dict[str, Any]]) -> Exception:
        kind, message, tb, env_where = value
        if kind == "user":
            return UserError(f"{message} (env process {i}, {self._describe_shard(i)})")
        where = {**self._where(i), **env_where}
        if kind == "env":  # the env's own message names it, its index and seed
            plain = where.pop("message", None)
            return EnvWorkerError(plain or message, i, tb, where, detail=None if plain else message,
                                  appendix=f"\n\nWorker traceback:\n{tb}")
        return EnvWorkerError(f"env process {i} ({self._describe_shard(i)}) failed in {command!r}: {message}\n\n"
                              f"Worker traceback:\n{tb}", i, tb, where)

    def _dead(self, i: int, command: str) -> EnvWorkerError:
        proc = self._procs[i]
        proc.join(timeout=1.0)
        code = proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return EnvWorkerError(
            f"env process {i} ({self._describe_shard(i)}, pid {proc.pid}) died during {command.replace('step_shared', 'step')!r} "
            f"({how}). A simulator crash or the out-of-memory killer are the usual causes.",
            i, where=self._where(i),
        )

    def _broken(self, err: EnvWorkerError) -> None:
        """A worker is dead or stuck: the batch cannot continue; free everything and raise."""
        self._waiting = "broken"
        self.close(timeout_s=2.0)
        raise err

    def _describe_shard(self, i: int) -> str:
        start, end = self.bounds[i]
        seeds = self._seeds[start:end]
        seeded = "" if seeds[0] is None or seeds[-1] is None else (
            f", seed {seeds[0]}" if end - start == 1 else f", seeds {seeds[0]}..{seeds[-1]}")
        return (f"env {start}" if end - start == 1 else f"envs {start}..{end - 1}") + seeded

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
                    self._send_bytes(i, "step", WAKE)
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
    def reset(self, seed: int | Sequence[int] | None = None) -> Obs:
        self._begin("reset")
        seeds = env_seeds(seed, self.num_envs)
        if seed is not None:
            self._seeds = list(seeds)
        self._send_all("reset", [None if seed is None else seeds[start:end] for start, end in self.bounds])
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

    def handshake_stats(self) -> HandshakeStats:
        """Counters and flags of the step handshake, read now (no per-step bookkeeping)."""
        return HandshakeStats(
            steps_posted=self._seq,
            steps_done=tuple(int(bell.row[Doorbell.DONE]) for bell in self._bells),
            parent_asleep=tuple(bool(bell.row[Doorbell.PARENT_ASLEEP]) for bell in self._bells),
            reply_spins=tuple(waiter.spins for waiter in self._reply_waiters),
        )

    def set_reply_spin(self, spin_s: float) -> None:
        """Set how long the parent polls around a step's typical reply time (``reply_spin_s``,
        :class:`ReplyWaiter`); 0 makes it block for every reply while the workers keep their own
        spin (``spin_s``), which is how ``benchmarks/env_worker_spin`` measures the workers' spin
        alone. The constructor's choice is ``spin_s`` with fewer workers than cores, else 0."""
        if spin_s < 0:
            raise UserError(f"MultiprocessVecEnv.set_reply_spin: spin_s must be >= 0, got {spin_s:g}.")
        self.reply_spin_s = spin_s
        for waiter in self._reply_waiters:
            waiter.spin_s = spin_s

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
