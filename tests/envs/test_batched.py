"""The batched (Isaac Gym / Isaac Lab-style) adapter on a real batched torch env."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # batched_pointmass, whatever tests/ layout runs us

from batched_pointmass import BatchedPointMass  # noqa: E402

from embodied.errors import UserError  # noqa: E402
from envs.adapters.batched_adapter import BatchedVecEnv  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402

ENV_ID = f"{BatchedPointMass.__module__}:BatchedPointMass"


def make(num_envs: int = 4, max_episode_steps: int | None = None, **kwargs) -> BatchedVecEnv:
    cfg = EnvConfig(id=ENV_ID, num_envs=num_envs, max_episode_steps=max_episode_steps, kwargs=kwargs)
    env = make_vec_env(cfg, seed=3)
    assert isinstance(env, BatchedVecEnv)
    return env


def oracle(env: BatchedVecEnv) -> torch.Tensor:
    """The action that moves every mass straight to its goal (reached in one step when close)."""
    inner = env.env
    return ((inner.goal - inner.pos) / inner.step_size).clamp(-1.0, 1.0)


def test_registry_picks_batched_adapter_and_passes_kwargs():
    assert resolve_adapter(EnvConfig(id=ENV_ID)) == "batched"
    env = make(num_envs=5, max_episode_steps=7, step_size=0.05)
    assert env.num_envs == 5 and env.env.num_envs == 5
    assert env.env.step_size == 0.05 and env.env.max_episode_steps == 7
    assert env.device == "cpu"
    assert set(env.observation_space.spaces) == {"state"}
    assert env.observation_space["state"].shape == (4,) and env.action_space.shape == (2,)


def test_a_gymnasium_class_is_not_claimed():
    # a plain gymnasium.Env class goes to the gymnasium adapter, not this one
    assert resolve_adapter(EnvConfig(id="gymnasium.envs.classic_control.cartpole:CartPoleEnv")) == "gymnasium"


def test_reset_and_step_return_torch_tensors_of_the_contract_shapes():
    env = make(num_envs=6)
    obs = env.reset(seed=0)
    assert isinstance(obs["state"], torch.Tensor) and obs["state"].shape == (6, 4)
    assert obs["state"].dtype == torch.float32
    res = env.step(torch.zeros(6, 2))
    assert isinstance(res.obs["state"], torch.Tensor) and res.obs["state"].shape == (6, 4)
    assert res.reward.shape == (6,) and res.reward.dtype == torch.float32
    assert res.terminated.dtype == torch.bool and res.truncated.dtype == torch.bool
    assert res.terminated.shape == res.truncated.shape == (6,)
    assert isinstance(res.info["success"], torch.Tensor) and res.info["success"].dtype == torch.bool
    assert isinstance(res.episodes.done, torch.Tensor)
    # numpy actions are accepted too
    res = env.step(np.zeros((6, 2), np.float32))
    assert isinstance(res.reward, torch.Tensor)


def test_reset_seed_is_deterministic():
    a, b = make(), make()
    assert torch.equal(a.reset(seed=5)["state"], b.reset(seed=5)["state"])
    assert not torch.equal(a.reset(seed=5)["state"], a.reset(seed=6)["state"])


def test_termination_auto_reset_final_obs_and_episode_stats():
    env = make(num_envs=8)
    env.reset(seed=1)
    returns = torch.zeros(8)
    for _ in range(20):  # at most 2*sqrt(2)/0.2 ~ 15 steps to any goal
        res = env.step(oracle(env))
        returns += res.reward
        if res.terminated.all():
            break
    done = res.terminated | res.truncated
    assert done.any()
    assert not res.truncated.any()
    assert res.info["success"][done].all()
    final = res.final_obs["state"]
    final_dist = torch.linalg.vector_norm(final[done, 2:] - final[done, :2], dim=1)
    assert (final_dist < 0.1).all()  # the last obs of the finished episode is at the goal
    assert not torch.allclose(res.obs["state"][done], final[done])  # obs is the next episode's first
    ep = res.episodes
    assert torch.equal(ep.done, done)
    assert (ep.length[done] >= 1).all() and ep.success[done].all()
    rows = ep.finished()
    assert len(rows) == int(done.sum()) and all(r["success"] == 1.0 for r in rows)


def test_truncation_at_the_time_limit_is_not_termination():
    env = make(num_envs=4, max_episode_steps=5, goal_radius=1e-9)  # a goal is never reached
    env.reset(seed=2)
    total = torch.zeros(4)
    for t in range(5):
        res = env.step(torch.zeros(4, 2))
        total += res.reward
        if t < 4:
            assert not (res.terminated | res.truncated).any() and res.final_obs is None
    assert res.truncated.all() and not res.terminated.any()
    assert torch.equal(res.episodes.length, torch.full((4,), 5))
    assert torch.allclose(res.episodes.episode_return, total)
    assert not res.episodes.success.any()
    # zero actions: the final obs is the initial state of the episode, not the reset one
    assert res.final_obs is not None
    # next step starts a fresh episode: length counters were reset
    res = env.step(torch.zeros(4, 2))
    assert not res.episodes.done.any()


def test_isaac_lab_dict_observations_are_renamed_to_state():
    env = make(num_envs=3, obs_as_dict=True)
    assert set(env.observation_space.spaces) == {"state"}
    obs = env.reset(seed=0)
    assert set(obs) == {"state"} and obs["state"].shape == (3, 4)
    res = env.step(oracle(env))
    assert set(res.obs) == {"state"}


def test_chunk_step_masks_the_steps_after_an_episode_ended():
    n, c = 8, 6
    env = make(num_envs=n, max_episode_steps=4, goal_radius=1e-9)  # truncation after 4 steps
    env.reset(seed=0)
    env.step(torch.zeros(n, 2))  # one step in: every episode ends at chunk step index 2
    res = env.chunk_step(torch.zeros(n, c, 2))
    assert isinstance(res.rewards, torch.Tensor) and res.rewards.shape == (n, c)
    assert res.valid.dtype == torch.bool and res.valid.shape == (n, c)
    expected_valid = torch.tensor([True, True, True, False, False, False]).expand(n, c)
    assert torch.equal(res.valid, expected_valid)
    assert res.truncated[:, 2].all() and not res.truncated[:, [0, 1, 3, 4, 5]].any()
    assert not res.terminated.any()
    assert (res.rewards[:, 3:] == 0).all() and (res.rewards[:, :3] < 0).all()
    assert res.episodes.done.all() and torch.equal(res.episodes.length, torch.full((n,), 4))
    assert res.final_obs is not None and res.final_obs["state"].shape == (n, 4)
    assert isinstance(res.info["success"], torch.Tensor)


def test_chunk_step_final_obs_comes_from_the_step_the_episode_ended():
    n = 8
    env = make(num_envs=n)
    env.reset(seed=4)
    goals = env.env.goal.clone()
    finished = torch.zeros(n, dtype=torch.bool)
    for _ in range(16):  # one oracle step per chunk: every goal is reached within 15 chunks
        chunk = torch.stack([oracle(env), torch.zeros(n, 2), torch.zeros(n, 2)], dim=1)  # (N, 3, 2)
        res = env.chunk_step(chunk)
        done = res.episodes.done
        assert torch.equal(done, res.terminated.any(dim=1))
        assert res.terminated.sum(dim=1).le(1).all()  # at most one done per env per chunk
        if done.any():
            final = res.final_obs["state"][done]
            assert torch.allclose(final[:, 2:], goals[done])  # the goal of the episode that ended
            assert (torch.linalg.vector_norm(final[:, 2:] - final[:, :2], dim=1) < 0.1).all()
            assert res.episodes.success[done].all()
        finished |= done
        goals = torch.where(done[:, None], env.env.goal, goals)
    assert finished.all()


def test_chunk_step_agrees_with_the_contracts_step_by_step_reference():
    # Episodes that end at different steps of a chunk (successes at random, time limits after
    # them), some envs ending at two steps of one chunk: BatchedVecEnv's stacked, once-masked
    # chunk_step must give what the contract's reference (VecEnv.chunk_step over step) gives.
    from envs.base import VecEnv

    n, c = 16, 4
    fast, ref = (make(num_envs=n, max_episode_steps=3, goal_radius=0.45, step_size=0.3) for _ in range(2))
    fast.reset(seed=1), ref.reset(seed=1)
    ends = torch.zeros(n, dtype=torch.int64)  # episodes that ended in the chunk, per env (masked ones too)
    inner_step = ref.env.step

    def counting_step(actions):
        out = inner_step(actions)
        ends.add_((out[2] | out[3]).long())
        return out

    ref.env.step = counting_step
    gen = torch.Generator().manual_seed(0)
    first_end_steps, two_ends = set(), 0
    for _ in range(12):
        chunk = torch.rand(n, c, 2, generator=gen) * 2 - 1
        ends.zero_()
        a, b = fast.chunk_step(chunk), VecEnv.chunk_step(ref, chunk)
        first_end_steps |= {int(np.flatnonzero(row)[0]) for row in np.asarray(b.terminated | b.truncated) if row.any()}
        two_ends += int((ends > 1).sum())
        for name in ("rewards", "terminated", "truncated", "valid"):
            np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
        np.testing.assert_array_equal(np.asarray(a.obs["state"]), np.asarray(b.obs["state"]))
        np.testing.assert_array_equal(np.asarray(a.info["success"]), np.asarray(b.info["success"]))
        done = np.asarray(b.episodes.done)
        np.testing.assert_array_equal(np.asarray(a.episodes.done), done)
        if done.any():
            np.testing.assert_array_equal(np.asarray(a.final_obs["state"])[done], np.asarray(b.final_obs["state"])[done])
            for name in ("episode_return", "length", "success"):
                np.testing.assert_array_equal(np.asarray(getattr(a.episodes, name))[done], np.asarray(getattr(b.episodes, name))[done])
        else:
            assert a.final_obs is None and b.final_obs is None
    assert len(first_end_steps) >= 3 and two_ends > 0  # first dones at several chunk steps; second ones masked


def test_chunk_shape_is_checked():
    env = make(num_envs=2)
    env.reset()
    with pytest.raises(UserError, match="chunk_step expects"):
        env.chunk_step(torch.zeros(2, 3))


def test_a_class_without_the_marker_is_refused():
    cfg = EnvConfig(id="envs.adapters.batched_adapter:BatchedVecEnv", num_envs=2)
    # BatchedVecEnv has no is_vector_env marker: not claimed, and the batched adapter refuses it
    assert resolve_adapter(cfg) != "batched"
    with pytest.raises(UserError, match="not a batched env class"):
        make_vec_env(EnvConfig(id=cfg.id, adapter="batched", num_envs=2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensors_stay_on_the_cuda_device():
    env = make(num_envs=16, device="cuda")
    assert env.device.startswith("cuda")
    obs = env.reset(seed=0)
    assert obs["state"].is_cuda
    res = env.chunk_step(torch.zeros(16, 4, 2, device="cuda"))
    assert res.rewards.is_cuda and res.valid.is_cuda and res.obs["state"].is_cuda
    res = env.step(oracle(env))
    assert res.reward.is_cuda and res.terminated.is_cuda and res.episodes.done.is_cuda
    assert isinstance(res.episodes.finished(), list)  # works on cuda tensors


def test_ignore_terminations_needs_the_batched_env_to_implement_it():
    with pytest.raises(UserError, match="has no 'ignore_terminations' parameter"):
        make_vec_env(EnvConfig(id=ENV_ID, num_envs=2, ignore_terminations=True), seed=0)


class NanPointMass(BatchedPointMass):
    """Row ``row``'s simulation blows up at step ``at`` of its first episode: its position becomes
    NaN (so do its observation and reward) until the time limit resets it."""

    def __init__(self, num_envs: int, row: int = 2, at: int = 3, **kwargs) -> None:
        super().__init__(num_envs, **kwargs)
        self.row, self.at, self.t = row, at, 0

    def step(self, actions):
        self.t += 1
        if self.t == self.at:
            self.pos[self.row] = float("nan")
        return super().step(actions)


def test_nan_in_a_batched_env_names_the_row_and_its_seed():
    from embodied.errors import EnvError, format_failure

    env = BatchedVecEnv(NanPointMass(4, goal_radius=1e-9), env_id="NanPointMass")
    env.reset(seed=3)
    env.step(torch.zeros(4, 2))
    env.step(torch.zeros(4, 2))
    with pytest.raises(EnvError) as info:
        env.step(torch.zeros(4, 2))
    assert format_failure(info.value).startswith(
        "The env failed (exit code 3): env NanPointMass (env index 2, seed 3) returned NaN/inf at step 3 of its episode: "
        "its observation 'state' holds NaN.")


def test_nan_with_drop_masks_the_row_until_the_env_resets_it():
    env = BatchedVecEnv(NanPointMass(4, goal_radius=1e-9, max_episode_steps=6), nonfinite="drop")
    zeros = torch.zeros(4, 2)
    env.reset(seed=3)
    env.step(zeros)
    before = env.step(zeros)
    with pytest.warns(UserWarning, match="1 env\\(s\\) returned NaN/inf \\(first: env index 2\\)"):
        res = env.step(zeros)
    assert torch.equal(res.info["nonfinite"], torch.tensor([False, False, True, False]))
    assert torch.isfinite(res.obs["state"]).all() and torch.isfinite(res.reward).all()
    assert torch.equal(res.obs["state"][2], before.obs["state"][2])  # the row's last finite observation
    assert torch.equal(res.final_obs["state"][2], before.obs["state"][2]) and res.reward[2] == 0
    assert res.truncated[2] and not res.terminated[2] and not res.episodes.done[2]
    for _ in range(2):  # still NaN inside the env: masked, counted once
        res = env.step(zeros)
        assert res.info["nonfinite"][2] and torch.isfinite(res.obs["state"]).all()
    res = env.step(zeros)  # step 6: the time limit ends (and resets) every env
    assert res.episodes.done[[0, 1, 3]].all() and not res.episodes.done[2]
    res = env.step(zeros)
    assert "nonfinite" not in res.info and torch.isfinite(res.obs["state"]).all()
    assert env.nonfinite_episodes == 1
    chunk = env.chunk_step(torch.zeros(4, 3, 2))
    assert "nonfinite" not in chunk.info
