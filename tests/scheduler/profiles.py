"""Hand-made profiles and seeded random instances shared by the scheduler tests."""

from __future__ import annotations

import random
from dataclasses import replace

from scheduler import ComponentProfile, CostModel, Profile, Resources, MacroFlow


def component(name: str, fixed_s: float = 0.0, per_item_s: float = 0.0, exponent: float = 1.0, **kwargs) -> ComponentProfile:
    return ComponentProfile(name, CostModel(fixed_s, per_item_s, exponent), **kwargs)


def profile(*components: ComponentProfile, latency_s: float = 0.0, s_per_mib: float = 0.0) -> Profile:
    return Profile({c.name: c for c in components}, transfer_latency_s=latency_s, transfer_s_per_mib=s_per_mib)


def random_component(rng: random.Random, name: str, *, fixed: bool = True, memory: bool = True) -> ComponentProfile:
    return component(
        name,
        fixed_s=rng.choice([0.0, rng.uniform(0.0, 0.5)]) if fixed else 0.0,
        per_item_s=rng.uniform(0.001, 0.2),
        exponent=rng.choice([0.0, 0.5, 1.0]),
        memory_gib=rng.uniform(0.0, 6.0) if memory else 0.0,
        memory_per_item_gib=rng.choice([0.0, rng.uniform(0.0, 0.3)]) if memory else 0.0,
        offload_s=rng.uniform(0.0, 0.5),
        onload_s=rng.uniform(0.0, 0.5),
        output_mib_per_item=rng.uniform(0.0, 2.0),
        weights_mib=rng.uniform(0.0, 50.0),
    )


def random_instance(seed: int, kind: str = "embodied") -> tuple[MacroFlow, Profile, Resources]:
    """A small random workflow, profile and (possibly heterogeneous) resources."""
    rng = random.Random(seed)
    if kind == "embodied":
        workflow = MacroFlow.embodied(num_envs=rng.randint(1, 6), rollout_steps=rng.randint(1, 3),
                                     train_epochs=rng.randint(1, 2), train_overlap=rng.random() < 0.5)
        names = ("env", "rollout", "trainer")
    else:
        workflow = MacroFlow.reasoning(num_prompts=rng.randint(1, 5), group_size=rng.randint(1, 3),
                                      train_epochs=rng.randint(1, 2))
        names = ("rollout", "reward", "trainer")
    components = [random_component(rng, n) for n in names]
    if rng.random() < 0.5:
        components.append(component("weight_sync", fixed_s=rng.uniform(0.0, 0.3)))
    prof = profile(*components, latency_s=rng.choice([0.0, 0.05]), s_per_mib=rng.choice([0.0, 0.01]))
    resources = Resources.gpus(rng.randint(1, 2), rng.choice([8.0, 12.0, 20.0]))
    if rng.random() < 0.5:
        resources = resources + Resources.cpu_cores(rng.randint(1, 2), rng.choice([8.0, 16.0]))
        if rng.random() < 0.5:  # the first stage (env / rollout) only runs on CPU, the trainer only on GPU
            prof = replace(prof, components={
                **prof.components,
                names[0]: replace(prof[names[0]], device_kind="cpu"),
                "trainer": replace(prof["trainer"], device_kind="gpu"),
            })
    return workflow, prof, resources
