"""Log-probabilities of a flow-matching policy's denoising chain (πRL: Flow-SDE and Flow-Noise).

A flow policy (π0, π0.5) turns Gaussian noise into an action chunk in N Euler steps of a learned
velocity field, from t = 1 (noise) to t = 0 (actions), with ``x_t = t * noise + (1 - t) * actions``
and the velocity ``v = noise - actions``. The ODE step is ``x_{t - dt} = x_t - dt * v``: no
likelihood. πRL (RLinf, arXiv 2510.25889) makes every step a Gaussian transition

    x_{k+1} ~ N(mean_k, std_k^2)       (elementwise),

so the chain x_0 (noise), x_1, ..., x_N (the actions) has the likelihood
``sum_k log N(x_{k+1}; mean_k, std_k^2)``: the policy's log-probability of the chain given x_0
(the prior of x_0 does not depend on the weights and is left out).

* ``flow_sde``: the ODE turned into an SDE with the same marginals (Flow-GRPO): with
  ``sigma_k = noise_level * sqrt(t / (1 - t))`` (t = 1 uses the next grid point in the
  denominator), ``mean = x0_hat * (1 - t_next) + x1_hat * (t_next - sigma^2 * dt / (2 t))`` and
  ``std = sqrt(dt) * sigma``, where ``x0_hat = x_t - t v`` and ``x1_hat = x_t + (1 - t) v``.
* ``flow_noise``: the ODE's mean (``x0_hat * (1 - t_next) + x1_hat * t_next = x_t - dt v``) and a
  learned std (a noise network on the action expert's features), so the std trains too.

At ``noise_level = 0`` Flow-SDE's mean is the Euler step exactly. Shapes: x, v (B, H, D); t, dt
(B,) or scalars.
"""

from __future__ import annotations

import math

import torch

#: Noise methods of πRL's ``noise_method`` option.
NOISE_METHODS = ("flow_sde", "flow_noise")


def flow_timesteps(num_steps: int, device: torch.device | None = None) -> torch.Tensor:
    """The Euler grid (N + 1,): 1, 1 - 1/N, ..., 1/N, 0."""
    if num_steps < 1:
        raise ValueError(f"flow_timesteps: num_steps must be >= 1, got {num_steps}")
    return torch.cat([torch.linspace(1.0, 1.0 / num_steps, num_steps, device=device), torch.zeros(1, device=device)])


def flow_sde_sigmas(num_steps: int, noise_level: float, device: torch.device | None = None) -> torch.Tensor:
    """Flow-SDE's per-step noise scale (N,): ``noise_level * sqrt(t / (1 - t))`` at each step's
    start t, with t = 1's denominator taken at the next grid point (it would be 0)."""
    t = flow_timesteps(num_steps, device)
    denominator = 1 - torch.where(t == 1, t[1] if num_steps > 1 else torch.zeros_like(t[0]), t)
    return (noise_level * torch.sqrt(t / denominator))[:-1]


def flow_transition(
    x: torch.Tensor, velocity: torch.Tensor, step: int, num_steps: int, method: str, noise_level: float,
    learned_std: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std (both like ``x`` (B, H, D)) of step ``step`` (0-based) of an N-step chain.

    ``method``: ``flow_sde`` (``noise_level`` sets the std), ``flow_noise`` (``learned_std``, like
    ``x``, is the std) or ``ode`` (std 0: the Euler step)."""
    if x.shape != velocity.shape:
        raise ValueError(f"flow_transition: x {tuple(x.shape)} and velocity {tuple(velocity.shape)} differ")
    if not 0 <= step < num_steps:
        raise ValueError(f"flow_transition: step {step} is outside 0..{num_steps - 1}")
    grid = flow_timesteps(num_steps, x.device).to(x.dtype)
    t, t_next = grid[step], grid[step + 1]
    dt = t - t_next
    x0_hat = x - velocity * t
    x1_hat = x + velocity * (1 - t)
    if method == "ode":
        return x0_hat * (1 - t_next) + x1_hat * t_next, torch.zeros_like(x)
    if method == "flow_sde":
        sigma = flow_sde_sigmas(num_steps, noise_level, x.device).to(x.dtype)[step]
        mean = x0_hat * (1 - t_next) + x1_hat * (t_next - sigma**2 * dt / (2 * t))
        return mean, torch.full_like(x, float(torch.sqrt(dt) * sigma))
    if method == "flow_noise":
        if learned_std is None or learned_std.shape != x.shape:
            raise ValueError(f"flow_transition: flow_noise needs learned_std shaped like x {tuple(x.shape)}")
        return x0_hat * (1 - t_next) + x1_hat * t_next, learned_std
    raise ValueError(f"flow_transition: method must be one of ode, {', '.join(NOISE_METHODS)}; got {method!r}")


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``log N(sample; mean, std^2)``; 0 where std is 0 (a deterministic step)."""
    if not (sample.shape == mean.shape == std.shape):
        raise ValueError(f"gaussian_log_prob: shapes {tuple(sample.shape)}, {tuple(mean.shape)}, {tuple(std.shape)} differ")
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    log_prob = -torch.log(safe) - 0.5 * math.log(2 * math.pi) - 0.5 * ((sample - mean) / safe) ** 2
    return torch.where(zero, torch.zeros_like(log_prob), log_prob)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy ``0.5 * log(2 pi e std^2)`` of N(., std^2); 0 where std is 0."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    return torch.where(zero, torch.zeros_like(std), 0.5 * torch.log(2 * math.pi * math.e * safe**2))
