"""One GRPO iteration of a tiny language model through the Ray pipeline (real actors, channels
over sockets, weight sync through the object store)."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.runtime.weights import state_of
from pipelines.reasoning.workflow import ReasoningWorkflow
from pipelines.runner import Runner
from tests.pipelines.reasoning.tiny import tiny_config


@pytest.mark.slow
def test_one_iteration_through_ray_changes_the_weights_with_a_finite_loss(tmp_path, ray_cluster) -> None:
    cfg = tiny_config(tmp_path, "cluster.backend=ray", "data.train_batch_size=8", "algo.num_minibatches=2",
                      "plan.chunks=2")
    workflow = ReasoningWorkflow(cfg)
    workflow.preflight()
    runner = Runner(cfg, None, workflow)
    try:
        runner.start(ray_cluster)
        before = state_of(workflow.trainer.remote.export_weights().result())
        metrics = runner.step()
        after = state_of(workflow.trainer.remote.export_weights().result())
        evaluation = workflow.evaluate(None)
    finally:
        workflow.close()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["plan/chunks"] == 2 and metrics["weights/version"] == 0 and metrics["charts/samples"] == 32
    assert metrics["losses/optimizer_steps"] == 2 and metrics["losses/non_finite_steps"] == 0
    for key in ("losses/policy", "losses/entropy", "losses/grad_norm", "losses/ppo_kl", "reward/mean",
                "response_length/mean", "perf/rollout_tokens_per_s", "perf/trainer_tokens_per_s"):
        assert math.isfinite(metrics[key]), key
    assert metrics["losses/grad_norm"] > 0 and 0 < metrics["reward/mean"] < 1
    assert 0 <= metrics["reward/frac_reward_zero_std"] < 1
    assert set(evaluation) >= {"eval/greedy_acc", "eval/sampled_acc", "eval/pass@2"} and evaluation["eval/problems"] == 8
