"""The message probe: the cost of one channel message between two worker processes
(:func:`probe_transfer`), bounced by an :class:`Echo`."""

from __future__ import annotations

import time

import numpy as np

from embodied.runtime import Channel, Cluster, RankResources, Worker, WorkerGroup, wait_all
from pipelines.probes.common import MIB


class Echo:
    """Bounces channel messages back: measures the cost of one message between two workers
    (:func:`probe_transfer`)."""

    def bounce(self, inbox: Channel, outbox: Channel, count: int) -> None:
        for _ in range(count):
            outbox.put(0, inbox.get(0))

    def serve(self, inbox: Channel, outbox: Channel, payload: np.ndarray, count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            outbox.put(0, payload)
            inbox.get(0)
        return (time.perf_counter() - t0) / (2 * count)


class EchoWorker(Worker, Echo):
    """A worker that only bounces the message probe's messages."""


def probe_transfer(cluster: Cluster, obs_mib: float, log, ends: tuple[WorkerGroup, WorkerGroup] | None = None) -> tuple[float, float]:
    """(latency_s, s_per_mib) of one channel message between two worker processes: ``ends``, two
    one-rank groups of workers that are :class:`Echo` (the first serves, the second bounces), or
    two :class:`EchoWorker` started for it."""
    if cluster.backend != "ray":
        return 0.0, 0.0
    own = [] if ends is not None else [WorkerGroup(cluster, EchoWorker, 1, name=f"profile-echo-{end}", resources=RankResources(0.01))
                                       for end in ("serve", "bounce")]
    server, bouncer = ends if ends is not None else own
    a_in, b_in = Channel("a", server), Channel("b", bouncer)
    times = {}
    big = max(1.0, obs_mib)
    try:
        for mib in (0.001, big):
            payload = np.zeros(max(1, int(mib * MIB)), np.uint8)
            count = 30 if mib < 1 else 10
            srv = server.remote.serve(a_in, b_in, payload, count)
            bnc = bouncer.remote.bounce(b_in, a_in, count)
            wait_all(srv, bnc)
            times[mib] = srv.result()
    finally:
        for group in own:
            group.shutdown()
    s_per_mib = max(0.0, (times[big] - times[0.001]) / (big - 0.001))
    latency_s = max(0.0, times[0.001])
    log(f"  message latency {latency_s * 1e3:.2f} ms, {s_per_mib * 1e3:.2f} ms/MiB")
    return latency_s, s_per_mib
