"""``ColorReach-v0``: a language-conditioned pixel task, rendered with numpy (no simulator).

A point agent moves in the square arena [-1, 1]^2 among ``num_targets`` coloured targets (red,
blue, green, yellow); the instruction names the one to reach: ``"move to the red target"``. It is
the fast, deterministic stand-in for a manipulation task that a VLA's learning test needs: the
policy must read the instruction to pick the target and the image to find it.

Per env (one episode):

* reset(seed): the agent and the targets are placed uniformly at random (targets at least
  ``min_separation`` apart and away from the agent), from the seed alone: envs reset with one seed
  start from one layout (GRPO groups).
* goal: env i of a :class:`VecEnv` of this adapter is asked for colour ``(i // task_every) mod
  num_targets`` of :data:`COLORS` (``env.kwargs.goal`` fixes one colour for every env).
  Instructions are per env, as the contract has them (``VecEnv.instructions``). GRPO compares the
  ``algo.group_size`` consecutive envs of a group, reset with one seed: ``task_every`` equal to
  the group size gives a group one layout AND one goal (one task). The envs of a VecEnv count
  from 0, and every env chunk of a planned run is a VecEnv of its own: keep the chunk sizes
  multiples of ``task_every * num_targets`` (the tiny recipes run one chunk).
* action (2,) in [-1, 1]: the agent moves by ``speed * action`` (clipped to the arena).
* reward: ``1`` on success (the agent within ``success_radius`` of the goal target; terminated),
  plus, with ``reward="dense"`` (default), the decrease of the distance to the goal at every step
  (potential-based shaping: the best policy is unchanged). ``reward="sparse"``: success only.
* truncated after ``max_steps`` (default 12; ``env.max_episode_steps`` overrides it).
* observations: ``rgb`` (S, S, 3) uint8 with S = ``env.image_size`` (dark arena, targets as
  coloured squares, the agent as a white square), and ``state`` (4 + 2 * num_targets,) float32 =
  agent xy, goal target xy, then every target's xy in colour order (the privileged state a
  scripted expert reads). ``env.obs_mode``: ``state``, ``rgb`` or ``state+rgb``.

:func:`expert` is the scripted expert (straight to the goal at full speed), for demonstrations
(``warmstart.expert=envs.adapters.color_reach:expert``); :func:`careless_expert` one that misreads the colour in 30% of its episodes.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.gymnasium_adapter import resolve_backend, vectorize
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.registry import register_adapter

ENV_ID = "ColorReach-v0"
#: Target colours (RGB), in the order of ``state`` and of the goal assignment.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40), "blue": (40, 90, 240), "green": (40, 200, 60), "yellow": (235, 215, 40),
}
BACKGROUND = (30, 30, 30)
AGENT = (245, 245, 245)
OBS_MODES = ("state", "rgb", "state+rgb")
REWARDS = ("dense", "sparse")


class ColorReach(gym.Env):
    """One env; see the module docstring. ``goal`` is a colour name of :data:`COLORS`."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self, goal: str = "red", num_targets: int = 2, image_size: int = 32, obs_mode: str = "state+rgb",
        speed: float = 0.25, success_radius: float = 0.3, max_steps: int = 12, reward: str = "dense",
        min_separation: float = 0.6, target_px: int = 0, agent_px: int = 0,
    ) -> None:
        colors = list(COLORS)
        if not 1 <= num_targets <= len(colors):
            raise UserError(f"env.kwargs.num_targets={num_targets!r} must be between 1 and {len(colors)}.")
        if goal not in colors[:num_targets]:
            raise UserError(f"env.kwargs.goal={goal!r} must be one of the {num_targets} target colours "
                            f"{', '.join(colors[:num_targets])}.{did_you_mean(str(goal), colors)}")
        if obs_mode not in OBS_MODES:
            raise UserError(f"env.obs_mode={obs_mode!r} must be one of {', '.join(OBS_MODES)} for {ENV_ID}.")
        if reward not in REWARDS:
            raise UserError(f"env.kwargs.reward={reward!r} must be one of {', '.join(REWARDS)}.")
        if speed <= 0 or success_radius <= 0 or max_steps < 1 or min_separation < 0:
            raise UserError("env.kwargs.speed and success_radius must be > 0, max_steps >= 1, min_separation >= 0.")
        self.colors = colors[:num_targets]
        self.goal = self.colors.index(goal)
        self.size, self.obs_mode, self.reward_mode = int(image_size), obs_mode, reward
        self.speed, self.radius, self.max_steps, self.separation = float(speed), float(success_radius), int(max_steps), float(min_separation)
        # square sides in pixels (6 and 4 at 32 x 32): big enough for a 16-patch ViT to place them
        self.target_px = target_px or max(2, round(self.size * 0.19))
        self.agent_px = agent_px or max(2, round(self.size / 8))
        spaces: dict[str, gym.Space] = {}
        if obs_mode != "rgb":
            spaces["state"] = gym.spaces.Box(-1.0, 1.0, (4 + 2 * num_targets,), np.float32)
        if obs_mode != "state":
            spaces["rgb"] = gym.spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.render_mode = "rgb_array"
        self.agent = np.zeros(2)
        self.targets = np.zeros((num_targets, 2))
        self.t = 0

    @property
    def instruction(self) -> str:
        return instruction_of(self.colors[self.goal])

    # --- dynamics ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        points: list[np.ndarray] = []
        while len(points) < len(self.colors) + 1:  # the agent first, then the targets
            p = rng.uniform(-0.85, 0.85, size=2)
            if all(np.linalg.norm(p - q) >= self.separation for q in points):
                points.append(p)
        self.agent, self.targets = points[0], np.stack(points[1:])
        self.t = 0
        return self._obs(), {"success": False}

    def distance(self) -> float:
        return float(np.linalg.norm(self.agent - self.targets[self.goal]))

    def step(self, action):
        before = self.distance()
        move = np.clip(np.asarray(action, np.float64).reshape(2), -1.0, 1.0) * self.speed
        self.agent = np.clip(self.agent + move, -1.0, 1.0)
        self.t += 1
        after = self.distance()
        success = after <= self.radius
        reward = float(success) + (before - after if self.reward_mode == "dense" else 0.0)
        truncated = self.t >= self.max_steps and not success
        return self._obs(), reward, bool(success), bool(truncated), {"success": bool(success)}

    # --- observations --------------------------------------------------------------------------
    def state(self) -> np.ndarray:
        """(4 + 2 * num_targets,) float32: agent xy, goal xy, every target's xy."""
        return np.concatenate([self.agent, self.targets[self.goal], self.targets.reshape(-1)]).astype(np.float32)

    def render(self) -> np.ndarray:
        """(S, S, 3) uint8: x to the right, y up."""
        frame = np.empty((self.size, self.size, 3), np.uint8)
        frame[:] = BACKGROUND
        for color, xy in zip(self.colors, self.targets):
            self._square(frame, xy, self.target_px, COLORS[color])
        self._square(frame, self.agent, self.agent_px, AGENT)
        return frame

    def _square(self, frame: np.ndarray, xy: np.ndarray, side: int, color: tuple[int, int, int]) -> None:
        col = (xy[0] + 1) / 2 * (self.size - 1)
        row = (1 - xy[1]) / 2 * (self.size - 1)
        r0, c0 = int(round(row - (side - 1) / 2)), int(round(col - (side - 1) / 2))
        frame[max(0, r0): max(0, r0 + side), max(0, c0): max(0, c0 + side)] = color

    def _obs(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if self.obs_mode != "rgb":
            out["state"] = self.state()
        if self.obs_mode != "state":
            out["rgb"] = self.render()
        return out


def instruction_of(color: str) -> str:
    """The instruction that asks for the ``color`` target."""
    return f"move to the {color} target"


def expert(obs: dict[str, Any]) -> np.ndarray:
    """The scripted expert of a batch of observations (``state`` (N, D) as above): full speed
    straight at the goal, slowing down to land on it. Returns actions (N, 2) float32 in [-1, 1].
    Assumes the default ``speed`` 0.25."""
    if "state" not in obs:
        raise UserError(f"the {ENV_ID} expert reads the 'state' observation: set env.obs_mode=state+rgb.")
    state = np.asarray(obs["state"], np.float32)
    delta = state[:, 2:4] - state[:, 0:2]
    return np.clip(delta / 0.25, -1.0, 1.0).astype(np.float32)


#: The share of episodes in which :func:`careless_expert` heads for the instructed target.
CARELESS_RELIABILITY = 0.7


def careless_expert(obs: dict[str, Any]) -> np.ndarray:
    """A demonstrator who misreads the colour now and then: :func:`expert`'s moves, towards the
    instructed target in :data:`CARELESS_RELIABILITY` of the episodes and towards another one
    otherwise (chosen by a pseudo-random coin of the layout, fixed for an episode). A policy
    cloned from it reaches targets and mostly the right one; sampling it (as RL's rollouts do)
    reproduces the slips, greedy decoding mostly not. RL has the slips to remove, as an SFT
    checkpoint leaves RL its remaining failures. Returns (N, 2) in [-1, 1]."""
    if "state" not in obs:
        raise UserError(f"the {ENV_ID} expert reads the 'state' observation: set env.obs_mode=state+rgb.")
    state = np.asarray(obs["state"], np.float32)
    goal, targets = state[:, 2:4], state[:, 4:].reshape(len(state), -1, 2)  # (N, 2), (N, num_targets, 2)
    coin = (np.floor(np.abs(targets).sum(axis=(1, 2)) * 1e4).astype(np.int64) % 1000) / 1000.0  # (N,) in [0, 1)
    is_goal = np.linalg.norm(targets - goal[:, None], axis=-1) < 1e-6  # (N, num_targets)
    other = np.argmin(is_goal, axis=1)  # the first target that is not the goal
    aim = np.where((coin < CARELESS_RELIABILITY)[:, None], goal, targets[np.arange(len(state)), other])
    return np.clip((aim - state[:, 0:2]) / 0.25, -1.0, 1.0).astype(np.float32)


def _claims(env_id: str) -> bool:
    return env_id == ENV_ID


@register_adapter("color_reach", _claims, priority=10, doc="ColorReach-v0: a language-conditioned numpy pixel task (VLA tests).")
def make_color_reach(cfg: EnvConfig, seed: int) -> VecEnv:
    """``ColorReach-v0`` envs; env i is asked for colour ``(i // task_every) mod num_targets`` (or ``env.kwargs.goal``)."""
    kwargs = dict(cfg.kwargs)
    num_targets = int(kwargs.pop("num_targets", 2))
    fixed = kwargs.pop("goal", None)
    every = kwargs.pop("task_every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UserError(f"env.kwargs.task_every={every!r} must be a positive integer (envs in a row asked for one colour).")
    if cfg.max_episode_steps is not None:
        kwargs["max_steps"] = cfg.max_episode_steps
    backend = resolve_backend(cfg, auto="inprocess")
    colors = list(COLORS)[: max(1, num_targets)]
    goals = [fixed or colors[(i // every) % len(colors)] for i in range(cfg.num_envs)]
    make = functools.partial(ColorReach, num_targets=num_targets, image_size=cfg.image_size, obs_mode=cfg.obs_mode, **kwargs)
    try:
        make(goal=goals[0])  # bad kwargs fail here, in this process
    except TypeError as err:
        raise UserError(f"env.kwargs of {ENV_ID}: {err}. Its parameters: num_targets, goal, task_every, speed, success_radius, "
                        "max_steps, reward, min_separation, target_px, agent_px.") from None
    return vectorize([functools.partial(make, goal=g) for g in goals], cfg, backend, [instruction_of(g) for g in goals])
