"""The planner plans the flow workload: the rollout probe times the π0 policy's own ``act`` (every
flow step an action-expert pass), so twice the flow steps is a costlier profiled rollout, and
`embodied plan` plans the tiny π0 recipe."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from embodied.config import apply_overrides  # noqa: E402
from embodied.runtime import Cluster, ClusterConfig  # noqa: E402
from pipelines.config import EmbodiedConfig  # noqa: E402
from pipelines.plan_cli import cmd_plan  # noqa: E402
from pipelines.probes import profile_embodied  # noqa: E402
from pipelines.recipes import load_recipe  # noqa: E402
from tests.fresh_cache import fresh_cache  # noqa: E402

RECIPE = "colorreach_pi0_ppo_tiny"
#: A small iteration of the recipe on one core (the probes time batches of 1, 2 and 4 envs on one
#: thread): seconds of profiling, the same rollout and trainer code as the recipe's.
SMALL = ["env.num_envs=4", "algo.rollout_steps=2", "cluster.backend=local", "cluster.num_cpus=1"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return fresh_cache()


def _config(*overrides: str) -> EmbodiedConfig:
    _, data = load_recipe(RECIPE)
    return apply_overrides(EmbodiedConfig, data, [*SMALL, *overrides])


def test_twice_the_flow_steps_is_a_costlier_profiled_rollout(cache, monkeypatch) -> None:
    monkeypatch.setenv("EMBODIED_CACHE", cache)
    profiles = {}
    with Cluster(ClusterConfig(backend="local", num_cpus=1)) as cluster:
        for steps in (5, 10):
            profiles[steps] = profile_embodied(_config(f"policy.kwargs.num_steps={steps}"), cluster, log=lambda *_: None)
    assert profiles[5].meta["key"] != profiles[10].meta["key"]  # the flow steps are part of what a profile is of
    for batch in (2, 4):
        five, ten = (profiles[s]["rollout"].cost.time_s(batch, 1) for s in (5, 10))
        assert ten > 1.2 * five, f"batch {batch}: {ten * 1e3:.1f} ms per call with 10 flow steps, {five * 1e3:.1f} ms with 5"


def test_embodied_plan_plans_the_tiny_pi0_recipe(cache, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("EMBODIED_CACHE", cache)
    assert cmd_plan([RECIPE, *SMALL, "policy.kwargs.num_steps=10", "--out", str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert "workflow: 4 envs x 2 steps" in out
    assert any(line.startswith("chosen:") for line in out.splitlines())
    assert (tmp_path / "plan.png").stat().st_size > 10_000
