"""Flow-SDE / Flow-Noise transition math (embodied.rl.flow) against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.rl.flow import flow_sde_sigmas, flow_timesteps, flow_transition, gaussian_entropy, gaussian_log_prob


def test_grid_and_sigmas_by_hand() -> None:
    assert flow_timesteps(2).tolist() == [1.0, 0.5, 0.0]
    # t = 1 divides by 1 - 0.5 (the next grid point): 0.5 * sqrt(1 / 0.5); t = 0.5: 0.5 * sqrt(0.5 / 0.5)
    assert flow_sde_sigmas(2, 0.5).tolist() == pytest.approx([0.5 * math.sqrt(2.0), 0.5])


def test_flow_sde_two_step_chain_log_prob_by_hand() -> None:
    """N = 2, noise_level 0.5, x = 1, v = 2 at both steps, the next sample 0.

    step 0: t = 1, t' = 0.5, dt = 0.5, sigma = 0.5 sqrt(2): x0 = x - v = -1, x1 = x = 1,
            mean = -1 * 0.5 + 1 * (0.5 - 0.5 * 0.5 / 2) = -0.125, std = sqrt(0.5) * 0.5 sqrt(2) = 0.5
    step 1: t = 0.5, t' = 0, dt = 0.5, sigma = 0.5: x0 = 0, x1 = 2,
            mean = 0 * 1 + 2 * (0 - 0.25 * 0.5 / 1) = -0.25, std = sqrt(0.5) * 0.5
    """
    x, v, nxt = torch.ones(1, 1, 1), torch.full((1, 1, 1), 2.0), torch.zeros(1, 1, 1)
    mean0, std0 = flow_transition(x, v, 0, 2, "flow_sde", 0.5)
    mean1, std1 = flow_transition(x, v, 1, 2, "flow_sde", 0.5)
    assert (mean0.item(), std0.item()) == pytest.approx((-0.125, 0.5))
    assert (mean1.item(), std1.item()) == pytest.approx((-0.25, math.sqrt(0.5) * 0.5))
    log_norm = 0.5 * math.log(2 * math.pi)
    step0 = -math.log(0.5) - log_norm - 0.5 * (0.125 / 0.5) ** 2
    step1 = -math.log(math.sqrt(0.5) * 0.5) - log_norm - 0.5 * 0.5
    chain = gaussian_log_prob(nxt, mean0, std0) + gaussian_log_prob(nxt, mean1, std1)
    assert chain.item() == pytest.approx(step0 + step1, abs=1e-6)
    assert step0 + step1 == pytest.approx(-0.2570413 - 0.1292177, abs=1e-6)


def test_zero_noise_is_the_euler_step() -> None:
    x, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    for step in range(4):
        dt = 1.0 / 4
        mean, std = flow_transition(x, v, step, 4, "flow_sde", 0.0)
        assert torch.allclose(mean, x - dt * v, atol=1e-6)
        assert (std == 0).all()
        ode, _ = flow_transition(x, v, step, 4, "ode", 0.0)
        assert torch.allclose(ode, x - dt * v, atol=1e-6)


def test_flow_noise_uses_the_learned_std_and_the_ode_mean() -> None:
    x, v, std = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.full((2, 3, 4), 0.1)
    mean, got = flow_transition(x, v, 1, 2, "flow_noise", 0.5, std)
    assert torch.allclose(mean, x - 0.5 * v, atol=1e-6) and got is std
    with pytest.raises(ValueError, match="learned_std"):
        flow_transition(x, v, 1, 2, "flow_noise", 0.5)


def test_gaussian_helpers() -> None:
    std = torch.tensor([0.0, 2.0])
    log_prob = gaussian_log_prob(torch.tensor([5.0, 1.0]), torch.tensor([0.0, 0.0]), std)
    assert log_prob[0] == 0  # a deterministic step adds nothing
    assert log_prob[1].item() == pytest.approx(-math.log(2.0) - 0.5 * math.log(2 * math.pi) - 0.125)
    assert gaussian_entropy(std).tolist() == pytest.approx([0.0, 0.5 * math.log(2 * math.pi * math.e * 4.0)])
    with pytest.raises(ValueError, match="shapes"):
        gaussian_log_prob(torch.zeros(2), torch.zeros(3), torch.ones(2))
