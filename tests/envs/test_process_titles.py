"""Env processes of MultiprocessVecEnv say which shard they host (ps, htop) and write their output
to the run's log dir."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

from embodied import logs
from envs.multiprocess import MultiprocessVecEnv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process titles are read from /proc")


class ChattyEnv(gym.Env):
    """Prints, warns and logs while it is built, like simulators do."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        print("simulator banner: v1.2.3")
        warnings.warn("Box bound precision lowered by casting to float32", UserWarning)

    def reset(self, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_env_processes_are_named_after_their_shard_and_log_to_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(logs.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(logs.LABEL_ENV, "env-7")  # what the env worker rank 7 of group "env" exports
    venv = MultiprocessVecEnv([ChattyEnv] * 4, num_procs=2)
    try:
        with open(f"/proc/{venv.pids[0]}/comm") as f:
            first = int(f.read().strip().removeprefix("env-7-shard"))  # shards are numbered over the process
        for i, pid in enumerate(venv.pids):
            with open(f"/proc/{pid}/comm") as f:
                assert f.read().strip() == f"env-7-shard{first + i}"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert f.read().split(b"\0")[0].decode() == f"embodied::env-7-shard{first + i}"
        venv.reset(seed=0)
    finally:
        venv.close()
    for shard in (first, first + 1):
        text = (tmp_path / "logs" / f"env-7-shard{shard}.log").read_text()
        assert text.count("simulator banner: v1.2.3") == 2  # two envs per shard
        assert "Box bound precision lowered by casting to float32" in text


def test_without_a_label_the_shard_still_shows(monkeypatch):
    monkeypatch.delenv(logs.LABEL_ENV, raising=False)
    monkeypatch.delenv(logs.RUN_DIR_ENV, raising=False)
    venv = MultiprocessVecEnv([ChattyEnv] * 2, num_procs=2)
    try:
        comms = []
        for pid in venv.pids:
            with open(f"/proc/{pid}/comm") as f:
                comms.append(f.read().strip())
    finally:
        venv.close()
    first = int(comms[0].removeprefix("main-shard"))
    assert comms == [f"main-shard{first}", f"main-shard{first + 1}"]


def test_two_vec_envs_of_one_process_never_share_a_label(tmp_path, monkeypatch):
    """An env worker with two chunks makes two VecEnvs: their processes and logs stay apart."""
    monkeypatch.setenv(logs.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(logs.LABEL_ENV, "env-0")
    a = MultiprocessVecEnv([ChattyEnv] * 2, num_procs=2)
    b = MultiprocessVecEnv([ChattyEnv] * 2, num_procs=2)
    try:
        comms = []
        for pid in a.pids + b.pids:
            with open(f"/proc/{pid}/comm") as f:
                comms.append(f.read().strip())
    finally:
        a.close(), b.close()
    assert len(set(comms)) == 4
    assert len(list((tmp_path / "logs").glob("env-0-shard*.log"))) == 4
