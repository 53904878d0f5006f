"""Isaac Gym / Isaac Lab-style batched envs: one object steps all N envs at once, in torch.

The user names the class with ``env.id = "package.module:ClassName"``; the adapter builds it once
with ``num_envs`` and ``env.kwargs`` and wraps it in :class:`BatchedVecEnv`, which returns the
env's own torch tensors on its ``device`` (no per-env wrapping, no copies to numpy).

The protocol a class must follow (the shape of Isaac Lab's ``DirectRLEnv``)::

    class MyBatchedEnv:
        is_vector_env = True          # marker: this class steps a whole batch itself
        def __init__(self, num_envs: int, **kwargs): ...
            # also gets ``seed=`` and ``max_episode_steps=`` when __init__ declares them
        num_envs: int
        device: str | torch.device
        single_observation_space: gym.spaces.Box | gym.spaces.Dict   # ONE env's space
        single_action_space: gym.spaces.Box                            # ONE env's space
            # (``observation_space``/``action_space`` are used when the ``single_*`` ones are absent)
        def reset(self, seed: int | list[int] | None = None) -> obs | tuple[obs, dict]: ...  # a list: one seed per env
        def step(self, actions: Tensor) -> tuple[obs, reward, terminated, truncated, info]: ...
        def close(self) -> None: ...                  # optional
        def render(self) -> Tensor | None: ...        # optional, (N, H, W, 3) uint8
        instructions: list[str]                       # optional, one language instruction per env

Shapes (N = num_envs): ``actions`` (N, A) float32 on ``device``; ``obs`` a tensor (N, D) or a dict
of tensors such as Isaac Lab's ``{"policy": (N, D)}``; ``reward`` (N,); ``terminated`` and
``truncated`` (N,) bool. The env resets finished envs inside ``step``: their ``obs`` rows are the
first observation of the next episode, and ``info["final_obs"]`` (same structure as ``obs``; gymnasium's
``"final_observation"`` is accepted too) holds the last observation of the finished episodes in
the rows that are done. ``info["success"]`` (N,) bool is optional.

rsl_rl's 4-tuple ``(obs, reward, dones, extras)`` with ``extras["time_outs"]`` is accepted too:
``truncated = dones & time_outs``, ``terminated = dones & ~time_outs``.

Observation keys: a tensor becomes ``{"state": obs}``; in a dict, Isaac Lab's ``"policy"`` group is
renamed ``"state"`` (the key policies read) and the other groups (``"critic"``, ...) are kept.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from embodied.errors import UserError
from envs.base import ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, to_numpy
from envs.config import EnvConfig
from envs.registry import register_adapter
from envs.serial import SUCCESS_KEYS, obs_space_as_dict

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: importing the adapters package (which every
# CPU env worker process does) then does not pay torch's import time.
Tensor = "torch.Tensor"
TorchObs = dict[str, "torch.Tensor"]


def is_batched_env_class(obj: Any) -> bool:
    """Whether ``obj`` is a class that follows the batched protocol (``is_vector_env = True``)."""
    return isinstance(obj, type) and bool(getattr(obj, "is_vector_env", False))


def _import_class(env_id: str) -> Any:
    module_name, attr = env_id.split(":", 1)
    module = importlib.import_module(module_name)
    return getattr(module, attr, None)


def _claims(env_id: str) -> bool:
    if ":" not in env_id:
        return False
    try:
        return is_batched_env_class(_import_class(env_id))
    except Exception:  # noqa: BLE001 - an id we cannot import is the gymnasium adapter's to explain
        return False


def _rename_obs_space(space: gym.spaces.Dict) -> gym.spaces.Dict:
    spaces = dict(space.spaces)
    if "policy" in spaces and "state" not in spaces:
        spaces = {("state" if k == "policy" else k): v for k, v in spaces.items()}
    return gym.spaces.Dict(spaces)


class BatchedVecEnv(VecEnv):
    """The VecEnv contract on top of one batched torch env (see the module docstring).

    ``instructions`` (one per env) default to the env's own ``instructions`` attribute, if any.
    """

    def __init__(self, env: Any, instructions: list[str] | None = None) -> None:
        import torch

        self.env = env
        self._instructions = list(instructions) if instructions is not None else getattr(env, "instructions", None)
        self.num_envs = int(env.num_envs)
        self.device = str(getattr(env, "device", "cpu"))
        obs_space = getattr(env, "single_observation_space", None) or env.observation_space
        self.observation_space = _rename_obs_space(obs_space_as_dict(obs_space))
        self.action_space = getattr(env, "single_action_space", None) or env.action_space
        n, dev = self.num_envs, self.device
        self._returns = torch.zeros(n, dtype=torch.float32, device=dev)
        self._lengths = torch.zeros(n, dtype=torch.int64, device=dev)
        self._has_success = False
        self._warned_final_obs = False
        self._closed = False

    # --- conversions ---------------------------------------------------------------------------
    def _obs(self, obs: Any) -> TorchObs:
        if isinstance(obs, dict):
            if "policy" in obs and "state" not in obs:
                return {("state" if k == "policy" else k): v for k, v in obs.items()}
            return dict(obs)
        return {"state": obs}

    def _actions(self, actions: Any) -> Tensor:
        import torch

        if isinstance(actions, np.ndarray) and not actions.flags.writeable:
            actions = actions.copy()  # e.g. from Ray's zero-copy store; torch warns on read-only memory
        return torch.as_tensor(actions, dtype=torch.float32, device=self.device)

    def _flag(self, x: Any) -> Tensor:
        import torch

        return torch.as_tensor(x, device=self.device).reshape(self.num_envs).bool()

    def _success(self, info: dict[str, Any]) -> Tensor | None:
        for key in SUCCESS_KEYS:
            if key in info:
                self._has_success = True
                return self._flag(info[key])
        return None

    # --- contract ------------------------------------------------------------------------------
    def reset(self, seed: int | Sequence[int] | None = None) -> TorchObs:
        if "seed" in inspect.signature(self.env.reset).parameters:
            out = self.env.reset(seed=seed)
        else:
            out = self.env.reset()
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            out = out[0]
        self._returns.zero_()
        self._lengths.zero_()
        return self._obs(out)

    def step(self, actions: Any) -> StepResult:
        import torch

        out = self.env.step(self._actions(self.check_step(actions)))
        if len(out) == 5:
            obs, reward, terminated, truncated, info = out
            terminated, truncated = self._flag(terminated), self._flag(truncated)
        elif len(out) == 4:  # rsl_rl VecEnv: (obs, rewards, dones, extras["time_outs"])
            obs, reward, dones, info = out
            dones = self._flag(dones)
            time_outs = self._flag(info.get("time_outs", torch.zeros_like(dones)))
            terminated, truncated = dones & ~time_outs, dones & time_outs
        else:
            raise TypeError(f"{type(self.env).__name__}.step returned {len(out)} values; expected 5 (or rsl_rl's 4)")
        info = dict(info or {})
        obs = self._obs(obs)
        reward = torch.as_tensor(reward, device=self.device).reshape(self.num_envs).float()
        done = terminated | truncated
        success = self._success(info)

        self._returns += reward
        self._lengths += 1
        episodes = EpisodeStats(done, self._returns.clone(), self._lengths.clone(), None)
        if self._has_success:
            episodes.success = success if success is not None else torch.zeros_like(done)
        self._returns.masked_fill_(done, 0.0)
        self._lengths.masked_fill_(done, 0)

        final_obs = None
        if bool(done.any()):
            final_obs = self._final_obs(info, obs)
        out_info = {k: v for k, v in info.items() if k not in ("final_obs", "final_observation", *SUCCESS_KEYS)}
        if success is not None:
            out_info["success"] = success
        return StepResult(obs, reward, terminated, truncated, final_obs, episodes, out_info)

    def _final_obs(self, info: dict[str, Any], obs: TorchObs) -> TorchObs:
        for key in ("final_obs", "final_observation"):
            if info.get(key) is not None:
                return self._obs(info[key])
        if not self._warned_final_obs:
            warnings.warn(
                f"{type(self.env).__name__}.step puts no info['final_obs']; using the reset observation as "
                "final_obs (truncated episodes then bootstrap from the wrong state).",
                stacklevel=3,
            )
            self._warned_final_obs = True
        return obs

    def chunk_step(self, actions: Any) -> ChunkStepResult:
        """Step the whole batch C times; rows after an env's done are masked out (``valid`` False).

        A batched simulator cannot pause one env, so after an env's episode ends at step j its
        remaining actions move the freshly reset env, as in :meth:`VecEnv.chunk_step`; everything
        stays in torch on ``device``. The per-step results are stacked and masked once per chunk;
        only the steps where an episode ended (``step`` already knows) merge final observations
        and stats, so a chunk costs C steps and a few tensor ops, not a dozen ops per step (each
        a kernel launch on a GPU).
        """
        import torch

        actions = self._actions(self.check_chunk(actions))
        n, c, dev = self.num_envs, actions.shape[1], self.device
        rewards, terms, truncs = [], [], []
        ended: Tensor | None = None  # envs whose episode ended at an earlier step of the chunk
        final_obs: TorchObs | None = None
        episodes: EpisodeStats | None = None
        success: Tensor | None = None
        result = None
        for j in range(c):
            result = self.step(actions[:, j])
            rewards.append(result.reward)
            terms.append(result.terminated)
            truncs.append(result.truncated)
            if "success" in result.info:  # the success of the last step in the chunk's episode
                step_success = result.info["success"]
                success = step_success if ended is None or success is None else torch.where(ended, success, step_success)
            if result.final_obs is None:  # no env finished at this step
                continue
            done = result.terminated | result.truncated
            just_done = done if ended is None else done & ~ended
            final_obs = _merge_rows(final_obs, result.final_obs, just_done)
            episodes = _merge_episodes(episodes, result.episodes, just_done)
            ended = just_done if ended is None else ended | just_done
        assert result is not None
        reward = torch.stack(rewards, dim=1)
        terminated, truncated = torch.stack(terms, dim=1), torch.stack(truncs, dim=1)
        valid = torch.ones((n, c), dtype=torch.bool, device=dev)
        if ended is not None:  # mask the steps after each env's first done
            ended_before = (terminated | truncated).cumsum(dim=1) > 0
            valid[:, 1:] = ~ended_before[:, :-1]
            reward = reward * valid
            terminated, truncated = terminated & valid, truncated & valid
        if episodes is None:
            episodes = EpisodeStats(
                torch.zeros(n, dtype=torch.bool, device=dev),
                torch.zeros(n, dtype=torch.float32, device=dev),
                torch.zeros(n, dtype=torch.int64, device=dev),
                None,
            )
        if self._has_success and episodes.success is None:
            episodes.success = torch.zeros_like(episodes.done)
        info = {} if success is None else {"success": success}
        return ChunkStepResult(result.obs, reward, terminated, truncated, valid, final_obs, episodes, info)

    @property
    def instructions(self) -> list[str] | None:
        return self._instructions

    def render(self) -> np.ndarray | None:
        render = getattr(self.env, "render", None)
        frames = render() if callable(render) else None
        return None if frames is None else to_numpy(frames)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _merge_episodes(base: EpisodeStats | None, new: EpisodeStats, rows: Tensor) -> EpisodeStats:
    """The stats of ``rows`` from ``new``, the others from ``base`` (``new``'s own rows if None)."""
    import torch

    if base is None:
        done = rows.clone()
        success = None if new.success is None else torch.where(rows, new.success, torch.zeros_like(rows))
        return EpisodeStats(done, new.episode_return, new.length, success)
    success = base.success
    if new.success is not None:
        success = torch.where(rows, new.success, base.success if base.success is not None else torch.zeros_like(rows))
    return EpisodeStats(
        base.done | rows,
        torch.where(rows, new.episode_return, base.episode_return),
        torch.where(rows, new.length, base.length),
        success,
    )


def _merge_rows(base: TorchObs | None, new: TorchObs | None, rows: Tensor) -> TorchObs | None:
    """``base[k][rows] = new[k][rows]`` for every key, allocating ``base`` as a clone of ``new``."""
    import torch

    if new is None:
        return base
    if base is None:
        return {k: v.clone() for k, v in new.items()}
    for k, v in new.items():
        mask = rows.reshape((-1,) + (1,) * (v.dim() - 1))
        base[k] = torch.where(mask, v, base[k])
    return base


@register_adapter(
    "batched",
    _claims,
    priority=40,
    doc="Isaac Gym/Isaac Lab-style batched torch envs by package.module:ClassName (is_vector_env = True).",
)
def make_batched(cfg: EnvConfig, seed: int) -> BatchedVecEnv:
    """A batched torch env class (``is_vector_env = True``) by ``package.module:ClassName``."""
    if ":" not in cfg.id:
        raise UserError(f"env.adapter=batched needs env.id='package.module:ClassName', got {cfg.id!r}.")
    try:
        cls = _import_class(cfg.id)
    except ImportError as err:
        raise UserError(f"env.id={cfg.id!r}: cannot import module ({err}).") from None
    if not is_batched_env_class(cls):
        raise UserError(
            f"env.id={cfg.id!r} is not a batched env class: the batched adapter needs a class with "
            "'is_vector_env = True' that steps all envs at once (see docs/custom_envs.md)."
        )
    if cfg.obs_mode != "state":
        raise UserError(f"env.obs_mode={cfg.obs_mode!r}: batched envs define their own observations; use 'state'.")
    params = inspect.signature(cls).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = dict(cfg.kwargs)
    if "seed" in params or accepts_any:
        kwargs.setdefault("seed", seed)
    if cfg.max_episode_steps is not None:
        if "max_episode_steps" not in params and not accepts_any:
            raise UserError(
                f"env.max_episode_steps is set but {cls.__name__}.__init__ has no 'max_episode_steps' "
                "parameter; batched envs apply their own time limit."
            )
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    if cfg.ignore_terminations:
        if "ignore_terminations" not in params and not accepts_any:
            raise UserError(
                f"env.ignore_terminations=true but {cls.__name__}.__init__ has no 'ignore_terminations' "
                "parameter; a batched env resets its own envs, so it must implement this itself."
            )
        kwargs["ignore_terminations"] = True
    env = cls(num_envs=cfg.num_envs, **kwargs)
    if int(env.num_envs) != cfg.num_envs:
        raise UserError(f"{cls.__name__} was built with num_envs={cfg.num_envs} but reports {env.num_envs}.")
    return BatchedVecEnv(env)
