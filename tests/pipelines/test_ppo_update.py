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
