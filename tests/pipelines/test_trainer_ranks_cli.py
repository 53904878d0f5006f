"""`embodied train ... workers.trainer=2` end to end: real Ray, gloo ranks, real files; a run
resumes onto another number of ranks, and a planned run lays out its ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipelines.test_train_cli import embodied

pytestmark = [pytest.mark.slow, pytest.mark.heavy,
              pytest.mark.xdist_group("two_rank_run")]  # one worker builds the module's two_rank_run once

#: 4 CartPole envs x 64 decisions = 256 samples an iteration, 2 minibatches: blocks of 64 per rank.
SHORT = ["env.num_envs=4", "algo.rollout_steps=64", "algo.num_minibatches=2", "algo.epochs=2", "logging.wandb=false",
         "eval.episodes=1", "checkpoint.every=1", "workers.trainer_cpus=0.25", "cluster.timeout_s=60"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("ranks") / "run"
    result = embodied("train", "cartpole_ppo", f"run.dir={run}", "workers.trainer=2", "algo.total_env_steps=768",
                      "plan.profile=false", "plan.offload=[trainer, rollout]", *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_two_trainer_ranks_train_a_run_to_the_end(two_rank_run):
    """Two DDP ranks, with the trainer and the rollout offloading between phases (plan.offload)."""
    summary = json.loads((two_rank_run / "summary.json").read_text())
    assert summary["iterations"] == 3 and summary["env_steps"] == 768
    trainers = json.loads((two_rank_run / "plan.json").read_text())["workers"]["trainer"]
    assert [t["rank"] for t in trainers] == [0, 1] and trainers[0]["pid"] != trainers[1]["pid"]
    assert (two_rank_run / "logs" / "trainer-1.log").is_file()
    last = rows(two_rank_run)[-1]
    assert last["weights/version"] == 2 and last["losses/epochs"] == 2.0 and last["charts/samples"] == 256.0
    # plan.offload: the trainer ranks and the rollout leave their devices between their phases
    assert last["offload/offload_s"] > 0 and last["offload/onload_s"] > 0
    assert last["offload/rollout_offload_s"] > 0 and last["offload/rollout_onload_s"] > 0


def test_resume_onto_one_rank(two_rank_run):
    """The checkpoint of two ranks continues on one: weights, optimizer and version carry on,
    every iteration logged once (one rank's checkpoint onto two sharded ranks:
    test_data_parallel.py)."""
    result = embodied("train", f"resume={two_rank_run}", "workers.trainer=1", "algo.total_env_steps=1024")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr
    logged = rows(two_rank_run)
    assert [r["iteration"] for r in logged] == [1, 2, 3, 4]
    assert [r["weights/version"] for r in logged] == [0, 1, 2, 3]  # weights continued, not restarted
    assert json.loads((two_rank_run / "summary.json").read_text())["env_steps"] == 1024


def test_a_planned_run_profiles_and_lays_out_two_ranks(tmp_path):
    """plan.profile=true with two trainer ranks: the profile measures one rank's share, the plan
    gives the trainer an even number of cores, each rank pinned to its own."""
    run = tmp_path / "planned"
    result = embodied("train", "cartpole_ppo", f"run.dir={run}", "workers.trainer=2", "algo.total_env_steps=256",
                      "plan.max_chunks=2", *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((run / "plan.json").read_text())
    assert saved["planned"] and saved["workflow"]["ranks"] == {"env": 1, "rollout": 1, "trainer": 2}
    cores = saved["plan"]["placement"]["trainer"]
    assert len(cores) % 2 == 0
    per_rank = [r["cores"] for r in saved["layout"]["trainer"]]
    assert len(per_rank) == 2 and sorted(c for r in per_rank for c in r) == sorted(cores)
    assert "(2 rank(s))" in (run / "logs" / "driver.log").read_text()  # the trainer probe ran one rank's share
