"""The off-policy workflow through the Runner on Reach1D (tests/pipelines/reach_env.py: random
return about -25, a good policy about -4): SAC learns; a checkpoint with the replay buffer resumes
with the buffer, the networks, the optimizers and the generator exactly as saved; RLPD mixes a
scripted expert's demonstrations into its batches; the trainer worker resumes bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embodied.checkpoint import load_checkpoint, save_checkpoint
from embodied.metrics import read_metrics
from embodied.rl.replay import Transitions
from embodied.runtime import Channel, Cluster, WorkerGroup
from embodied.runtime.cluster import ClusterConfig
from pipelines.cli import build_train_config
from pipelines.offpolicy.workers import TRAINER_KEY, ReplayTrainerWorker
from pipelines.rundir import RunDir
from pipelines.runner import Runner
from pipelines.workflow import WORKFLOWS

REACH = ["halfcheetah_sac", "env.id=tests.pipelines.reach_env:Reach1D", "env.backend=inprocess", "env.num_envs=8",
         "algo.rollout_steps=8", "algo.learning_starts=500", "algo.batch_size=128", "algo.gamma=0.9",
         "algo.hidden_sizes=[64,64]", "algo.utd=0.5", "eval.episodes=16", "eval.num_envs=8", "eval.every=0",
         "cluster.backend=local", "logging.wandb=false", "logging.tensorboard=false", "logging.progress=none"]


def train(*args: str) -> tuple[dict, list[dict]]:
    cfg = build_train_config(list(args))
    workflow = WORKFLOWS.get(cfg.workflow).build(cfg)
    spaces = workflow.preflight()
    if cfg.resume is not None:
        from embodied.checkpoint import find_checkpoint

        workflow.check_checkpoint(find_checkpoint(cfg.resume), *spaces)
    with RunDir.create(cfg, resume=cfg.resume is not None) as run:
        summary = Runner(cfg, run, workflow).run()
    return summary, read_metrics(run.path)


@pytest.mark.slow
@pytest.mark.learning
def test_sac_learns_to_reach_through_the_runner(tmp_path):
    summary, rows = train(*REACH, "algo.total_env_steps=5000", f"run.dir={tmp_path / 'sac'}")
    assert summary["eval/episode_return"] > -10, summary
    assert summary["eval/success_rate"] is not None
    last = rows[-1]
    assert last["losses/updates"] == 32 and last["replay/size"] == 5056  # utd 0.5 of 64 transitions; nothing overwritten
    assert rows[0]["rollout/explore"] == 1.0 and last["rollout/explore"] == 0.0
    assert last["losses/alpha"] > 0 and np.isfinite(last["losses/qf_loss"])


@pytest.mark.slow
def test_a_checkpoint_with_the_replay_buffer_resumes_with_it(tmp_path):
    run = tmp_path / "resumed"
    common = [*REACH, f"run.dir={run}", "checkpoint.replay=true", "checkpoint.every=5", "algo.learning_starts=256",
              "algo.overlap=true"]
    _, rows = train(*common, "algo.total_env_steps=640")  # 10 iterations of 64 transitions
    model, optimizer, state = load_checkpoint(run)
    assert state["iteration"] == 10 and model["replay.rewards"].shape == (80, 8)  # 10 x 8 steps of 8 envs
    assert len(optimizer["param_groups"]) == 3  # actor, critics, temperature
    _, rows = train(f"resume={run}", "algo.total_env_steps=960")
    resumed = rows[10:]
    assert [r["iteration"] for r in resumed] == [11, 12, 13, 14, 15]
    assert resumed[0]["replay/size"] == 704  # the saved 640 and the first resumed iteration's
    assert resumed[0]["weights/version"] > rows[9]["weights/version"]  # the update count goes on
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 960


@pytest.mark.slow
def test_rlpd_mixes_a_scripted_experts_demonstrations_into_its_batches(tmp_path):
    summary, rows = train(*REACH, "algo.name=rlpd", "demos.expert=tests.pipelines.offpolicy.reach_expert:expert",
                          "demos.episodes=4", "demos.num_envs=4", "algo.num_qs=4", "algo.total_env_steps=1024",
                          "algo.learning_starts=256", f"run.dir={tmp_path / 'rlpd'}")
    assert rows[-1]["replay/demos"] == 4 * 40  # four successful episodes of 40 steps
    assert np.isfinite(rows[-1]["losses/qf_loss"]) and summary["env_steps"] == 1024


@pytest.mark.slow
def test_two_env_workers_of_two_chunks_fill_one_buffer_and_sync_every_k_updates(tmp_path):
    _, rows = train(*REACH, "workers.env=2", "plan.chunks=2", "env.num_envs=4", "algo.total_env_steps=1024",
                    "algo.learning_starts=256", "algo.sync_every=64", "plan.profile=false", f"run.dir={tmp_path / 'two'}")
    assert [r["replay/size"] for r in rows[:3]] == [64, 128, 192]  # 2 workers x 2 chunks x 2 envs x 8 steps each
    learning = [r for r in rows if r["rollout/explore"] == 0.0]
    assert all(r["losses/updates"] == 32 for r in learning[1:])
    # 32 updates an iteration, a sync every 64: every other iteration, the actors 32 or 64 updates behind
    assert [r["weights/synced"] for r in learning[1:7]] in ([1.0, 0.0] * 3, [0.0, 1.0] * 3)
    assert {r["weights/lag"] for r in learning[2:]} == {32.0, 64.0}


def test_rlpd_without_demonstrations_and_pixels_are_refused():
    with pytest.raises(Exception, match="algo.name=rlpd mixes demonstrations into every batch: set demos.path"):
        build_train_config(["maniskill_pickcube_sac", "algo.name=rlpd"])
    with pytest.raises(Exception, match="trains on state observations"):
        build_train_config(["maniskill_pushcube_sac", "env.obs_mode=rgb"])


def transitions(seed: int, steps: int = 4, envs: int = 2) -> Transitions:
    g = np.random.default_rng(seed)
    obs = g.uniform(-1, 1, (steps, envs, 2)).astype(np.float32)
    flags = np.zeros((steps, envs), bool)
    return Transitions({"state": obs}, g.uniform(-1, 1, (steps, envs, 1)).astype(np.float32),
                       g.normal(size=(steps, envs)).astype(np.float32), {"state": obs + 0.1}, flags, flags | (g.random((steps, envs)) < 0.2))


def test_the_trainer_resumes_from_a_saved_checkpoint_bit_for_bit(tmp_path):
    """Two trainers fed the same transitions: one trains on, the other is built fresh from the
    first's checkpoint (written and read by the checkpoint code); their next updates agree exactly."""
    import gymnasium as gym

    cfg = build_train_config([*REACH[:1], "env.id=tests.pipelines.reach_env:Reach1D", "env.num_envs=2", "algo.learning_starts=8",
                              "algo.batch_size=16", "algo.hidden_sizes=[16]", "algo.utd=1.5", "algo.n_step=2"])
    spaces = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (2,), np.float32)}), gym.spaces.Box(-1, 1, (1,), np.float32)
    cluster = Cluster(ClusterConfig(backend="local"))
    try:
        a = WorkerGroup(cluster, ReplayTrainerWorker, 1, cfg, *spaces, name="trainer-a")
        b = WorkerGroup(cluster, ReplayTrainerWorker, 1, cfg, *spaces, name="trainer-b")
        to_a, to_b = Channel("a", a), Channel("b", b)

        def feed(seed: int) -> tuple[dict, dict]:
            to_a.put(TRAINER_KEY, (0, transitions(seed)))
            to_b.put(TRAINER_KEY, (0, transitions(seed)))
            return a.remote.train(to_a, 1, 3e-4).result(), b.remote.train(to_b, 1, 3e-4).result()

        for seed in range(3):
            to_a.put(TRAINER_KEY, (0, transitions(seed)))
            a.remote.train(to_a, 1, 3e-4).result()
        state = a.remote.state(True).result()
        save_checkpoint(tmp_path / "ckpt", 3, state["model"], state["optimizer"],
                        {"version": state["version"], "generator": state["generator"].tolist()})
        model, optimizer, meta = load_checkpoint(tmp_path / "ckpt")
        assert b.remote.load_state(model, optimizer, torch.tensor(meta["generator"], dtype=torch.uint8)).result() == 24
        for seed in (3, 4):
            stats_a, stats_b = feed(seed)
            assert stats_a["losses/updates"] > 0 and stats_a["losses/qf_loss"] == stats_b["losses/qf_loss"]
        final_a, final_b = a.remote.state(True).result()["model"], b.remote.state(True).result()["model"]
        assert final_a.keys() == final_b.keys()
        assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    finally:
        cluster.shutdown()
