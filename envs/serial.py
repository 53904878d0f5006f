"""``SerialVecEnv``: a batch of single gymnasium envs stepped in sequence in this process.

This is the in-process backend for CPU simulators and the engine inside every process of the
multiprocess backend. It implements the contract of :mod:`envs.base` exactly, including
``chunk_step`` that stops stepping an env once its episode ended inside the chunk.

The user's env failing is reported as such: an exception from an env's constructor, ``reset`` or
``step`` becomes an :class:`~embodied.errors.EnvError` naming the env id, its index and seed
(a :class:`~embodied.errors.UserError` stays one), and every batch is checked for NaN/inf
(``env.nonfinite``, :mod:`envs.nonfinite`) before it leaves.

With ``timeout_s`` (``env.timeout_s``, the in-process backend) the envs live in a thread of their
own (:class:`_EnvThread`: built, reset, stepped, rendered and closed there, so a simulator's
thread-bound state such as a GL context stays in one thread) and the caller waits for each call
at most that long: an env that hangs raises :class:`EnvTimeout` naming the env (id, index, seed)
and what it was doing, with the hung thread's Python stack in the log, as an env process of the
multiprocess backend does. The hand-off costs a few microseconds per call (not per env).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import EnvError, ExitCode, UserError
from envs.base import ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, env_seeds, to_numpy
from envs.nonfinite import NONFINITE_INFO_KEY, all_finite, bad_rows, check_mode

log = logging.getLogger(__name__)

EnvFn = Callable[[], gym.Env]


def obs_space_as_dict(space: gym.Space) -> gym.spaces.Dict:
    """The contract's Dict observation space for a single env's space (Box -> {"state": Box})."""
    if isinstance(space, gym.spaces.Dict):
        return space
    if isinstance(space, gym.spaces.Box):
        return gym.spaces.Dict({"state": gym.spaces.Box(space.low, space.high, space.shape, np.float32)})
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Dict({"state": gym.spaces.Box(0, space.n - 1, (1,), np.float32)})
    raise TypeError(f"observation space {space} is not supported; return a Box or a Dict of Boxes")


def obs_as_dict(obs: Any) -> dict[str, np.ndarray]:
    """One env's observation as the contract's dict (state as float32)."""
    if isinstance(obs, dict):
        return {k: np.asarray(to_numpy(v)) for k, v in obs.items()}
    arr = np.asarray(to_numpy(obs))
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return {"state": arr.astype(np.float32, copy=False)}


#: Info keys that carry a task's success flag (``success`` as in ManiSkill/Meta-World, or ``is_success``).
SUCCESS_KEYS = ("success", "is_success")


def success_of(info: dict[str, Any]) -> bool | None:
    """The success flag of one env's info (the first of :data:`SUCCESS_KEYS` it has), or None."""
    for key in SUCCESS_KEYS:
        if key in info:
            return bool(np.asarray(to_numpy(info[key])).reshape(-1)[0])
    return None


class _Rows:
    """The batch observation of one call, filled row by row in place (no per-env dicts, no stack).

    The arrays are allocated at the first row with its keys, shapes and dtypes (as ``np.stack``
    would give them); later rows are assigned into them.
    """

    __slots__ = ("n", "arrays", "state")

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrays: dict[str, np.ndarray] | None = None
        self.state: np.ndarray | None = None  # arrays["state"] when observations are plain arrays

    def set(self, i: int, obs: Any) -> None:
        """Row ``i`` = one env's observation: a dict of arrays, or a Box/Discrete value (-> "state")."""
        if self.state is not None and type(obs) is np.ndarray:  # noqa: E721 - the hot case, checked fast
            self.state[i] = obs
            return
        arrays = self.arrays
        if arrays is None:  # keys, shapes and dtypes as obs_as_dict gives them
            arrays = self.arrays = {key: np.empty((self.n, *v.shape), v.dtype) for key, v in obs_as_dict(obs).items()}
            if not isinstance(obs, dict):
                self.state = arrays["state"]
        if not isinstance(obs, dict):
            obs = {"state": obs}
        for key, value in obs.items():
            arrays[key][i] = value if isinstance(value, np.ndarray) else to_numpy(value)


def env_name(env: gym.Env) -> str:
    """A gymnasium env's id (``CartPole-v1``), or ``module:Class`` of an env made from its class."""
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return spec.id
    cls = type(env.unwrapped)
    return f"{cls.__module__}:{cls.__qualname__}"


class EnvTimeout(EnvError):
    """An env of the in-process backend did not return within ``env.timeout_s`` (exit code 5)."""

    exit_code = ExitCode.TIMEOUT
    headline = "Timed out"


class _EnvThread:
    """One daemon thread that runs the calls of a :class:`SerialVecEnv`'s envs; the caller waits
    for each at most ``timeout_s``. A call that does not return in time leaves the thread to it
    (it cannot be stopped) and the VecEnv unusable."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            seq, fn = job
            try:
                self._results.put((seq, True, fn()))
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller
                self._results.put((seq, False, err))

    def call(self, fn: Callable[[], Any], timeout_s: float | None) -> Any:
        """``fn()`` run in the thread; :class:`queue.Empty` when it did not return within ``timeout_s``."""
        self._seq += 1
        seq = self._seq
        self._jobs.put((seq, fn))
        while True:
            got, ok, value = self._results.get(timeout=timeout_s)
            if got == seq:  # an older result belongs to a call whose caller stopped waiting (Ctrl-C)
                break
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        self._jobs.put(None)

    def stack(self) -> list[str]:
        """The thread's Python stack, innermost last."""
        frame = sys._current_frames().get(self.thread.ident or -1)
        return traceback.format_stack(frame) if frame is not None else []

    def locals_of(self, code_names: tuple[str, ...], names: tuple[str, ...]) -> dict[str, Any]:
        """Local variables ``names`` of the frames of this module's functions ``code_names`` that
        the thread is in, each from the innermost frame that has it (which env a loop is at)."""
        found: dict[str, Any] = {}
        frame = sys._current_frames().get(self.thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name in code_names and frame.f_code.co_filename == __file__:
                for name in names:
                    if name not in found and name in frame.f_locals:
                        found[name] = frame.f_locals[name]
            frame = frame.f_back
        return found


class SerialVecEnv(VecEnv):
    """``len(env_fns)`` gymnasium envs stepped one after another, with auto-reset.

    env_id:      the env's name in error messages (default: the first env's gymnasium id, or
                 ``module:Class``).
    first_index: index of ``env_fns[0]`` in the whole batch this VecEnv is a shard of (the
                 multiprocess backend's env processes), for error messages.
    nonfinite:   ``"error"`` or ``"drop"``: what a NaN/inf in an observation or reward does
                 (``env.nonfinite``; see :class:`~envs.config.EnvConfig`).
    timeout_s:   longest wait for one call of the envs (a reset, a step, a chunk, a render;
                 ``env.timeout_s``); None: the envs run in the caller's thread, unbounded (the
                 multiprocess backend's env processes, whose parent bounds them).
    start_timeout_s: with ``timeout_s``, longest wait for the envs to be built (``env.start_timeout_s``).
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        instructions: Sequence[str] | None = None,
        *,
        env_id: str | None = None,
        first_index: int = 0,
        nonfinite: str = "error",
        timeout_s: float | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        self.first_index = first_index
        self.nonfinite = check_mode(nonfinite)
        self.env_id = env_id
        self.timeout_s = timeout_s
        self._thread = _EnvThread(f"envs-{env_id or 'serial'}") if timeout_s is not None else None
        self._hung: EnvTimeout | None = None
        self._seeds: list[int | None] = [None] * len(env_fns)
        self.envs = []
        self._guarded(lambda: self._build(env_fns), "building the env", start_timeout_s, "env.start_timeout_s")
        self.num_envs = len(self.envs)
        if self.env_id is None:
            self.env_id = env_name(self.envs[0])
        first = self.envs[0]
        self.observation_space = obs_space_as_dict(first.observation_space)
        self.action_space = first.action_space
        self._instructions = list(instructions) if instructions is not None else None
        # Plain Python numbers: the per-env loop updates them every step (numpy scalars cost more).
        self._returns = [0.0] * self.num_envs
        self._lengths = [0] * self.num_envs
        self._episode_count = np.zeros(self.num_envs, np.int64)
        self._has_success = False
        self._closed = False
        self._last_obs: Obs | None = None  # the batch the next decision is made in (``drop`` needs it)
        self.nonfinite_episodes = 0
        """Episodes ended by ``nonfinite="drop"`` since construction."""

    # --- the calls' thread ----------------------------------------------------------------------
    def _build(self, env_fns: Sequence[EnvFn]) -> None:
        for i, fn in enumerate(env_fns):
            try:
                self.envs.append(fn())
            except (UserError, KeyboardInterrupt):
                raise
            except Exception as err:
                for env in self.envs:
                    env.close()
                raise self._env_error(i, "building the env", err) from err

    def _guarded(self, fn: Callable[[], Any], doing: str, timeout_s: float | None = None,
                 option: str = "env.timeout_s") -> Any:
        """``fn()``: in the caller's thread without a timeout, else in the envs' thread, waited for
        at most ``timeout_s`` (default ``self.timeout_s``); an env that hangs is an :class:`EnvTimeout`."""
        if self._thread is None:
            return fn()
        if self._hung is not None:
            raise self._hung
        wait_s = self.timeout_s if timeout_s is None and option == "env.timeout_s" else timeout_s
        try:
            return self._thread.call(fn, wait_s)
        except queue.Empty:
            self._hung = self._timeout(doing, wait_s, option)
            raise self._hung from None

    def _timeout(self, doing: str, timeout_s: float, option: str) -> EnvTimeout:
        """The error of a call that did not return: which env (the loop variable ``i`` of the
        method the envs' thread is in) and what it was doing; its Python stack goes to the log."""
        assert self._thread is not None
        local = self._thread.locals_of(("_advance", "_reset", "_reset_finite", "_reset_one", "_build", "_render", "_close_envs"),
                                        ("i", "doing"))
        i = local["i"] if isinstance(local.get("i"), int) else 0
        doing = local["doing"] if isinstance(local.get("doing"), str) else doing
        stack = "".join(self._thread.stack()).rstrip()
        log.warning("env %s (env index %d) did not return within %g s (%s) while %s; the Python stack of its thread:\n%s",
                  self.env_id, self.first_index + i, timeout_s, option, doing, stack)
        error = self._env_error(
            i, doing, f"did not return within {timeout_s:g} s ({option})",
            f"it may hang (a stuck simulator); the Python stack of its thread is in the log. Raise {option} if the env is "
            "just that slow")
        return EnvTimeout(detail=error.detail, where=error.where)

    # --- helpers -------------------------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None = None) -> Any:
        if seed is not None:
            self._seeds[i] = seed
        obs, _ = self.envs[i].reset(seed=seed)
        self._returns[i] = 0.0
        self._lengths[i] = 0
        return obs

    def _env_error(self, i: int, doing: str, cause: BaseException | str, hint: str | None = None) -> EnvError:
        """An :class:`EnvError` for env ``i`` of this VecEnv: what went wrong (an exception, or a
        sentence), what it was doing ("" to leave out), and what to do (default: read its traceback)."""
        what = cause if isinstance(cause, str) else f"raised {type(cause).__name__}: {cause}"
        seed = self._seeds[i] if i < len(getattr(self, "_seeds", ())) else None
        hint = hint or "its traceback is in the log"
        where = {"env_id": self.env_id, "env_index": self.first_index + i, "seed": seed}
        during = f" while {doing}" if doing else ""
        return EnvError(detail=f"{what}{during}. This is a failure of the env, not of Embodied or the policy: {hint}.",
                        where={k: v for k, v in where.items() if v is not None})

    # --- contract ------------------------------------------------------------------------------
    def reset(self, seed: int | Sequence[int] | None = None) -> Obs:
        return self._guarded(lambda: self._reset(seed), "resetting (reset())")

    def _reset(self, seed: int | Sequence[int] | None) -> Obs:
        rows = _Rows(self.num_envs)
        i = 0
        try:
            for i, env_seed in enumerate(env_seeds(seed, self.num_envs)):
                rows.set(i, self._reset_one(i, env_seed))
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as err:
            raise self._env_error(i, "resetting (reset())", err) from err
        batch = rows.arrays
        assert batch is not None
        if not all_finite(batch.values()):
            self._nonfinite_reset(rows)
        self._last_obs = batch
        return batch

    def step(self, actions: Any) -> StepResult:
        """One step is a chunk of one action: the same per-env loop, auto-reset and episode stats."""
        actions = to_numpy(self.check_step(actions))
        if self._thread is None:
            advanced = self._advance(actions, 1, chunked=False)
        else:
            advanced = self._guarded(lambda: self._advance(actions, 1, chunked=False), "stepping (step())")
        obs, rewards, terminated, truncated, _, final_obs, episodes, info = advanced
        return StepResult(obs, rewards, terminated, truncated, final_obs, episodes, info)

    def chunk_step(self, actions: Any) -> ChunkStepResult:
        actions = to_numpy(self.check_chunk(actions))
        n, c = actions.shape[0], actions.shape[1]
        advanced = self._guarded(lambda: self._advance(actions, c, chunked=True), "stepping (step())")
        obs, rewards, terminated, truncated, valid, final_obs, episodes, info = advanced
        assert valid is not None
        return ChunkStepResult(
            obs, rewards.reshape(n, c), terminated.reshape(n, c), truncated.reshape(n, c), valid.reshape(n, c), final_obs, episodes, info
        )

    def _advance(self, actions: np.ndarray, c: int, chunked: bool) -> tuple[Any, ...]:
        """Step every env through its actions: ``actions[i]`` is one action, or (chunked) a chunk
        of ``c`` that stops where the env's episode ends. Returns (obs, rewards, terminated,
        truncated, valid or None, final_obs, episodes, info) with per-step arrays flat (n * c).

        The hot loop of both backends on CPU: plain Python lists and counters, final observations
        and episode stats filled only when an episode ends, observation rows assigned in place.
        Beyond the envs' own steps it costs microseconds per env, a small share of any real
        simulator's step (even one that evicts the caches, as a ManiSkill step does).
        """
        n = self.num_envs
        size = n * c
        rewards = [0.0] * size
        terminated = [False] * size
        truncated = [False] * size
        valid = [False] * size
        success = [False] * n
        returns, lengths = self._returns, self._lengths
        episodes = EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64), None)
        rows = _Rows(n)
        finals: _Rows | None = None  # final observations, once an episode ends
        i, doing = 0, "stepping (step())"
        try:
            for i, (env, env_actions) in enumerate(zip(self.envs, actions)):
                k = i * c
                obs = None
                for action in env_actions if chunked else (env_actions,):
                    obs, reward, term, trunc, info = env.step(action)
                    reward = float(reward)
                    returns[i] += reward
                    lengths[i] += 1
                    rewards[k] = reward
                    valid[k] = True
                    succ = success_of(info) if info else None
                    if succ is not None:
                        self._has_success = True
                        success[i] = succ
                    if term or trunc:
                        terminated[k], truncated[k] = bool(term), bool(trunc)
                        self._finish_episode(i, succ, episodes)
                        if finals is None:
                            finals = _Rows(n)
                        finals.set(i, obs)
                        doing = "resetting after its episode ended (reset())"
                        obs = self._reset_one(i)
                        doing = "stepping (step())"
                        break  # the rest of the chunk belonged to an episode that is over
                    k += 1
                rows.set(i, obs)
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as err:
            raise self._env_error(i, doing, err) from err
        batch = rows.arrays
        assert batch is not None
        out = [
            batch,
            np.array(rewards, np.float32),
            np.array(terminated, bool),
            np.array(truncated, bool),
            np.array(valid, bool) if chunked else None,
            self._final(finals, episodes.done, batch),
            self._with_success(episodes),
            {"success": np.array(success, bool)} if self._has_success else {},
        ]
        # the hot path: one isfinite(...).all() per array; the rows are looked at only when it fails
        if not all_finite([out[1], *batch.values(), *(out[5].values() if out[5] is not None else ())]):
            self._nonfinite_step(rows, out, c)
        self._last_obs = batch
        return tuple(out)

    # --- NaN / inf -----------------------------------------------------------------------------
    def _nonfinite_step(self, rows: _Rows, out: list[Any], c: int) -> None:
        """Raise for the first env whose step returned NaN/inf (``error``), or end those envs'
        episodes (``drop``): in ``out`` (the result lists of ``_advance``), each such env's
        decision becomes a time-limit cut at the observation it was made in (``final_obs``), with
        reward 0, not a finished episode in the stats; the env is reset into ``obs``."""
        n = self.num_envs
        batch, rewards, terminated, truncated, valid, final_obs, episodes, info = out
        named = {f"observation {k!r}": v for k, v in batch.items()}
        named["reward"] = rewards
        if final_obs is not None:
            done = episodes.done  # rows of finals that are not done hold the current obs (checked above)
            named.update({f"final observation {k!r}": np.where(_rows_mask(done, v), v, 0) for k, v in final_obs.items()})
        bad, what = bad_rows(named, n)
        if self.nonfinite == "error":
            i = int(np.flatnonzero(bad)[0])
            others = int(bad.sum()) - 1
            also = f" ({others} other env(s) of this batch too)" if others else ""
            raise self._env_error(
                i, "", f"returned NaN/inf at step {self._lengths[i]} of its episode: its {what[i]}{also}",
                "env.nonfinite=drop ends such episodes instead (counted in env/nonfinite_episodes)") from None
        last = self._last_obs
        if final_obs is None:
            final_obs = out[5] = {k: v.copy() for k, v in batch.items()}
        for i in np.flatnonzero(bad):
            span = slice(i * c, (i + 1) * c)
            rewards[span] = 0.0
            terminated[span] = False
            truncated[span] = False
            truncated[i * c] = True
            if valid is not None:
                valid[span] = False
                valid[i * c] = True
            episodes.done[i] = False
            for k, v in final_obs.items():
                v[i] = last[k][i] if last is not None else 0
            self.nonfinite_episodes += 1
            log.warning("env %s (env index %d, seed %s): %s after %d steps of its episode; the episode is dropped "
                        "(env.nonfinite=drop) and the env reset", self.env_id, self.first_index + i, self._seeds[i],
                        what[int(i)], self._lengths[i])
            rows.set(int(i), self._reset_finite(int(i)))
        info[NONFINITE_INFO_KEY] = bad

    def _reset_finite(self, i: int) -> Any:
        """Reset env ``i`` (``drop``) and return its first observation, which must be finite."""
        try:
            obs = self._reset_one(i)
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as err:
            raise self._env_error(i, "resetting after a non-finite step (reset())", err) from err
        if not all_finite(obs_as_dict(obs).values()):
            raise self._env_error(i, "resetting after a non-finite step (reset())", "returned NaN/inf again",
                                  "env.nonfinite=drop cannot continue with an env whose reset is not finite")
        return obs

    def _nonfinite_reset(self, rows: _Rows) -> None:
        """``reset`` returned NaN/inf: raise (``error``), or reset those envs once more (``drop``)."""
        assert rows.arrays is not None
        bad, what = bad_rows({f"observation {k!r}": v for k, v in rows.arrays.items()}, self.num_envs)
        if self.nonfinite == "error":
            i = int(np.flatnonzero(bad)[0])
            raise self._env_error(i, "", f"returned NaN/inf from reset(): its {what[i]}",
                                  "env.nonfinite=drop resets such envs once more instead") from None
        for i in np.flatnonzero(bad):
            rows.set(int(i), self._reset_finite(int(i)))

    def _finish_episode(self, i: int, success: bool | None, episodes: EpisodeStats) -> None:
        episodes.done[i] = True
        episodes.episode_return[i] = self._returns[i]
        episodes.length[i] = self._lengths[i]
        if success is not None:
            if episodes.success is None:
                episodes.success = np.zeros(self.num_envs, bool)
            episodes.success[i] = success
        self._episode_count[i] += 1

    def _with_success(self, episodes: EpisodeStats) -> EpisodeStats:
        if self._has_success and episodes.success is None:
            episodes.success = np.zeros(self.num_envs, bool)
        return episodes

    def _final(self, finals: _Rows | None, done: np.ndarray, batch: Obs) -> Obs | None:
        if finals is None:
            return None
        # Rows of envs that did not finish hold their current obs (not meaningful).
        assert finals.arrays is not None
        keep = ~done
        for key, array in finals.arrays.items():
            array[keep] = batch[key][keep]
        return finals.arrays

    @property
    def instructions(self) -> list[str] | None:
        return self._instructions

    def render(self) -> np.ndarray | None:
        return self._guarded(self._render, "rendering (render())")

    def _render(self) -> np.ndarray | None:
        frames = []
        for i, env in enumerate(self.envs):  # noqa: B007 - ``i`` names the env that hangs
            frames.append(env.render())
        if any(f is None for f in frames):
            return None
        return np.stack([np.asarray(f) for f in frames])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._hung is not None:  # its thread is still inside the env: closing it would hang too
            log.warning("env %s: not closing its envs, one of them hangs (%s)", self.env_id, self._hung)
            return
        try:
            self._guarded(self._close_envs, "closing (close())")
        except EnvTimeout:
            pass  # logged; the thread is left to the env
        if self._thread is not None:
            self._thread.stop()

    def _close_envs(self) -> None:
        for i, env in enumerate(self.envs):  # noqa: B007 - ``i`` names the env that hangs
            env.close()


def _rows_mask(rows: np.ndarray, like: np.ndarray) -> np.ndarray:
    """(N,) row flags broadcast against an (N, ...) array."""
    return rows.reshape((-1,) + (1,) * (like.ndim - 1))
