"""MuJoCo MJX (MuJoCo in JAX): ``env.id=mjx/<Task>``, N envs as one jit-compiled batch on the device.

:class:`MjxEnv` follows the batched protocol of :mod:`envs.adapters.batched_adapter` and comes
in through :class:`~envs.adapters.batched_adapter.BatchedVecEnv`, which adds episode statistics,
the NaN/inf policy and ``chunk_step``. One ``step`` is one jitted call: ``jax.vmap`` over the
task's physics step (``frame_skip`` ``mjx.step``), reward and termination, then the time limit
and the auto-reset of the finished rows inside the same call. Observations, rewards and flags
come back as torch tensors viewing the JAX buffers through DLPack (no copy, on CPU and on CUDA);
actions go the other way the same way.

Tasks (``envs/mjx_tasks``): ``mjx/HalfCheetah``, ``mjx/Hopper`` (terminates), ``mjx/Reacher``:
gymnasium's MJCF files with the v5 rewards reimplemented in JAX. ``env.kwargs``: the task's
gymnasium-v5 options (``ctrl_cost_weight``, ...), and ``device`` (``auto``: JAX's default
device, a GPU with ``jax[cuda12]`` installed; ``cpu``; ``cuda`` / ``cuda:K``; a run's
``workers.env_device``, when set, is this device),
``solver_iterations`` / ``ls_iterations`` (the constraint solver's, default the model's).

The env compiles its step when it is built: XLA takes tens of seconds for a task on a CPU, and a
worker's constructor has a longer timeout than a step. Compiled programs are kept in JAX's
persistent cache under ``$EMBODIED_CACHE/jax`` (default ``~/.cache/embodied/jax``), so a
second process with the same task, batch size and device loads them instead. MJX does not
render batched: state observations only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.batched_adapter import BatchedVecEnv
from envs.base import env_seeds
from envs.config import EnvConfig
from envs.registry import register_adapter

PREFIX = "mjx/"
BACKENDS = ("auto", "batched")
INSTALL_HINT = "pip install 'embodied[mjx]' (mujoco-mjx, jax; on an NVIDIA GPU also 'jax[cuda12]')"


@functools.lru_cache(maxsize=1)
def installed() -> bool:
    return importlib.util.find_spec("jax") is not None and importlib.util.find_spec("mujoco.mjx") is not None


def _claims(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def _import_jax() -> Any:
    """JAX, configured to share a GPU with torch and to keep its compiled programs on disk."""
    # JAX takes 75% of a GPU's memory at its first allocation unless told otherwise; the rollout
    # and the trainer's torch share that device
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    cache = Path(os.environ.get("EMBODIED_CACHE", Path.home() / ".cache" / "embodied")) / "jax"
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return jax


def _import_mjx() -> Any:
    """``mujoco.mjx``, without the lines it prints when NVIDIA Warp (its other backend) is absent."""
    with contextlib.redirect_stdout(io.StringIO()):
        from mujoco import mjx
    return mjx


def jax_device(name: str) -> Any:
    """The JAX device for ``env.kwargs.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:K``."""
    jax = _import_jax()
    if name == "auto":
        return jax.devices()[0]
    if name == "cpu":
        return jax.devices("cpu")[0]
    if name == "cuda" or name.startswith("cuda:"):
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if index >= len(gpus):
            raise UserError(f"env.kwargs.device={name!r}: JAX sees {len(gpus)} GPU(s) ({jax.default_backend()} backend). "
                            "On an NVIDIA machine install JAX's CUDA build: pip install 'jax[cuda12]'.")
        return gpus[index]
    raise UserError(f"env.kwargs.device={name!r} is not one of auto, cpu, cuda, cuda:K.")


def torch_device(device: Any) -> str:
    """The torch device string of a JAX device (``cpu``, ``cuda:K``)."""
    return "cpu" if device.platform == "cpu" else f"cuda:{device.id}"


class MjxEnv:
    """``num_envs`` envs of one MJX task, stepped as one batch by a jit-compiled function.

    ``seed``: env i's generator starts from ``seed + i`` (until ``reset`` reseeds it). Each env
    draws its initial states from its own key, so envs reset with the same seed start alike.
    ``max_episode_steps``: the time limit (default the task's gymnasium limit). ``ignore_terminations``:
    episodes run to the time limit. ``task_kwargs``: the task's gymnasium-v5 options.

    Shapes (N = num_envs): actions (N, A) float32; observations (N, D) float32; reward (N,)
    float32; terminated, truncated (N,) bool; all torch tensors on :attr:`device`.
    """

    is_vector_env = True

    def __init__(self, num_envs: int, task: str = "HalfCheetah", seed: int = 0, max_episode_steps: int | None = None,
                 ignore_terminations: bool = False, device: str = "auto", solver_iterations: int | None = None,
                 ls_iterations: int | None = None, **task_kwargs: float) -> None:
        jax = _import_jax()
        mjx = _import_mjx()

        from envs.mjx_tasks import TASKS

        task_cls = TASKS.get(task)
        mj_model = task_cls.load_model()
        if solver_iterations is not None:
            mj_model.opt.iterations = int(solver_iterations)
        if ls_iterations is not None:
            mj_model.opt.ls_iterations = int(ls_iterations)
        self.task = task_cls(mj_model, **task_kwargs)
        self.task_name = task
        self.num_envs = int(num_envs)
        self.max_episode_steps = int(max_episode_steps or task_cls.max_episode_steps)
        self.ignore_terminations = bool(ignore_terminations)
        self.jax_device = jax_device(device)
        self.device = torch_device(self.jax_device)
        low, high = mj_model.actuator_ctrlrange.T.astype(np.float32)
        self.single_action_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (task_cls.obs_size,), np.float32)

        self._model = mjx.put_model(mj_model, device=self.jax_device)
        self._data0 = mjx.make_data(self._model)
        self._keys = self._seed_keys(env_seeds(seed, self.num_envs))  # (N, 2) until the first reset
        self._state: tuple[Any, Any, Any] | None = None  # (data, steps (N,), keys (N, 2)) of the batch
        # Compiled here, not at the first step: a worker's constructor has cluster.start_timeout_s,
        # a step only cluster.timeout_s, and XLA takes tens of seconds for a task on a CPU
        donate = () if self.jax_device.platform == "cpu" else (0,)  # XLA's CPU backend cannot reuse buffers
        self._reset_fn = jax.jit(self._batched_reset).lower(self._keys).compile()
        state, _ = self._reset_fn(self._keys)
        actions = jax.device_put(np.zeros((self.num_envs, len(low)), np.float32), self.jax_device)
        self._step_fn = jax.jit(self._batched_step, donate_argnums=donate).lower(state, actions).compile()

    # --- one env (pure JAX; vmapped below) -----------------------------------------------------
    def _reset_one(self, key: Any) -> tuple[Any, Any]:
        """A new episode's data drawn with ``key``, and the env's next key."""
        import jax
        from mujoco import mjx

        key, draw = jax.random.split(key)
        qpos, qvel = self.task.initial_state(draw)
        data = self._data0.replace(qpos=qpos, qvel=qvel)
        # positions of the bodies for the first observation; the next mjx.step recomputes the rest
        return mjx.kinematics(self._model, data), key

    def _step_one(self, data: Any, action: Any) -> tuple[Any, Any, Any, Any]:
        import jax
        from mujoco import mjx

        after = jax.lax.fori_loop(0, self.task.frame_skip, lambda _, d: mjx.step(self._model, d), data.replace(ctrl=action))
        reward, terminated = self.task.reward(data, after, action)
        return after, self.task.observe(after), reward.astype(np.float32), terminated

    # --- the batch (jitted) --------------------------------------------------------------------
    def _batched_reset(self, keys: Any) -> tuple[tuple[Any, Any, Any], Any]:
        import jax
        import jax.numpy as jnp

        data, keys = jax.vmap(self._reset_one)(keys)
        steps = jnp.zeros(self.num_envs, jnp.int32)
        return (data, steps, keys), jax.vmap(self.task.observe)(data)

    def _batched_step(self, state: tuple[Any, Any, Any], actions: Any) -> tuple[Any, ...]:
        import jax
        import jax.numpy as jnp

        data, steps, keys = state
        after, final_obs, reward, terminated = jax.vmap(self._step_one)(data, actions)
        if self.ignore_terminations:
            terminated = jnp.zeros_like(terminated)
        steps = steps + 1
        truncated = (steps >= self.max_episode_steps) & ~terminated
        done = terminated | truncated

        def reset_done(carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
            data, steps, keys = carry
            fresh, new_keys = jax.vmap(self._reset_one)(keys)
            rows = lambda x: done.reshape((-1,) + (1,) * (x.ndim - 1))  # noqa: E731
            data = jax.tree_util.tree_map(lambda new, old: jnp.where(rows(old), new, old), fresh, data)
            return data, jnp.where(done, 0, steps), jnp.where(rows(keys), new_keys, keys)

        # the reset runs only on the steps where some env finished (a branch, not a select)
        data, steps, keys = jax.lax.cond(done.any(), reset_done, lambda carry: carry, (after, steps, keys))
        obs = jax.vmap(self.task.observe)(data)  # the reset rows' first observation, the others' final one
        return (data, steps, keys), obs, reward, terminated, truncated, final_obs

    # --- the protocol --------------------------------------------------------------------------
    def _seed_keys(self, seeds: list[int]) -> Any:
        import jax
        import jax.numpy as jnp

        keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
        return jax.device_put(keys, self.jax_device)

    def reset(self, seed: int | Sequence[int] | None = None) -> tuple[Any, dict]:
        """Start a new episode in every env; ``seed`` as :meth:`envs.base.VecEnv.reset` says."""
        if seed is not None:
            self._keys = self._seed_keys(env_seeds(seed, self.num_envs))
        elif self._state is not None:  # the generators as the last step left them
            self._keys = self._state[2]
        self._state, obs = self._reset_fn(self._keys)
        return _to_torch(obs), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict]:
        """Step all envs with ``actions`` (N, A); finished envs restart inside (``info["final_obs"]``)."""
        if self._state is None:
            raise RuntimeError(f"mjx/{self.task_name}: step() before reset()")
        self._state, obs, reward, terminated, truncated, final_obs = self._step_fn(self._state, self._to_jax(actions))
        return (_to_torch(obs), _to_torch(reward), _to_torch(terminated), _to_torch(truncated),
                {"final_obs": _to_torch(final_obs)})

    def _to_jax(self, actions: Any) -> Any:
        """``actions`` (torch or numpy) as a JAX array on the env's device, through DLPack when it can."""
        import jax

        if hasattr(actions, "__dlpack__") and not isinstance(actions, np.ndarray):
            actions = actions.detach().float().contiguous()
            try:
                return jax.dlpack.from_dlpack(actions)
            except Exception:  # noqa: BLE001 - another device, a view JAX does not take: one copy
                actions = actions.cpu().numpy()
        return jax.device_put(np.asarray(actions, np.float32), self.jax_device)

    def render(self) -> None:
        """MJX renders no batched images: None (no videos for ``mjx/`` tasks)."""
        return None

    def close(self) -> None:
        self._state = None


def _to_torch(x: Any) -> Any:
    """A torch tensor viewing JAX array ``x`` through DLPack (no copy)."""
    import torch

    return torch.utils.dlpack.from_dlpack(x)


def task_names() -> list[str]:
    from envs.mjx_tasks import TASKS

    return TASKS.names()


@register_adapter(
    "mjx",
    _claims,
    priority=15,
    doc="MuJoCo MJX tasks (mjx/HalfCheetah, mjx/Hopper, mjx/Reacher): N envs in one jit-compiled JAX batch, CPU or GPU.",
    takes_device=True,
)
def make_mjx(cfg: EnvConfig, seed: int) -> BatchedVecEnv:
    """An MJX task ``mjx/<Task>`` as a :class:`BatchedVecEnv` of torch tensors on the simulator's device."""
    if not installed():
        raise UserError(f"env.id={cfg.id!r} needs MuJoCo MJX and JAX: {INSTALL_HINT}.")
    if cfg.backend not in BACKENDS:
        raise UserError(f"env.backend={cfg.backend!r}: an MJX task is one batched simulation; use one of "
                        f"{', '.join(BACKENDS)}.{did_you_mean(cfg.backend, BACKENDS)}")
    if cfg.obs_mode != "state":
        raise UserError(f"env.obs_mode={cfg.obs_mode!r}: MJX renders no batched camera images; mjx/ tasks have "
                        "state observations only (env.obs_mode=state).")
    task = cfg.id[len(PREFIX):]
    names = task_names()
    if task not in names:
        raise UserError(f"env.id={cfg.id!r}: no MJX task {task!r}.{did_you_mean(task, names)} "
                        f"MJX tasks: {', '.join(PREFIX + n for n in names)}.")
    env = MjxEnv(cfg.num_envs, task=task, seed=seed, max_episode_steps=cfg.max_episode_steps,
                 ignore_terminations=cfg.ignore_terminations, **cfg.kwargs)
    return BatchedVecEnv(env, nonfinite=cfg.nonfinite, env_id=cfg.id)
