"""pipelines.ppo: which episode ends bootstrap (hand-computed, one env, gamma 0.5, lambda 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.config import PPOConfig
from pipelines.ppo import compute_advantages


def _data(terminated, truncated):
    # 3 steps of one env: rewards 1, 1, 1; V = 0 everywhere except V(final obs of step 1) = 4, V(obs_3) = 2
    return {
        "rewards": np.ones((3, 1), np.float32),
        "values": np.zeros((3, 1), np.float32),
        "terminated": np.array(terminated, bool).reshape(3, 1),
        "truncated": np.array(truncated, bool).reshape(3, 1),
        "final_values": np.array([[0.0], [4.0], [0.0]], np.float32),
        "last_values": np.array([2.0], np.float32),
    }


@pytest.mark.parametrize("bootstrap", [False, True])
def test_termination_bootstraps_only_when_asked(bootstrap):
    algo = PPOConfig(gamma=0.5, gae_lambda=1.0, bootstrap_terminated=bootstrap)
    adv, ret = compute_advantages(_data([0, 1, 0], [0, 0, 0]), algo, torch.device("cpu"))
    # episode 1 = steps 0-1 ending in a termination at step 1; episode 2 = step 2, bootstrapped by V(obs_3) = 2
    end = 0.5 * 4.0 if bootstrap else 0.0  # gamma * V(final obs) or nothing
    expected = [1 + 0.5 * (1 + end), 1 + end, 1 + 0.5 * 2.0]
    torch.testing.assert_close(ret[:, 0], torch.tensor(expected))
    torch.testing.assert_close(adv, ret)  # values are 0


def test_truncation_bootstraps_either_way():
    for bootstrap in (False, True):
        algo = PPOConfig(gamma=0.5, gae_lambda=1.0, bootstrap_terminated=bootstrap)
        _, ret = compute_advantages(_data([0, 0, 0], [0, 1, 0]), algo, torch.device("cpu"))
        assert ret[1, 0].item() == pytest.approx(1 + 0.5 * 4.0)


# -- action chunks: one decision per chunk, discounted as its env steps -------------------------------


def test_chunk_transition_by_hand():
    """Chunks of C=3 steps, gamma 0.5: env 0 runs the chunk out, env 1 terminates at its second
    step (its third is not part of the episode), env 2 is truncated at its first step."""
    from pipelines.ppo import bootstrap_scale, chunk_transition

    rewards = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 9.0], [3.0, 0.0, 0.0]], np.float32)
    terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    truncated = np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0]], bool)
    valid = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    reward, term, trunc, steps = chunk_transition(rewards, terminated, truncated, valid, gamma=0.5)
    np.testing.assert_allclose(reward, [1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2, 3.0])
    assert term.tolist() == [False, True, False] and trunc.tolist() == [False, False, True]
    assert steps.tolist() == [3, 2, 1]
    np.testing.assert_allclose(bootstrap_scale(steps, 3, 0.5), [1.0, 2.0, 4.0])  # 0.5 ** (steps - 3)


def test_chunked_gae_equals_the_per_step_discounted_return():
    """With lambda 1 a chunk-level advantage is the per-step discounted return (bootstrapped by
    V at the end, or by V(final obs) of a truncation inside a chunk, after the steps taken)."""
    from pipelines.ppo import bootstrap_scale, chunk_transition

    gamma, chunk = 0.9, 4
    rng = np.random.default_rng(0)
    step_rewards = rng.normal(size=(3, 1, chunk)).astype(np.float32)  # 3 decisions of one env
    valid = np.ones((3, 1, chunk), bool)
    truncated = np.zeros((3, 1, chunk), bool)
    valid[2, 0, 2:] = False  # the episode is truncated at the second step of the last chunk
    truncated[2, 0, 1] = True
    values, v_final, v_last = np.array([[0.3], [-0.2], [0.1]], np.float32), 1.5, 7.0
    rows = [chunk_transition(step_rewards[t], np.zeros((1, chunk), bool), truncated[t], valid[t], gamma) for t in range(3)]
    data = {
        "rewards": np.stack([r[0] for r in rows]),
        "values": values,
        "terminated": np.stack([r[1] for r in rows]),
        "truncated": np.stack([r[2] for r in rows]),
        "final_values": np.array([[0.0], [0.0], [v_final * bootstrap_scale(rows[2][3], chunk, gamma)[0]]], np.float32),
        "last_values": np.array([v_last], np.float32),  # belongs to the next episode: must not leak in
        "action_chunk": chunk,
    }
    adv, _ = compute_advantages(data, PPOConfig(gamma=gamma, gae_lambda=1.0), torch.device("cpu"))
    flat = step_rewards.reshape(-1)[: 2 * chunk + 2]  # the 10 steps the episode took
    discounted = sum(gamma**k * r for k, r in enumerate(flat)) + gamma ** len(flat) * v_final
    assert adv[0, 0].item() == pytest.approx(discounted - values[0, 0], rel=1e-5)
    later = sum(gamma**k * r for k, r in enumerate(flat[chunk:])) + gamma ** (len(flat) - chunk) * v_final
    assert adv[1, 0].item() == pytest.approx(later - values[1, 0], rel=1e-5)
