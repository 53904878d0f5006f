"""Scripted experts for LIBERO-Object and LIBERO-Spatial, on privileged state, through the OSC_POSE
delta controller the adapter uses.

What to pick and where to put it comes from the task's BDDL goal, so one expert serves every task
of both suites: ``(:goal (And (In obj region)))`` (LIBERO-Object: the object into the basket's
``contain_region``) or ``(:goal (And (On obj target)))`` (LIBERO-Spatial: the black bowl onto the
plate). The expert reads the simulator's ground truth (robosuite's ``sim.data``: the objects'
body positions and collision-geom boxes, the grip site's pose, the goal region's site), never the
observation, and walks through named stages (above, narrow, descend, grasp, lift, carry, lower,
release, rise), each moving the grip site to a target point with the gripper pointing down::

    task = list_tasks("libero_object")[0]  # envs.adapters.libero_adapter.LiberoTask
    expert = libero_expert(task)
    env = task_env(task)                   # the adapter's single LiberoEnv, obs_mode=state
    obs, _ = env.reset(seed=0)             # official initial state 0
    expert.reset(env)
    action = expert(env, obs)              # (7,) float32 in [-1, 1], every step

    episode = record_episode(env, expert, seed=0)   # observations, actions, LIBERO's success

How it grasps follows from the object's footprint (its collision geoms' boxes): an object narrower
than the open gripper is taken at its centre, the fingers closing across its narrowest horizontal
axis; a wider one (a bowl) is taken by its wall, at the point of its rim with the most room
around it, the fingers narrowed first and radial there so that one goes inside and one outside.
The object is carried high enough to clear every other object, lowered until it is just above the
target (``On``) or inside the region's box (``In``), and let go. A lift that leaves the object
behind starts the pick over (twice at most). LIBERO's own ``check_success()`` decides success.

``embodied demos libero_object`` (or ``libero_spatial/<k>``, ...) records these experts through
:mod:`pipelines.demo_sources`; the functions at the end of this module (``tasks_of``,
``make_env``, ``make_expert``, ``recorded_keys``) are what that source calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import UserError

#: The suites whose goals the expert handles (one pick-and-place predicate each).
SUITES = ("libero_spatial", "libero_object")
#: Metres of grip-site target offset per unit of action (OSC_POSE's output_max for position).
STEP_M = 0.05
#: Radians of rotation per unit of action (OSC_POSE's output_max for orientation).
STEP_RAD = 0.5
OPEN, CLOSED, HOLD = -1.0, 1.0, 0.0
#: The grip site's orientation pointing straight down, fingers opening along world y (the Panda's
#: pose at LIBERO's initial states, without its small tilt); columns are the site's axes in world.
DOWN = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
#: Widest object (metres, across its narrowest horizontal axis) the Panda's fingers close around
#: (they open to about 0.08 m); a wider one is grasped by its wall.
MAX_GRASP_WIDTH_M = 0.07
#: How far below its top a tall object is grasped: the finger pads' length, so the hand stays clear.
FINGER_DEPTH_M = 0.03
#: Lowest grasp point above the object's bottom (the fingertips stay off the floor or table).
MIN_GRASP_HEIGHT_M = 0.01
#: Inward distance from a wide object's outer edge to the grip point on its wall.
WALL_INSET_M = 0.012
#: How far below its rim a wall grasp closes.
WALL_DEPTH_M = 0.02
#: Height of the grip site above the object's top before descending onto it (at least).
HOVER_M = 0.06
#: Clearance of the carried object's bottom above every other object (and of the hand on the way to it).
CARRY_CLEARANCE_M = 0.04
#: Gap between the object's bottom and the target's top when an ``On`` object is let go.
DROP_GAP_M = 0.01
#: Height of the object's bottom above the goal region's floor when an ``In`` object is let go.
IN_RELEASE_M = 0.04
#: Steps of closing that narrow the open fingers to about half their 0.08 m opening (each step
#: closes them by about 0.01 m).
NARROW_STEPS = 4
#: Where the outer finger is (metres from the grip point, along the fingers) once narrowed.
OUTER_FINGER_M = 0.03
#: The Panda hand's half width along the fingers and its height above the grip site (metres): the
#: hand's ends must clear the scene as the fingers do.
HAND_HALF_WIDTH_M, HAND_HEIGHT_M = 0.09, 0.08
#: Room (metres) beside the outer finger that makes a rim point as good as any roomier one.
ENOUGH_ROOM_M = 0.03
#: Directions around a wide object's rim a wall grasp chooses from.
WALL_DIRECTIONS = 12
#: A lift counts as holding the object when its bottom rose by this much.
LIFTED_M = 0.02
#: Picks an episode starts over after a lift that left the object behind.
RETRIES = 2


# --- the goal -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One ``(predicate obj target)`` of a BDDL goal: ``in`` (``target`` is a region site, e.g.
    ``basket_1_contain_region``) or ``on`` (``target`` is an object, e.g. ``plate_1``)."""

    predicate: str
    obj: str
    target: str


_GOAL = re.compile(r"\(:goal\s*\(\s*and\s*((?:\([^()]*\)\s*)+)\)\s*\)", flags=re.I | re.S)
_ATOM = re.compile(r"\(\s*(\w+)\s+([\w-]+)\s+([\w-]+)\s*\)")


def parse_goal(bddl_text: str) -> Goal:
    """The single pick-and-place atom of a BDDL problem's ``(:goal (And ...))``, names lowercased
    as LIBERO's parser keeps them; a goal with another shape is a UserError."""
    found = _GOAL.search(bddl_text)
    atoms = _ATOM.findall(found[1]) if found else []
    if len(atoms) != 1 or atoms[0][0].lower() not in ("in", "on"):
        shown = " ".join(found[0].split()) if found else "no (:goal (And ...))"
        raise UserError(f"the LIBERO expert needs a goal of one (In obj region) or (On obj target); this BDDL has {shown}.")
    predicate, obj, target = (name.lower() for name in atoms[0])
    return Goal(predicate, obj, target)


def task_goal(task: Any) -> Goal:
    """The goal of a :class:`envs.adapters.libero_adapter.LiberoTask` (from its BDDL file)."""
    return parse_goal(Path(task.bddl_file).read_text())


# --- privileged state -----------------------------------------------------------------------------------


def domain_env(env: Any) -> Any:
    """LIBERO's robosuite env (the BDDL problem) under the adapter's ``LiberoEnv`` (or a wrapper of it)."""
    control_env = getattr(env, "unwrapped", env).env  # LiberoEnv.env: LIBERO's ControlEnv
    return control_env.env


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in world coordinates (metres): ``low`` (3,), ``high`` (3,)."""

    low: np.ndarray
    high: np.ndarray

    @property
    def centre(self) -> np.ndarray:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class GeomBox:
    """A collision geom's bounding box in its own frame: world ``centre`` (3,), ``rotation`` (3, 3)
    (columns: the box's axes in world), ``half`` (3,) half-sizes in metres."""

    centre: np.ndarray
    rotation: np.ndarray
    half: np.ndarray

    def world_box(self) -> Box:
        half = np.abs(self.rotation) @ self.half
        return Box(self.centre - half, self.centre + half)

    def distance(self, point: np.ndarray) -> float:
        """Euclidean distance from ``point`` (3,) to the box (0 inside)."""
        local = np.abs(self.rotation.T @ (point - self.centre))
        return float(np.linalg.norm(np.maximum(0.0, local - self.half)))


def body_geoms(domain: Any, body: str) -> list[GeomBox]:
    """The collision geoms of the object ``body`` (LIBERO's name) and of its child bodies (a
    cabinet's drawers), as MuJoCo's per-geom ``geom_aabb`` boxes placed in world."""
    model, data = domain.sim.model._model, domain.sim.data._data
    root = domain.obj_body_id[body]
    bodies = {root}
    for b in range(root + 1, model.nbody):  # MuJoCo numbers a body's subtree after it
        if model.body_parentid[b] in bodies:
            bodies.add(b)
    geoms = []
    for g in np.flatnonzero(np.isin(model.geom_bodyid, list(bodies))):
        if model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0:
            continue  # a visual geom
        rotation = data.geom_xmat[g].reshape(3, 3).copy()
        geoms.append(GeomBox(data.geom_xpos[g] + rotation @ model.geom_aabb[g, :3], rotation, model.geom_aabb[g, 3:].copy()))
    return geoms


def extent(domain: Any, body: str) -> Box:
    """The world box around an object's collision geoms."""
    boxes = [g.world_box() for g in body_geoms(domain, body)]
    return Box(np.min([b.low for b in boxes], axis=0), np.max([b.high for b in boxes], axis=0))


def body_position(domain: Any, body: str) -> np.ndarray:
    """The object's body position (3,): the point LIBERO's predicates test."""
    return np.array(domain.sim.data.body_xpos[domain.obj_body_id[body]], np.float64)


def grip_pose(domain: Any) -> tuple[np.ndarray, np.ndarray]:
    """The grip site's position (3,) and rotation (3, 3) in world: the point between the finger pads."""
    data = domain.sim.data
    return np.array(data.get_site_xpos("gripper0_grip_site")), np.array(data.get_site_xmat("gripper0_grip_site")).reshape(3, 3)


def rotation_vector(rot: np.ndarray) -> np.ndarray:
    """The axis-angle vector (3,) of a rotation matrix (3, 3)."""
    cos = np.clip((np.trace(rot) - 1) / 2, -1.0, 1.0)
    angle = float(np.arccos(cos))
    axis = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]])
    if angle < 1e-6:
        return axis / 2
    if np.pi - angle < 1e-3:  # near a half turn the antisymmetric part vanishes
        axis = np.sqrt(np.maximum((np.diag(rot) + 1) / 2, 0.0))
        axis *= np.sign(np.where(np.abs(rot[:, np.argmax(axis)]) > 1e-9, rot[:, np.argmax(axis)], 1.0))
        return axis / np.linalg.norm(axis) * angle
    return axis / (2 * np.sin(angle)) * angle


def yaw_rotation(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def finger_yaw(axis_xy: np.ndarray) -> float:
    """The yaw (radians, in [-pi/2, pi/2]) of :data:`DOWN` that opens the fingers along ``axis_xy``."""
    yaw = float(np.arctan2(axis_xy[1], axis_xy[0]) - np.pi / 2)
    return float((yaw + np.pi / 2) % np.pi - np.pi / 2)  # the fingers are symmetric under a half turn


def narrow_axis(geoms: list[GeomBox]) -> tuple[np.ndarray, float]:
    """The object's narrowest horizontal direction (unit (2,)) and its width there (metres): of the
    principal axes of its geom boxes' corners and the world's x and y, the one it is thinnest along
    (a round object's principal axes are arbitrary, the world's are not)."""
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], np.float64)
    corners = np.concatenate([g.centre + (signs * g.half) @ g.rotation.T for g in geoms])[:, :2]
    centred = corners - corners.mean(axis=0)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    candidates = [vectors[:, 0], vectors[:, 1], np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    widths = [float(np.ptp(corners @ axis)) for axis in candidates]
    best = int(np.argmin(widths))
    return candidates[best], widths[best]


# --- the expert -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """Move the grip site to the stage's target with the gripper command ``gripper`` (-1 open,
    +1 close, 0 hold the fingers where they are); done when within ``tolerance_m`` (after
    ``min_steps``) or after ``max_steps``."""

    name: str
    gripper: float
    max_steps: int
    min_steps: int = 0
    tolerance_m: float = 0.01


def pick_place_stages(wall_grasp: bool) -> tuple[Stage, ...]:
    """The stages of one pick and place. A wall grasp first narrows the fingers (``narrow``: the
    outer finger then needs little room beside the object) and descends holding them there."""
    narrow_steps = NARROW_STEPS if wall_grasp else 0
    return (
        Stage("above", OPEN, max_steps=60, tolerance_m=0.012),
        Stage("narrow", CLOSED, max_steps=narrow_steps, min_steps=narrow_steps, tolerance_m=0.0),
        Stage("descend", HOLD if wall_grasp else OPEN, max_steps=40, tolerance_m=0.006),
        Stage("grasp", CLOSED, max_steps=12, min_steps=12, tolerance_m=0.0),
        Stage("lift", CLOSED, max_steps=40, tolerance_m=0.015),
        Stage("carry", CLOSED, max_steps=60, tolerance_m=0.025),
        Stage("lower", CLOSED, max_steps=40, tolerance_m=0.006),
        Stage("release", OPEN, max_steps=10, min_steps=10, tolerance_m=0.0),
        Stage("rise", OPEN, max_steps=10_000, tolerance_m=0.0),
    )


@dataclass(frozen=True)
class Plan:
    """How an episode's expert holds the object and how high it carries it, decided from the scene
    at the start of a pick."""

    stages: tuple[Stage, ...]
    yaw: float
    """The grip site's yaw about world z from :data:`DOWN` (radians)."""
    grasp_offset: np.ndarray
    """Grip point minus the object's body position (3,)."""
    approach_height_m: float
    """Height of the grip site above the grip point before descending."""
    carry_bottom_z: float
    """World height (metres) the object's bottom is carried at."""
    hold_depth_m: float
    """Grip site height above the object's bottom at the grasp."""


def plan_pick(domain: Any, obj: str) -> Plan:
    """Plan the pick of ``obj`` (see the module docstring): a centre grasp across its narrowest
    axis when it fits between the fingers, else a wall grasp."""
    geoms = body_geoms(domain, obj)
    box = extent(domain, obj)
    axis, width = narrow_axis(geoms)
    others = [g for name in domain.obj_body_id if name != obj for g in body_geoms(domain, name)]
    wall = width > MAX_GRASP_WIDTH_M
    if wall:
        grip, yaw = wall_grip(box, others, robot_base_xy(domain))
    else:
        grip = box.centre.copy()
        grip[2] = max(box.centre[2], box.high[2] - FINGER_DEPTH_M, box.low[2] + MIN_GRASP_HEIGHT_M)
        yaw = finger_yaw(axis)
    highest = max((g.world_box().high[2] for g in others), default=box.high[2])
    return Plan(
        stages=pick_place_stages(wall),
        yaw=yaw,
        grasp_offset=grip - body_position(domain, obj),
        approach_height_m=float(box.high[2] - grip[2] + HOVER_M),
        carry_bottom_z=float(max(highest, box.high[2]) + CARRY_CLEARANCE_M),
        hold_depth_m=float(grip[2] - box.low[2]),
    )


def wall_grip(box: Box, others: list[GeomBox], base_xy: np.ndarray) -> tuple[np.ndarray, float]:
    """The grip point on a wide round object's wall and the fingers' yaw there. Of
    :data:`WALL_DIRECTIONS` points around its rim, those whose outer finger and the hand's ends
    keep :data:`ENOUGH_ROOM_M` from every other object's geoms qualify (when none does, the
    roomiest); of those, the one needing the least wrist turn from :data:`DOWN` wins, then the one
    nearest the robot's base (``base_xy``: the easiest to reach). The fingers open radially."""
    centre, radius = box.centre, float(np.min(box.high[:2] - box.low[:2]) / 2) - WALL_INSET_M
    best_key, best = None, (centre, 0.0)
    for angle in np.arange(WALL_DIRECTIONS) * (2 * np.pi / WALL_DIRECTIONS):
        direction = np.array([np.cos(angle), np.sin(angle)])
        point = np.array([*(centre[:2] + radius * direction), box.high[2] - WALL_DEPTH_M])
        fingers = [point + np.array([*(OUTER_FINGER_M * direction), dz]) for dz in (0.0, 0.03, 0.06)]
        hand = [point + np.array([*(side * HAND_HALF_WIDTH_M * direction), HAND_HEIGHT_M]) for side in (-1.0, 1.0)]
        probes = fingers + hand
        room = min((g.distance(p) for g in others for p in probes), default=np.inf)
        yaw = finger_yaw(direction)
        key = (round(min(room, ENOUGH_ROOM_M), 3), -round(abs(yaw), 3), -float(np.linalg.norm(point[:2] - base_xy)))
        if best_key is None or key > best_key:
            best_key, best = key, (point, yaw)
    return best


def robot_base_xy(domain: Any) -> np.ndarray:
    """The (x, y) of the robot's base in world (metres)."""
    robot = domain.robots[0]
    return np.array(domain.sim.data.get_body_xpos(robot.robot_model.root_body))[:2]


@dataclass
class LiberoExpert:
    """A pick-and-place expert for one BDDL goal (see the module docstring): ``reset(env)`` at the
    start of every episode, then ``expert(env)`` gives each step's action (7,) float32."""

    goal: Goal
    plan: Plan | None = None
    stage_index: int = 0
    steps: int = 0
    retries: int = 0
    """Picks this episode may still start over (:data:`RETRIES`)."""
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def stage(self) -> Stage:
        return self.plan.stages[self.stage_index]

    def reset(self, env: Any) -> None:
        """Start a new episode from the env's current (just reset) state."""
        domain = domain_env(env)
        for name in (self.goal.obj,) + ((self.goal.target,) if self.goal.predicate == "on" else ()):
            if name not in domain.obj_body_id:
                raise UserError(f"the LIBERO expert's goal names {name!r}, which this scene lacks (objects: {', '.join(domain.obj_body_id)}).")
        self.retries = RETRIES
        self._start(domain)

    def _start(self, domain: Any) -> None:
        """Plan a pick from the scene as it is now and begin at the first stage."""
        self.plan = plan_pick(domain, self.goal.obj)
        self.stage_index, self.steps = 0, 0
        self.memory = {"start_bottom": float(extent(domain, self.goal.obj).low[2])}

    def __call__(self, env: Any, obs: Any = None) -> np.ndarray:
        """The action (7,) float32 for ``env``'s current state (``obs`` is not read: the expert acts
        on privileged state)."""
        if self.plan is None:
            raise UserError("call expert.reset(env) after env.reset() and before the first action.")
        domain = domain_env(env)
        tcp, rot = grip_pose(domain)
        while self.stage_index < len(self.plan.stages) - 1 and self._done(self._target(domain, tcp), tcp):
            self._advance(domain, tcp)
        self.steps += 1
        return self._action(tcp, rot, self._target(domain, tcp), self.stage.gripper)

    def _target(self, domain: Any, tcp: np.ndarray) -> np.ndarray:
        """The grip site's target point (3,) of the current stage."""
        plan, name = self.plan, self.stage.name
        obj = body_position(domain, self.goal.obj)
        grip = self.memory.get("grasp_at", obj + plan.grasp_offset)
        hold = self.memory.get("hold", plan.hold_depth_m)
        carry_z = plan.carry_bottom_z + hold
        if name == "above":  # at a height that clears every object, so the arm reaches it over them
            return np.array([grip[0], grip[1], max(grip[2] + plan.approach_height_m, plan.carry_bottom_z + plan.hold_depth_m)])
        if name in ("narrow", "release"):
            return self.memory.setdefault(f"{name}_at", tcp)
        if name in ("descend", "grasp"):
            return grip
        if name == "lift":
            return np.array([grip[0], grip[1], carry_z])
        if name in ("carry", "lower"):
            place_xy, bottom_z = self._place(domain)
            held_xy = self.memory["held_xy"]  # the object's place in the hand
            return np.array([*(place_xy + held_xy), carry_z if name == "carry" else bottom_z + hold])
        return np.array([tcp[0], tcp[1], carry_z])  # rise

    def _place(self, domain: Any) -> tuple[np.ndarray, float]:
        """Where the object goes: its body's (x, y) and its bottom's height when let go."""
        if self.goal.predicate == "on":
            return body_position(domain, self.goal.target)[:2], float(extent(domain, self.goal.target).high[2] + DROP_GAP_M)
        site = self.goal.target
        rot = np.array(domain.sim.data.get_site_xmat(site)).reshape(3, 3)
        half = np.abs(rot @ domain.object_sites_dict[site].size)
        centre = np.array(domain.sim.data.get_site_xpos(site))
        return centre[:2], float(centre[2] - half[2] + IN_RELEASE_M)

    def _advance(self, domain: Any, tcp: np.ndarray) -> None:
        """Enter the next stage, noting what later stages hold on to; a lift that left the object
        where it was starts the pick over (while retries last)."""
        finished = self.stage.name
        self.stage_index, self.steps = self.stage_index + 1, 0
        bottom = float(extent(domain, self.goal.obj).low[2])
        if finished == "descend":
            self.memory["grasp_at"] = tcp  # the fingers close here
        elif finished == "grasp":
            self.memory["hold"] = float(tcp[2] - bottom)
        elif finished == "lift":
            self.memory["held_xy"] = (tcp - body_position(domain, self.goal.obj))[:2]
            if bottom < self.memory["start_bottom"] + LIFTED_M and self.retries > 0:
                self.retries -= 1
                self._start(domain)

    def _done(self, target: np.ndarray, tcp: np.ndarray) -> bool:
        stage = self.stage
        if self.steps >= stage.max_steps:
            return True
        return self.steps >= stage.min_steps and float(np.linalg.norm(target - tcp)) < stage.tolerance_m

    def _action(self, tcp: np.ndarray, rot: np.ndarray, target: np.ndarray, gripper: float) -> np.ndarray:
        """OSC_POSE's delta action (7,): the translation to ``target`` and the rotation to the plan's
        downward pose, each clipped to one step's range, and the gripper command."""
        wanted = yaw_rotation(self.plan.yaw) @ DOWN
        turn = rotation_vector(wanted @ rot.T)  # a world-frame rotation, as OSC_POSE applies its delta
        move = np.clip((target - tcp) / STEP_M, -1.0, 1.0)
        return np.concatenate([move, np.clip(turn / STEP_RAD, -1.0, 1.0), [gripper]]).astype(np.float32)


def libero_expert(task: Any) -> LiberoExpert:
    """The expert of a LIBERO-Spatial or LIBERO-Object task (``LiberoTask``), from its BDDL goal."""
    if task.suite not in SUITES:
        raise UserError(f"no scripted LIBERO expert for {task.id}: the experts cover {', '.join(SUITES)}.")
    return LiberoExpert(task_goal(task))


# --- episodes -------------------------------------------------------------------------------------------


def task_env(task: Any, obs_mode: str = "state", image_size: int = 128, max_episode_steps: int | None = None, **kwargs: Any) -> Any:
    """The adapter's single ``LiberoEnv`` of ``task`` on its official initial states (reset seed s
    starts from state s mod 50), with the suite's time limit unless ``max_episode_steps`` is given."""
    from envs.adapters.libero_adapter import LiberoEnv, load_init_states
    from envs.adapters.libero_adapter import max_episode_steps as suite_limit

    return LiberoEnv(task.bddl_file, load_init_states(task), obs_mode=obs_mode, image_size=image_size,
                     max_episode_steps=max_episode_steps or suite_limit(task.suite), **kwargs)


@dataclass
class ExpertEpisode:
    """One expert episode: ``observations`` T+1 dicts (the env's, the reset's first), ``actions``
    (T, 7) float32, ``success`` (LIBERO's ``check_success()`` at the last step), the official
    initial state it started from and the stage the expert ended in."""

    observations: list[dict[str, np.ndarray]]
    actions: np.ndarray
    success: bool
    init_state: int
    stage: str


def record_episode(env: Any, expert: LiberoExpert, seed: int) -> ExpertEpisode:
    """Reset ``env`` with ``seed`` (official state ``seed mod S`` on a one-task env) and let the
    expert act until LIBERO reports success or the env truncates."""
    obs, info = env.reset(seed=seed)
    expert.reset(env)
    observations, actions = [obs], []
    while True:
        action = expert(env, obs)
        obs, _, terminated, truncated, info = env.step(action)
        observations.append(obs)
        actions.append(action)
        if terminated or truncated:
            break
    return ExpertEpisode(observations, np.array(actions, np.float32).reshape(-1, 7), bool(info["success"]),
                         int(info["init_state"]), expert.stage.name)


# --- the expert module of ``embodied demos`` (pipelines.demo_sources.ExpertModule) ---------------------

#: The camera of the ``rgb`` key (the adapter's agentview; ``rgb/wrist`` is the eye-in-hand one).
CAMERA = "agentview"
#: The longer of the two suites' time limits (LIBERO-Object's 280; LIBERO-Spatial's is 220): the
#: experts finish well within either.
DEFAULT_MAX_EPISODE_STEPS = 280


def tasks_of(env_id: str) -> list[Any]:
    """The tasks an id selects (``libero_object``, ``libero_spatial/3``, ``libero_object/<name>``),
    as :class:`envs.experts.ExpertTask`; a suite without experts is a UserError."""
    from envs.adapters.libero_adapter import parse_id
    from envs.experts import ExpertTask

    suite, tasks = parse_id(env_id)
    if suite not in SUITES:
        raise UserError(f"env_id={env_id!r}: the scripted LIBERO experts cover {', '.join(SUITES)} (pick-and-place goals).")
    return [ExpertTask(t.id, t.name, t.instruction) for t in tasks]


def _libero_task(task: Any) -> Any:
    from envs.adapters.libero_adapter import parse_id

    return parse_id(task.env_id)[1][0]


def make_env(task: Any, obs_mode: str, image_size: int, max_episode_steps: int) -> Any:
    """The adapter's ``LiberoEnv`` of an ``ExpertTask`` (:func:`task_env`)."""
    return task_env(_libero_task(task), obs_mode=obs_mode, image_size=image_size, max_episode_steps=max_episode_steps)


def make_expert(task: Any) -> LiberoExpert:
    """The scripted expert of an ``ExpertTask`` (:func:`libero_expert`)."""
    return libero_expert(_libero_task(task))


def recorded_keys(obs_mode: str) -> tuple[str, ...]:
    """The observation keys the adapter shows a policy in ``obs_mode``: ``state`` (8,) always, and
    the agentview and wrist frames unless ``state``."""
    return ("state",) if obs_mode == "state" else ("state", "rgb", "rgb/wrist")
