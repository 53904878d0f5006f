"""The LIBERO adapter: everything that works without the scene assets, and the missing-asset error.

hf-libero ships task files (bddl) and initial states but not the scene assets, so the simulator
itself cannot start on a machine without them; these tests use the real package for the rest.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("libero") is None:
    pytest.skip(
        "LIBERO is optional: pip install robosuite==1.4.0 termcolor bddl==1.0.1 future easydict "
        "&& pip install --no-deps hf-libero==0.1.4",
        allow_module_level=True,
    )
pytest.importorskip("robosuite", reason="LIBERO needs robosuite==1.4.0")

from embodied.errors import UserError  # noqa: E402
from envs.adapters import libero_adapter as lib  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402

TASK_COUNTS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}


def assets_present() -> bool:
    return any(lib.is_assets_dir(p) for p in lib.asset_search_paths())


def test_suites_and_task_listing():
    assert lib.list_suites() == list(TASK_COUNTS)
    for suite, count in TASK_COUNTS.items():
        tasks = lib.list_tasks(suite)
        assert len(tasks) == count
        assert [t.index for t in tasks] == list(range(count))
        assert len({t.name for t in tasks}) == count
        for t in tasks:
            assert t.suite == suite and t.id == f"{suite}/{t.index}"
            assert t.instruction and t.instruction == t.instruction.strip()
            assert Path(t.bddl_file).is_file() and Path(t.init_states_file).is_file()
            assert "(:language" in Path(t.bddl_file).read_text()


def test_known_instructions():
    spatial = lib.list_tasks("libero_spatial")
    assert spatial[0].instruction == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    goal = lib.list_tasks("libero_goal")
    assert goal[0].name == "open_the_middle_drawer_of_the_cabinet"
    assert goal[0].instruction == "open the middle drawer of the cabinet"
    assert lib.list_tasks("libero_10")[0].instruction == "put both the alphabet soup and the tomato sauce in the basket"


@pytest.mark.parametrize("suite", list(TASK_COUNTS))
def test_fixed_initial_states(suite):
    tasks = lib.list_tasks(suite)
    dims = set()
    for t in tasks[:10]:
        states = lib.load_init_states(t)
        assert states.ndim == 2 and states.shape[0] == 50 and states.dtype == np.float64
        assert np.isfinite(states).all()
        assert len(np.unique(states, axis=0)) == 50  # 50 distinct initial states
        dims.add(states.shape[1])
    assert len(dims) >= 1


def test_id_syntax():
    assert lib.parse_id("libero_spatial")[1] == lib.list_tasks("libero_spatial")
    suite, tasks = lib.parse_id("libero_10/3")
    assert suite == "libero_10" and tasks == [lib.list_tasks("libero_10")[3]]
    name = lib.list_tasks("libero_90")[42].name
    assert lib.parse_id(f"libero_90/{name}")[1][0].index == 42
    for env_id in ("libero_spatial", "libero_object/0", "libero_goal/9", f"libero_90/{name}", "libero_10"):
        assert resolve_adapter(EnvConfig(id=env_id)) == "libero"


def test_bad_ids_are_user_errors_with_suggestions():
    with pytest.raises(UserError, match="Did you mean 'libero_spatial'"):
        make_vec_env(EnvConfig(id="libero_spatail", num_envs=1))
    with pytest.raises(UserError, match=r"tasks 0\.\.9"):
        make_vec_env(EnvConfig(id="libero_goal/10", num_envs=1))
    with pytest.raises(UserError, match="Did you mean 'open_the_middle_drawer_of_the_cabinet'"):
        make_vec_env(EnvConfig(id="libero_goal/open_the_midle_drawer_of_the_cabinet", num_envs=1))
    with pytest.raises(UserError, match="init_states"):
        make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1, kwargs={"init_states": "first"}))
    with pytest.raises(UserError, match="obs_mode"):
        make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1, obs_mode="depth"))


def _first_episode_states(num_envs: int, num_tasks: int, num_trials: int = 50) -> list[int]:
    """Global state ids (trial * num_tasks + task) of each env's first episode."""
    return [(first % num_trials) * num_tasks + task for task, first, _ in lib.init_state_schedule(num_envs, num_tasks)]


def test_eval_batch_env_i_gets_state_i_mod_count():
    # a whole suite: 10 tasks x 50 states
    assert _first_episode_states(500, 10) == list(range(500))
    assert _first_episode_states(520, 10) == [i % 500 for i in range(520)]
    assert _first_episode_states(8, 10) == list(range(8))
    # one task: 50 states
    assert _first_episode_states(60, 1) == [i % 50 for i in range(60)]


def test_later_episodes_walk_through_every_state_of_each_task():
    num_envs, num_tasks, num_trials = 12, 10, 50
    seen: dict[int, list[int]] = {t: [] for t in range(num_tasks)}
    for task, first, stride in lib.init_state_schedule(num_envs, num_tasks):
        seen[task] += [(first + k * stride) % num_trials for k in range(num_trials // stride)]
    for task, trials in seen.items():
        assert sorted(trials) == list(range(num_trials)), task  # each state once, no env repeats another


def test_instructions_per_env():
    tasks = lib.env_tasks("libero_spatial", 12)
    spatial = lib.list_tasks("libero_spatial")
    assert [t.index for t in tasks] == [i % 10 for i in range(12)]
    assert [t.instruction for t in tasks][:2] == [spatial[0].instruction, spatial[1].instruction]
    assert {t.instruction for t in lib.env_tasks("libero_goal/4", 3)} == {lib.list_tasks("libero_goal")[4].instruction}


@pytest.mark.skipif(assets_present(), reason="LIBERO scene assets are installed here")
def test_missing_assets_is_a_user_error_that_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.delenv("LIBERO_ASSETS_PATH", raising=False)
    with pytest.raises(UserError) as err:
        make_vec_env(EnvConfig(id="libero_spatial/0", num_envs=2), seed=0)
    message = str(err.value)
    assert str(lib.libero_package_dir() / "assets") in message  # where LIBERO looks
    assert "scenes/libero_tabletop_base_style.xml" in message
    assert "lerobot/libero-assets" in message and "assets_path" in message and "LIBERO_ASSETS_PATH" in message
    # an explicit folder without the assets is named too
    with pytest.raises(UserError, match=str(tmp_path)):
        make_vec_env(EnvConfig(id="libero_spatial/0", num_envs=1, kwargs={"assets_path": str(tmp_path)}))


@pytest.mark.skipif(assets_present(), reason="LIBERO scene assets are installed here")
def test_first_use_never_prompts_and_fails_with_the_asset_error(tmp_path):
    """A fresh home (no LIBERO config yet) and no stdin: LIBERO must not ask anything."""
    env = {k: v for k, v in os.environ.items() if k not in ("LIBERO_CONFIG_PATH", "LIBERO_ASSETS_PATH")}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    script = textwrap.dedent(
        """
        from embodied.errors import UserError
        from envs.config import EnvConfig
        from envs.registry import make_vec_env
        try:
            make_vec_env(EnvConfig(id="libero_goal/0", num_envs=1))
        except UserError as err:
            print("USER_ERROR", err)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "USER_ERROR LIBERO's scene assets are missing" in out.stdout
    assert "Do you want" not in out.stdout + out.stderr
    assert (tmp_path / "cache" / "embodied" / "libero" / "config.yaml").is_file()


@pytest.mark.parametrize("obs_mode", ["state", "state+rgb"])
def test_the_env_constructor_reaches_libero_scene_loading(tmp_path, obs_mode):
    """Real LIBERO + robosuite up to the point the assets are read: bddl parsed, our assets folder used.

    ``state`` builds LIBERO's ControlEnv without a renderer, ``state+rgb`` its OffScreenRenderEnv.
    """
    task = lib.list_tasks("libero_spatial")[0]
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "scenes" / "libero_tabletop_base_style.xml")):
        lib.LiberoEnv(task.bddl_file, lib.load_init_states(task), str(tmp_path), obs_mode=obs_mode, image_size=32)


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


@pytest.mark.slow
@pytest.mark.skipif(not assets_present(), reason="needs the LIBERO scene assets (see the missing-assets test)")
def test_libero_rollout_with_assets():
    cfg = EnvConfig(id="libero_spatial", num_envs=2, obs_mode="state+rgb", image_size=64, max_episode_steps=5)
    env = make_vec_env(cfg, seed=0)
    try:
        assert env.instructions == [t.instruction for t in lib.list_tasks("libero_spatial")[:2]]
        obs = env.reset(seed=0)
        assert obs["state"].shape == (2, 8) and obs["rgb"].shape == (2, 64, 64, 3)
        assert obs["rgb/wrist"].shape == (2, 64, 64, 3)
        res = env.chunk_step(np.zeros((2, 6, 7), np.float32))
        assert res.truncated[:, 4].all() and not res.valid[:, 5].any()
    finally:
        env.close()
