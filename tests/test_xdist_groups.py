"""`make test` runs on pytest-xdist with --dist loadgroup: the tests of an ``xdist_group`` share
one worker, so a module fixture they share (a trained run, a two-node cluster) is built once.
When a pytest/xdist pairing breaks the grouping, the suite still passes, only slower: this says so."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("grouping_check")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist with --dist loadgroup (make test)")
    # xdist's scheduler puts tests with the same "@group" suffix of their node id on one worker
    assert request.node.nodeid.endswith("@grouping_check"), (
        f"{request.node.nodeid}: xdist_group is ignored by this pytest/pytest-xdist pair (see pyproject.toml)")
