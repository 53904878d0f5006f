"""The plain reference loop and the Ray-shaped pipeline are the same algorithm: with the in-process
backend, one chunk, one trainer and a fixed seed they produce the same weights after an iteration."""

from __future__ import annotations

import pytest
import torch

from embodied.config import apply_overrides
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.plain_loop import PlainLoop
from pipelines.runner import Runner


def _cfg(*overrides: str) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "env.backend=inprocess", "algo.rollout_steps=16",
        "algo.total_env_steps=640", "algo.epochs=2", "algo.num_minibatches=2", "plan.profile=false",
        "cluster.backend=local", *overrides,
    ])


@pytest.mark.parametrize("algo", [
    [],
    ["algo.name=grpo", "algo.group_size=2", "algo.outcome=return", "algo.norm_adv=false", "algo.rollout_steps=40"],
    ["algo.micro_batch_size=8", "algo.target_kl=0.5"],
])
def test_pipeline_and_plain_loop_produce_the_same_weights(algo):
    cfg = _cfg(*algo)
    runner = Runner(cfg, None, EmbodiedWorkflow(cfg))
    with Cluster(cfg.cluster) as cluster:
        runner.start(cluster)
        for _ in range(2):
            runner.step()
        pipeline = runner.workflow.trainer_state()["model"]
    loop = PlainLoop(cfg)
    try:
        for i in range(2):
            loop.iteration(i, cfg.algo.lr * (1 - i * cfg.steps_per_iteration / cfg.algo.total_env_steps))  # anneal_lr
        plain = loop.policy.state_dict()
    finally:
        loop.close()
    assert set(pipeline) == set(plain)
    for name in pipeline:
        torch.testing.assert_close(pipeline[name], plain[name], rtol=0, atol=0, msg=name)
    fresh = PlainLoop(cfg)
    try:
        assert any(not torch.equal(fresh.policy.state_dict()[k], plain[k]) for k in plain)  # training changed them
    finally:
        fresh.close()
