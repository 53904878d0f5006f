"""docs/custom_envs.md, run as written: its files are written out and its snippets executed.

A block preceded by ``<!-- file: PATH -->`` is written to PATH under a temporary folder on
``sys.path``; a block preceded by ``<!-- run -->`` is executed, in page order, in one namespace.
The assertions below then check what the page promises.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom_envs.md"
BLOCK = re.compile(r"<!-- (file: (?P<path>\S+)|run) -->\s*```python\n(?P<code>.*?)```", re.DOTALL)


def doc_blocks() -> list[tuple[str | None, str]]:
    """(path or None for a run block, code) in page order."""
    return [(m.group("path"), m.group("code")) for m in BLOCK.finditer(DOC.read_text())]


@pytest.fixture
def doc_namespace(tmp_path):
    """Write the page's files, run its snippets; yield the namespace after each run block."""
    blocks = doc_blocks()
    for path, code in blocks:
        if path is not None:
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
    sys.path.insert(0, str(tmp_path))
    namespace: dict = {"__name__": "custom_envs_doc"}
    after_each: list[dict] = []
    try:
        for path, code in blocks:
            if path is None:
                exec(compile(code, f"{DOC.name}:run", "exec"), namespace)
                after_each.append(dict(namespace))
        yield after_each
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
            del sys.modules[name]
        gym.registry.pop("MyEnv-v0", None)


def test_the_page_has_the_blocks_this_test_runs():
    blocks = doc_blocks()
    assert [p for p, _ in blocks if p] == ["mypkg/myenv.py", "mypkg/batched.py"]
    assert sum(p is None for p, _ in blocks) == 3
    env_file = dict(blocks)["mypkg/myenv.py"]
    assert len(env_file.strip().splitlines()) <= 30  # the "~20-line" example stays short


def test_custom_gymnasium_class_by_module_class_id(doc_namespace):
    ns = doc_namespace[0]
    env, obs, result = ns["env"], ns["obs"], ns["result"]
    assert type(env).__name__ == "SerialVecEnv" and env.num_envs == 4
    inner = env.envs[0]
    assert isinstance(inner, gym.wrappers.TimeLimit)
    state, _ = inner.reset(seed=0)
    assert abs(state[0] - state[1]) >= 0.05  # standing still never reaches the target...
    truncated = [inner.step(np.zeros(1, np.float32))[3] for _ in range(50)]
    assert truncated == [False] * 49 + [True]  # ...so the episode ends at the configured limit, 50 steps
    assert inner.unwrapped.size == 2.0  # kwargs reached the constructor
    assert obs["state"].shape == (4, 2) and obs["state"].dtype == np.float32
    assert np.abs(obs["state"]).max() <= 2.0
    assert result.reward.shape == (4,) and (result.reward <= 0).all()
    assert result.info["success"].shape == (4,)


def test_custom_env_time_limit_and_success_through_make_vec_env(doc_namespace):
    from envs.config import EnvConfig
    from envs.registry import make_vec_env

    env = make_vec_env(EnvConfig(id="mypkg.myenv:MyEnv", num_envs=2, max_episode_steps=3, kwargs={"size": 0.01}))
    env.reset(seed=0)
    res = env.step(np.zeros((2, 1), np.float32))
    # size 0.01: position and target are always within 0.05 of each other -> success, terminated
    assert res.terminated.all() and res.info["success"].all()
    assert [r["success"] for r in res.episodes.finished()] == [1.0, 1.0]
    env.close()
    env = make_vec_env(EnvConfig(id="mypkg.myenv:MyEnv", num_envs=2, max_episode_steps=3, kwargs={"size": 50.0}))
    env.reset(seed=0)
    for _ in range(3):
        res = env.step(np.zeros((2, 1), np.float32))
    assert res.truncated.all() and not res.terminated.any()
    env.close()


def test_a_kwarg_the_custom_class_does_not_take_is_a_user_error(doc_namespace):
    from embodied.errors import UserError
    from envs.config import EnvConfig
    from envs.registry import make_vec_env

    with pytest.raises(UserError, match=r"env.kwargs.sise: mypkg.myenv:MyEnv takes no parameter 'sise'. Did you mean 'size'"):
        make_vec_env(EnvConfig(id="mypkg.myenv:MyEnv", num_envs=1, kwargs={"sise": 1.0}))


def test_by_gymnasium_id_and_module_env_id(doc_namespace):
    by_id, by_module_id = doc_namespace[1]["by_id"], doc_namespace[1]["by_module_id"]
    assert by_id.envs[0].unwrapped.speed == 0.2  # kwargs pass through gym.make
    assert by_id.envs[0].spec.id == by_module_id.envs[0].spec.id == "MyEnv-v0"
    assert by_module_id.envs[0].spec.max_episode_steps == 100  # the registered time limit


def test_batched_example(doc_namespace):
    ns = doc_namespace[2]
    batched, obs, result, chunk = ns["batched"], ns["obs"], ns["result"], ns["chunk"]
    assert type(batched).__name__ == "BatchedVecEnv" and batched.num_envs == 1024
    assert batched.env.max_episode_steps == 50  # env.max_episode_steps reached the constructor
    assert isinstance(obs["state"], torch.Tensor) and obs["state"].shape == (1024, 2)
    assert isinstance(result.reward, torch.Tensor) and result.reward.shape == (1024,)
    assert result.terminated.dtype == torch.bool
    assert chunk.rewards.shape == (1024, 8) and chunk.valid.shape == (1024, 8)
    # success is reported per step and is what terminates an episode here
    assert torch.equal(result.terminated, result.info["success"])
