"""End to end through the `embodied` CLI: real Ray workers, real envs, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[2]
CACHE = fresh_cache()  # profiles measured fresh by this test run


def embodied(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": CACHE}
    # A ray.init() earlier in this test process sets RAY_AUTH_MODE=token in os.environ (Ray's token
    # set-up), which silences the notice the quiet-terminal test expects in driver.log: a user's
    # shell does not have it.
    env.pop("RAY_AUTH_MODE", None)
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def require_maniskill() -> None:
    """Skip the test cleanly without ManiSkill or a Vulkan device for it."""
    pytest.importorskip("mani_skill")
    from tests.envs.conftest import vulkan_problem

    problem = vulkan_problem()
    if problem:
        pytest.skip(problem)


#: A planned run takes its plan and its workers' torch thread counts from timings, and a thread
#: count changes the floating-point sums of an update: under the load of parallel tests (or on
#: another CPU) a seed's learning curve is another draw, and CartPole's PPO can lose its 500 at the
#: end of one. Learning tests whose subject is not the plan run unplanned (every worker on every
#: core, one thread each): the same numbers in every run on a machine, and no profile measured
#: first (~10 CPU-s for a small env, ~35 for ManiSkill). A planned run learns in the staleness
#: test (training beside the next collection is a plan), and the default recipe runs as planned.
UNPLANNED = ("plan.profile=false",)
#: Learning tests whose subject is an algorithm or an env feature, not Ray: the same worker classes
#: on the local backend (threads of the CLI process), ~25 CPU-s of Ray processes less per run. The
#: Ray pipeline learns in test_cartpole_ppo_learns_through_the_ray_pipeline; GRPO's episodic
#: collection over Ray ranks is in tests/pipelines/test_streams.py.
LOCAL = ("cluster.backend=local",)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.learning
def test_cartpole_ppo_learns_through_the_ray_pipeline(tmp_path):
    run = tmp_path / "cartpole"
    # half the recipe's budget (constant lr: the same run up to there): seed 1 trains at 500 from
    # ~23k env steps on (measured to 100k, unplanned, on the AVX2 EPYC host)
    result = embodied("train", "cartpole_ppo", f"run.dir={run}", "seed=1", "algo.total_env_steps=50000", *UNPLANNED)
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["train/episode_return"] >= 450, s
    assert s["eval/episode_return"] >= 450, s
    # what a run leaves
    assert (run / "config.yaml").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("iteration", "env_steps", "wall_s", "train/episode_return", "perf/env_steps_per_s"):
        assert key in rows[-1], key
    for key in ("env_steps", "wall_s", "train/episode_return", "eval/episode_return", "eval/success_rate"):
        assert key in s, key
    assert s["eval/success_rate"] is None  # CartPole has no success signal
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run / "wandb").glob("offline-run-*"))
    assert (run / "checkpoints" / "latest").is_file()
    assert "[train]" in result.stderr  # plain progress lines when stdout is not a terminal
    # a quiet terminal: Ray's notices and library warnings go to the run's log files, not the terminal
    terminal = result.stdout + result.stderr
    assert "Token authentication" not in terminal and "WARN" not in terminal and "Traceback" not in terminal
    assert "Token authentication" in (run / "logs" / "driver.log").read_text()


@pytest.mark.slow
@pytest.mark.learning
def test_cartpole_grpo_learns_without_a_critic(tmp_path):
    run = tmp_path / "cartpole-grpo"
    result = embodied("train", "cartpole_grpo", f"run.dir={run}", "seed=1", "logging.wandb=false", *UNPLANNED, *LOCAL)
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["eval/episode_return"] >= 450, s
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "losses/value" not in rows[-1] and rows[-1]["grpo/unfinished_episodes"] == 0.0
    assert 0.0 <= rows[-1]["grpo/frac_reward_zero_std"] <= 1.0


#: Reach1D (tests/pipelines/reach_env.py): a continuous env defined in a test file, random return
#: about -25, close to the target (> -10) within ~6k steps; a learning test at 20k steps costs the
#: overhead of a run more than its training.
REACH = ("gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D", "algo.total_env_steps=20000", "algo.rollout_steps=80",
         "env.num_envs=8", "logging.wandb=false", "eval.episodes=16")


@pytest.mark.slow
@pytest.mark.learning
def test_ppo_learns_with_training_beside_the_next_collection(tmp_path):
    """A continuous env defined in a test file (Reach1D), algo.staleness=1, planned: the trainer
    trains on the last iteration's samples while the rollout collects the next one with weights one
    version old, and PPO still learns (train return -25 -> -6.6 and eval -5.3 measured; the same
    run unstale: -4.4 eval; on-policy learning of the same env: the action-chunk test)."""
    run = tmp_path / "reach-stale"
    result = embodied("train", *REACH, f"run.dir={run}", "algo.staleness=1")
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["train/episode_return"] > -10 and s["eval/episode_return"] > -10, s
    assert s["eval/success_rate"] is not None  # the env's info["success"] reaches the summary
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["weights/lag"] == 1.0
    assert json.loads((run / "plan.json").read_text())["workflow"]["train_overlap"] is True


#: the tests sharing ``short_run`` go to one pytest-xdist worker, which trains it once
SHORT_RUN = pytest.mark.xdist_group("short_run")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "short"
    result = embodied(
        "train", "cartpole_ppo", f"run.dir={run}", "algo.total_env_steps=2048", "env.num_envs=4",
        "algo.rollout_steps=128", "logging.wandb=false", "checkpoint.every=1", "eval.episodes=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@SHORT_RUN
def test_resume_continues_from_the_latest_checkpoint(short_run, tmp_path):
    before = [json.loads(x) for x in (short_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in before] == [1, 2, 3, 4]
    result = embodied("train", f"resume={short_run}", "algo.total_env_steps=3072")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr
    rows = [json.loads(x) for x in (short_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["env_steps"] == 3072
    assert rows[-1]["weights/version"] == 5  # weights continued, not restarted
    assert yaml.safe_load((short_run / "config.yaml").read_text())["algo"]["total_env_steps"] == 3072


@SHORT_RUN
def test_eval_reports_return_of_a_run(short_run):
    result = embodied("eval", str(short_run), "episodes=3")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout[result.stdout.index("{"):])
    assert out["eval/episodes"] == 3 and out["eval/episode_return"] > 0


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@SHORT_RUN
@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "cartpole_ppo", "algo.lrr=1"], "Unknown config key 'algo.lrr'. Did you mean 'algo.lr'"),
        (["train", "cartpole_ppo", "algo.epochs=many"], "Config key 'algo.epochs' expects int, got 'many'"),
        (["train", "cartpole_pp"], "Unknown recipe 'cartpole_pp'. Did you mean 'cartpole_ppo'"),
        (["train", "cartpole_ppo", "env.id=CartPol-v1"], "Unknown env id 'CartPol-v1'"),
        (["train", "cartpole_ppo", "algo.staleness=3"], "algo.staleness must be 0 (on-policy) or 1"),
        (["eval", "/nonexistent/run"], "No run or checkpoint at '/nonexistent/run'"),
        (["train", "resume=/nonexistent/run"], "No run or checkpoint at '/nonexistent/run'"),
    ],
)
def test_bad_input_is_one_paragraph_exit_2_and_writes_nothing(short_run, args, needle):
    before = _snapshot(short_run)
    args = [a.replace("RUN", str(short_run)) for a in args]
    result = embodied(*args, f"run.dir={short_run}") if args[0] == "train" and "resume" not in args[-1] else embodied(*args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.stderr
    assert _snapshot(short_run) == before


@SHORT_RUN
def test_bad_override_on_resume_writes_nothing(short_run):
    before = _snapshot(short_run)
    result = embodied("train", f"resume={short_run}", "algo.lrr=1")
    assert result.returncode == 2 and "algo.lrr" in result.stderr
    assert _snapshot(short_run) == before


@SHORT_RUN
def test_existing_run_dir_is_not_overwritten(short_run):
    before = _snapshot(short_run)
    result = embodied("train", "cartpole_ppo", f"run.dir={short_run}")
    assert result.returncode == 2 and "already exists" in result.stderr
    assert _snapshot(short_run) == before


def test_recipes_lists_bundled_recipes():
    result = embodied("recipes")
    assert result.returncode == 0
    assert "cartpole_ppo" in result.stdout and "halfcheetah_ppo" in result.stdout and "gym_ppo" in result.stdout
    every = embodied("recipes", "--all")
    assert every.returncode == 0, every.stderr
    for section, entry in (("policies", "openvla_oft"), ("env adapters", "maniskill"), ("algorithms", "grpo"),
                           ("advantage estimators", "rloo"), ("workflows", "embodied")):
        assert section in every.stdout and f"  {entry} " in every.stdout


@pytest.mark.slow
@pytest.mark.learning
def test_ppo_trains_on_an_isaac_style_batched_torch_env(tmp_path):
    """A batched env stepping all envs at once in torch (Isaac Gym / Isaac Lab style) plugs in by
    env.id, without per-env wrapping, and PPO learns it."""
    run = tmp_path / "pointmass"
    result = embodied(
        "train", "gym_ppo", "env.id=tests.envs.batched_pointmass:BatchedPointMass", "env.num_envs=64",
        "algo.total_env_steps=120000", "algo.rollout_steps=32", "algo.epochs=4", "algo.num_minibatches=4",
        "policy.normalize_obs=false", f"run.dir={run}", "logging.wandb=false", "eval.episodes=64", *UNPLANNED, *LOCAL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["eval/success_rate"] >= 0.9, s


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["policy.name=cnn"], "image"),  # a pixel policy on a state-only env
        (["env.id=tests.pipelines.reach_env:Reach1D", "policy.name=mlpp"], "Unknown policy 'mlpp'. Did you mean 'mlp'"),
        (["env.id=tests.pipelines.reach_env:Nope"], "has no class 'Nope'"),
        (["plan.chunks=99"], "plan.chunks must be between 1 and env.num_envs"),
    ],
)
def test_policy_env_mismatch_and_bad_plans_are_user_errors(tmp_path, overrides, needle):
    run = tmp_path / "never"
    result = embodied("train", "gym_ppo", *overrides, f"run.dir={run}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert needle in result.stderr.replace("\n", " ")
    assert not run.exists()


def test_forced_plan_with_chunks_and_trainer_offload(tmp_path):
    """A forced hybrid plan with 2 chunks and the trainer offloading between phases runs, writes
    plan.json and profile.json, and accounts the bytes it moved."""
    run = tmp_path / "forced"
    result = embodied(
        "train", "cartpole_ppo", f"run.dir={run}", "algo.total_env_steps=2048", "logging.wandb=false",
        "plan.mode=hybrid", "plan.chunks=2", "plan.offload=[trainer]", "eval.episodes=2", "plan.replan_threshold=0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[m2flow] chosen: hybrid, 2 chunk(s)" in result.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert plan["plan"]["num_chunks"] == 2 and plan["plan"]["mode"] == "hybrid" and plan["candidates"]
    assert 0 < plan["bound"]["iteration_s"] <= plan["plan"]["predicted_iteration_s"]
    assert (run / "profile.json").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["plan/chunks"] == 2 for r in rows)
    assert all(r["offload/bytes"] > 0 for r in rows[1:])  # onloaded before every training phase
    assert all(r["plan/predicted_iteration_s"] > 0 and r["plan/measured_over_predicted"] > 0 for r in rows)


def test_forced_streams_plan_runs_a_stream_rank_per_stream(tmp_path):
    """A streams plan on 2 cores: stream rank s (its env and its policy in one process) pinned to
    core s, one chunk each; the iterations take every env step of the configured batch."""
    run = tmp_path / "streams"
    result = embodied(
        "train", "cartpole_ppo", f"run.dir={run}", "algo.total_env_steps=2048", "logging.wandb=false",
        "plan.mode=streams", "plan.chunks=2", "eval.episodes=2", "plan.replan_threshold=0", "plan.calibrate=0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[m2flow] chosen: streams, 2 chunk(s)" in result.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["plan"]["mode"], plan["plan"]["lanes"]) == ("streams", 2)
    assert [r["cores"] for r in plan["layout"]["env"]] == [[0], [1]]
    assert [r["cores"] for r in plan["layout"]["rollout"]] == [[0], [1]]
    assert sorted(plan["workers"]) == ["stream", "trainer"]
    assert len({w["pid"] for w in plan["workers"]["stream"]}) == 2
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = plan["workflow"]["num_envs"] * plan["workflow"]["rollout_steps"]
    assert rows and all(r["plan/mode"] == "streams" for r in rows)
    assert [r["env_steps"] for r in rows] == [steps * (i + 1) for i in range(len(rows))]


def test_plan_command_prints_candidates_bound_and_draws_the_timeline(tmp_path):
    out, data = tmp_path / "plan.png", tmp_path / "plan.json"
    result = embodied(
        "plan", "gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D", "env.num_envs=4", "algo.rollout_steps=8",
        "--out", str(out), "--json", str(data),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mode" in result.stdout and "predicted_s" in result.stdout  # the candidate table
    assert "chosen:" in result.stdout and "lower bound for any plan:" in result.stdout
    assert "beyond the least work: " in result.stdout  # where the chosen plan spends the time above it
    assert out.stat().st_size > 10_000
    saved = json.loads(data.read_text())
    bound, chosen, sequential = saved["bound"], saved["plan"], saved["sequential"]
    assert 0 < bound["iteration_s"] <= chosen["predicted_iteration_s"] <= sequential["predicted_iteration_s"]
    assert set(bound["work_device_s"]) == {"env", "rollout", "trainer"} and saved["candidates"]


@pytest.mark.slow
def test_replans_when_the_simulator_slows_down(tmp_path):
    """Env steps get 3 ms slower after 300 steps: measured iterations drift from the prediction,
    and the run re-plans between iterations and says why."""
    run = tmp_path / "drift"
    result = embodied(
        "train", "gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D", "env.kwargs.delay_s=0.003",
        "env.kwargs.delay_after_steps=300", "env.num_envs=8", "algo.rollout_steps=40", "algo.total_env_steps=9600",
        "algo.epochs=2", "plan.replan_threshold=0.5", "plan.calibrate=0", f"run.dir={run}", "logging.wandb=false", "eval.episodes=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[m2flow] iterations" in result.stderr and "env " in result.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    replans = [r["plan/replanned"] for r in rows if r.get("plan/replanned")]
    assert replans, "no re-plan logged"
    assert "measured/profiled per call: env" in replans[0]


@pytest.mark.slow
def test_calibration_measures_candidates_first_and_settles_on_the_fastest(tmp_path):
    """The first iterations run the planner's best candidates; the run keeps the fastest one it
    measured, predicts it from that measurement, and says so in the log, the metrics and plan.json."""
    run = tmp_path / "calibrate"
    result = embodied("train", "cartpole_ppo", "algo.total_env_steps=12800", "plan.calibrate=0.3", "plan.replan_threshold=0",
                      f"run.dir={run}", "logging.wandb=false", "eval.episodes=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[m2flow] calibrated on iterations 2-" in result.stderr
    calibration = json.loads((run / "plan.json").read_text())["calibration"]
    measured = calibration["measured"]
    fastest = min(calibration["compared"], key=lambda m: m["iteration_s"])
    chosen = calibration["chosen"]
    assert _plan_key(chosen) == _plan_key(fastest["plan"])
    assert chosen["predicted_iteration_s"] == pytest.approx(fastest["iteration_s"])
    assert len(calibration["candidates"]) >= len(measured)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    calibrating = [r["iteration"] for r in rows if r.get("plan/calibrating")]
    # the warm-up, then each measured plan's iterations, back to back from the start
    assert calibrating == list(range(1, len(calibrating) + 1))
    assert len(calibrating) == 1 + sum(len(m["iterations"]) for m in measured)
    # the planner's choice first, at no cost to the budget (the run would run it anyway); the other
    # plans within 30% of the run's 50 iterations
    assert (measured[0]["plan"]["mode"], measured[0]["plan"]["num_chunks"]) == (rows[0]["plan/mode"], rows[0]["plan/chunks"])
    assert sum(len(m["iterations"]) for m in measured[1:]) <= 15
    settled = [r for r in rows if r.get("plan/calibrated")]
    assert len(settled) == 1 and settled[0]["iteration"] == calibrating[-1]
    after = rows[len(calibrating):]
    assert after and all(r["plan/predicted_iteration_s"] == pytest.approx(chosen["predicted_iteration_s"]) for r in after)
    assert {(r["plan/mode"], r["plan/chunks"]) for r in after} == {(chosen["mode"], chosen["num_chunks"])}


def _plan_key(plan: dict) -> tuple:
    return plan["mode"], json.dumps(plan["placement"], sort_keys=True), plan["num_chunks"]


@pytest.mark.slow
def test_calibration_measures_the_choice_again_after_the_others_and_compares_them_at_its_pace(tmp_path):
    """With a wide margin (``plan.calibrate_margin``) calibration measures several plans on the real
    workers, reconfigured between iterations; the planner's choice, measured first, is measured again
    last, and the plans between are compared at the run's pace then: each one's measured seconds
    times the choice's latest over the choice's where that plan ran."""
    run = tmp_path / "bracketed"
    result = embodied("train", "cartpole_ppo", "algo.total_env_steps=76800", "plan.calibrate=1", "plan.calibrate_margin=0.25",
                      "plan.replan_threshold=0", f"run.dir={run}", "logging.wandb=false", "eval.episodes=2", "plan.learn=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "measured again last, the others at its pace now" in result.stderr
    calibration = json.loads((run / "plan.json").read_text())["calibration"]
    measured, compared, chosen = calibration["measured"], calibration["compared"], calibration["chosen"]
    keys = [_plan_key(m["plan"]) for m in measured]
    # the choice first and last, and every other plan once, in between
    assert len(measured) >= 3 and keys[0] == keys[-1] and len(set(keys)) == len(keys) - 1
    iterations = [i for m in measured for i in m["iterations"]]
    assert iterations == list(range(2, 2 + len(iterations)))  # back to back after the warm-up
    # one price per plan, in the order first measured: the choice's is its latest measurement ...
    assert [_plan_key(m["plan"]) for m in compared] == keys[:-1]
    first, last = measured[0], measured[-1]
    assert compared[0]["iteration_s"] == pytest.approx(last["iteration_s"])

    def middle(m: dict) -> float:
        return (m["iterations"][0] + m["iterations"][-1]) / 2

    # ... the others' at the choice's pace now: their seconds over the choice's where they ran
    # (between its two measurements), times its latest
    for m, now in zip(measured[1:-1], compared[1:]):
        share = (middle(m) - middle(first)) / (middle(last) - middle(first))
        then = first["iteration_s"] + (last["iteration_s"] - first["iteration_s"]) * share
        assert now["iteration_s"] == pytest.approx(m["iteration_s"] * last["iteration_s"] / then)
        assert now["iterations"] == m["iterations"]
    fastest = min(compared, key=lambda m: m["iteration_s"])
    assert _plan_key(chosen) == _plan_key(fastest["plan"])
    assert chosen["predicted_iteration_s"] == pytest.approx(fastest["iteration_s"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # each measured plan ran its iterations, and the run goes on under the one chosen
    for m in measured:
        assert {(rows[i - 1]["plan/mode"], rows[i - 1]["plan/chunks"]) for i in m["iterations"]} == {(m["plan"]["mode"], m["plan"]["num_chunks"])}
    after = [r for r in rows if r["iteration"] > iterations[-1]]
    assert after and {(r["plan/mode"], r["plan/chunks"]) for r in after} == {(chosen["mode"], chosen["num_chunks"])}


@pytest.mark.slow
def test_default_recipe_runs_on_maniskill_and_leaves_a_video(tmp_path):
    """`embodied train` with no recipe is ManiSkill PushCube (a few iterations here): the real CPU
    simulator in worker processes, a plan, an evaluation with success, and an mp4 of it."""
    require_maniskill()
    run = tmp_path / "pushcube"
    result = embodied(
        "train", f"run.dir={run}", "env.num_envs=4", "algo.rollout_steps=50", "algo.total_env_steps=400",
        "eval.episodes=2", "eval.num_envs=2", "eval.every=0", "logging.wandb=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["recipe"] == "maniskill_pushcube_ppo" and s["env_steps"] == 400
    assert s["eval/success_rate"] is not None  # ManiSkill reports success
    video = run / "videos" / "eval.mp4"
    assert video.is_file() and video.stat().st_size > 10_000


@pytest.mark.slow
def test_maniskill_batched_backend_trains_through_the_pipeline(tmp_path):
    """env.backend=batched is ManiSkill's GPU path (torch tensors from one batched simulation);
    without CUDA it runs on ManiSkill's CPU simulation with one env, through the same pipeline,
    evaluation and video."""
    require_maniskill()
    run = tmp_path / "batched"
    result = embodied(
        "train", f"run.dir={run}", "env.backend=batched", "env.num_envs=1", "algo.rollout_steps=50",
        "algo.total_env_steps=200", "eval.episodes=2", "eval.num_envs=1", "eval.every=0", "logging.wandb=false",
        *UNPLANNED,  # the default recipe's test profiles ManiSkill
        *LOCAL,  # its subject is the backend (the default recipe's test runs ManiSkill on Ray)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["env_steps"] == 200 and s["eval/success_rate"] is not None
    assert (run / "videos" / "eval.mp4").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.learning
def test_ppo_learns_with_action_chunks(tmp_path):
    """policy.action_chunk=4: the MLP predicts 4 velocities per observation, the env workers apply
    them with chunk_step, PPO treats each chunk as one decision (discount gamma**4), and the reach
    task is still learned; env steps count the steps taken."""
    run = tmp_path / "reach-chunks"
    result = embodied(
        "train", "gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D", f"run.dir={run}", "policy.action_chunk=4",
        "algo.total_env_steps=24000", "algo.rollout_steps=20", "env.num_envs=8", "logging.wandb=false",
        "eval.episodes=16", *UNPLANNED, *LOCAL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(run)
    assert s["eval/episode_return"] > -10, s  # random: about -25; -5.7 after 24k steps
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["env_steps"] == 8 * 20 * 4  # 40-step episodes end on chunk boundaries: no step skipped
    assert s["env_steps"] == rows[-1]["env_steps"] >= 24000
