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

from embodied.errors import EnvError, UserError
from envs.base import ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, to_numpy
from envs.nonfinite import NONFINITE_INFO_KEY, bad_rows, check_mode
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
    ``env_id`` names the env in error messages (default: its class).

    NaN/inf (``nonfinite``, ``env.nonfinite``) are checked on the whole batch in torch (a few
    kernels and the one device sync a step already has). ``error`` raises an
    :class:`~embodied.errors.EnvError` naming the first bad row. ``drop``: a batched simulator
    cannot reset one env, so a bad row is masked instead until the env ends that episode itself
    (its time limit): each masked step is recorded as a time-limit cut at the row's last finite
    observation, with reward 0, which is also the observation the policy sees for that row; it
    does not count as an env step, and the episode counts once in ``env/nonfinite_episodes``.
    """

    def __init__(self, env: Any, instructions: list[str] | None = None, *, nonfinite: str = "error",
                 env_id: str | None = None) -> None:
        import torch

        self.nonfinite = check_mode(nonfinite)
        self.env_id = env_id or f"{type(env).__module__}:{type(env).__qualname__}"
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
        self._seed: int | None = None
        self._last_obs: TorchObs | None = None  # the observation the next decision is made in
        self._masked = torch.zeros(n, dtype=torch.bool, device=dev)  # rows whose episode was dropped
        self.nonfinite_episodes = 0

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
        self._masked.zero_()
        self._seed = seed if isinstance(seed, int) else None
        obs = self._obs(out)
        bad = self._bad(obs, None, None, None)
        if bool(bad.any()):  # no finite observation to fall back on: an error whatever env.nonfinite says
            raise self._error(bad, obs, None, None, "reset() returned NaN/inf", "no finite observation to continue from")
        self._last_obs = obs
        return obs

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

        # NaN/inf: checked in torch on the whole batch; one sync for both flags
        given_final = next((info[k] for k in ("final_obs", "final_observation") if info.get(k) is not None), None)
        bad = self._bad(obs, reward, self._obs(given_final) if given_final is not None else None, done)
        any_done, any_bad = (bool(x) for x in torch.stack([done.any(), bad.any()]).tolist())
        if any_bad and self.nonfinite == "error":
            raise self._error(bad, obs, reward, self._obs(given_final) if given_final is not None else None,
                              f"returned NaN/inf at step {int(self._lengths[int(torch.nonzero(bad)[0])]) + 1} of its episode",
                              "env.nonfinite=drop masks such episodes instead (counted in env/nonfinite_episodes)")

        self._returns += reward
        self._lengths += 1
        episodes = EpisodeStats(done, self._returns.clone(), self._lengths.clone(), None)
        if self._has_success:
            episodes.success = success if success is not None else torch.zeros_like(done)
        self._returns.masked_fill_(done, 0.0)
        self._lengths.masked_fill_(done, 0)

        final_obs = None
        if any_done:
            final_obs = self._final_obs(info, obs)
        out_info = {k: v for k, v in info.items() if k not in ("final_obs", "final_observation", *SUCCESS_KEYS)}
        if success is not None:
            out_info["success"] = success
        result = StepResult(obs, reward, terminated, truncated, final_obs, episodes, out_info)
        if any_bad:
            result = self._drop(result, bad)
        self._masked &= ~done  # the env ended (and reset) the row's episode itself: the next one is new
        self._last_obs = result.obs
        return result

    # --- NaN / inf -----------------------------------------------------------------------------
    def _bad(self, obs: TorchObs, reward: Tensor | None, final_obs: TorchObs | None, done: Tensor | None) -> Tensor:
        """(N,) bool: rows holding a NaN/inf in an observation, the reward or (where done) a final observation."""
        import torch

        n = self.num_envs
        finite = torch.ones(n, dtype=torch.bool, device=self.device) if reward is None else torch.isfinite(reward)
        for v in obs.values():
            if torch.is_tensor(v) and v.is_floating_point():
                finite = finite & torch.isfinite(v).reshape(n, -1).all(1)
        if final_obs is not None and done is not None:
            for v in final_obs.values():
                if torch.is_tensor(v) and v.is_floating_point():
                    finite = finite & (torch.isfinite(v).reshape(n, -1).all(1) | ~done)
        return ~finite

    def _error(self, bad: Tensor, obs: TorchObs, reward: Tensor | None, final_obs: TorchObs | None, what: str,
               hint: str) -> EnvError:
        named = {f"observation {k!r}": to_numpy(v) for k, v in obs.items()}
        if reward is not None:
            named["reward"] = to_numpy(reward)
        for k, v in (final_obs or {}).items():
            named[f"final observation {k!r}"] = to_numpy(v)
        mask, described = bad_rows(named, self.num_envs)
        i = int(np.flatnonzero(mask)[0]) if mask.any() else int(to_numpy(bad).nonzero()[0][0])
        others = int(to_numpy(bad).sum()) - 1
        also = f" ({others} other env(s) of this batch too)" if others > 0 else ""
        where = {"env_id": self.env_id, "env_index": i, "seed": self._seed}
        return EnvError(detail=f"{what}: its {described.get(i, 'values')}{also}. This is a failure of the env, not of "
                               f"Embodied or the policy: {hint}.", where={k: v for k, v in where.items() if v is not None})

    def _drop(self, result: StepResult, bad: Tensor) -> StepResult:
        """Mask the rows in ``bad`` (see the class docstring)."""
        import torch

        last = self._last_obs
        assert last is not None, "step() before reset()"
        new = bad & ~self._masked
        count = int(new.sum())
        if count:
            self.nonfinite_episodes += count
            warnings.warn(f"{self.env_id}: {count} env(s) returned NaN/inf (first: env index "
                          f"{int(torch.nonzero(new)[0])}); their episodes are masked until the env ends them "
                          "(env.nonfinite=drop)", stacklevel=3)
        self._masked |= bad
        rows = lambda v: bad.reshape((-1,) + (1,) * (v.dim() - 1))  # noqa: E731
        obs = {k: torch.where(rows(v), last[k], v) if torch.is_tensor(v) else v for k, v in result.obs.items()}
        base = result.final_obs if result.final_obs is not None else obs
        final_obs = {k: torch.where(rows(v), last[k], v) if torch.is_tensor(v) else v for k, v in base.items()}
        episodes = result.episodes
        episodes.done = episodes.done & ~bad
        self._returns.masked_fill_(bad, 0.0)
        self._lengths.masked_fill_(bad, 0)
        info = dict(result.info)
        info[NONFINITE_INFO_KEY] = bad
        return StepResult(obs, torch.where(bad, torch.zeros_like(result.reward), result.reward), result.terminated & ~bad,
                          result.truncated | bad, final_obs, episodes, info)

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
        dropped: Tensor | None = None  # rows whose decision ended on NaN/inf (env.nonfinite=drop)
        result = None
        for j in range(c):
            result = self.step(actions[:, j])
            if NONFINITE_INFO_KEY in result.info:
                step_dropped = result.info[NONFINITE_INFO_KEY] if ended is None else result.info[NONFINITE_INFO_KEY] & ~ended
                dropped = step_dropped if dropped is None else dropped | step_dropped
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
        if dropped is not None:
            info[NONFINITE_INFO_KEY] = dropped
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
    return BatchedVecEnv(env, nonfinite=cfg.nonfinite, env_id=cfg.id)
