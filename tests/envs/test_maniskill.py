"""The ManiSkill adapter on the real simulator (CPU backend, Vulkan through lavapipe).

The reference is raw ManiSkill: single envs made with ``gym.make`` + ``CPUGymWrapper`` and stepped
by hand in this process (seeded reset, auto-reset by hand after a done). The adapter's
multiprocess backend must reproduce it exactly: observations (state and camera pixels), rewards,
terminated/truncated, final observations, the first observation of the next episode, success.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import UserError
from envs.config import EnvConfig
from envs.multiprocess import MultiprocessVecEnv
from envs.registry import make_vec_env, resolve_adapter

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raw_env(obs_mode: str, max_steps: int, image_size: int = 32) -> gym.Env:
    """A raw ManiSkill single env, as a user would make it by hand (with the adapter's documented
    ``enhanced_determinism``: unseeded resets draw from the env's own RNG, not torch's global one)."""
    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    kwargs = {"sensor_configs": {"width": image_size, "height": image_size}} if obs_mode != "state" else {}
    env = gym.make(
        "PushCube-v1", num_envs=1, obs_mode=obs_mode, sim_backend="physx_cpu", render_backend="cpu",
        max_episode_steps=max_steps, enhanced_determinism=True, **kwargs,
    )
    return CPUGymWrapper(env)


def raw_contract_obs(obs, obs_mode: str) -> dict[str, np.ndarray]:
    """What the contract promises for a raw ManiSkill observation (written out by hand)."""
    if obs_mode == "state":
        return {"state": obs.astype(np.float32)}
    rgb = obs["sensor_data"]["base_camera"]["rgb"]
    if obs_mode == "state+rgb":
        return {"state": obs["state"].astype(np.float32), "rgb": rgb}
    agent, extra = obs["agent"], obs["extra"]
    state = np.concatenate(
        [np.asarray(v, np.float32).reshape(-1) for v in (*agent.values(), *extra.values())]
    )
    return {"state": state, "rgb": rgb}


def check_against_raw(
    obs_mode: str, num_envs: int, num_procs: int, max_steps: int, chunks: list[int], seed: int = 11, batched: bool = False
) -> dict[str, int]:
    """Step the adapter's env and raw single envs with the same actions; everything must match.

    ``batched``: the env under test is the batched backend (ManiSkill's ``ManiSkillVectorEnv``,
    here on the CPU simulation with one env) instead of the multiprocess one. A batched simulator
    cannot pause one env, so after an episode ends inside a chunk the rest of that env's chunk
    moves the next episode (masked out: ``valid`` False, reward 0); the multiprocess backend
    stops that env's chunk there. Returns how many episodes ended terminated and truncated.
    """
    cfg = EnvConfig(
        id="PushCube-v1", num_envs=num_envs, num_procs=num_procs, backend="multiprocess",
        obs_mode=obs_mode, image_size=32, max_episode_steps=max_steps,
    )
    raws = [raw_env(obs_mode, max_steps) for _ in range(num_envs)]
    if batched:
        from envs.adapters.batched_adapter import BatchedVecEnv
        from envs.adapters.maniskill_adapter import ManiSkillBatchedEnv

        env = BatchedVecEnv(ManiSkillBatchedEnv(cfg, sim_backend="physx_cpu"))
        assert env.device == "cpu"
    else:
        env = make_vec_env(cfg)
        assert isinstance(env, MultiprocessVecEnv) and env.num_procs == num_procs
    try:
        assert env.instructions == ["push the cube to the red and white target region"] * num_envs
        obs = env.reset(seed=seed)
        raw_obs = [raw_contract_obs(raws[i].reset(seed=seed + i)[0], obs_mode) for i in range(num_envs)]
        assert set(obs) == set(env.observation_space.spaces)
        for k in obs:
            assert tuple(obs[k].shape[1:]) == env.observation_space[k].shape
            np.testing.assert_array_equal(obs[k], np.stack([o[k] for o in raw_obs]), err_msg=f"reset {k}")
        rng = np.random.default_rng(0)
        finished = 0
        ends = {"terminated": 0, "truncated": 0}
        lengths = [0] * num_envs
        for chunk in chunks:
            actions = rng.uniform(-1, 1, (num_envs, chunk, 8)).astype(np.float32)
            result = env.chunk_step(actions) if chunk > 1 else env.step(actions[:, 0])
            rewards = np.asarray(result.rewards if chunk > 1 else result.reward[:, None])
            terminated = np.asarray(result.terminated if chunk > 1 else result.terminated[:, None])
            truncated = np.asarray(result.truncated if chunk > 1 else result.truncated[:, None])
            for i in range(num_envs):
                ended = False
                for j in range(chunk):
                    o, r, term, trunc, info = raws[i].step(actions[i, j])
                    if ended:  # batched: the next episode moves on, masked out
                        lengths[i] += 1
                        assert rewards[i, j] == 0 and not terminated[i, j] and not truncated[i, j]
                        assert not np.asarray(result.valid)[i, j]
                        continue
                    live_info = info
                    lengths[i] += 1
                    assert rewards[i, j] == np.float32(r), (i, j)
                    assert (terminated[i, j], truncated[i, j]) == (bool(term), bool(trunc)), (i, j)
                    if term or trunc:  # the episode ended: final obs, then the next episode's first obs
                        finished += 1
                        ends["terminated" if term else "truncated"] += 1
                        assert result.episodes.done[i] and result.final_obs is not None
                        for k, v in raw_contract_obs(o, obs_mode).items():
                            np.testing.assert_array_equal(result.final_obs[k][i], v, err_msg=f"final_obs {k}")
                        assert result.episodes.success[i] == bool(info["success"])
                        assert result.episodes.length[i] == lengths[i]
                        lengths[i] = 0
                        o, _ = raws[i].reset()
                        ended = True
                        if not batched:
                            break  # chunk_step skips the rest of the chunk for this env
                for k, v in raw_contract_obs(o, obs_mode).items():
                    np.testing.assert_array_equal(result.obs[k][i], v, err_msg=f"obs {k} env {i}")
                assert result.info["success"][i] == bool(live_info["success"])
        assert finished >= num_envs  # every env went through at least one auto-reset
        return ends
    finally:
        env.close()
        for raw in raws:
            raw.close()


@pytest.mark.slow
def test_push_cube_state_multiprocess_matches_raw_maniskill(vulkan):
    # episodes of 5 steps, chunks of 3: episodes end mid-chunk and at chunk borders
    check_against_raw("state", num_envs=3, num_procs=2, max_steps=5, chunks=[1, 3, 3, 1, 3, 2])


@pytest.mark.slow
def test_push_cube_rgb_multiprocess_matches_raw_maniskill(vulkan):
    check_against_raw("rgb", num_envs=2, num_procs=2, max_steps=3, chunks=[2, 2, 1])


def succeed_at_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """In this process, PushCube also succeeds (and so terminates) at the ``step``-th step of the
    episodes whose seed is even: random actions alone never push the cube onto the goal, and the
    success of a step that ends an episode is what an auto-reset must not lose."""
    import torch
    from mani_skill.envs.tasks.tabletop.push_cube import PushCubeEnv

    evaluate = PushCubeEnv.evaluate

    def patched(self):
        info = evaluate(self)
        even = torch.as_tensor(self._episode_seed % 2 == 0, device=self.device)
        info["success"] = info["success"] | ((self.elapsed_steps == step) & even)
        return info

    monkeypatch.setattr(PushCubeEnv, "evaluate", patched)


def test_batched_backend_matches_raw_maniskill_on_the_cpu_simulation(vulkan, monkeypatch):
    # The GPU backend's code (ManiSkillVectorEnv's auto-reset, final_info, final observations,
    # BatchedVecEnv's stats and torch chunk_step) on ManiSkill's CPU simulation: only the device
    # differs. Episodes end by success at step 4 or by the time limit at step 5.
    succeed_at_step(monkeypatch, 4)
    ends = check_against_raw("state", num_envs=1, num_procs=1, max_steps=5, chunks=[1, 3, 3, 1, 3, 2, 3, 3, 1, 3, 2], batched=True)
    assert ends["terminated"] and ends["truncated"]


@pytest.mark.slow
def test_batched_backend_rgb_matches_raw_maniskill_on_the_cpu_simulation(vulkan):
    check_against_raw("rgb", num_envs=1, num_procs=1, max_steps=3, chunks=[2, 2, 1], batched=True)


def test_batched_backend_renders_numpy_frames_and_checks_actions(vulkan):
    from envs.adapters.batched_adapter import BatchedVecEnv
    from envs.adapters.maniskill_adapter import ManiSkillBatchedEnv

    cfg = EnvConfig(id="PushCube-v1", num_envs=1, obs_mode="state", render_size=48, backend="batched")
    with make_vec_env(cfg) as env:  # env.backend=batched without CUDA: ManiSkill's CPU simulation
        assert isinstance(env, BatchedVecEnv) and isinstance(env.env, ManiSkillBatchedEnv) and env.device == "cpu"
        env.reset(seed=0)
        frames = env.render()
        assert isinstance(frames, np.ndarray) and frames.shape == (1, 48, 48, 3) and frames.dtype == np.uint8
        with pytest.raises(UserError, match="action space"):
            env.step(np.zeros((1, 7), np.float32))
        with pytest.raises(UserError, match="chunk_step expects"):
            env.chunk_step(np.zeros((1, 8), np.float32))
    with pytest.raises(UserError, match="one env per process"):
        make_vec_env(dataclasses.replace(cfg, num_envs=2))


def test_batched_benchmark_runs_on_the_cpu_simulation(vulkan, tmp_path):
    # benchmarks/maniskill_batched.py is what measures the GPU simulation with >= 256 envs when a
    # GPU is there; here its code runs end to end on ManiSkill's CPU simulation with one env.
    import json

    from benchmarks.maniskill_batched import main

    out = main(["--sim-backend", "physx_cpu", "--rounds", "2", "--window", "0.2", "--out", str(tmp_path / "ms.json")])
    report = json.loads(out.read_text())
    assert report["sim_backend"] == "physx_cpu" and report["machine"]["cpu_cores"] >= 1
    (run,) = report["runs"]
    assert run["num_envs"] == 1 and run["device"] == "cpu"
    rows = {row["variant"]: row for row in run["results"]}
    assert set(rows) == {"raw", "contract step", "contract chunk8"}
    for name, row in rows.items():
        assert row["steps_per_s"] >= row["steps_per_s_median"] > 0
        if name != "raw":
            assert row["ratio"] == pytest.approx(row["steps_per_s"] / rows["raw"]["steps_per_s"], abs=1e-3)


@pytest.mark.slow
def test_an_rgb_env_built_after_the_last_one_closed_reuses_the_renderer(vulkan):
    """SAPIEN rebuilds its renderer when the last env that held it is gone, and its first picture
    (ManiSkill takes one while building the env) then regenerates a BRDF lookup table: seconds on
    lavapipe. The adapter keeps the renderer, so the second env of a process builds far faster than
    the first. In a fresh process: this one may hold a renderer from earlier tests."""
    code = """
import gc, json, time
from envs.config import EnvConfig
from envs.registry import make_vec_env
from envs.vulkan import ensure_vulkan_env
ensure_vulkan_env()
import mani_skill.envs  # imported before the clock starts
cfg = EnvConfig(id="PushCube-v1", num_envs=1, backend="inprocess", obs_mode="rgb", image_size=32)
seconds = []
for _ in range(2):
    t0 = time.perf_counter()
    env = make_vec_env(cfg)
    env.reset(seed=0)
    seconds.append(time.perf_counter() - t0)
    env.close()
    del env
    gc.collect()
print(json.dumps(seconds))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"first rgb env built and reset in {first:.2f} s, the second in {second:.2f} s")
    assert second < first / 3, (first, second)


@pytest.mark.slow
def test_push_cube_state_plus_rgb_spaces(vulkan):
    cfg = EnvConfig(id="PushCube-v1", num_envs=2, num_procs=1, backend="multiprocess", obs_mode="state+rgb", image_size=24)
    with make_vec_env(cfg) as env:
        assert env.observation_space["rgb"].shape == (24, 24, 3)
        assert env.observation_space["state"].shape == (35,)  # the privileged state, as in obs_mode=state
        obs = env.reset(seed=0)
        assert obs["rgb"].shape == (2, 24, 24, 3) and obs["rgb"].dtype == np.uint8
        assert obs["state"].shape == (2, 35) and obs["state"].dtype == np.float32
        assert obs["rgb"].std() > 0  # a real picture, not a blank frame
        frames = env.render()
        assert frames.ndim == 4 and frames.shape[0] == 2 and frames.dtype == np.uint8


def _build_and_step(task: str, obs_mode: str) -> None:
    """Build ``task`` in ``obs_mode``, reset and step it twice through the contract (UserError
    from building passes through)."""
    cfg = EnvConfig(id=task, num_envs=1, backend="inprocess", obs_mode=obs_mode, image_size=32, max_episode_steps=2)
    env = make_vec_env(cfg)
    try:
        obs = env.reset(seed=0)
        keys = set(obs)  # more cameras: rgb (the first) and rgb/<camera>
        assert keys == set(env.observation_space.spaces) and set(obs_mode.split("+")) <= keys, task
        assert ("rgb" in obs_mode) == any(k.startswith("rgb") for k in keys), task
        assert isinstance(env.action_space, gym.spaces.Box), task
        for _ in range(2):
            result = env.step(np.zeros((1, *env.action_space.shape), env.action_space.dtype))
        assert result.truncated.all() or result.terminated.all(), task
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.exhaustive
def test_every_registered_task_steps_or_says_what_it_lacks(vulkan):
    """Any id in ManiSkill's registry: it builds, resets and steps through the contract (multi-robot
    tasks with one flat action) with state and rgb observations, or fails at once with a UserError
    (assets not downloaded here, no camera for rgb, an obs mode the task lacks), never another
    exception. One env per task and mode ``state+rgb`` (the privileged state and the camera);
    a task without a camera is then built with ``state`` alone."""
    from envs.adapters.maniskill_adapter import maniskill_registry

    built = {"state": [], "rgb": []}
    refused: dict[str, dict[str, str]] = {"state": {}, "rgb": {}}
    for task in sorted(maniskill_registry()):
        try:
            _build_and_step(task, "state+rgb")
            built["state"].append(task)
            built["rgb"].append(task)
            continue
        except UserError as err:
            refused["rgb"][task] = str(err)
        try:
            _build_and_step(task, "state")
            built["state"].append(task)
        except UserError as err:
            refused["state"][task] = str(err)
    for mode in ("state", "rgb"):
        assert {"PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1", "PushT-v1", "TwoRobotPickCube-v1",
                "DrawSVG-v1"} <= set(built[mode]), mode
        assert len(built[mode]) >= 40, (mode, built[mode], refused[mode])
        assert all("asset" in why or "camera" in why or "obs_mode" in why for why in refused[mode].values()), refused[mode]
    assert "UnitreeG1Stand-v1" in refused["rgb"] and "SO100GraspCube-v1" in refused["rgb"]


def test_ids_are_claimed_by_the_right_adapter():
    assert resolve_adapter(EnvConfig(id="PushCube-v1")) == "maniskill"
    assert resolve_adapter(EnvConfig(id="HalfCheetah-v5")) == "gymnasium"


def test_claiming_a_gymnasium_id_does_not_import_maniskill():
    code = (
        "import sys; from envs.config import EnvConfig; from envs.registry import resolve_adapter; "
        "assert resolve_adapter(EnvConfig(id='CartPole-v1')) == 'gymnasium'; "
        "assert 'mani_skill' not in sys.modules, 'claims imported ManiSkill'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_unknown_task_is_a_user_error_with_close_matches():
    with pytest.raises(UserError, match="Unknown ManiSkill task 'PushCub-v1'.*Did you mean 'PushCube-v1'"):
        make_vec_env(EnvConfig(id="PushCub-v1", adapter="maniskill"))


def test_task_with_missing_assets_is_a_user_error():
    from envs.adapters.maniskill_adapter import missing_assets

    if not missing_assets("PickSingleYCB-v1"):
        pytest.skip("the YCB assets are downloaded on this machine")
    with pytest.raises(UserError, match=r"(?s)PickSingleYCB-v1.*ycb.*download_asset.*MS_ASSET_DIR"):
        make_vec_env(EnvConfig(id="PickSingleYCB-v1", num_envs=1))


@pytest.mark.slow
def test_undeclared_robot_assets_are_a_user_error_not_a_prompt(vulkan):
    # AnymalC's robot files are downloaded on first use; ManiSkill would prompt on stdin.
    import mani_skill

    if os.path.exists(os.path.join(mani_skill.ASSET_DIR, "robots", "anymal_c")):
        pytest.skip("the AnymalC robot assets are downloaded on this machine")
    cfg = EnvConfig(id="AnymalC-Reach-v1", num_envs=1, num_procs=1, backend="multiprocess")
    with pytest.raises(UserError, match=r"(?s)anymal_c.*download_asset"):
        make_vec_env(cfg)


def test_bad_env_kwargs_are_user_errors_from_the_worker(vulkan):
    cfg = EnvConfig(id="PushCube-v1", num_envs=1, num_procs=1, backend="multiprocess", kwargs={"robot_uid": "panda"})
    with pytest.raises(UserError, match=r"env.kwargs.robot_uid: PushCube-v1 takes no parameter 'robot_uid'. Did you mean 'robot_uids'") as err:
        make_vec_env(cfg)
    assert "control_mode" in str(err.value)  # the task's parameters and its base class's
    cfg = EnvConfig(id="PushCube-v1", num_envs=1, num_procs=1, backend="multiprocess", kwargs={"control_mode": "pd_ee_delta_pos3"})
    with pytest.raises(UserError, match=r"control_mode='pd_ee_delta_pos3' is not a control mode of PushCube-v1's robot\. Did you mean 'pd_ee_delta_pos'") as err:
        make_vec_env(cfg)
    assert "pd_joint_delta_pos" in str(err.value) and "Traceback" not in str(err.value)
    cfg = EnvConfig(id="PushCube-v1", num_envs=1, num_procs=1, backend="multiprocess", kwargs={"control_mode": "pd_ee_delta_pose"})
    with make_vec_env(cfg) as env:  # another robot controller: the action space follows
        assert env.action_space.shape == (7,)


def test_bad_obs_mode_and_backend_are_user_errors():
    with pytest.raises(UserError, match="obs_mode='depth'"):
        make_vec_env(EnvConfig(id="PushCube-v1", obs_mode="depth"))
    with pytest.raises(UserError, match="env.backend='gpu'"):
        make_vec_env(EnvConfig(id="PushCube-v1", backend="gpu"))


def test_instructions_for_tasks():
    from envs.adapters.maniskill_adapter import instruction_for

    assert instruction_for("PickCube-v1") == "pick up the red cube and move it to the goal position"
    # from the task's docstring ("A simple task where the objective is to ...")
    assert instruction_for("SO100GraspCube-v1").startswith("grasp a cube with the SO100 arm")
    assert instruction_for("Empty-v1") == "complete the empty task"


def test_camera_keys():
    from envs.adapters.maniskill_adapter import camera_keys

    assert camera_keys(["base_camera", "hand_camera"]) == {"base_camera": "rgb", "hand_camera": "rgb/hand_camera"}


@pytest.mark.gpu
def test_gpu_batched_backend():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from envs.adapters.batched_adapter import BatchedVecEnv
    from envs.adapters.maniskill_adapter import ManiSkillBatchedEnv

    cfg = EnvConfig(id="PushCube-v1", num_envs=16, obs_mode="state", max_episode_steps=4)
    env = make_vec_env(cfg)
    try:
        assert isinstance(env, BatchedVecEnv) and isinstance(env.env, ManiSkillBatchedEnv)
        assert env.device.startswith("cuda")
        obs = env.reset(seed=0)
        assert obs["state"].shape == (16, 35) and obs["state"].device.type == "cuda"
        for t in range(4):
            result = env.step(torch.zeros((16, 8), device=env.device))
        assert result.truncated.all() and result.final_obs is not None and result.episodes.done.all()
        chunk = env.chunk_step(torch.zeros((16, 3, 8), device=env.device))
        assert chunk.rewards.shape == (16, 3)
    finally:
        env.close()


def test_missing_vulkan_is_a_user_error_that_says_how_to_fix_it():
    # a user-chosen ICD that does not exist: SAPIEN finds no Vulkan driver
    code = (
        "from envs.config import EnvConfig; from embodied.errors import UserError\n"
        "from envs.adapters.maniskill_adapter import make_cpu_env\n"
        "try:\n    make_cpu_env(EnvConfig(id='PushCube-v1'))\nexcept UserError as err:\n    print('USERERROR', err)\n"
    )
    env = {**os.environ, "VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300).stdout
    assert "USERERROR ManiSkill needs a Vulkan device" in out and "scripts/setup_vulkan.sh" in out
