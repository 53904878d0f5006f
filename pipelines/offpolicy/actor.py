"""The SAC actor behind the policy contract, for evaluation (:func:`pipelines.evaluate.evaluate_policy`)
and videos: it acts on the ``state`` observation; training never calls ``evaluate``."""

from __future__ import annotations

import torch

from embodied.algorithms.sac import SquashedGaussianActor, flat_state
from policies.base import ActionOutput, Evaluation, Policy


class ActorPolicy(Policy):
    """``act``: the tanh-squashed Gaussian's sample, or its mode with ``deterministic``."""

    has_critic = False

    def __init__(self, actor: SquashedGaussianActor) -> None:
        super().__init__()
        self.actor = actor

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActionOutput:
        state = flat_state(obs)
        if deterministic:
            actions = self.actor.mode(state)
            return ActionOutput(actions, torch.zeros(len(actions), device=actions.device), None)
        actions, logprobs = self.actor.sample(state)
        return ActionOutput(actions, logprobs, None)

    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> Evaluation:
        raise NotImplementedError("the SAC actor is trained from its critics (embodied/algorithms/sac.py), not scored "
                                  "by evaluate: a squashed action's log-probability needs the pre-tanh sample")
