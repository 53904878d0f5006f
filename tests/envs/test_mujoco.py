"""MuJoCo (gymnasium) envs through the gymnasium adapter: state and pixels, both backends.

The reference is raw gymnasium envs stepped by hand in this process (seeded reset, auto-reset
by hand after a done): the multiprocess backend must give identical observations (state and
rendered pixels), rewards, terminated/truncated, final observations and next-episode starts.
"""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from embodied.errors import UserError
from envs.adapters.gymnasium_adapter import ensure_mujoco_gl
from envs.config import EnvConfig
from envs.multiprocess import MultiprocessVecEnv
from envs.registry import make_vec_env
from envs.serial import SerialVecEnv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gl_problem() -> str | None:
    backend = ensure_mujoco_gl()
    if backend is None:
        return "no offscreen OpenGL for MuJoCo: install libegl1 (MUJOCO_GL=egl) or libosmesa6 (MUJOCO_GL=osmesa)"
    code = "import gymnasium as gym; e = gym.make('InvertedPendulum-v5', render_mode='rgb_array', width=8, height=8); e.reset(); e.render(); e.close()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    if proc.returncode != 0:
        return f"MuJoCo cannot render offscreen with MUJOCO_GL={backend}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


@pytest.fixture(scope="module")
def gl():
    problem = _gl_problem()
    if problem:
        pytest.skip(problem)


def raw_env(env_id: str, max_steps: int, size: int | None = None) -> gym.Env:
    if size is None:
        return gym.make(env_id, max_episode_steps=max_steps)
    env = gym.make(env_id, max_episode_steps=max_steps, render_mode="rgb_array", width=size, height=size)
    return env


def raw_frame(env: gym.Env) -> np.ndarray:
    # the adapter switches shadows, reflections and skybox off (software rendering); so do we
    renderer = env.unwrapped.mujoco_renderer
    if renderer.viewer is None:
        env.render()  # the first render makes the offscreen viewer
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        renderer.viewer.scn.flags[flag] = False
    return env.render()


def raw_obs(env: gym.Env, obs: np.ndarray, obs_mode: str) -> dict[str, np.ndarray]:
    out = {}
    if obs_mode != "rgb":
        out["state"] = obs.astype(np.float32)
    if obs_mode != "state":
        out["rgb"] = raw_frame(env)
    return out


def check_against_raw(env_id, obs_mode, num_envs, num_procs, max_steps, steps, size=32, seed=5):
    cfg = EnvConfig(
        id=env_id, num_envs=num_envs, num_procs=num_procs, backend="multiprocess",
        obs_mode=obs_mode, image_size=size, max_episode_steps=max_steps,
    )
    raws = [raw_env(env_id, max_steps, size if obs_mode != "state" else None) for _ in range(num_envs)]
    env = make_vec_env(cfg)
    finished = 0
    try:
        assert isinstance(env, MultiprocessVecEnv)
        expected_keys = {"state+rgb": {"state", "rgb"}, "rgb": {"rgb"}, "state": {"state"}}[obs_mode]
        assert set(env.observation_space.spaces) == expected_keys
        obs = env.reset(seed=seed)
        for i in range(num_envs):
            for k, v in raw_obs(raws[i], raws[i].reset(seed=seed + i)[0], obs_mode).items():
                np.testing.assert_array_equal(obs[k][i], v, err_msg=f"reset {k}")
        rng = np.random.default_rng(1)
        for t in range(steps):
            actions = rng.uniform(-1, 1, (num_envs, *env.action_space.shape)).astype(np.float32)
            result = env.step(actions)
            for i in range(num_envs):
                o, r, term, trunc, _ = raws[i].step(actions[i])
                assert result.reward[i] == np.float32(r)
                assert (result.terminated[i], result.truncated[i]) == (term, trunc)
                expected = raw_obs(raws[i], o, obs_mode)
                if term or trunc:
                    finished += 1
                    for k, v in expected.items():
                        np.testing.assert_array_equal(result.final_obs[k][i], v, err_msg=f"final {k} t={t}")
                    o, _ = raws[i].reset()
                    expected = raw_obs(raws[i], o, obs_mode)
                for k, v in expected.items():
                    np.testing.assert_array_equal(result.obs[k][i], v, err_msg=f"obs {k} t={t} env {i}")
    finally:
        env.close()
        for raw in raws:
            raw.close()
    return finished


def test_half_cheetah_state_multiprocess_matches_raw():
    assert check_against_raw("HalfCheetah-v5", "state", num_envs=3, num_procs=2, max_steps=7, steps=20) >= 6


def test_inverted_pendulum_terminations_match_raw():
    # random actions topple the pendulum within a few steps: terminations, not truncations
    assert check_against_raw("InvertedPendulum-v5", "state", num_envs=4, num_procs=3, max_steps=1000, steps=40) >= 4


def test_half_cheetah_state_plus_rgb_multiprocess_matches_raw(gl):
    assert check_against_raw("HalfCheetah-v5", "state+rgb", num_envs=2, num_procs=2, max_steps=4, steps=9) >= 4


def test_inverted_pendulum_rgb_only(gl):
    check_against_raw("InvertedPendulum-v5", "rgb", num_envs=2, num_procs=1, max_steps=5, steps=6)


def test_chunk_step_multiprocess_matches_inprocess(gl, same):
    base = dict(id="HalfCheetah-v5", num_envs=3, num_procs=2, obs_mode="state+rgb", image_size=16, max_episode_steps=5)
    with make_vec_env(EnvConfig(backend="multiprocess", **base)) as mp_env, make_vec_env(EnvConfig(backend="inprocess", **base)) as ref:
        assert isinstance(ref, SerialVecEnv)
        same(mp_env.reset(seed=3), ref.reset(seed=3))
        rng = np.random.default_rng(0)
        for _ in range(5):  # chunks of 3 over episodes of 5: some end mid-chunk
            actions = rng.uniform(-1, 1, (3, 3, 6)).astype(np.float32)
            same(mp_env.chunk_step(actions), ref.chunk_step(actions))


def test_pixels_look_like_a_scene(gl):
    with make_vec_env(EnvConfig(id="HalfCheetah-v5", num_envs=1, obs_mode="rgb", image_size=48)) as env:
        frame = env.reset(seed=0)["rgb"][0]
    assert frame.shape == (48, 48, 3) and frame.dtype == np.uint8
    assert frame.std() > 5  # not a blank image


def test_auto_backend_is_inprocess_and_bad_values_are_user_errors():
    with make_vec_env(EnvConfig(id="CartPole-v1", num_envs=2)) as env:
        assert isinstance(env, SerialVecEnv)
    with pytest.raises(UserError, match="env.backend='multiproces'.*Did you mean 'multiprocess'"):
        make_vec_env(EnvConfig(id="CartPole-v1", backend="multiproces"))
    with pytest.raises(UserError, match="env.obs_mode='pixels'"):
        make_vec_env(EnvConfig(id="CartPole-v1", obs_mode="pixels"))


def test_a_misspelt_env_kwarg_is_a_user_error_with_the_envs_parameters():
    kwargs = {"forward_reward_wieght": 2.0}
    for backend in ("inprocess", "multiprocess"):
        cfg = EnvConfig(id="HalfCheetah-v5", num_envs=2, num_procs=1, backend=backend, kwargs=kwargs)
        with pytest.raises(UserError, match=r"env.kwargs.forward_reward_wieght: HalfCheetah-v5 takes no parameter.*Did you mean 'forward_reward_weight'") as err:
            make_vec_env(cfg)
        # HalfCheetahEnv passes **kwargs on to MujocoEnv: the parameters of both are listed
        assert "ctrl_cost_weight" in str(err.value) and "frame_skip" in str(err.value)
    with make_vec_env(EnvConfig(id="HalfCheetah-v5", num_envs=1, kwargs={"forward_reward_weight": 2.0})) as env:
        inner = env.envs[0]  # the kwarg reached HalfCheetah: its forward reward is 2 x its velocity
        inner.reset(seed=0)
        info = inner.step(np.ones(6, np.float32))[4]
        assert info["x_velocity"] > 0.5 and info["reward_forward"] == pytest.approx(2.0 * info["x_velocity"])


@pytest.mark.slow
def test_every_gymnasium_mujoco_env_steps_with_state_and_pixels(gl):
    ids = sorted(k for k, s in gym.registry.items() if isinstance(s.entry_point, str) and s.entry_point.startswith("gymnasium.envs.mujoco"))
    built = []
    for obs_mode in ("state", "rgb"):
        for env_id in ids:
            cfg = EnvConfig(id=env_id, num_envs=2, backend="inprocess", max_episode_steps=2, obs_mode=obs_mode, image_size=24)
            if env_id == "Pusher-v4":  # gymnasium refuses it on mujoco>=3: a UserError, not a traceback
                with pytest.raises(UserError, match="Pusher-v4.*mujoco<3"):
                    make_vec_env(cfg)
                continue
            with make_vec_env(cfg) as env:
                obs = env.reset(seed=0)
                assert set(obs) == ({"rgb"} if obs_mode == "rgb" else {"state"})
                for _ in range(2):
                    result = env.step(np.zeros((2, *env.action_space.shape), env.action_space.dtype))
                assert (result.truncated | result.terminated).all()
            built.append(env_id)
    assert {"HalfCheetah-v5", "Hopper-v5", "Ant-v5", "InvertedPendulum-v5", "Humanoid-v5"} <= set(built) and len(built) >= 40


def test_mujoco_gl_is_chosen_for_workers():
    code = "import os; from envs.adapters.gymnasium_adapter import ensure_mujoco_gl; print(ensure_mujoco_gl())"
    env = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() in ("egl", "osmesa", "None")
