"""The runtime: cluster, workers, worker groups and channels."""

from embodied.runtime.channel import Channel, default_route
from embodied.runtime.cluster import Cluster, ClusterConfig
from embodied.runtime.mailbox import ChannelTimeout
from embodied.runtime.worker import (
    Endpoint,
    GroupFuture,
    Location,
    RankResources,
    Worker,
    WorkerEnvError,
    WorkerError,
    WorkerGroup,
    WorkerTimeout,
    WorkerUserError,
    wait_all,
)

__all__ = [
    "Channel",
    "ChannelTimeout",
    "Cluster",
    "ClusterConfig",
    "Endpoint",
    "GroupFuture",
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
