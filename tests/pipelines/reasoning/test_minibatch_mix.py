"""``algo.minibatch_mix``: minibatches of whole groups (streamed) or of responses shuffled across
groups (TRL's), and the plans each can run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from embodied.algorithms import build_algorithm
from embodied.errors import ConfigError
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Cluster, ClusterConfig, WorkerGroup
from embodied.runtime.weights import state_of
from pipelines.reasoning.config import ReasoningAlgoConfig
from pipelines.reasoning.planning import chunk_choices
from pipelines.reasoning.prompts import PromptReader, chunk_prompts
from pipelines.reasoning.rollout import ROLLOUT_BACKENDS, Generation
from pipelines.reasoning.samples import GeneratedChunk, score_chunk
from pipelines.reasoning.verifiers import RewardFunction
from pipelines.reasoning.workers import TrainerWorker
from pipelines.reasoning.workflow import ReasoningWorkflow
from policies.base import Evaluation
from tests.pipelines.reasoning.tiny import tiny_config


class RecordingTokenPolicy(nn.Module):
    """K=3 tokens over 5 symbols from a 2-d state; remembers the ``id`` of every sample it scores,
    one list per ``evaluate`` call (one call per minibatch without micro-batching)."""

    has_critic = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(2, 3 * 5)
        self.calls: list[list[int]] = []

    def evaluate(self, obs, actions):
        self.calls.append(obs["id"].tolist())
        dist = torch.distributions.Categorical(logits=self.head(obs["state"]).reshape(-1, 3, 5))
        return Evaluation(dist.log_prob(actions), dist.entropy(), None)

    def update_normalizer(self, obs) -> None:
        pass


def _response_batch(groups: int, group_size: int) -> TrajectoryBatch:
    """One iteration's responses as the reasoning trainer gets them: T = 1, prompt-major groups."""
    n = groups * group_size
    rng = np.random.default_rng(0)
    return TrajectoryBatch(
        obs={"state": rng.normal(size=(1, n, 2)).astype(np.float32), "id": np.arange(n)[None]},
        actions=rng.integers(0, 5, (1, n, 3)), logprobs=np.full((1, n, 3), -1.6, np.float32),
        rewards=rng.integers(0, 2, (1, n, 1)).astype(np.float32), terminated=np.ones((1, n, 1), bool),
        truncated=np.zeros((1, n, 1), bool), valid=np.ones((1, n, 1), bool), action_mask=np.ones((1, n, 3), bool),
        group_ids=np.repeat(np.arange(groups), group_size),
    ).check()


def test_shuffled_minibatches_mix_groups_and_use_every_response_once_per_epoch() -> None:
    groups, G, M, epochs = 8, 4, 2, 3
    algo = ReasoningAlgoConfig(group_size=G, num_minibatches=M, epochs=epochs, minibatch_mix="shuffled", lr=1e-2)
    policy = RecordingTokenPolicy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    stats = build_algorithm(algo).update(policy, optimizer, _response_batch(groups, G), 1e-2,
                                         generator=torch.Generator().manual_seed(0))
    assert stats["losses/epochs"] == epochs and len(policy.calls) == epochs * M  # one evaluate per step
    group_of = lambda i: i // G  # noqa: E731 (prompt-major ids)
    for epoch in range(epochs):
        steps = policy.calls[epoch * M : (epoch + 1) * M]
        assert sorted(i for step in steps for i in step) == list(range(groups * G))  # each response once
        assert [len(step) for step in steps] == [groups * G // M] * M
        # whole groups would put groups / M groups in each step; shuffled, each step holds part of more
        assert all(len({group_of(i) for i in step}) > groups // M for step in steps)
    assert policy.calls[0] != policy.calls[M]  # a fresh shuffle each epoch


def _trainer_results(tmp_path, mixes: list[str], chunk_counts: list[int], *overrides: str) -> list[tuple[dict, dict]]:
    """(stats, weights) of one TrainerWorker.train per (mix, chunk count), all on the same scored
    responses of 8 prompts x 4 (the tests' tiny model and verifier)."""
    cfg = tiny_config(tmp_path, "data.train_batch_size=8", *overrides)
    draws = PromptReader(ReasoningWorkflow(cfg).prepared().train, 8, seed=2).draws(0)
    G = cfg.algo.group_size
    backend = ROLLOUT_BACKENDS.get("transformers")(cfg, torch.device("cpu"))
    torch.manual_seed(1)
    gen = backend.generate([d.record.prompt for d in draws], samples=G)
    reward = RewardFunction(cfg.reward)
    results = []
    with Cluster(ClusterConfig(backend="local")) as cluster:
        for run, (mix, k) in enumerate(zip(mixes, chunk_counts)):
            run_cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, minibatch_mix=mix))
            trainer = WorkerGroup(cluster, TrainerWorker, 1, run_cfg, name=f"trainer-{run}")
            channel = Channel("scored", trainer)
            for c in chunk_prompts(draws, k):
                part = Generation(**{f.name: getattr(gen, f.name)[c.first * G : (c.first + len(c)) * G]
                                     for f in dataclasses.fields(gen)})
                channel.put(c.index, score_chunk(GeneratedChunk.of(c, part, G, cfg.data.max_prompt_length,
                                                                   backend.pad_token_id, 0, 0.0), reward))
            stats = trainer.remote.train(channel, k, 1e-2).result()
            results.append((stats, state_of(trainer.remote.export_weights().result())))
            trainer.shutdown()
    return results


def test_one_shuffled_minibatch_is_the_whole_batch_update(tmp_path) -> None:
    """With one minibatch, shuffling across groups changes nothing: the loss and the step are
    those of the whole batch, as the streamed whole-groups minibatch gives them."""
    (groups, groups_weights), (shuffled, shuffled_weights) = _trainer_results(
        tmp_path, ["groups", "shuffled"], [1, 1], "algo.num_minibatches=1")
    assert groups["losses/optimizer_steps"] == shuffled["losses/optimizer_steps"] == 1.0
    assert shuffled["losses/grad_norm"] > 0
    assert shuffled["losses/policy"] == pytest.approx(groups["losses/policy"], rel=1e-6, abs=1e-9)
    for name in groups_weights:
        torch.testing.assert_close(shuffled_weights[name], groups_weights[name], rtol=1e-6, atol=1e-7)


def test_shuffled_minibatches_do_not_depend_on_the_chunking(tmp_path) -> None:
    """Two minibatches: shuffled ones are the same however the responses arrive, and they are not
    the whole groups' (another split of the batch, another pair of steps)."""
    (one, one_weights), (two, two_weights), (groups, groups_weights) = _trainer_results(
        tmp_path, ["shuffled", "shuffled", "groups"], [1, 2, 2], "algo.num_minibatches=2")
    assert one["losses/optimizer_steps"] == two["losses/optimizer_steps"] == groups["losses/optimizer_steps"] == 2.0
    assert all(torch.equal(one_weights[name], two_weights[name]) for name in one_weights)
    assert any(not torch.equal(one_weights[name], groups_weights[name]) for name in one_weights)


def test_a_streaming_plan_cannot_shuffle_across_groups(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"plan.chunks=2 streams whole groups .* algo.minibatch_mix=shuffled"):
        tiny_config(tmp_path, "algo.num_minibatches=4", "algo.minibatch_mix=shuffled", "plan.chunks=2")
    shuffled = tiny_config(tmp_path, "algo.num_minibatches=4", "algo.minibatch_mix=shuffled")
    assert chunk_choices(shuffled) == [1]  # the planner tries one chunk only
    assert chunk_choices(tiny_config(tmp_path, "algo.num_minibatches=4", "plan.chunks=1",
                                     "algo.minibatch_mix=shuffled")) == [1]
    assert chunk_choices(tiny_config(tmp_path, "algo.num_minibatches=4")) == [1, 2, 4]
