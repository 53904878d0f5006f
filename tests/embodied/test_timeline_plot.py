"""The Gantt chart of predicted timelines renders to a readable PNG."""

import pytest

pytest.importorskip("matplotlib")

from embodied.timeline_plot import bar_text, plot_timelines  # noqa: E402
from scheduler import ComponentProfile, CostModel, Profile, Resources, MacroFlow, plan, sequential_plan, simulate  # noqa: E402


def _timelines():
    profile = Profile({
        "env": ComponentProfile("env", CostModel(0.02, 0.004), device_kind="cpu"),
        "rollout": ComponentProfile("rollout", CostModel(0.03, 0.002), device_kind="gpu", memory_gib=20.0,
                                    offload_s=0.3, onload_s=0.3),
        "trainer": ComponentProfile("trainer", CostModel(0.2, 0.0005), device_kind="gpu", memory_gib=60.0,
                                  offload_s=0.4, onload_s=0.4),
    })
    workflow = MacroFlow.embodied(num_envs=64, rollout_steps=4)
    resources = Resources.gpus(1, 70.0) + Resources.cpu_cores(2, 8.0)
    baseline = simulate(sequential_plan(workflow, resources, profile), profile, workflow, resources)
    return {"sequential": baseline, "chosen plan": plan(workflow, profile, resources).best_timeline}, resources


def test_plot_writes_a_png(tmp_path):
    timelines, resources = _timelines()
    path = plot_timelines(timelines, tmp_path / "plots" / "timeline.png", title="embodied",
                          device_names=[d.name for d in resources.devices])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # two panels of bars and labels, not an empty canvas


def test_bar_text():
    timeline = _timelines()[0]["sequential"]
    texts = {bar_text(s) for s in timeline.spans}
    assert {"t0 c0", "e0", "on", "off"} <= texts


def test_plot_needs_a_timeline(tmp_path):
    with pytest.raises(ValueError):
        plot_timelines({}, tmp_path / "x.png")
