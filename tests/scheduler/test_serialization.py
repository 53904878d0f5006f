"""JSON round trips: what the runtime writes next to its metrics must read back identically."""

import json
import math

import pytest

from scheduler import ComponentProfile, CostModel, Plan, Profile, Resources, MacroFlow, plan, sequential_plan
from tests.scheduler.profiles import random_instance


def _through_json(data):
    return json.loads(json.dumps(data, allow_nan=False))


@pytest.mark.parametrize("seed", range(4))
def test_plan_round_trip(seed):
    workflow, prof, resources = random_instance(seed)
    best = plan(workflow, prof, resources, max_chunks=3).best
    assert Plan.from_dict(_through_json(best.to_dict())) == best


def test_shared_plan_round_trips_with_its_lanes_and_older_plans_read_as_one_lane():
    pool = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}
    shared = Plan("shared", pool, 4, 64, (), 5.25, lanes=2)
    assert Plan.from_dict(_through_json(shared.to_dict())) == shared
    older = {k: v for k, v in Plan("hybrid", pool, 2, None, (), 5.7).to_dict().items() if k != "lanes"}
    assert Plan.from_dict(older).lanes == 1


def test_plan_without_prediction_round_trips_as_null():
    baseline = sequential_plan(MacroFlow.reasoning(num_prompts=4, group_size=2), Resources.gpus(1, 80.0))
    data = _through_json(baseline.to_dict())
    assert data["predicted_iteration_s"] is None
    back = Plan.from_dict(data)
    assert math.isnan(back.predicted_iteration_s) and back.placement == baseline.placement


def test_profile_round_trip():
    prof = Profile(
        {
            "env": ComponentProfile("env", CostModel(0.01, 0.002, 0.9), memory_gib=3.0, memory_per_item_gib=0.01,
                                    offload_s=0.5, onload_s=0.7, device_kind="cpu", output_mib_per_item=0.2),
            "rollout": ComponentProfile("rollout", CostModel(0.02, 0.001), weights_mib=1400.0, device_kind="gpu"),
        },
        transfer_latency_s=0.001,
        transfer_s_per_mib=0.0004,
        meta={"host": "node-0", "probe_batches": [8, 32, 128]},
    )
    assert Profile.from_dict(_through_json(prof.to_dict())) == prof


def test_workflow_and_resources_round_trip():
    workflow = MacroFlow.embodied(num_envs=16, rollout_steps=8, train_epochs=2, train_minibatch=32)
    assert MacroFlow.from_dict(_through_json(workflow.to_dict())) == workflow
    ranked = MacroFlow.embodied(num_envs=16, rollout_steps=8, ranks={"trainer": 2, "env": 1})
    data = _through_json(ranked.to_dict())
    assert data["ranks"] == {"env": 1, "trainer": 2} and MacroFlow.from_dict(data) == ranked
    resources = Resources.gpus(2, 80.0) + Resources.cpu_cores(4, 4.0)
    assert Resources.from_dict(_through_json(resources.to_dict())) == resources


def test_from_dict_names_wrong_keys():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['chunks'\]"):
        Plan.from_dict({"mode": "colocated", "placement": {}, "num_chunks": 1, "chunks": 2})
    with pytest.raises(ValueError, match="missing key"):
        Profile.from_dict({})
    with pytest.raises(ValueError, match="mode must be one of"):
        Plan.from_dict({"mode": "pipelined", "placement": {"env": [0]}, "num_chunks": 1})
    with pytest.raises(ValueError, match="unknown workflow kind"):
        MacroFlow.from_dict({"kind": "robotics"})
    with pytest.raises(ValueError, match="does not use num_envs"):
        MacroFlow("reasoning", num_envs=4, num_prompts=2, group_size=2)


def test_gpu_sharing_round_trips_in_plans_and_profiles_and_older_ones_read_as_none():
    one_gpu = {"env": (0,), "rollout": (0,), "trainer": (0,)}
    overlap = Plan("colocated", one_gpu, 2, None, (), 1.0, gpu_sharing="overlap")
    assert Plan.from_dict(json.loads(json.dumps(overlap.to_dict()))) == overlap
    older = {k: v for k, v in overlap.to_dict().items() if k != "gpu_sharing"}
    assert Plan.from_dict(older).gpu_sharing is None
    prof = Profile({"env": ComponentProfile("env", CostModel(0.0, 0.1, 1.0))}, gpu_switch_s=0.002, gpu_contention=1.2)
    assert Profile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof
    with pytest.raises(ValueError, match="gpu_contention"):
        Profile({}, gpu_contention=2.5)
    with pytest.raises(ValueError, match="gpu_sharing"):
        Plan("colocated", one_gpu, 1, None, (), 1.0, gpu_sharing="both")


def test_a_profile_written_before_gpu_sharing_loads_with_its_defaults_and_a_newer_key_is_named():
    prof = Profile({"env": ComponentProfile("env", CostModel(0.0, 0.1, 1.0))}, gpu_switch_s=0.002, gpu_contention=1.2)
    older = {k: v for k, v in prof.to_dict().items() if not k.startswith("gpu_")}
    loaded = Profile.from_dict(_through_json(older))
    assert (loaded.gpu_switch_s, loaded.gpu_contention) == (0.0, 1.5)
    assert loaded.components == prof.components
    newer = {**prof.to_dict(), "gpu_mps": True}
    with pytest.raises(ValueError, match=r"Profile: unknown key\(s\) \['gpu_mps'\]; allowed: .*'gpu_contention'"):
        Profile.from_dict(newer)
