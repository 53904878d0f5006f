"""The process group of data-parallel ranks on real Ray processes: rendezvous on loopback, every
collective bounded by the timeout, and the rank that died named when a survivor reports first."""

from __future__ import annotations

import os

import pytest
import torch

from embodied.runtime import RankResources, Worker, WorkerError, WorkerGroup
from embodied.runtime.distributed import Rendezvous, join_process_group

pytestmark = pytest.mark.slow


class Peer(Worker):
    def rendezvous(self) -> tuple[str, int]:
        self.store = Rendezvous("127.0.0.1", self.world_size, timeout_s=30)
        return self.store.address

    def join(self, host: str, port: int, timeout_s: float) -> None:
        join_process_group(host, port, self.rank, self.world_size, "gloo", timeout_s)

    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t)

    def listening(self) -> list[str]:
        import psutil

        return sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN})

    def die(self) -> None:
        os._exit(1)


def peers(cluster, timeout_s: float) -> WorkerGroup:
    group = WorkerGroup(cluster, Peer, 2, name="peers", resources=RankResources(0.25))
    host, port = group.on(0).rendezvous().result()
    group.remote.join(host, port, timeout_s).wait()
    return group


def test_ranks_meet_on_loopback_and_a_missing_peer_times_out(ray_cluster):
    group = peers(ray_cluster, timeout_s=3)
    try:
        assert group.remote.all_reduce(1.5).wait() == [3.0, 3.0]
        loopback = ("127.0.0.1", "::1", "::ffff:127.0.0.1")  # the store, and gloo's pairs (an IPv6 socket)
        assert all(ip in loopback for ips in group.remote.listening().wait() for ip in ips)
        with pytest.raises(WorkerError, match="all_reduce") as err:  # rank 1 never joins this collective
            group.on(0).all_reduce(1.0).result(timeout_s=60)
        assert err.value.rank == 0 and "imed out" in str(err.value)
    finally:
        group.shutdown()


def test_the_rank_that_died_is_named_not_the_survivor(ray_cluster):
    group = peers(ray_cluster, timeout_s=20)
    try:
        group.on(1).die()
        with pytest.raises(WorkerError) as err:  # rank 0 notices its lost peer in the collective
            group.on(0).all_reduce(1.0).result(timeout_s=60)
        assert err.value.rank == 0
        dead = group.first_dead("all_reduce")
        assert dead is not None and dead.rank == 1 and "the worker process died" in str(dead)
        assert dead.where["node"] and dead.where["pid"]
    finally:
        group.shutdown()
