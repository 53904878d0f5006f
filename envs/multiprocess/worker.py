"""The env worker process: its entry point, main loop and command handling.

:func:`worker_main` runs in each worker process: it sets the worker's signals, CPU affinity,
environment and thread budget before any simulator is imported, builds a
:class:`~envs.serial.SerialVecEnv` over its shard of envs, reports the spaces, then serves
commands until ``close`` or the parent's end: steps posted on its
:class:`~envs.multiprocess.doorbell.Doorbell` (results written into the
:class:`~envs.multiprocess.buffers.StepBuffers` block) and pickled commands from the pipe
(``attach``, ``step``, ``chunk_step``, ``reset``, ``render``, ``call``, ``close``). Every error
goes back to the parent as ``("error", (kind, message, traceback, where))`` (:func:`describe`).

With ``parent_death_signal`` (the ``forkserver`` start method, whose server process is the
parent) the process is killed when its parent dies, even while its simulator hangs in C code; and
``SIGUSR1`` makes it write every thread's Python stack to its log (the parent asks for that
before it gives up on a process that does not answer).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from embodied import logs
from embodied.errors import EnvError, UserError
from embodied.threads import THREAD_ENV_VARS
from envs.multiprocess.buffers import StepBuffers
from envs.multiprocess.doorbell import DEFAULT_SPIN_S, WAKE, CommandWaiter, Doorbell, memory_fence



#: prctl(2) option: the signal this process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def worker_main(
    index: int,
    conn: Connection,
    payload: bytes,
    env_vars: dict[str, str],
    threads: int,
    cores: set[int] | None = None,
    spin_s: float = DEFAULT_SPIN_S,
    label: str | None = None,
    first_index: int = 0,
    env_id: str | None = None,
    nonfinite: str = "error",
    parent_death_signal: bool = False,
) -> None:
    """Entry point of worker ``index``: build a SerialVecEnv over its shard (envs ``first_index``
    on of the whole batch), then serve commands."""
    if parent_death_signal:
        _die_with_parent()
    # Ctrl-C reaches the whole process group; the parent handles it and closes us cleanly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The parent's CPU affinity at construction (a forkserver started earlier may have another).
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    # Before any simulator (or torch) import: the parent's environment (a forkserver started
    # earlier may hold an older one), then the worker's thread budget.
    os.environ.update(env_vars)
    for key in (logs.RUN_DIR_ENV, logs.LABEL_ENV):  # unset in the parent: unset here too
        if key not in env_vars:
            os.environ.pop(key, None)
    # Name the process after the shard it hosts (ps: "env-0-shard1"), and send its output to
    # <run_dir>/logs/env-0-shard1.log when the parent has a run dir (embodied.logs).
    label = label or logs.child_label(f"shard{index}")
    logs.set_process_title(f"embodied::{label}", comm=label)
    logs.redirect_worker_output(label)
    try:  # SIGUSR1: every thread's Python stack to the log (or stderr), also while stuck in C code
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no SIGUSR1 (Windows) or no file descriptor
        pass
    for key in THREAD_ENV_VARS:
        os.environ[key] = str(threads)
    _limit_torch_threads(threads)
    venv = None
    buffers: StepBuffers | None = None
    rows = (0, 0)
    try:
        env_fns, instructions = cloudpickle.loads(payload)
        from envs.serial import SerialVecEnv

        venv = SerialVecEnv(env_fns, instructions, env_id=env_id, first_index=first_index, nonfinite=nonfinite)
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
            if message == WAKE:  # a wake-up for a step seen already
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
                reply = ("error", describe(err))
            conn.send(reply)
            waiter.replied()
    except KeyboardInterrupt:
        pass
    except Exception as err:  # noqa: BLE001 - a failed env constructor
        try:
            conn.send(("error", describe(err)))
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
        return Doorbell.PIPE, ("error", describe(err))
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


def describe(err: BaseException) -> tuple[str, str, str, dict[str, Any]]:
    """``(kind, message, traceback text, where)`` of an exception, always picklable: kind ``"user"``
    (a UserError: its message), ``"env"`` (an EnvError: its ``detail``, or its message when it
    has none, and ``where`` naming the env, its index and seed) or ``"error"`` (``"Type: message"``)."""
    tb = "".join(traceback.format_exception(err))
    if isinstance(err, UserError):
        return "user", str(err), tb, {}
    if isinstance(err, EnvError):
        where = {k: v for k, v in err.where.items() if isinstance(v, (int, str))}
        if err.detail is None:
            where["message"] = str(err)
        return "env", err.detail or "", tb, where
    return "error", f"{type(err).__name__}: {err}", tb, {}


def _die_with_parent() -> None:
    """Have the kernel kill this process when its parent (the forkserver) dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl: nobody would kill us later
        os._exit(1)
