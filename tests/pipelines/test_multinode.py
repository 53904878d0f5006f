"""A real two-node Ray cluster on this machine (two raylets with resources of their own, started
with ``ray.cluster_utils.Cluster``): `embodied train cluster.address=...` puts the env workers on
one node and the trainer ranks on the other and runs to completion; weights reach rollout ranks
on the other node with one copy of the payload per node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.heavy,
              pytest.mark.xdist_group("two_nodes")]  # one worker builds the module's two_nodes once


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "EMBODIED_CACHE": str(tmp_path / "cache")}
    for key in ("RAY_ADDRESS", "EMBODIED_RUN_DIR", "EMBODIED_RUN_TOKEN"):
        env.pop(key, None)
    return env


@pytest.fixture(scope="module")
def two_nodes():
    """Head node {CPU: 2, node_env: 1}, second node {CPU: 2, node_trainer: 1}."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 2, "resources": {"node_env": 1}, "include_dashboard": False})
    trainer_node = cluster.add_node(num_cpus=2, resources={"node_trainer": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster, {"env": cluster.head_node.node_id, "trainer": trainer_node.node_id}
    finally:
        cluster.shutdown()


def test_weights_reach_rollout_ranks_on_another_node_once_per_node(two_nodes, tmp_path):
    cluster, nodes = two_nodes
    out = subprocess.run([sys.executable, "-m", "tests.pipelines.multinode_weights", cluster.address], cwd=ROOT,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["trainer_node"] == nodes["trainer"] and got["rollout_nodes"] == [nodes["env"]] * 2
    assert got["versions"] == [0, 0]
    assert got["payload_bytes"] > 100 * 1024  # in the object stores, not inlined
    # the trainer's node holds the payload, and the rollouts' node one copy for its two ranks
    assert got["copies_on_nodes"] == sorted([nodes["trainer"], nodes["env"]])


def test_a_run_on_two_nodes_puts_workers_where_asked_and_completes(two_nodes, tmp_path):
    cluster, nodes = two_nodes
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "train", "cartpole_ppo", f"run.dir={run}", f"cluster.address={cluster.address}",
         "workers.env_resources={node_env: 0.1}", "workers.rollout_resources={node_env: 0.1}",
         "workers.trainer_resources={node_trainer: 0.1}", "workers.trainer=2", "env.num_envs=4", "algo.rollout_steps=32",
         "algo.total_env_steps=384", "plan.profile=false", "logging.wandb=false", "eval.episodes=1",
         "cluster.timeout_s=60", "cluster.start_timeout_s=120"],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 3 and summary["env_steps"] == 384
    workers = json.loads((run / "plan.json").read_text())["workers"]
    assert [w["node_id"] for w in workers["env"]] == [nodes["env"]]
    assert [w["node_id"] for w in workers["rollout"]] == [nodes["env"]]
    assert [w["node_id"] for w in workers["trainer"]] == [nodes["trainer"]] * 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weights/version"] for r in rows] == [0, 1, 2]  # weights crossed to the env node every iteration


LOCAL_RAY = """
import json, ray
from embodied.runtime import Cluster, ClusterConfig
with Cluster(ClusterConfig(num_cpus=1)):
    print(json.dumps({"nodes": [n["NodeID"] for n in ray.nodes()], "ip": ray.util.get_node_ip_address()}))
"""


def test_a_run_without_an_address_starts_its_own_loopback_ray_beside_a_cluster(two_nodes, tmp_path):
    """The two-node cluster recorded itself as this machine's current cluster (as `ray start` does):
    a run without cluster.address still starts a Ray of its own, on loopback, and does not join it."""
    cluster, nodes = two_nodes
    out = subprocess.run([sys.executable, "-c", LOCAL_RAY], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ip"] == "127.0.0.1" and len(got["nodes"]) == 1 and not set(got["nodes"]) & set(nodes.values())
