"""Shared fixtures: a Ray cluster per session (started once, 2 CPUs), GPU skip marker."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def pytest_collection_modifyitems(config, items):
    # The longest tests first (heavy: minutes; slow: > 10 s), so that pytest-xdist's workers do
    # not end on one of them alone; a stable sort keeps each module's order within a class.
    items.sort(key=lambda item: 0 if "heavy" in item.keywords else 1 if "slow" in item.keywords else 2)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray shared by the tests that need real actors (started once: ~3 s)."""
    from embodied.runtime import Cluster, ClusterConfig

    cluster = Cluster(ClusterConfig(backend="ray", num_cpus=4, timeout_s=120))
    yield cluster
    cluster.shutdown()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tests run on 2 shared cores: oversubscribed torch threads make small ops 10-20x slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def pickcube_demos(tmp_path_factory):
    """Four scripted PickCube-v1 episodes at 32 px (``embodied demos``), recorded once per test
    process for the SFT tests of every policy."""
    from pipelines.demos import DemoConfig, record_demos

    out = tmp_path_factory.mktemp("demos") / "pick.h5"
    record_demos(DemoConfig("PickCube-v1", episodes=4, out=str(out), image_size=32), log=lambda _: None)
    return out
