"""The runtime: cluster, workers, worker groups (their calls' futures and errors) and channels."""

from embodied.runtime.channel import Channel, default_route
from embodied.runtime.cluster import Cluster, ClusterConfig, NodeInfo
from embodied.runtime.futures import (
    GroupFuture,
    Location,
    WorkerEnvError,
    WorkerError,
    WorkerTimeout,
    WorkerUserError,
    wait_all,
)
from embodied.runtime.mailbox import ChannelTimeout
from embodied.runtime.worker import Endpoint, RankResources, Worker, WorkerGroup

__all__ = [
    "Channel",
    "ChannelTimeout",
    "Cluster",
    "ClusterConfig",
    "Endpoint",
    "GroupFuture",
    "NodeInfo",
    "Location",
    "RankResources",
    "Worker",
    "WorkerEnvError",
    "WorkerError",
    "WorkerGroup",
    "WorkerTimeout",
    "WorkerUserError",
    "default_route",
    "wait_all",
]
