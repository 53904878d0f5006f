"""The reasoning workers on the local backend (the same code runs as Ray actors): the rollout's
logprobs are the trainer's after a weight sync, chunks stream whole groups, group ids survive
chunking and shuffling with the advantages unchanged, and the trainer's updates do not depend on
the chunking."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from embodied.algorithms import build_algorithm
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Cluster, ClusterConfig, Worker, WorkerGroup
from embodied.runtime.weights import state_of
from pipelines.reasoning.prompts import PromptReader, chunk_prompts
from pipelines.reasoning.rollout import ROLLOUT_BACKENDS, Generation
from pipelines.reasoning.samples import GeneratedChunk, score_chunk
from pipelines.reasoning.verifiers import RewardFunction
from pipelines.reasoning.workers import TrainerWorker
from pipelines.reasoning.workflow import ReasoningWorkflow
from pipelines.runner import Runner
from tests.pipelines.reasoning.tiny import tiny_config


class Collector(Worker):
    """The consumer end of a channel, for a test to read what a worker sent."""

    def collect(self, channel: Channel, keys: list[int]) -> list:
        return [channel.get(key) for key in keys]


def rows(gen: Generation, start: int, stop: int) -> Generation:
    """Rows ``start .. stop-1`` of a generation (what generating those prompts alone returns)."""
    return Generation(**{f.name: getattr(gen, f.name)[start:stop] for f in dataclasses.fields(gen)})


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_the_trainers_after_a_weight_sync(tmp_path, temperature) -> None:
    cfg = tiny_config(tmp_path, f"policy.kwargs.temperature={temperature}", "data.train_batch_size=8")
    workflow = ReasoningWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    with Cluster(cfg.cluster) as cluster:
        try:
            runner.start(cluster)
            before = state_of(workflow.trainer.remote.export_weights().result())
            runner.step()  # one GRPO iteration: the trainer's weights leave the checkpoint's
            after = state_of(workflow.trainer.remote.export_weights().result())
            assert any(not torch.equal(before[k], after[k]) for k in before)
            workflow.rollout.remote.load_weights(workflow.trainer.remote.export_weights().handle(0)).wait()
            collector = WorkerGroup(cluster, Collector, 1, name="collector")
            generated = Channel("generated", collector)
            draws = PromptReader(workflow.prepared().train, 8, seed=5).draws(0)
            workflow.rollout.remote.generate(chunk_prompts(draws, 1), generated).wait()
            [chunk] = collector.remote.collect(generated, [0]).result()
            assert (~chunk.prompt_mask[:, 0]).any() and chunk.prompt_mask[:, -1].all()  # left-padded to P
            batch = score_chunk(chunk, RewardFunction(cfg.reward)).batch
            recomputed = workflow.trainer.remote.score(batch).result()  # (n, K) one teacher-forced pass
        finally:
            workflow.close()
    mask = chunk.response_mask
    assert mask.sum() >= len(mask)  # every response scores at least its first token
    np.testing.assert_allclose(recomputed[mask], chunk.logprobs[mask], rtol=0, atol=2e-5)
    assert (recomputed[~mask] == 0).all() and (chunk.logprobs[~mask] == 0).all()


def test_chunks_stream_whole_groups_in_order(tmp_path) -> None:
    from pipelines.reasoning.workers import RewardWorker, RolloutWorker

    cfg = tiny_config(tmp_path, "data.train_batch_size=6", "algo.num_minibatches=3")
    workflow = ReasoningWorkflow(cfg)
    train = workflow.prepared().train
    G = cfg.algo.group_size
    with Cluster(cfg.cluster) as cluster:
        rollout = WorkerGroup(cluster, RolloutWorker, 1, cfg, name="rollout")
        reward = WorkerGroup(cluster, RewardWorker, 1, cfg, name="reward")
        trainer = WorkerGroup(cluster, TrainerWorker, 1, cfg, name="trainer")
        collector = WorkerGroup(cluster, Collector, 1, name="collector")
        generated, scored = Channel("generated", reward), Channel("scored", collector)
        rollout.remote.load_weights(trainer.remote.export_weights().handle(0)).wait()
        draws = PromptReader(train, 6, seed=0).draws(2)
        chunks = chunk_prompts(draws, 3)
        rollout_f = rollout.remote.generate(chunks, generated)
        reward_f = reward.remote.score(3, generated, scored)
        received = collector.remote.collect(scored, [0, 1, 2]).result()
        assert rollout_f.result()["response_tokens"] > 0 and reward_f.result()["reward_s"] >= 0
        for group in (rollout, reward, trainer, collector):
            group.shutdown()
    assert [c.index for c in received] == [0, 1, 2]
    for chunk, sent in zip(received, chunks):
        ids = chunk.batch.group_ids
        expected = [d.group_id for d in sent.draws]
        assert list(ids) == [g for g in expected for _ in range(G)]  # whole groups, prompt-major
        assert expected == [12 + sent.first + j for j in range(len(sent))]  # iteration 2 x 6 prompts + position
        assert chunk.batch.num_steps == 1 and chunk.batch.actions.shape[1:] == (len(sent) * G, cfg.max_new_tokens)


def test_group_ids_and_advantages_do_not_depend_on_chunking_or_arrival_order(tmp_path) -> None:
    cfg = tiny_config(tmp_path, "data.train_batch_size=8", "algo.num_minibatches=4")
    workflow = ReasoningWorkflow(cfg)
    draws = PromptReader(workflow.prepared().train, 8, seed=1).draws(3)
    G = cfg.algo.group_size
    backend = ROLLOUT_BACKENDS.get("transformers")(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    gen = backend.generate([d.record.prompt for d in draws], samples=G)  # every response once
    reward = RewardFunction(cfg.reward)
    algorithm = build_algorithm(cfg.algo)
    by_sample: list[dict[tuple[int, int], float]] = []
    for k in (1, 2, 4):
        chunks = chunk_prompts(draws, k)
        scored = [score_chunk(GeneratedChunk.of(c, rows(gen, c.first * G, (c.first + len(c)) * G), G,
                                                cfg.data.max_prompt_length, backend.pad_token_id, 0, 0.0), reward)
                  for c in chunks]
        for order in (list(range(k)), random.Random(k).sample(range(k), k)):  # chunks arriving in any order
            batch = TrajectoryBatch.concat([scored[i].batch for i in order])
            advantages = algorithm.advantages(batch.to_torch()).advantages[0]  # (n,)
            ids = batch.group_ids
            position = {}
            table = {}
            for i, g in enumerate(ids):
                position[g] = position.get(g, -1) + 1
                table[(int(g), position[g])] = float(advantages[i])
            by_sample.append(table)
    assert all(table == by_sample[0] for table in by_sample[1:])
    assert sorted({g for g, _ in by_sample[0]}) == [d.group_id for d in draws]  # one group per prompt draw
    scores = np.asarray([r.score for r in reward(gen.texts, ["x"] * len(gen), ["synthetic/arith"] * len(gen)).results])
    assert 0 < scores.mean() < 1  # the groups carry a signal: the comparison above is not all zeros
    assert any(abs(a) > 0 for a in by_sample[0].values())


def test_the_trainers_updates_do_not_depend_on_the_chunking(tmp_path) -> None:
    cfg = tiny_config(tmp_path, "data.train_batch_size=8", "algo.num_minibatches=2")
    workflow = ReasoningWorkflow(cfg)
    draws = PromptReader(workflow.prepared().train, 8, seed=2).draws(0)
    G = cfg.algo.group_size
    backend = ROLLOUT_BACKENDS.get("transformers")(cfg, torch.device("cpu"))
    torch.manual_seed(1)
    gen = backend.generate([d.record.prompt for d in draws], samples=G)
    reward = RewardFunction(cfg.reward)
    weights, stats = {}, {}
    with Cluster(ClusterConfig(backend="local")) as cluster:
        for k in (1, 2):
            trainer = WorkerGroup(cluster, TrainerWorker, 1, cfg, name=f"trainer-{k}")
            channel = Channel("scored", trainer)
            for c in chunk_prompts(draws, k):
                part = rows(gen, c.first * G, (c.first + len(c)) * G)
                channel.put(c.index, score_chunk(GeneratedChunk.of(c, part, G, cfg.data.max_prompt_length,
                                                                   backend.pad_token_id, 0, 0.0), reward))
            stats[k] = trainer.remote.train(channel, k, 1e-2).result()
            weights[k] = state_of(trainer.remote.export_weights().result())
            trainer.shutdown()
    assert stats[1]["losses/optimizer_steps"] == stats[2]["losses/optimizer_steps"] == 2.0  # one per minibatch
    assert stats[1]["losses/grad_norm"] > 0 and stats[1]["losses/policy"] == stats[2]["losses/policy"]
    assert all(torch.equal(weights[1][name], weights[2][name]) for name in weights[1])
