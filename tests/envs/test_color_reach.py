"""ColorReach-v0: layouts from the seed, dynamics and rewards by hand, the rendering, the experts, the adapter."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.errors import UserError
from envs.adapters.color_reach import (
    AGENT, BACKGROUND, COLORS, ColorReach, careless_expert, expert, instruction_of,
)
from envs.config import EnvConfig
from envs.registry import make_vec_env


def test_one_seed_one_layout_whatever_the_goal():
    red, blue = ColorReach(goal="red"), ColorReach(goal="blue")
    a, _ = red.reset(seed=7)
    b, _ = blue.reset(seed=7)
    assert np.array_equal(red.targets, blue.targets) and np.array_equal(red.agent, blue.agent)
    assert np.array_equal(a["rgb"], b["rgb"])
    assert np.array_equal(a["state"][:2], b["state"][:2]) and not np.array_equal(a["state"][2:4], b["state"][2:4])
    red.reset(seed=8)
    assert not np.array_equal(red.targets, blue.targets)
    assert red.instruction == "move to the red target" == instruction_of("red")


def test_step_moves_by_speed_times_action_and_rewards_the_distance_gained():
    env = ColorReach(goal="blue", speed=0.25, success_radius=0.3, max_steps=3)
    obs, _ = env.reset(seed=3)
    assert obs["state"].shape == env.observation_space["state"].shape == (8,)
    assert obs["rgb"].shape == env.observation_space["rgb"].shape == (32, 32, 3)
    start, goal = env.agent.copy(), env.targets[1].copy()
    before = np.linalg.norm(start - goal)
    obs, reward, terminated, truncated, info = env.step(np.array([0.4, -2.0]))  # the second clipped to -1
    expected = np.clip(start + 0.25 * np.array([0.4, -1.0]), -1, 1)
    assert np.allclose(env.agent, expected) and np.allclose(obs["state"][:2], expected)
    after = np.linalg.norm(expected - goal)
    success = after <= 0.3
    assert reward == pytest.approx(before - after + float(success))
    assert terminated == success == info["success"] and not truncated
    assert np.allclose(obs["state"][2:4], goal) and np.allclose(obs["state"][4:], env.targets.reshape(-1))


def test_success_terminates_and_the_time_limit_truncates():
    env = ColorReach(goal="red", max_steps=2, reward="sparse")
    env.reset(seed=0)
    env.agent = env.targets[0] + np.array([0.2, 0.0])
    _, reward, terminated, truncated, _ = env.step(np.array([-0.4, 0.0]))  # lands on the target
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.reset(seed=0)
    away = -np.sign(env.targets[0] - env.agent)  # walks away from the goal
    _, reward, terminated, truncated, _ = env.step(away)
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, truncated, _ = env.step(away)
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_the_frame_shows_the_agent_and_the_targets_where_the_state_says():
    env = ColorReach(num_targets=3, image_size=32)
    obs, _ = env.reset(seed=5)
    frame = obs["rgb"]
    for color, (x, y) in zip(["red", "blue", "green"], env.targets):
        row, col = int(round((1 - y) / 2 * 31)), int(round((x + 1) / 2 * 31))
        assert tuple(frame[row, col]) == COLORS[color]
    x, y = env.agent
    assert tuple(frame[int(round((1 - y) / 2 * 31)), int(round((x + 1) / 2 * 31))]) == AGENT
    assert tuple(frame[0, 0]) in (BACKGROUND, *COLORS.values(), AGENT)
    assert (frame == np.array(BACKGROUND, np.uint8)).all(-1).mean() > 0.8


def test_the_expert_succeeds_and_the_careless_expert_in_about_70_percent():
    def success_rate(act, episodes=200):
        wins = 0
        for seed in range(episodes):
            env = ColorReach(goal=["red", "blue"][seed % 2])
            obs, _ = env.reset(seed=seed)
            for _ in range(env.max_steps):
                action = act({"state": obs["state"][None]})[0]
                obs, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    wins += terminated
                    break
        return wins / episodes

    assert success_rate(expert) == 1.0
    assert 0.55 <= success_rate(careless_expert) <= 0.8  # CARELESS_RELIABILITY = 0.7 of the episodes
    with pytest.raises(UserError, match="state"):
        expert({"rgb": np.zeros((1, 32, 32, 3), np.uint8)})


def test_the_careless_expert_keeps_its_target_for_the_episode():
    env = ColorReach(goal="red")
    obs, _ = env.reset(seed=11)
    state = np.repeat(obs["state"][None], 2, axis=0)
    state[1, 0:2] = [0.3, -0.2]  # the agent elsewhere: the layout, hence the chosen target, is the same
    moves = careless_expert({"state": state})
    aims = [obs["state"][4:6], obs["state"][6:8]]
    chosen = [min(range(2), key=lambda k, i=i: np.linalg.norm(np.clip((aims[k] - state[i, 0:2]) / 0.25, -1, 1) - moves[i]))
              for i in range(2)]
    assert chosen[0] == chosen[1]


def test_the_adapter_asks_for_colours_in_blocks_and_checks_its_kwargs():
    env = make_vec_env(EnvConfig(id="ColorReach-v0", num_envs=6, obs_mode="rgb", image_size=16, kwargs={"task_every": 2}), seed=0)
    try:
        assert env.instructions == [instruction_of(c) for c in ["red", "red", "blue", "blue", "red", "red"]]
        obs = env.reset(seed=[4] * 6)
        assert set(obs) == {"rgb"} and obs["rgb"].shape == (6, 16, 16, 3)
        assert (obs["rgb"] == obs["rgb"][:1]).all()  # one seed, one layout
    finally:
        env.close()
    with pytest.raises(UserError, match="task_every"):
        make_vec_env(EnvConfig(id="ColorReach-v0", num_envs=2, kwargs={"task_every": 0}), seed=0)
    with pytest.raises(UserError, match="goal='purple'"):
        make_vec_env(EnvConfig(id="ColorReach-v0", num_envs=2, kwargs={"goal": "purple"}), seed=0)
    with pytest.raises(UserError, match="parameters"):
        make_vec_env(EnvConfig(id="ColorReach-v0", num_envs=2, kwargs={"sped": 1.0}), seed=0)
    with pytest.raises(UserError, match="obs_mode"):
        make_vec_env(EnvConfig(id="ColorReach-v0", num_envs=2, obs_mode="depth"), seed=0)
