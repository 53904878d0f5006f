"""`embodied eval` end to end: its progress lines, its results file, and the faults it meets (a
checkpoint that does not fit, a corrupt latest checkpoint, an env whose video cannot be made).

Every command runs in a temporary directory (so nothing lands in the checkout) with a short
CartPole run trained once for the module on the local backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.pipelines.test_eval_cli_faults"


def embodied(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_AUTH_MODE", None)
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


class Frames(gym.Env):
    """Ten-step episodes of a 2-D point; ``render()`` gives a small frame."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.renders = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, self.t >= 10, {}

    def render(self):
        self.renders += 1
        return np.full((16, 16, 3), 100, np.uint8)


class RenderFails(Frames):
    """Renders two frames, then its renderer fails (a lost GL context)."""

    def render(self):
        if self.renders >= 2:
            raise RuntimeError("the GL context was lost")
        return super().render()


class NoRenderer(Frames):
    """No renderer: ``render()`` returns None (as gymnasium envs without a render mode do)."""

    def render(self):
        return None


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("eval")
    run = work / "short"
    result = embodied(
        "train", "cartpole_ppo", f"run.dir={run}", "algo.total_env_steps=1024", "env.num_envs=4", "algo.rollout_steps=128",
        "logging.wandb=false", "logging.tensorboard=false", "checkpoint.every=1", "eval.episodes=2", "plan.profile=false",
        "cluster.backend=local", cwd=work, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_eval_shows_progress_and_writes_its_results(run, tmp_path):
    result = embodied("eval", str(run), "episodes=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[eval] CartPole-v1: 3/3 episodes (100%)" in result.stderr  # plain lines: stderr is not a terminal
    files = sorted((run / "eval").glob("iter_*.json"))
    assert len(files) == 1 and f"[eval] results: {files[0]}" in result.stderr
    saved = json.loads(files[0].read_text())
    assert saved["checkpoint"] == str(run / "checkpoints" / "iter_000002") and saved["env_id"] == "CartPole-v1"
    assert saved["metrics"]["eval/episodes"] == 3 and len(saved["episodes"]) == 3
    assert saved["seed"] == 10_000_000 + 0  # the run's seed (0) + the evaluation's offset
    assert {"env", "return", "length"} <= set(saved["episodes"][0])
    printed = json.loads(result.stdout[result.stdout.index("{"):])
    assert printed["results"] == str(files[0])
    assert list(tmp_path.iterdir()) == []  # nothing in the current directory


def test_eval_of_a_checkpoint_that_does_not_fit_is_a_user_error(run, tmp_path):
    result = embodied("eval", str(run), "policy.hidden_sizes=[8]", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    text = result.stderr.replace("\n", " ")
    assert "does not fit the model built from this config" in text and "Evaluate it with the config" in text
    assert "Traceback" not in result.stderr and "a bug" not in text
    assert not (run / "eval").exists() or not list((run / "eval").glob("*hidden*"))


def test_eval_of_a_corrupt_latest_checkpoint_names_what_works_and_falls_back(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "eval", ignore_errors=True)
    model = copy / "checkpoints" / "iter_000002" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-100])  # truncated
    refused = embodied("eval", str(copy), "episodes=2", cwd=tmp_path)
    assert refused.returncode == 4, refused.stderr[-3000:]
    text = refused.stderr.replace("\n", " ")
    assert "iter_000001" in text and f"embodied eval {copy} resume_fallback=true" in text
    assert "Traceback" not in refused.stderr
    result = embodied("eval", str(copy), "episodes=2", "resume_fallback=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Evaluating the newest intact one instead" in result.stderr and "iter_000001" in result.stderr
    saved = json.loads(next((copy / "eval").glob("*.json")).read_text())
    assert saved["checkpoint"] == str(copy / "checkpoints" / "iter_000001")


@pytest.mark.parametrize("env_class, needle", [("RenderFails", "RuntimeError: the GL context was lost"),
                                               ("NoRenderer", "has no renderer")])
def test_an_eval_video_that_cannot_be_made_says_so_and_leaves_no_file(tmp_path, env_class, needle):
    result = embodied("eval", "gym_ppo", f"env.id={HERE}:{env_class}", "env.num_envs=2", "episodes=2", "video=true",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "no evaluation video" in line]
    assert len(lines) == 1 and needle in lines[0] and "metrics are not affected" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.rglob("*.mp4")) == []  # no partial video
    saved = json.loads(next(tmp_path.glob("runs/eval-gym_ppo/eval/*.json")).read_text())
    assert saved["video"] is None and saved["metrics"]["eval/episode_return"] == 10.0


def test_an_eval_video_of_an_env_that_renders_is_made(tmp_path):
    result = embodied("eval", "gym_ppo", f"env.id={HERE}:Frames", "env.num_envs=2", "episodes=2", "video=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no evaluation video" not in result.stderr
    saved = json.loads(next(tmp_path.glob("runs/eval-gym_ppo/eval/*.json")).read_text())
    assert saved["video"] and Path(tmp_path, saved["video"]).stat().st_size > 1000


def test_a_suite_evaluation_shows_each_tasks_progress_and_writes_its_table(tmp_path):
    suite = "tests.pipelines.test_suite_eval"
    result = embodied("eval", "gym_ppo", f"env.id={suite}:EasyTask", f"suite={suite}:EasyTask,{suite}:HardTask",
                      "episodes_per_task=3", "env.num_envs=3", "video=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"[eval] task 1/2 {suite}:EasyTask: 3/3 episodes (100%)" in result.stderr
    assert f"[eval] task 2/2 {suite}:HardTask: 3/3 episodes (100%)" in result.stderr
    saved = json.loads(next(tmp_path.glob("runs/eval-gym_ppo/eval/gym_ppo-suite-*.json")).read_text())
    assert [t["id"] for t in saved["suite"]["tasks"]] == [f"{suite}:EasyTask", f"{suite}:HardTask"]
    assert saved["seed"] == 0 and saved["recipe"] == "gym_ppo"
