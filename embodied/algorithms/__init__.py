"""RL algorithms as objects chosen by config (``algo.name``): PPO and GRPO, one file each; the
off-policy SAC and RLPD (``sac.py``, trained from a replay buffer by ``pipelines/offpolicy``).

    algorithm = build_algorithm(cfg.algo)
    metrics = algorithm.update(policy, optimizer, batch, lr)   # batch: a TrajectoryBatch

The same code trains an MLP, a CNN, a token policy, a VLA and a language model: an algorithm only
calls the policy contract's ``evaluate``.
"""

from embodied.algorithms.base import ALGORITHMS, Advantages, Algorithm, build_algorithm, build_optimizer
from embodied.algorithms.config import AlgoConfig
from embodied.algorithms.sac import SAC, SACConfig, build_off_policy

__all__ = ["ALGORITHMS", "Advantages", "AlgoConfig", "Algorithm", "SAC", "SACConfig", "build_algorithm",
           "build_off_policy", "build_optimizer"]
