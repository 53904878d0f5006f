"""RL math: advantage estimators and PPO/GRPO losses as pure, shape-checked torch functions.

Tensors are time-major ``(T, B)`` (rollout steps, parallel envs) or flat ``(N,)`` samples.
"""

from embodied.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae,
    grpo_advantages,
    normalize_advantages,
)
from embodied.rl.losses import (
    approx_kl,
    entropy_bonus,
    ppo_loss,
    ppo_policy_loss,
    should_stop_early,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "approx_kl",
    "entropy_bonus",
    "gae",
    "grpo_advantages",
    "normalize_advantages",
    "ppo_loss",
    "ppo_policy_loss",
    "should_stop_early",
    "value_loss",
]
