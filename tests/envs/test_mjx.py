"""MJX tasks (``env.id=mjx/<Task>``) through the batched adapter, on JAX's CPU backend.

The reference is gymnasium's own v5 env stepped by hand from the same state: an MJX
observation holds the whole simulator state of Reacher and Hopper (minus the root's x, which
their dynamics do not depend on), so gymnasium's env is set to it with ``set_state`` and both
are stepped with the same actions. Compiling a task's step takes XLA tens of seconds on a CPU:
each task is built once per module, with a few envs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("jax", reason="needs the mjx extra: pip install 'embodied[mjx]'")
pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'embodied[mjx]'")

from embodied.errors import UserError  # noqa: E402
from envs.adapters.batched_adapter import BatchedVecEnv  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402
from tests.fresh_cache import fresh_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

N = 4
#: a short time limit, so that truncation and auto-reset come within a few steps
REACHER_LIMIT = 5
#: Hopper's steps compared with gymnasium's: contacts in float32 (MJX) and float64 (MuJoCo) drift
#: apart after a few dozen steps
COMPARED_STEPS = 10
#: the xdist group of this module: its compiled envs are built once, on one worker; each build
#: compiles for tens of seconds
pytestmark = [pytest.mark.xdist_group("mjx"), pytest.mark.slow]


def make(env_id: str, **kwargs) -> BatchedVecEnv:
    env = make_vec_env(EnvConfig(id=env_id, num_envs=N, **kwargs), seed=0)
    assert isinstance(env, BatchedVecEnv)
    return env


@pytest.fixture(scope="module")
def reacher():
    env = make("mjx/Reacher", max_episode_steps=REACHER_LIMIT, kwargs={"device": "cpu"})
    yield env
    env.close()


@pytest.fixture(scope="module")
def hopper():
    env = make("mjx/Hopper")
    yield env
    env.close()


def random_actions(seed: int, steps: int, dim: int) -> torch.Tensor:
    return torch.rand(steps, N, dim, generator=torch.Generator().manual_seed(seed)) * 2 - 1  # (T, N, A)


def reacher_state(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qpos, qvel) of Reacher from its observation: joint angles from cos/sin, the target, velocities."""
    qpos = np.concatenate([np.arctan2(obs[2:4], obs[0:2]), obs[4:6]])
    return qpos, np.concatenate([obs[6:8], [0.0, 0.0]])


def hopper_state(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qpos, qvel) of Hopper from its observation (root x = 0; velocities below the clip of 10)."""
    return np.concatenate([[0.0], obs[:5]]), obs[5:]


def test_the_registry_names_the_mjx_adapter_and_its_errors():
    assert resolve_adapter(EnvConfig(id="mjx/Reacher")) == "mjx"
    with pytest.raises(UserError, match="Did you mean 'mjx/Reacher'|Did you mean 'Reacher'"):
        make_vec_env(EnvConfig(id="mjx/Reachr", num_envs=2))
    with pytest.raises(UserError, match="state observations only"):
        make_vec_env(EnvConfig(id="mjx/Reacher", num_envs=2, obs_mode="rgb"))
    with pytest.raises(UserError, match="env.backend='multiprocess'"):
        make_vec_env(EnvConfig(id="mjx/Reacher", num_envs=2, backend="multiprocess"))
    with pytest.raises(UserError, match="no option 'ctrl_cost'.*reward_control_weight"):
        make_vec_env(EnvConfig(id="mjx/Reacher", num_envs=2, kwargs={"ctrl_cost": 1.0}))


def test_tensors_have_the_contract_shapes_dtypes_and_device(reacher):
    assert reacher.device == "cpu"
    assert reacher.observation_space["state"].shape == (10,) and reacher.action_space.shape == (2,)
    np.testing.assert_array_equal(reacher.action_space.low, [-1, -1])
    obs = reacher.reset(seed=0)
    result = reacher.step(torch.zeros(N, 2))
    tensors = {"obs": obs["state"], "next obs": result.obs["state"], "reward": result.reward,
               "terminated": result.terminated, "truncated": result.truncated,
               "episodes.return": result.episodes.episode_return, "episodes.length": result.episodes.length}
    for name, x in tensors.items():
        assert isinstance(x, torch.Tensor) and x.device.type == "cpu", name
    assert obs["state"].shape == result.obs["state"].shape == (N, 10)
    assert obs["state"].dtype == result.obs["state"].dtype == result.reward.dtype == torch.float32
    assert result.reward.shape == result.terminated.shape == result.truncated.shape == (N,)
    assert result.terminated.dtype == result.truncated.dtype == torch.bool
    # numpy actions are accepted too
    assert isinstance(reacher.step(np.zeros((N, 2), np.float32)).reward, torch.Tensor)


def test_seeds_decide_the_initial_states(reacher):
    first = reacher.reset(seed=3)["state"].clone()
    torch.testing.assert_close(reacher.reset(seed=3)["state"], first, rtol=0, atol=0)
    assert not torch.equal(reacher.reset(seed=4)["state"], first)
    assert len({tuple(row.tolist()) for row in first}) == N  # env i is seeded with 3 + i
    grouped = reacher.reset(seed=[4, 4, 9, 9])["state"]  # GRPO groups: same seed, same start
    torch.testing.assert_close(grouped[0], grouped[1], rtol=0, atol=0)
    torch.testing.assert_close(grouped[0], first[1], rtol=0, atol=0)
    assert not torch.equal(grouped[1], grouped[2])


def test_same_seed_and_actions_give_the_same_trajectory(reacher):
    actions = random_actions(0, 2 * REACHER_LIMIT, 2)
    runs = []
    for _ in range(2):
        reacher.reset(seed=11)
        runs.append(torch.stack([reacher.step(a).obs["state"].clone() for a in actions]))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_reacher_matches_gymnasium_reacher_v5_stepped_by_hand(reacher):
    obs = reacher.reset(seed=5)["state"].numpy().copy()
    actions = random_actions(1, REACHER_LIMIT - 1, 2)
    reference = gym.make("Reacher-v5").unwrapped
    reference.reset(seed=0)
    for i in range(N):
        reference.set_state(*reacher_state(obs[i]))
        expected = [reference.step(a[i].numpy().astype(np.float64))[:2] for a in actions]
        reacher.reset(seed=5)
        got = [reacher.step(a) for a in actions]
        for step, ((exp_obs, exp_reward), res) in enumerate(zip(expected, got)):
            np.testing.assert_allclose(res.obs["state"][i].numpy(), exp_obs, atol=2e-4, err_msg=f"env {i} step {step}")
            assert abs(float(res.reward[i]) - exp_reward) < 2e-4, (i, step)
    reference.close()


def test_truncation_auto_reset_final_obs_and_episode_statistics(reacher):
    reacher.reset(seed=2)
    actions = random_actions(2, 2 * REACHER_LIMIT, 2)
    returns = torch.zeros(N)
    for t, action in enumerate(actions, start=1):
        before = reacher.step(action)
        returns += before.reward
        at_limit = t % REACHER_LIMIT == 0
        assert not before.terminated.any()  # Reacher never terminates
        assert bool(before.truncated.all()) is at_limit and bool(before.truncated.any()) is at_limit
        if not at_limit:
            assert before.final_obs is None and not before.episodes.done.any()
            continue
        assert before.episodes.done.all()
        torch.testing.assert_close(before.episodes.episode_return, returns)
        assert before.episodes.length.tolist() == [REACHER_LIMIT] * N
        final, first = before.final_obs["state"], before.obs["state"]
        assert not torch.equal(final, first)
        # the next episode's first observation: joints within 0.1 rad of 0, velocities within 0.005
        assert (first[:, 0:2] > np.cos(0.1) - 1e-6).all() and (first[:, 6:8].abs() <= 0.005 + 1e-6).all()
        returns.zero_()


def test_hopper_terminates_when_it_falls_and_matches_gymnasium(hopper):
    obs = hopper.reset(seed=0)["state"].numpy().copy()
    assert hopper.observation_space["state"].shape == (11,) and hopper.action_space.shape == (3,)
    actions = random_actions(3, 100, 3)
    reference = gym.make("Hopper-v5").unwrapped
    reference.reset(seed=0)
    reference.set_state(*hopper_state(obs[0]))
    ended = torch.zeros(N, dtype=torch.bool)
    for t, action in enumerate(actions, start=1):
        result = hopper.step(action)
        if not ended[0] and t <= COMPARED_STEPS:
            exp_obs, exp_reward, exp_terminated, _, _ = reference.step(action[0].numpy().astype(np.float64))
            assert bool(result.terminated[0]) == exp_terminated, t
            if not exp_terminated:
                np.testing.assert_allclose(result.obs["state"][0].numpy(), exp_obs, atol=5e-3, rtol=1e-3, err_msg=f"step {t}")
            assert abs(float(result.reward[0]) - exp_reward) < 1e-2 * max(1.0, abs(exp_reward)), t
        assert not (result.terminated & result.truncated).any()
        for i in torch.nonzero(result.terminated).flatten().tolist():
            z, angle = result.final_obs["state"][i, 0:2].tolist()
            assert z <= 0.7 or abs(angle) >= 0.2, (i, z, angle)  # gymnasium's unhealthy states
            if not ended[i]:
                assert int(result.episodes.length[i]) == t and bool(result.episodes.done[i])
            assert abs(result.obs["state"][i, 1]) < 0.01  # restarted upright
        ended |= result.terminated
        if ended.all():
            break
    assert ended.all(), "random actions topple every hopper within 100 steps"
    assert not result.truncated.any()
    reference.close()


#: Reacher-v5's return over 100 episodes of gymnasium's env: zero actions (the arm stays where it
#: starts) -12.0, uniform random actions -42.6. A policy above this threshold moves the fingertip
#: towards the target.
REACHED_RETURN = -8.0


def test_the_env_workers_build_the_simulator_on_workers_env_device(reacher):
    """``workers.env_device=cpu`` over the recipe's ``env.kwargs.device=cuda``: the env ranks' MJX
    batch is on the CPU (the device the planner costs and Ray reserves for). The shapes of the
    ``reacher`` fixture, so JAX's cache holds the compiled step."""
    from embodied.config import apply_overrides
    from pipelines.config import EmbodiedConfig
    from pipelines.onpolicy.chunks import EnvChunks, Pinning

    cfg = apply_overrides(EmbodiedConfig, {}, [
        "env.id=mjx/Reacher", "env.backend=batched", f"env.num_envs={N}", f"env.max_episode_steps={REACHER_LIMIT}",
        "env.kwargs={device: cuda}", "workers.env_device=cpu"])
    chunks = EnvChunks(cfg)
    chunks.configure(0, 1, Pinning())
    try:
        assert [env.device for env in chunks.envs] == ["cpu"]
        assert chunks.start(0, 0).obs["state"].device.type == "cpu"
    finally:
        chunks.close()


@pytest.mark.learning
@pytest.mark.timeout(1800)  # ~2 CPU-minutes, compilation included, but far longer on a heavily shared host
def test_ppo_learns_to_reach_on_the_cpu_simulator(tmp_path):
    """The mjx_reacher_ppo recipe through the CLI (64 MJX envs on JAX's CPU backend, the local
    backend, unplanned) for 120k of its 200k steps: the evaluation return of the mean action
    passes REACHED_RETURN (the whole recipe: train -5.8, eval -4.6, seed 1)."""
    run = tmp_path / "reacher"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": fresh_cache()}
    env.pop("RAY_AUTH_MODE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "train", "mjx_reacher_ppo", f"run.dir={run}", "seed=1", "algo.total_env_steps=120000", "plan.profile=false",
         "cluster.backend=local", "logging.wandb=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=1700, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval/episode_return"] > REACHED_RETURN, summary
    assert "Failed to import" not in result.stdout + result.stderr  # MJX's notices about NVIDIA Warp


@pytest.mark.gpu
def test_on_a_gpu_the_simulator_and_its_tensors_stay_on_the_device():
    """With JAX's CUDA build (scripts/gpu_checks.sh installs it): the batch is simulated on the GPU
    and every tensor of the contract is a CUDA tensor; actions made on the GPU go in without a copy."""
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here: pip install 'jax[cuda12]'")
    env = make("mjx/Reacher", max_episode_steps=REACHER_LIMIT, kwargs={"device": "cuda"})
    obs = env.reset(seed=0)
    for _ in range(REACHER_LIMIT):
        result = env.step(torch.zeros(N, 2, device="cuda"))
    for x in (obs["state"], result.obs["state"], result.reward, result.terminated, result.truncated,
              result.final_obs["state"], result.episodes.episode_return):
        assert x.device.type == "cuda"
    assert result.truncated.all() and result.episodes.length.tolist() == [REACHER_LIMIT] * N
    env.close()
