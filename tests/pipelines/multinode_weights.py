"""Run by ``test_multinode.py`` as a driver of its own on a two-node cluster: the trainer on the
node with ``node_trainer``, two rollout ranks on the node with ``node_env``; prints as JSON where
the weight payload lies after both rollout ranks loaded it, and where the ranks ran.

    python -m tests.pipelines.multinode_weights HOST:PORT
"""

from __future__ import annotations

import json
import sys

import numpy as np
from gymnasium import spaces


def main(address: str) -> dict:
    import ray

    from embodied.config import apply_overrides
    from embodied.runtime import Cluster, ClusterConfig, RankResources, WorkerGroup, wait_all
    from pipelines.config import EmbodiedConfig
    from pipelines.onpolicy.workers import RolloutWorker, TrainerWorker

    # a policy of ~0.5 MB: above Ray's inline limit, so the payload lives in the nodes' object stores
    cfg = apply_overrides(EmbodiedConfig, {}, ["env.id=CartPole-v1", "policy.hidden_sizes=[256, 256]"])
    obs = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (4,), np.float32)})
    act = spaces.Discrete(2)
    with Cluster(ClusterConfig(address=address, timeout_s=60, start_timeout_s=120)) as cluster:
        trainer = WorkerGroup(cluster, TrainerWorker, 1, cfg, obs, act, name="trainer",
                              resources=RankResources(0.5, custom={"node_trainer": 0.1}))
        rollout = WorkerGroup(cluster, RolloutWorker, 2, cfg, obs, act, 1, name="rollout",
                              resources=RankResources(0.5, custom={"node_env": 0.1}))
        weights = trainer.remote.export_weights()
        loaded = rollout.remote.load_weights(weights.handle(0))  # one ObjectRef to both ranks
        wait_all(weights, loaded)
        ref = weights.handle(0)
        where = ray.experimental.get_object_locations([ref])[ref]
        return {
            "payload_bytes": int(where["object_size"]),
            "copies_on_nodes": sorted(where["node_ids"]),
            "versions": loaded.wait(),
            "trainer_node": trainer.locations[0].node_id,
            "rollout_nodes": [loc.node_id for loc in rollout.locations],
        }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
