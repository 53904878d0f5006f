"""Meta-World (PyPI ``metaworld`` 3.x, v3 tasks): single tasks and the MT10 / MT50 sets.

Id syntax (``env.id``):

* ``metaworld/<task>``: one task, e.g. ``metaworld/reach-v3`` (:func:`list_tasks` lists the 50);
* ``metaworld_mt10``, ``metaworld_mt50``: the MT10 / MT50 sets (Meta-World's own order); env i runs
  task ``(i // task_every) mod T`` (``env.kwargs.task_every``, default 1: round robin; GRPO sets it
  to the group size so that a group's envs run one task);
* ``metaworld_mt10/<k>``, ``metaworld_mt50/<task>``: one task of a set by number or name.

Layouts: each task has ``NUM_VARIANTS`` (50) object/goal layouts, Meta-World's ``Task`` objects of
``MT1(task, seed=env.kwargs.layout_seed)`` (default 0; the same layouts whichever id selects the
task). An env reset with seed ``s`` starts from layout ``(s // T) mod 50`` and every later episode
advances by the number of envs on its task (the LIBERO adapter's rule for initial states), so two
envs on one task reset with one seed start from the same layout; ``info["layout"]`` names it.

Observations: ``state`` (39,) float32, Meta-World's goal-observable vector (hand position (3),
gripper opening (1), two objects' position + quaternion (14), the same 18 of the previous step,
goal position (3)); with ``obs_mode`` ``rgb`` / ``state+rgb`` also ``rgb`` (image_size, image_size, 3)
uint8 from ``env.kwargs.camera`` (default ``corner``; also ``corner2``, ``corner3``, ``topview``,
``behindGripper``, ``gripperPOV``), rows reversed: MuJoCo reads Meta-World's camera frames out
upside down. Rendering is offscreen through EGL or OSMesa (``MUJOCO_GL``, chosen as for gymnasium
MuJoCo envs) with shadows and reflections off.
Actions (4,) in [-1, 1]: end-effector position delta (3) and gripper effort (1).
Reward: Meta-World's dense reward (0..10). ``terminated`` on success (``info["success"]``, every
step), as Meta-World's ``AutoTerminateOnSuccessWrapper`` and MT evaluation count an episode
(``env.ignore_terminations`` runs it to the time limit instead); ``truncated`` at
``env.max_episode_steps`` (default 500, Meta-World's ``max_path_length``).
Instructions (``VecEnv.instructions``): one English sentence per task (:data:`INSTRUCTIONS`).
The scripted expert of a task is :func:`expert` (Meta-World's ``policies``), on the ``state``.

``env.kwargs.render=true`` keeps a renderer for ``render()`` / videos with ``obs_mode=state``.
Every other key of ``env.kwargs`` goes to the Meta-World env class (``reward_function_version``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.gymnasium_adapter import ensure_mujoco_gl, resolve_backend, unknown_kwarg, vectorize
from envs.adapters.libero_adapter import envs_per_task, init_state_index, task_index
from envs.adapters.robosuite_adapter import box, check_obs_mode
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.registry import register_adapter

PREFIX = "metaworld"
#: Object/goal layouts Meta-World samples per task (``MT1(...).train_tasks``).
NUM_VARIANTS = 50
#: Meta-World's ``max_path_length``: its envs refuse to step further.
MAX_EPISODE_STEPS = 500
CAMERAS = ("corner", "corner2", "corner3", "topview", "behindGripper", "gripperPOV")
#: Our keys of ``env.kwargs``; the rest go to the Meta-World env class.
OWN_KWARGS = ("camera", "layout_seed", "render", "task_every")
#: MT10, in Meta-World's order (``metaworld.env_dict.MT10_V3``).
MT10 = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)
#: One instruction per task, phrased to follow "What action should the robot take to ...?".
INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut and put it onto the peg",
    "basketball-v3": "put the ball into the basketball hoop",
    "bin-picking-v3": "move the puck from the red bin into the blue bin",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "reach over the wall and press the button from the top",
    "button-press-v3": "press the button from the front",
    "button-press-wall-v3": "reach around the wall and press the button",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out from under the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "lift the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "turn the lock to lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "turn the lock to unlock the door",
    "drawer-close-v3": "close the drawer",
    "drawer-open-v3": "open the drawer",
    "faucet-close-v3": "turn the faucet handle to close the faucet",
    "faucet-open-v3": "turn the faucet handle to open the faucet",
    "hammer-v3": "hammer the nail into the wall",
    "hand-insert-v3": "put the gripper into the hole",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "pull the peg out of the hole sideways",
    "pick-out-of-hole-v3": "pick the puck up out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "pick-place-wall-v3": "pick up the puck, lift it over the wall and place it at the goal",
    "plate-slide-back-side-v3": "slide the plate out of the cabinet sideways",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-side-v3": "slide the plate into the cabinet sideways",
    "plate-slide-v3": "slide the plate into the cabinet",
    "push-back-v3": "push the puck back to the goal",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "reach-v3": "reach the goal with the gripper",
    "reach-wall-v3": "reach over the wall to the goal",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "soccer-v3": "push the ball into the goal",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "stick-push-v3": "grasp the stick and push the box with it",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-close-v3": "slide the window closed",
    "window-open-v3": "slide the window open",
}
#: The 50 tasks of MT50, in Meta-World's order (``ALL_V3_ENVIRONMENTS``).
MT50 = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3", "button-press-topdown-v3",
    "button-press-topdown-wall-v3", "button-press-v3", "button-press-wall-v3", "coffee-button-v3", "coffee-pull-v3",
    "coffee-push-v3", "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3", "door-open-v3",
    "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3", "faucet-open-v3", "faucet-close-v3",
    "hammer-v3", "handle-press-side-v3", "handle-press-v3", "handle-pull-side-v3", "handle-pull-v3", "lever-pull-v3",
    "pick-place-wall-v3", "pick-out-of-hole-v3", "pick-place-v3", "plate-slide-v3", "plate-slide-side-v3",
    "plate-slide-back-v3", "plate-slide-back-side-v3", "peg-insert-side-v3", "peg-unplug-side-v3", "soccer-v3",
    "stick-push-v3", "stick-pull-v3", "push-v3", "push-wall-v3", "push-back-v3", "reach-v3", "reach-wall-v3",
    "shelf-place-v3", "sweep-into-v3", "sweep-v3", "window-open-v3", "window-close-v3",
)
SUITES: dict[str, tuple[str, ...]] = {"metaworld_mt10": MT10, "metaworld_mt50": MT50}


def import_metaworld() -> Any:
    """The ``metaworld`` package, with MuJoCo's offscreen GL chosen before it loads."""
    ensure_mujoco_gl()
    try:
        import metaworld
    except ImportError as err:
        raise UserError(f'Meta-World is not installed ({err}): pip install -e ".[metaworld]".') from None
    return metaworld


def list_tasks(suite: str = "metaworld_mt50") -> list[str]:
    """The task names of ``suite`` (``metaworld_mt10`` or ``metaworld_mt50``) in Meta-World's order."""
    if suite not in SUITES:
        raise UserError(f"Unknown Meta-World set {suite!r}.{did_you_mean(suite, SUITES)} Sets: {', '.join(SUITES)}.")
    return list(SUITES[suite])


def parse_id(env_id: str) -> list[str]:
    """The tasks an id in the module docstring's syntax selects."""
    head, _, selector = env_id.partition("/")
    if head == PREFIX:
        tasks, pick = list(MT50), selector
        if not selector:
            raise UserError(f"env.id={env_id!r} names no task: use metaworld/<task> (e.g. metaworld/reach-v3), "
                            "metaworld_mt10 or metaworld_mt50.")
    else:
        tasks, pick = list_tasks(head), selector
    if not pick:
        return tasks
    if re.fullmatch(r"\d+", pick) and head != PREFIX:
        if int(pick) >= len(tasks):
            raise UserError(f"env.id={env_id!r}: {head} has tasks 0..{len(tasks) - 1}.")
        return [tasks[int(pick)]]
    if pick not in tasks:
        raise UserError(
            f"env.id={env_id!r}: no Meta-World task {pick!r} here.{did_you_mean(pick, tasks)} "
            f"Tasks: envs.adapters.metaworld_adapter.list_tasks()."
        )
    return [pick]


def expert(task: str) -> Any:
    """Meta-World's scripted policy of ``task``: ``.get_action(state (39,)) -> action (4,)``."""
    import_metaworld()
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[task]()


class MetaWorldEnv(gym.Env):
    """One Meta-World task with the contract's dict observations and layout rule.

    num_tasks:    tasks of the env id (the seed -> layout rule);
    layout_stride: envs of the batch on this task (a new episode advances the layout by it);
    seed:         the seed of a first ``reset()`` that is given none.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        task: str,
        num_tasks: int = 1,
        layout_stride: int = 1,
        obs_mode: str = "state",
        image_size: int = 128,
        max_episode_steps: int = MAX_EPISODE_STEPS,
        camera: str = "corner",
        layout_seed: int = 0,
        render: bool = False,
        seed: int = 0,
        **env_kwargs: Any,
    ) -> None:
        check_obs_mode(obs_mode)
        if camera not in CAMERAS:
            raise UserError(f"env.kwargs.camera={camera!r} is not a Meta-World camera.{did_you_mean(camera, CAMERAS)} "
                            f"Cameras: {', '.join(CAMERAS)}.")
        if not 1 <= max_episode_steps <= MAX_EPISODE_STEPS:
            raise UserError(f"env.max_episode_steps={max_episode_steps}: Meta-World episodes last at most {MAX_EPISODE_STEPS} steps.")
        metaworld = import_metaworld()
        benchmark = metaworld.MT1(task, seed=layout_seed)
        self.layouts = list(benchmark.train_tasks)
        self.task = task
        self.num_tasks = num_tasks
        self.layout_stride = layout_stride
        self.obs_mode = obs_mode
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        self.render_mode = "rgb_array" if render or obs_mode != "state" else None
        self._seed = seed
        self._layout: int | None = None
        env_class = benchmark.train_classes[task]
        try:
            self.env = env_class(
                render_mode=self.render_mode, camera_name=camera, width=image_size, height=image_size, **env_kwargs
            )
        except TypeError as err:  # a misspelt env.kwargs key
            raise unknown_kwarg(err, f"metaworld/{task}", env_kwargs, env_class, also=OWN_KWARGS) or err
        self.env.max_path_length = max_episode_steps
        self._tuned = False
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        spaces: dict[str, gym.Space] = {} if obs_mode == "rgb" else {"state": box((39,))}
        if obs_mode != "state":
            spaces["rgb"] = box((image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self._steps = 0

    @property
    def layout(self) -> int | None:
        """Index of the layout (Meta-World ``Task``) of the current episode; None before a reset."""
        return self._layout

    def _next_layout(self, seed: int | None) -> int:
        if seed is not None:
            return init_state_index(seed, self.num_tasks, len(self.layouts))
        if self._layout is None:
            return init_state_index(self._seed, self.num_tasks, len(self.layouts))
        return (self._layout + self.layout_stride) % len(self.layouts)

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            return None
        if not self._tuned:  # shadows and reflections cost a software renderer most of a frame
            import mujoco

            viewer = self.env.mujoco_renderer._get_viewer("rgb_array")
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
                viewer.scn.flags[flag] = False
            self._tuned = True
        return np.ascontiguousarray(self.env.render()[::-1])

    def _observe(self, state: np.ndarray) -> dict[str, np.ndarray]:
        obs = {} if self.obs_mode == "rgb" else {"state": np.asarray(state, np.float32)}
        if self.obs_mode != "state":
            obs["rgb"] = self.render()
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._layout = self._next_layout(seed)
        self.env.set_task(self.layouts[self._layout])
        state, _ = self.env.reset()
        self._steps = 0
        return self._observe(state), {"layout": self._layout}

    def step(self, action: np.ndarray):
        state, reward, _, _, info = self.env.step(np.asarray(action, np.float32))
        self._steps += 1
        success = bool(info["success"])
        truncated = self._steps >= self.max_episode_steps and not success
        return self._observe(state), float(reward), success, truncated, {"success": success, "layout": self._layout}

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            env.close()  # the EGL context, before interpreter teardown
            self.env = None


# --- adapter ----------------------------------------------------------------------------------------


def _claims(env_id: str) -> bool:
    return env_id.partition("/")[0].startswith(PREFIX)


@register_adapter("metaworld", _claims, priority=20, doc="Meta-World tasks and sets: metaworld/reach-v3, metaworld_mt10, metaworld_mt50")
def make_metaworld(cfg: EnvConfig, seed: int) -> VecEnv:
    """Meta-World tasks and sets: ``metaworld/reach-v3``, ``metaworld_mt10``, ``metaworld_mt50/3``."""
    check_obs_mode(cfg.obs_mode)
    tasks = parse_id(cfg.id)
    kwargs = dict(cfg.kwargs)
    every = kwargs.pop("task_every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UserError(f"env.kwargs.task_every={every!r} must be a positive integer (envs in a row on one task).")
    import_metaworld()  # a missing package fails here, in this process, with its message
    env_fns = [
        functools.partial(
            MetaWorldEnv,
            tasks[task_index(i, len(tasks), every)],
            num_tasks=len(tasks),
            layout_stride=stride,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            max_episode_steps=cfg.max_episode_steps or MAX_EPISODE_STEPS,
            seed=seed + i,
            **kwargs,
        )
        for i, stride in enumerate(envs_per_task(cfg.num_envs, len(tasks), every))
    ]
    instructions = [INSTRUCTIONS[tasks[task_index(i, len(tasks), every)]] for i in range(cfg.num_envs)]
    # state steps are cheap (one process has no message overhead); rendered frames are not
    auto = "inprocess" if cfg.obs_mode == "state" else "multiprocess"
    return vectorize(env_fns, cfg, resolve_backend(cfg, auto=auto), instructions)
