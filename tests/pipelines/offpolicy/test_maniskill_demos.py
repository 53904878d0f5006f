"""RLPD's demonstration files: the scripted expert's ManiSkill trajectories (``embodied demos``)
read as transitions in the layout of the run's own ``state`` observation."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")

from pipelines.cli import build_train_config  # noqa: E402
from pipelines.demos import DemoConfig, record_demos  # noqa: E402
from pipelines.offpolicy.demos import demonstrations  # noqa: E402
from pipelines.workflow import WORKFLOWS  # noqa: E402


@pytest.mark.slow
def test_scripted_pushcube_demonstrations_become_transitions_of_the_runs_state(tmp_path):
    out = tmp_path / "push.h5"
    summary = record_demos(DemoConfig("PushCube-v1", episodes=1, out=str(out), obs_mode="state", seed=3), log=lambda _: None)
    cfg = build_train_config(["maniskill_pushcube_sac", "algo.name=rlpd", f"demos.path=[{out}]", "env.num_envs=1",
                              "env.backend=inprocess", "env.kwargs.control_mode=pd_ee_delta_pos"])
    obs_space, action_space = WORKFLOWS.get(cfg.workflow).build(cfg).preflight()
    demos = demonstrations(cfg, log=lambda _: None)
    steps = demos.num_steps
    assert demos.num_envs == 1 and steps >= 1 and summary.kept == 1
    assert demos.obs["state"].shape == (steps, 1, *obs_space["state"].shape)  # the env's own state layout
    assert demos.actions.shape == (steps, 1, *action_space.shape)
    assert np.array_equal(demos.next_obs["state"][:-1], demos.obs["state"][1:])  # observation t + 1 follows t
    assert np.isfinite(demos.rewards).all() and not demos.truncated[:-1].any() and not demos.terminated[:-1].any()
    with pytest.raises(Exception, match="this run trains PushCube-v1 from state with control_mode=pd_joint_delta_pos"):
        demonstrations(build_train_config(["maniskill_pushcube_sac", "algo.name=rlpd", f"demos.path=[{out}]"]))
