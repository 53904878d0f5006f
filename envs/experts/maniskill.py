"""Scripted experts for ManiSkill3 tabletop tasks, on privileged state, through the end-effector
controller ``pd_ee_delta_pos``.

An expert reads the simulator's ground truth (``env.unwrapped``: ``agent.tcp.pose``, the cubes'
poses, ``goal_region`` / ``goal_site``), never the observation, and returns one action (4,)
float32 in the controller's normalized units: a TCP displacement (x, y, z) in the robot base's
axes (the Panda base faces +x, so they are the world's), 1.0 = 0.1 m, and the gripper (1 open,
-1 closed). It walks through named stages (reach above, descend, grasp, carry, ...), each
moving the TCP to a target point; a stage ends when its target is reached (or after its step
limit), so an expert is one small state machine per episode::

    expert = expert_for("PickCube-v1")
    expert.reset()
    action = expert(env)      # (4,) float32, every step

    embodied demos PickCube-v1 episodes=100     # pipelines/demos.py records them

ManiSkill's own `success` decides which episodes are kept; the expert's success rate is what
`embodied demos` reports (docs/vla.md#demonstrations-and-sft).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied.errors import UserError, did_you_mean

#: The controller the experts command (ManiSkill's Panda end-effector delta-position controller).
CONTROL_MODE = "pd_ee_delta_pos"
#: Controllers an expert's action converts to: the delta-position one, and the delta-pose one
#: (7 dimensions, as OpenVLA checkpoints' actions: the same translation, no rotation).
CONTROL_MODES = (CONTROL_MODE, "pd_ee_delta_pose")
#: Metres of TCP target offset per unit of action (the controller's pos_lower/pos_upper, ±0.1 m).
STEP_M = 0.1
OPEN, CLOSED = 1.0, -1.0
#: A stage's target counts as reached within this distance (metres).
REACHED_M = 0.008

#: What a stage sees: positions (3,) in metres of the TCP and the task's objects, by name.
Scene = dict[str, np.ndarray]


@dataclass(frozen=True)
class Stage:
    """Move the TCP to ``target(scene)`` with the gripper at ``gripper``; done when reached
    (within ``tolerance_m``, after ``min_steps``) or after ``max_steps``."""

    name: str
    target: Callable[[Scene], np.ndarray]
    gripper: float
    max_steps: int = 40
    min_steps: int = 0
    tolerance_m: float = REACHED_M


class StageExpert:
    """Runs ``stages`` in order on the scene ``read(env.unwrapped, self)`` gives; the last stage
    holds. ``memory`` keeps what an episode needs later (where the cube was grasped)."""

    def __init__(self, env_id: str, read: Callable[[Any, "StageExpert"], Scene], stages: list[Stage]) -> None:
        self.env_id, self.read, self.stages = env_id, read, stages
        self.memory: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        """Start a new episode at the first stage."""
        self.stage, self.steps = 0, 0
        self.memory.clear()

    @property
    def stage_name(self) -> str:
        return self.stages[self.stage].name

    def __call__(self, env: Any) -> np.ndarray:
        scene = self.read(env.unwrapped, self)
        while self.stage < len(self.stages) - 1 and self._done(self.stages[self.stage], scene):
            self.stage, self.steps = self.stage + 1, 0
        stage = self.stages[self.stage]
        self.steps += 1
        return move_to(scene["tcp"], stage.target(scene), stage.gripper)

    def _done(self, stage: Stage, scene: Scene) -> bool:
        if self.steps >= stage.max_steps:
            return True
        return self.steps >= stage.min_steps and float(np.linalg.norm(stage.target(scene) - scene["tcp"])) < stage.tolerance_m


def move_to(tcp: np.ndarray, target: np.ndarray, gripper: float) -> np.ndarray:
    """The action (4,) that sets the controller's TCP target at ``target`` (clipped to one step's
    0.1 m per axis), with the gripper command."""
    delta = np.clip((target - tcp) / STEP_M, -1.0, 1.0)
    return np.append(delta, gripper).astype(np.float32)


def for_control_mode(action: np.ndarray, control_mode: str) -> np.ndarray:
    """An expert's ``pd_ee_delta_pos`` action (4,) as ``control_mode``'s: unchanged, or (7,) for
    ``pd_ee_delta_pose`` with a zero rotation (x, y, z, 0, 0, 0, gripper)."""
    if control_mode == CONTROL_MODE:
        return action
    if control_mode == "pd_ee_delta_pose":
        return np.concatenate([action[:3], np.zeros(3, action.dtype), action[3:]])
    raise UserError(f"control_mode={control_mode!r}: the scripted experts command {' or '.join(CONTROL_MODES)}.")


def _p(actor: Any) -> np.ndarray:
    """An actor's (or link's) position (3,) of env 0, numpy float64."""
    return np.asarray(actor.pose.p[0].cpu().numpy(), np.float64)


def _up(dz: float) -> np.ndarray:
    return np.array([0.0, 0.0, dz])


# --- the tasks -----------------------------------------------------------------------------------------


def push_cube() -> StageExpert:
    """PushCube-v1: the gripper closed, behind the cube (-x side) at table height, push it along +x
    until its centre is on the target's (success: within the 0.1 m goal radius)."""

    def read(env: Any, expert: StageExpert) -> Scene:
        return {"tcp": _p(env.agent.tcp), "cube": _p(env.obj), "goal": _p(env.goal_region), "half": env.cube_half_size}

    def behind(scene: Scene, height: float) -> np.ndarray:
        cube = scene["cube"]
        return np.array([cube[0] - scene["half"] - 0.03, cube[1], height])

    def pushed(scene: Scene) -> np.ndarray:
        goal = scene["goal"]
        return np.array([goal[0] - scene["half"] + 0.01, goal[1], scene["half"]])

    return StageExpert("PushCube-v1", read, [
        Stage("above behind", lambda s: behind(s, 0.08), CLOSED, tolerance_m=0.015),
        Stage("down behind", lambda s: behind(s, s["half"]), CLOSED),
        Stage("push", pushed, CLOSED, max_steps=60),
    ])


#: The index of the "grasp" stage of :func:`_pick_stages`: from it on the TCP holds where it closed.
GRASP = 2


def _pick_stages(cube_key: str) -> list[Stage]:
    """Reach above the cube, descend with the gripper open, close it on the cube, lift."""
    return [
        Stage("above cube", lambda s: s[cube_key] + _up(0.06), OPEN, tolerance_m=0.01),
        Stage("descend", lambda s: s[cube_key] + _up(0.0), OPEN, tolerance_m=0.006),
        Stage("grasp", lambda s: s["grasp_at"], CLOSED, min_steps=6, max_steps=6, tolerance_m=0.0),
        Stage("lift", lambda s: s["grasp_at"] + _up(0.08), CLOSED, tolerance_m=0.015),
    ]


def pick_cube() -> StageExpert:
    """PickCube-v1: grasp the cube from above, carry it to the goal, hold still there (success:
    the cube within 0.025 m of the goal and the robot static)."""
    def read(env: Any, expert: StageExpert) -> Scene:
        tcp, cube = _p(env.agent.tcp), _p(env.cube)
        scene = {"tcp": tcp, "cube": cube, "goal": _p(env.goal_site)}
        scene["grasp_at"] = expert.memory.setdefault("grasp_at", cube) if expert.stage >= GRASP else cube
        scene["offset"] = tcp - cube  # the cube's place in the hand once grasped
        return scene

    stages = _pick_stages("cube")[:3] + [
        Stage("carry", lambda s: s["goal"] + s["offset"], CLOSED, max_steps=200, tolerance_m=0.0),
    ]
    return StageExpert("PickCube-v1", read, stages)


def stack_cube() -> StageExpert:
    """StackCube-v1: pick the red cube (A), carry it above the green one (B), lower it onto B,
    open the gripper and rise (success: A on B, static, not grasped)."""
    def read(env: Any, expert: StageExpert) -> Scene:
        tcp, a, b = _p(env.agent.tcp), _p(env.cubeA), _p(env.cubeB)
        half = float(np.asarray(env.cube_half_size.cpu())[..., 2].reshape(-1)[0])
        scene = {"tcp": tcp, "cubeA": a, "cubeB": b, "offset": tcp - a}
        scene["grasp_at"] = expert.memory.setdefault("grasp_at", a) if expert.stage >= GRASP else a
        scene["on_b"] = b + _up(2 * half)  # A's centre when it rests on B
        return scene

    stages = _pick_stages("cubeA") + [
        Stage("above B", lambda s: s["on_b"] + _up(0.04) + s["offset"], CLOSED, max_steps=80, tolerance_m=0.008),
        Stage("lower", lambda s: s["on_b"] + _up(0.003) + s["offset"], CLOSED, max_steps=30, tolerance_m=0.003),
        Stage("release", lambda s: s["tcp"], OPEN, min_steps=6, max_steps=6, tolerance_m=0.0),
        Stage("rise", lambda s: s["on_b"] + _up(0.08), OPEN, max_steps=200, tolerance_m=0.0),
    ]
    return StageExpert("StackCube-v1", read, stages)


#: Task id -> a new expert of that task.
EXPERTS: dict[str, Callable[[], StageExpert]] = {
    "PushCube-v1": push_cube,
    "PickCube-v1": pick_cube,
    "StackCube-v1": stack_cube,
}


def expert_for(env_id: str) -> StageExpert:
    """A new scripted expert of ``env_id``; a UserError names the tasks that have one."""
    if env_id not in EXPERTS:
        raise UserError(f"no scripted expert for {env_id!r}.{did_you_mean(env_id, EXPERTS)} Tasks with one: {', '.join(EXPERTS)}.")
    return EXPERTS[env_id]()
