"""MultiprocessVecEnv against the in-process reference, on real (cheap) simulators.

The reference is :class:`SerialVecEnv` over the same env constructors and seeds, stepped in this
process: every field of every result must be identical (obs, rewards, terminated/truncated,
final_obs, episode stats, success), for ``step`` and for ``chunk_step`` with episodes ending
mid-chunk. Robustness: worker exceptions, killed and stuck workers, no leftover processes.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import EnvError, UserError, exit_code_of, format_failure
from envs.multiprocess import EnvWorkerError, EnvWorkerTimeout, MultiprocessVecEnv, shard_bounds
from envs.serial import SerialVecEnv


def cartpole(max_steps: int = 13) -> gym.Env:
    # A short time limit gives both terminations (pole falls) and truncations in a few steps.
    return gym.make("CartPole-v1", max_episode_steps=max_steps)


class SuccessEnv(gym.Env):
    """A tiny deterministic env with a success flag, a terminal state and a time limit."""

    observation_space = gym.spaces.Dict(
        {"state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), "rgb": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)}
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, horizon: int = 7) -> None:
        self.horizon = horizon
        self.t = 0
        self.pos = 0.0

    def _obs(self) -> dict[str, np.ndarray]:
        rgb = np.full((4, 4, 3), int(self.t * 10 + self.pos * 5) % 256, np.uint8)
        return {"state": np.array([self.pos, self.t, self.pos * 2], np.float32), "rgb": rgb}

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.pos = float(self.np_random.uniform(-1, 1))
        return self._obs(), {}

    def render(self) -> np.ndarray:
        return self._obs()["rgb"]

    def step(self, action):
        self.t += 1
        self.pos += float(action[0])
        success = self.pos > 1.5
        terminated = success or self.pos < -2.0
        truncated = self.t >= self.horizon and not terminated
        return self._obs(), float(action[1] + self.pos), terminated, truncated, {"success": success}


class CrashingEnv(gym.Env):
    """Misbehaves at step ``at``: raises, exits the process, or hangs."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, how: str = "raise", at: int = 3, crash: bool = True) -> None:
        self.how, self.at, self.crash, self.t = how, at, crash, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.crash and self.t == self.at:
            if self.how == "raise":
                raise ValueError("boom: the simulator exploded")
            if self.how == "user":
                raise UserError("the task needs an asset set you do not have")
            if self.how == "exit":
                os._exit(3)
            if self.how == "hang":
                time.sleep(600)
            if self.how == "nan":
                return np.array([0.0, np.nan], np.float32), 0.0, False, False, {}
        return np.zeros(2, np.float32), 0.0, False, False, {}


@pytest.fixture(autouse=True)
def _comparison(same):
    global assert_same
    assert_same = same


def run_side_by_side(make_fns, num_procs, steps, chunk, seed=7, action_seed=0):
    """Step MultiprocessVecEnv and SerialVecEnv with the same actions; assert identical results."""
    with MultiprocessVecEnv(make_fns, num_procs) as mp_env, SerialVecEnv(make_fns) as ref:
        assert mp_env.observation_space == ref.observation_space
        assert mp_env.action_space == ref.action_space
        assert_same(mp_env.reset(seed=seed), ref.reset(seed=seed), "reset")
        ref.action_space.seed(action_seed)
        finished = 0
        for t in range(steps):
            if chunk:
                actions = np.stack([np.stack([ref.action_space.sample() for _ in range(chunk)]) for _ in range(ref.num_envs)])
                a, b = mp_env.chunk_step(actions), ref.chunk_step(actions)
            else:
                actions = np.stack([ref.action_space.sample() for _ in range(ref.num_envs)])
                a, b = mp_env.step(actions), ref.step(actions)
            assert_same(a, b, f"t={t}")
            finished += int(np.asarray(b.episodes.done).sum())
        return finished


@pytest.mark.parametrize("num_procs", [1, 2, 3])
def test_step_matches_serial_cartpole(num_procs):
    finished = run_side_by_side([cartpole] * 5, num_procs, steps=60, chunk=0)
    assert finished > 10  # auto-reset and final_obs were exercised many times


def test_chunk_step_matches_serial_cartpole():
    # chunk 5 with episodes of <= 13 steps: episodes end mid-chunk, the rest of the chunk is skipped
    finished = run_side_by_side([cartpole] * 5, 2, steps=30, chunk=5)
    assert finished > 10


def test_dict_obs_success_and_chunk_stopping():
    fns = [functools.partial(SuccessEnv, horizon=h) for h in (3, 5, 7, 9)]
    assert run_side_by_side(fns, 2, steps=40, chunk=0) > 10
    assert run_side_by_side(fns, 3, steps=20, chunk=4) > 10


def test_chunk_step_stops_mid_chunk_and_auto_resets():
    fns = [functools.partial(SuccessEnv, horizon=h) for h in (2, 100)]
    with MultiprocessVecEnv(fns, 2) as env:
        env.reset(seed=0)
        actions = np.zeros((2, 4, 2), np.float32)  # no movement: env 0 is truncated at step 2
        r = env.chunk_step(actions)
        np.testing.assert_array_equal(r.valid, [[True, True, False, False], [True] * 4])
        np.testing.assert_array_equal(r.truncated, [[False, True, False, False], [False] * 4])
        assert r.final_obs is not None and r.final_obs["state"][0, 1] == 2  # last obs of the episode: t=2
        assert r.obs["state"][0, 1] == 0  # env 0 was reset: the next episode's first obs
        assert r.obs["state"][1, 1] == 4  # env 1 took all four steps
        assert r.episodes.done.tolist() == [True, False] and r.episodes.length[0] == 2
        assert r.info["success"].dtype == bool


def test_matches_raw_envs_stepped_by_hand():
    """Against raw gymnasium envs (no SerialVecEnv): obs, rewards, dones, final obs, auto-reset."""
    n = 4
    raw = [cartpole() for _ in range(n)]
    raw_obs = [raw[i].reset(seed=100 + i)[0] for i in range(n)]
    rng = np.random.default_rng(0)
    with MultiprocessVecEnv([cartpole] * n, 2) as env:
        obs = env.reset(seed=100)
        np.testing.assert_array_equal(obs["state"], np.stack(raw_obs))
        for _ in range(50):
            actions = rng.integers(0, 2, n)
            r = env.step(actions)
            for i in range(n):
                o, rew, term, trunc, _ = raw[i].step(int(actions[i]))
                assert r.reward[i] == np.float32(rew)
                assert (r.terminated[i], r.truncated[i]) == (term, trunc)
                if term or trunc:
                    np.testing.assert_array_equal(r.final_obs["state"][i], o)
                    o, _ = raw[i].reset()
                np.testing.assert_array_equal(r.obs["state"][i], o)


def test_async_split_and_misuse():
    with MultiprocessVecEnv([cartpole] * 4, 2) as env, SerialVecEnv([cartpole] * 4) as ref:
        env.reset(seed=1), ref.reset(seed=1)
        actions = np.array([0, 1, 1, 0])
        env.step_async(actions)
        with pytest.raises(RuntimeError, match="in flight"):
            env.step_async(actions)
        with pytest.raises(RuntimeError, match="in flight"):
            env.reset()
        assert_same(env.step_wait(), ref.step(actions))
        with pytest.raises(RuntimeError, match="no 'step'"):
            env.step_wait()
        env.chunk_step_async(np.ones((4, 3), np.int64))
        assert_same(env.chunk_step_wait(), ref.chunk_step(np.ones((4, 3), np.int64)))


def test_actions_of_another_dtype_reach_the_envs_unchanged():
    # float64 actions for a float32 space bypass shared memory (pickled), so the envs see them as given
    fns = [SuccessEnv] * 3
    with MultiprocessVecEnv(fns, 2) as env, SerialVecEnv(fns) as ref:
        env.reset(seed=3), ref.reset(seed=3)
        for dtype in (np.float64, np.float32, np.float64):
            actions = np.full((3, 2), 0.1, dtype)
            assert_same(env.step(actions), ref.step(actions))


def test_pickled_transport_matches_too():
    fns = [functools.partial(SuccessEnv, horizon=4)] * 3
    with MultiprocessVecEnv(fns, 2, shared_memory=False) as env, SerialVecEnv(fns) as ref:
        assert_same(env.reset(seed=5), ref.reset(seed=5))
        for _ in range(12):
            a = np.full((3, 2), 0.3, np.float32)
            assert_same(env.step(a), ref.step(a))
        stats = env.handshake_stats()  # nothing went through the doorbells
        assert (stats.steps_posted, stats.steps_done, stats.parent_asleep) == (0, (), ())
        assert len(stats.reply_spins) == 2


def test_wrong_chunk_shape_is_a_user_error():
    with MultiprocessVecEnv([SuccessEnv] * 2, 2) as env:
        env.reset(seed=0)
        with pytest.raises(UserError, match="chunk_step expects actions of shape"):
            env.chunk_step(np.zeros((2, 3, 5), np.float32))  # action dim 5 instead of 2
        with pytest.raises(UserError, match="chunk_step expects"):
            env.chunk_step(np.zeros((3, 3, 2), np.float32))  # 3 envs instead of 2
        with pytest.raises(UserError, match="step expects actions"):
            env.step(np.zeros((3, 2), np.float32))  # 3 envs instead of 2
        with pytest.raises(UserError, match=r"step expects actions of shape .* = \(2, 2\), got \(2, 3\)"):
            env.step(np.zeros((2, 3), np.float32))  # action dim 3 instead of 2
        env.chunk_step(np.zeros((2, 3, 2), np.float32))  # still usable afterwards


def test_instructions_and_seeds_per_env():
    fns = [SuccessEnv] * 3
    with MultiprocessVecEnv(fns, 2, instructions=["a", "b", "c"]) as env:
        assert env.instructions == ["a", "b", "c"]
        first = env.reset(seed=10)["state"][:, 0]
        again = env.reset(seed=10)["state"][:, 0]
        np.testing.assert_array_equal(first, again)
        assert len(set(first.tolist())) == 3  # env i got seed 10 + i


def test_shards_are_contiguous_and_balanced():
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with MultiprocessVecEnv([cartpole] * 2, num_procs=8) as env:
        assert env.num_procs == 2


def _state(pid: int) -> str | None:
    """The process state letter from /proc (``Z`` for a zombie), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _gone(pid: int) -> bool:
    """True once the process no longer exists (a zombie still exists: nobody reaped it)."""
    return _state(pid) is None


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def assert_reaped(pids, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    left = [(p, _state(p)) for p in pids if not _gone(p)]
    assert not left, f"worker processes left behind (pid, status): {left}"


def test_close_reaps_workers_and_is_idempotent():
    env = MultiprocessVecEnv([cartpole] * 4, 2)
    env.reset(seed=0)
    pids = env.pids
    assert all(p.is_alive() for p in env.processes)
    env.close()
    env.close()
    assert not any(p.is_alive() for p in env.processes)
    assert_reaped(pids)
    with pytest.raises(RuntimeError, match="closed"):
        env.step(np.zeros(4, np.int64))


def _shared_blocks_mapped() -> list[str]:
    """The POSIX shared-memory blocks this process maps, as /proc/self/maps names them (an
    unlinked block's path ends with " (deleted)")."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sorted({line.split(maxsplit=5)[5] for line in lines if "/dev/shm/psm_" in line})


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_the_step_block_has_no_name_left_once_the_workers_attached():
    """The step block is unlinked as soon as every worker has mapped it: the envs step through it
    as before, and nothing is left in /dev/shm however the processes end (a worker killed without
    closing, as Ray kills a plan's workers when a run switches plans, used to leave its blocks)."""
    with MultiprocessVecEnv([cartpole] * 4, 2) as env, SerialVecEnv([cartpole] * 4) as ref:
        blocks = _shared_blocks_mapped()
        assert blocks, "no shared step block mapped"
        assert all(b.endswith(" (deleted)") for b in blocks), blocks
        assert not any(Path(b.removesuffix(" (deleted)")).exists() for b in blocks)
        assert_same(env.reset(seed=3), ref.reset(seed=3), "reset")
        for t in range(20):
            actions = np.full(4, t % 2, np.int64)
            assert_same(env.step(actions), ref.step(actions), f"t={t}")


def test_worker_exception_names_worker_and_keeps_traceback():
    fns = [functools.partial(CrashingEnv, crash=False), functools.partial(CrashingEnv, "raise", 2)]
    env = MultiprocessVecEnv(fns, 2)
    env.reset(seed=0)
    env.step(np.zeros((2, 1), np.float32))
    with pytest.raises(EnvWorkerError) as info:
        env.step(np.zeros((2, 1), np.float32))
    message = str(info.value)
    assert info.value.worker_index == 1
    assert message.startswith("env tests.envs.test_multiprocess:CrashingEnv (env index 1, seed 1) raised ValueError: boom")
    assert "Worker traceback" in message and "in step" in message and "test_multiprocess.py" in message
    assert exit_code_of(info.value) == 3 and isinstance(info.value, EnvError)
    assert {k: info.value.where[k] for k in ("env_process", "env_index", "seed", "env_id")} == {
        "env_process": 1, "env_index": 1, "seed": 1, "env_id": "tests.envs.test_multiprocess:CrashingEnv"}
    assert format_failure(info.value).startswith(
        "The env failed (exit code 3): env tests.envs.test_multiprocess:CrashingEnv (env index 1, seed 1) raised "
        "ValueError: boom: the simulator exploded while stepping (step()).")
    # the other worker's reply was drained: the env is still in step and can be reset and closed
    env.reset(seed=1)
    pids = env.pids
    env.close()
    assert_reaped(pids)


def test_user_error_in_worker_stays_a_user_error():
    with MultiprocessVecEnv([functools.partial(CrashingEnv, "user", 1)], 1) as env:
        env.reset()
        with pytest.raises(UserError, match="asset set.*env process 0"):
            env.step(np.zeros((1, 1), np.float32))


def test_constructor_failure_is_reported_and_cleaned_up():
    def bad_env():
        raise RuntimeError("cannot build this env")

    def workers() -> set[int]:
        # env workers are grandchildren (children of the shared forkserver process)
        return {p for p in _descendants(os.getpid()) if _parent(p) != os.getpid()}

    before = workers()
    with pytest.raises(EnvWorkerError, match="cannot build this env"):
        MultiprocessVecEnv([cartpole, bad_env], 2)
    assert_reaped(workers() - before)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_dead_worker_raises_promptly_and_close_cleans_up(how):
    fns = [functools.partial(CrashingEnv, crash=False), functools.partial(CrashingEnv, "exit", 2 if how == "exit" else 10**9)]
    env = MultiprocessVecEnv(fns, 2)
    env.reset(seed=0)
    pids = env.pids
    if how == "kill":
        os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match="env process 1 .* died") as info:
        for _ in range(3):
            env.step(np.zeros((2, 1), np.float32))
    assert time.monotonic() - start < 5.0
    assert ("exit code 3" if how == "exit" else "signal 9") in str(info.value)
    env.close()
    assert not any(p.is_alive() for p in env.processes)
    assert_reaped(pids)


def test_stuck_worker_writes_its_stack_to_its_log(tmp_path, monkeypatch):
    """With a run dir, a worker that does not answer is asked for its Python stack first: the
    message names its log, which shows where it hangs."""
    from embodied import logs

    monkeypatch.setenv(logs.RUN_DIR_ENV, str(tmp_path))
    env = MultiprocessVecEnv([functools.partial(CrashingEnv, "hang", 1)], 1, timeout_s=1.0)
    env.reset(seed=5)
    with pytest.raises(EnvWorkerTimeout) as info:
        env.step(np.zeros((1, 1), np.float32))
    log = info.value.where["log"]
    assert f"Its Python stack is at the end of {log}." in str(info.value)
    assert "env process 0 (env 0, seed 5) did not answer 'step'" in str(info.value)
    text = Path(log).read_text()
    assert "time.sleep" in text or "in step" in text, text[-2000:]
    assert_reaped(env.pids)


@pytest.mark.parametrize("shared_memory", [True, False])
def test_nan_in_a_worker_names_the_env_or_drops_its_episode(shared_memory):
    """The workers check for NaN/inf: ``error`` names the env (its global index and seed);
    ``drop`` ends that env's episode, reset, with the mask in info, through shared memory too."""
    fns = [functools.partial(CrashingEnv, crash=False)] * 3 + [functools.partial(CrashingEnv, "nan", 2)]
    with MultiprocessVecEnv(fns, 2, shared_memory=shared_memory, env_id="Crash-v0") as env:
        env.reset(seed=10)
        env.step(np.zeros((4, 1), np.float32))
        with pytest.raises(EnvWorkerError) as info:
            env.step(np.zeros((4, 1), np.float32))
    assert str(info.value).startswith("env Crash-v0 (env index 3, seed 13) returned NaN/inf at step 2 of its episode: "
                                      "its observation 'state' holds NaN.")
    assert info.value.where["env_process"] == 1
    with MultiprocessVecEnv(fns, 2, shared_memory=shared_memory, nonfinite="drop") as env:
        env.reset(seed=10)
        first = env.step(np.ones((4, 1), np.float32))
        assert "nonfinite" not in first.info
        second = env.step(np.ones((4, 1), np.float32))
        np.testing.assert_array_equal(second.info["nonfinite"], [False, False, False, True])
        np.testing.assert_array_equal(second.truncated, [False, False, False, True])
        assert second.reward[3] == 0.0 and np.isfinite(second.obs["state"]).all()
        np.testing.assert_array_equal(second.final_obs["state"][3], first.obs["state"][3])
        assert not second.episodes.done.any()  # a dropped episode is not a finished one
        third = env.step(np.ones((4, 1), np.float32))
        assert "nonfinite" not in third.info  # the env was reset: its new episode goes on


def test_stuck_worker_times_out_and_is_killed():
    fns = [functools.partial(CrashingEnv, "hang", 1)]
    env = MultiprocessVecEnv(fns, 1, timeout_s=1.0)
    env.reset()
    start = time.monotonic()
    with pytest.raises(EnvWorkerTimeout, match=r"did not answer 'step' within 1 s \(env.timeout_s\)") as info:
        env.step(np.zeros((1, 1), np.float32))
    assert exit_code_of(info.value) == 5
    assert time.monotonic() - start < 8.0
    assert not any(p.is_alive() for p in env.processes)
    assert_reaped(env.pids)


def test_spawn_context_and_closures():
    offset = 0.25  # a closure: env fns are sent with cloudpickle

    def make():
        return gym.wrappers.TransformReward(cartpole(), lambda r: r + offset)

    with MultiprocessVecEnv([make] * 2, 2, context="spawn") as env:
        env.reset(seed=0)
        r = env.step(np.zeros(2, np.int64))
        np.testing.assert_allclose(r.reward, [1.25, 1.25])


def test_workers_run_single_threaded(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # the parent's own setting does not leak into workers

    def make():
        import torch  # imported by the env, after the worker set its thread budget

        env = cartpole()
        env.thread_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LP_NUM_THREADS")}
        env.thread_env["torch"] = torch.get_num_threads()
        return env

    with MultiprocessVecEnv([make], 1) as env:
        (threads,) = env.call("get_wrapper_attr", "thread_env")
    assert threads == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LP_NUM_THREADS": "1", "torch": 1}
    with MultiprocessVecEnv([make], 1, threads_per_worker=2) as env:
        (threads,) = env.call("get_wrapper_attr", "thread_env")
    assert threads["LP_NUM_THREADS"] == "2" and threads["torch"] == 2


def test_render_concatenates_frames_in_env_order():
    with MultiprocessVecEnv([SuccessEnv] * 3, 2) as env:
        obs = env.reset(seed=0)
        frames = env.render()
        assert frames.shape == (3, 4, 4, 3) and frames.dtype == np.uint8
        np.testing.assert_array_equal(frames, obs["rgb"])


def _affinity_env():
    env = cartpole()
    env.cores = sorted(os.sched_getaffinity(0))
    return env


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_workers_run_on_the_cores_of_the_parent_at_construction():
    # The forkserver starts with the parent's first affinity; a later pinning (a pipeline re-planned
    # onto other cores) must still reach the env processes made after it.
    before = os.sched_getaffinity(0)
    first = min(before)
    try:
        with MultiprocessVecEnv([_affinity_env], 1) as env:  # starts the forkserver on every core
            assert env.call("get_wrapper_attr", "cores") == [sorted(before)]
        os.sched_setaffinity(0, {first})
        with MultiprocessVecEnv([_affinity_env], 1) as env:
            assert env.call("get_wrapper_attr", "cores") == [[first]]
    finally:
        os.sched_setaffinity(0, before)


def test_command_waiter_spins_only_when_the_parent_answers_fast():
    from envs.multiprocess import CommandWaiter

    read, write = os.pipe()
    try:
        waiter = CommandWaiter(read, max_spin_s=200e-6)
        assert waiter.spin_budget() == 0.0  # no history yet: block
        waiter.gaps = [50e-6, 40e-6, 60e-6]
        assert waiter.spin_budget() == pytest.approx(100e-6)  # twice the median gap
        waiter.gaps = [5e-3, 4e-3, 6e-3]  # a policy runs between steps: never spin
        assert waiter.spin_budget() == 0.0
        waiter.gaps = [150e-6] * 3
        assert waiter.spin_budget() == pytest.approx(200e-6)  # capped
        assert CommandWaiter(read, max_spin_s=0).spin_budget() == 0.0

        # A command that arrives while the worker spins is picked up; the gap is recorded.
        waiter.gaps = [50e-6] * 3
        waiter.replied()
        os.write(write, b"S")
        assert waiter.wait() is False  # the pipe, not a doorbell
        waiter.received()
        assert waiter.spins == 1 and len(waiter.gaps) == 4
        assert os.read(read, 1) == b"S"
        waiter.received()  # one gap per reply
        assert len(waiter.gaps) == 4
        # A late command: the spin gives up and the wait blocks until it comes.
        waiter.replied()
        started = time.perf_counter()
        import threading

        threading.Timer(0.05, os.write, (write, b"S")).start()
        waiter.wait()
        waiter.received()
        assert time.perf_counter() - started >= 0.04
        assert waiter.gaps[-1] >= 0.04 and len(waiter.gaps) == 5
    finally:
        os.close(read)
        os.close(write)


def test_reply_waiter_sleeps_then_spins_around_the_typical_step():
    import threading

    from envs.multiprocess import ReplyWaiter

    read, write = os.pipe()
    try:
        waiter = ReplyWaiter(read, spin_s=2e-3, fraction=0.05)
        assert waiter.typical() is None  # no history yet: the caller blocks at once
        sent = time.perf_counter()
        waiter.wait(sent)
        assert waiter.spins == 0 and time.perf_counter() - sent < 1e-3
        waiter.durations = [20e-3, 18e-3, 22e-3]
        assert waiter.typical() == pytest.approx(20e-3)
        assert ReplyWaiter(read, spin_s=0).typical() is None  # spin off: always block

        # A reply on time: the waiter sleeps until 2 ms before the typical 20 ms, spins, sees it.
        sent = time.perf_counter()
        threading.Timer(0.019, os.write, (write, b"r")).start()
        waiter.wait(sent)
        waited = time.perf_counter() - sent
        assert 0.017 <= waited < 0.03 and waiter.spins == 1
        assert os.read(read, 1) == b"r"
        waiter.replied(sent)
        assert len(waiter.durations) == 4 and waiter.durations[-1] >= 0.018
        # An early reply wakes the sleep at once: no spin.
        sent = time.perf_counter()
        os.write(write, b"r")
        waiter.wait(sent)
        assert time.perf_counter() - sent < 5e-3 and waiter.spins == 1
        os.read(read, 1)
        # A late reply: the wait gives up 2 ms after the typical time and leaves it to the caller.
        sent = time.perf_counter()
        waiter.wait(sent)
        assert 0.021 <= time.perf_counter() - sent < 0.05 and waiter.spins == 2
        # Slow steps: the margin is 5% of the typical 60 ms (3 ms), longer than spin_s.
        waiter.durations = [60e-3] * 3
        sent = time.perf_counter()
        waiter.wait(sent)
        assert 0.0625 <= time.perf_counter() - sent < 0.09 and waiter.spins == 3
        # A descriptor select() cannot take (>= FD_SETSIZE) sleeps with poll in whole milliseconds.
        waiter.fileno = 5000
        assert waiter.sleep(0.0099) is False  # 9 ms of poll on the real pipe, nothing came
        os.write(write, b"r")
        assert waiter.sleep(0.05) is True
        os.read(read, 1)
    finally:
        os.close(read)
        os.close(write)


def test_no_spin_with_more_workers_than_cores():
    from envs.multiprocess import DEFAULT_SPIN_S

    cores = len(os.sched_getaffinity(0))
    with MultiprocessVecEnv([cartpole] * (cores + 1), cores + 1) as env:
        assert env.spin_s == 0.0 and env.reply_spin_s == 0.0
    with MultiprocessVecEnv([cartpole] * cores, cores) as env:  # workers spin, the parent has no core of its own
        assert env.spin_s == DEFAULT_SPIN_S and env.reply_spin_s == 0.0
    if cores > 1:
        with MultiprocessVecEnv([cartpole] * 2, 1) as env:
            assert env.spin_s == env.reply_spin_s == DEFAULT_SPIN_S
            env.reset(seed=0)
            for _ in range(20):
                env.step(np.zeros(2, np.int64))
            spins = env.handshake_stats().reply_spins[0]
            assert spins > 0  # steps came back-to-back: the parent spun for them
            env.set_reply_spin(0.0)  # the parent blocks for every reply now; the workers still spin
            for _ in range(20):
                env.step(np.zeros(2, np.int64))
            assert env.handshake_stats().reply_spins[0] == spins and env.spin_s == DEFAULT_SPIN_S
            with pytest.raises(UserError, match="spin_s must be >= 0"):
                env.set_reply_spin(-1e-6)


def test_negative_spin_is_a_user_error():
    from embodied.config import build_config
    from envs.config import EnvConfig

    with pytest.raises(UserError, match="env.worker_spin_us must be >= 0"):
        build_config(EnvConfig, {"id": "CartPole-v1", "num_envs": 2, "backend": "multiprocess", "worker_spin_us": -5})
    with pytest.raises(UserError, match="env.worker_spin_us must be >= 0"):
        MultiprocessVecEnv([functools.partial(cartpole, 1)] * 2, num_procs=2, spin_s=-5e-6)


def test_tight_loop_results_unchanged_with_and_without_spin():
    envs = [functools.partial(cartpole, 13)] * 3
    actions = np.random.default_rng(0).integers(0, 2, (40, 3))
    results = []
    for spin in (0.0, 1e-3):
        with MultiprocessVecEnv(envs, 2, spin_s=spin) as env:
            env.reset(seed=3)
            results.append([env.step(a) for a in actions])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.obs["state"], b.obs["state"])
        np.testing.assert_array_equal(a.reward, b.reward)
        np.testing.assert_array_equal(a.terminated | a.truncated, b.terminated | b.truncated)


# --- the shared-memory doorbell -----------------------------------------------------------------


def test_doorbell_handshake_sleeps_wakes_and_publishes():
    import multiprocessing as mp
    import select
    import threading

    from envs.multiprocess import WAKE, Doorbell

    parent_end, worker_end = mp.Pipe()
    poller = select.poll()
    poller.register(worker_end.fileno(), select.POLLIN)
    row = np.zeros(Doorbell.SLOTS, np.int64)
    parent, worker = Doorbell(row, parent_end), Doorbell(row, worker_end)
    try:
        # A step posted before the worker sleeps: no sleep at all, and the flag is down after.
        parent.ring(1)
        assert worker.worker_sleep(0, poller) is True and not parent.worker_asleep()
        # A step posted while the worker sleeps, with the wake-up the parent sends on seeing the flag.
        seen = []
        threading.Timer(0.02, lambda: (seen.append(parent.worker_asleep()), parent.ring(2), parent_end.send_bytes(WAKE))).start()
        start = time.perf_counter()
        assert worker.worker_sleep(1, poller) is True
        assert seen == [True] and time.perf_counter() - start < 0.5
        assert worker_end.recv_bytes() == WAKE
        # A step posted without a wake-up (a lost one) is still seen, after a sleep slice.
        threading.Timer(0.02, parent.ring, (3,)).start()
        start = time.perf_counter()
        assert worker.worker_sleep(2, poller) is True
        assert time.perf_counter() - start < 0.5 and not worker_end.poll()
        # A pickled command on the pipe ends the sleep without a step.
        threading.Timer(0.02, parent_end.send_bytes, (b"pickled",)).start()
        assert worker.worker_sleep(3, poller) is False
        assert worker_end.recv_bytes() == b"pickled"

        # publish: no pipe message while the parent watches; a wake-up when it sleeps, unless the
        # reply itself went through the pipe.
        worker.publish(3, Doorbell.SUCCESS)
        assert parent.done(3) and row[Doorbell.REPLY] == Doorbell.SUCCESS and not parent_end.poll()
        row[Doorbell.PARENT_ASLEEP] = 1
        worker.publish(4, Doorbell.PLAIN)
        assert parent_end.recv_bytes() == WAKE
        worker.publish(5, Doorbell.PIPE)
        assert not parent_end.poll()
        row[Doorbell.PARENT_ASLEEP] = 0

        # parent_sleep: done already -> no sleep; otherwise the flag is up while it sleeps.
        def fail(seconds):
            raise AssertionError("slept although the step was done")

        assert parent.parent_sleep(5, fail, 1.0) is True
        flags = []
        assert parent.parent_sleep(6, lambda s: flags.append(row[Doorbell.PARENT_ASLEEP]) or False, 0.01) is False
        assert flags == [1] and row[Doorbell.PARENT_ASLEEP] == 0
    finally:
        parent_end.close()
        worker_end.close()


class JitteryEnv(gym.Env):
    """Steps that take 0-3 ms at random (seeded): replies come early, on time and late."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, horizon: int = 9) -> None:
        self.horizon, self.t, self.x = horizon, 0, 0.0
        self.delays = np.random.default_rng(5)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.x = 0, float(self.np_random.uniform(-1, 1))
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        delay = float(self.delays.choice([0.0, 0.0, 2e-4, 1e-3, 3e-3]))
        if delay:
            time.sleep(delay)
        self.t += 1
        self.x += float(action[0])
        return np.array([self.x, self.t], np.float32), self.x, abs(self.x) > 3, self.t >= self.horizon, {}


@pytest.mark.parametrize("procs,spin_s", [(2, 0.0), (1, 200e-6), (2, 200e-6)])
def test_doorbell_under_jitter_matches_serial(procs, spin_s):
    """Irregular steps and irregular gaps between them (the parent sleeping, spinning and
    arriving late on both sides of the handshake): every step is answered, in order, exactly as
    the in-process reference; the counters end where the steps did."""
    fns = [JitteryEnv] * 4
    rng = np.random.default_rng(0)
    with MultiprocessVecEnv(fns, procs, spin_s=spin_s) as env, SerialVecEnv(fns) as ref:
        assert_same(env.reset(seed=1), ref.reset(seed=1), "reset")
        for t in range(150):
            actions = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
            env.step_async(actions)
            pause = rng.choice([0.0, 0.0, 1e-4, 2e-3])  # the policy's time between the calls
            if pause:
                time.sleep(pause)
            assert_same(env.step_wait(), ref.step(actions), f"t={t}")
        stats = env.handshake_stats()
        assert stats.steps_posted == 150
        if env.reply_spin_s:  # fewer workers than cores: the parent slept, then spun for replies
            assert all(spins > 0 for spins in stats.reply_spins)
        assert stats.steps_done == (150,) * procs
        assert stats.parent_asleep == (False,) * procs  # the parent waits for nothing now


def test_doorbell_steps_interleave_with_pipe_commands():
    """Shared-memory steps (plain, with success, with finished episodes) between pickled chunk
    steps, resets, calls and renders: the counters and the pipe stay in step with each other."""
    fns = [functools.partial(SuccessEnv, horizon=h) for h in (2, 3, 5)]
    rng = np.random.default_rng(1)
    with MultiprocessVecEnv(fns, 2) as env, SerialVecEnv(fns) as ref:
        assert_same(env.reset(seed=4), ref.reset(seed=4), "reset")
        kinds = []
        for t in range(60):
            kind = rng.choice(["step", "step", "step", "chunk", "reset", "call", "render"])
            kinds.append(kind)
            if kind == "step":
                actions = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
                assert_same(env.step(actions), ref.step(actions), f"t={t}")
            elif kind == "chunk":
                actions = rng.uniform(-1, 1, (3, 3, 2)).astype(np.float32)
                assert_same(env.chunk_step(actions), ref.chunk_step(actions), f"t={t}")
            elif kind == "reset":
                assert_same(env.reset(seed=t), ref.reset(seed=t), f"t={t}")
            elif kind == "call":
                assert env.call("get_wrapper_attr", "horizon") == [2, 3, 5]
            else:
                np.testing.assert_array_equal(env.render(), ref.render())
        stats = env.handshake_stats()
        assert stats.steps_posted == kinds.count("step") > 10  # chunk steps, resets, calls, renders go pickled
        assert stats.steps_done == (stats.steps_posted,) * 2


_PRELOAD_SCRIPT = """
import sys
import gymnasium as gym

def make():
    import tests.envs.preload_probe  # what a simulator's env constructor imports
    return gym.make("CartPole-v1")

if __name__ == "__main__":
    from envs.multiprocess import MultiprocessVecEnv
    preload = ("tests.envs.preload_probe",) if sys.argv[1] == "preload" else ()
    env = MultiprocessVecEnv([make] * 3, num_procs=3, preload=preload)
    env.reset(seed=0)
    print(" ".join(str(p) for p in env.pids))
    env.close()
"""


@pytest.mark.parametrize("preload", [True, False])
def test_a_preloaded_module_is_imported_once_by_the_forkserver_not_by_each_env_process(tmp_path, preload):
    """``preload``: the forkserver imports the simulator's modules once and the env processes it
    forks start with them (ManiSkill: ~4 CPU-s per process otherwise); without it each env process
    imports them itself. Run in a fresh interpreter: a forkserver takes its preload list when it
    starts."""
    record = tmp_path / "imports.txt"
    script = tmp_path / "preload_main.py"
    script.write_text(_PRELOAD_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PRELOAD_PROBE_FILE": str(record), "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, str(script), "preload" if preload else "plain"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    workers = set(result.stdout.split())
    importers = record.read_text().split()
    assert len(workers) == 3
    if preload:  # one import, in a process that is none of the env processes (the forkserver)
        assert len(importers) == 1 and not set(importers) & workers, (importers, workers)
    else:
        assert sorted(importers) == sorted(workers)
