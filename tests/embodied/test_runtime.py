"""The runtime on both backends: the same worker code, in-process and as Ray actors."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from embodied.errors import UserError, exit_code_of, format_failure
from embodied.runtime import (
    Channel,
    Cluster,
    ClusterConfig,
    RankResources,
    Worker,
    WorkerError,
    WorkerGroup,
    WorkerTimeout,
    wait_all,
)


class Producer(Worker):
    def __init__(self, scale: int) -> None:
        self.scale = scale

    def produce(self, channel: Channel, count: int, num_keys: int) -> int:
        for i in range(count):
            channel.put(i % num_keys, np.full(4, self.scale * 1000 + self.rank * 100 + i))
        return count

    def whoami(self) -> tuple[int, int, int]:
        return self.rank, self.world_size, os.getpid()

    def fail(self) -> None:
        raise ValueError("boom in the worker")

    def user_fail(self) -> None:
        raise UserError("bad user input")

    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    def die(self) -> None:
        os._exit(1)

    def getenv(self, key: str) -> str | None:
        return os.environ.get(key)


class Consumer(Worker):
    def consume(self, channel: Channel, keys: list[int], count_per_key: int) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {k: [] for k in keys}
        for _ in range(count_per_key):
            for k in keys:
                out[k].append(int(channel.get(k)[0]))
        return out

    def consume_batch(self, channel: Channel, key: int, n: int) -> list[int]:
        return [int(x[0]) for x in channel.get_batch(key, n)]

    def identity(self, x):
        return x

    def close_socket_inbox(self) -> bool:
        """Stop this rank's same-machine socket; False where it has none."""
        from embodied.runtime.socket_transport import inbox_of

        inbox = inbox_of(self.mailbox)
        if inbox is None:
            return False
        inbox.close()
        return True


class BrokenInit(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("cannot start rank 1")


@pytest.fixture(params=["local", "ray"])
def cluster(request, ray_cluster):
    if request.param == "ray":
        yield ray_cluster
    else:
        with Cluster(ClusterConfig(backend="local", timeout_s=30)) as c:
            yield c


def half() -> RankResources:
    return RankResources(num_cpus=0.5)


def test_ranks_know_their_rank_and_run_in_separate_processes_on_ray(cluster):
    group = WorkerGroup(cluster, Producer, 2, 1, resources=half())
    ranks = group.remote.whoami().wait()
    assert [(r, w) for r, w, _ in ranks] == [(0, 2), (1, 2)]
    pids = {pid for _, _, pid in ranks}
    assert (len(pids) == 2 and os.getpid() not in pids) if cluster.backend == "ray" else pids == {os.getpid()}
    # chosen ranks only
    assert [r[0] for r in group.on(1).whoami().wait()] == [1]
    group.shutdown()


def test_a_misspelt_method_or_a_missing_rank_fails_before_anything_is_sent():
    with Cluster(ClusterConfig(backend="local", timeout_s=30)) as cluster:
        group = WorkerGroup(cluster, Producer, 2, 1)
        calls = []
        group._call = lambda *args, **kwargs: calls.append(args)  # what would send a call
        with pytest.raises(AttributeError, match=r"Producer has no method 'whoam'; did you mean whoami\?"):
            group.remote.whoam()
        with pytest.raises(AttributeError, match="did you mean sleep"):
            group.on(1).slep(1.0)
        with pytest.raises(ValueError, match=r"ranks 0\.\.1; asked for \[5\]"):
            group.on(5)
        with pytest.raises(ValueError, match="asked for"):
            group.on()
        assert calls == []
        group.on(1).whoami()  # a method the worker has: sent
        assert calls == [("whoami",)]
        group.shutdown()


def test_ray_workers_start_with_the_torch_process_env(ray_cluster):
    from embodied.runtime.cluster import TORCH_PROCESS_ENV

    group = WorkerGroup(ray_cluster, Producer, 1, 1, resources=half())
    for key, default in TORCH_PROCESS_ENV.items():
        assert group.remote.getenv(key).wait() == [os.environ.get(key, default)]
    group.shutdown()


IDLE_WORKERS_SCRIPT = """
import os, time
from embodied.runtime import Cluster, ClusterConfig
from embodied.runtime.watchdog import RayNodes, children_of


def command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


cluster = Cluster(ClusterConfig(backend="ray", num_cpus=2, timeout_s=60))
time.sleep(3)  # Ray prestarts its idle workers right after the driver connects
nodes = RayNodes()
nodes.learn(os.getpid())
print(len(nodes.raylets), sum("ray::IDLE" in command_line(p) for r in nodes.raylets for p in children_of(r)))
cluster.shutdown()
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_local_ray_starts_no_idle_workers_that_no_actor_would_use():
    """Every worker of a run is an actor with thread variables of its own, which Ray starts a
    process for: the idle workers Ray prestarts for the job's runtime env would cost ~0.7 CPU-s
    each and never run anything."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    result = subprocess.run([sys.executable, "-c", IDLE_WORKERS_SCRIPT], cwd=root, capture_output=True, text=True,
                            timeout=120, env={**env, "PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["1", "0"], result.stdout  # the raylet found, no ray::IDLE under it


def test_torch_process_env_keeps_what_the_user_set(monkeypatch):
    from embodied.runtime.cluster import TORCH_PROCESS_ENV, apply_torch_process_env

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    apply_torch_process_env()
    assert os.environ["GOMP_SPINCOUNT"] == TORCH_PROCESS_ENV["GOMP_SPINCOUNT"]
    monkeypatch.setenv("GOMP_SPINCOUNT", "123")
    apply_torch_process_env()
    assert os.environ["GOMP_SPINCOUNT"] == "123"


def test_channel_routes_keys_to_owner_and_keeps_fifo_order(cluster):
    producers = WorkerGroup(cluster, Producer, 1, 1, resources=half())
    consumers = WorkerGroup(cluster, Consumer, 2, resources=half())
    channel = Channel("data", consumers)  # int key k -> rank k % 2
    c0 = consumers.on(0).consume(channel, [0, 2], 25)
    c1 = consumers.on(1).consume(channel, [1, 3], 25)
    p = producers.remote.produce(channel, 100, 4)
    wait_all(c0, c1, p)
    got = {**c0.result(), **c1.result()}
    for k in range(4):
        assert got[k] == [1000 + i for i in range(k, 100, 4)]  # in put order, only its own key
    producers.shutdown()
    consumers.shutdown()


def test_get_batch_and_two_producers_into_one_key(cluster):
    producers = WorkerGroup(cluster, Producer, 2, 1, resources=half())
    consumers = WorkerGroup(cluster, Consumer, 1, resources=half())
    channel = Channel("data", consumers)
    wait_all(producers.remote.produce(channel, 10, 1))
    items = consumers.remote.consume_batch(channel, 0, 20).result()
    assert sorted(items) == sorted([1000 + i for i in range(10)] + [1100 + i for i in range(10)])
    # each producer's own items stay in order
    assert [x for x in items if x < 1100] == [1000 + i for i in range(10)]
    producers.shutdown()
    consumers.shutdown()


def test_worker_exception_names_group_rank_method_and_cause(cluster):
    group = WorkerGroup(cluster, Producer, 2, 1, name="sim", resources=half())
    with pytest.raises(WorkerError) as err:
        group.on(1).fail().wait()
    msg = str(err.value)
    assert "sim[rank 1]" in msg and "fail()" in msg and "ValueError: boom in the worker" in msg
    assert "traceback in the worker" in msg
    group.shutdown()


def test_user_error_in_worker_stays_a_user_error(cluster):
    group = WorkerGroup(cluster, Producer, 1, 1, resources=half())
    with pytest.raises(UserError, match="bad user input"):
        group.remote.user_fail().wait()
    group.shutdown()


def test_construction_error_names_the_rank(cluster):
    with pytest.raises(WorkerError, match=r"BrokenInit\[rank 1\].*cannot start rank 1"):
        WorkerGroup(cluster, BrokenInit, 2, resources=half())


def test_wait_all_fails_fast_and_times_out(cluster):
    group = WorkerGroup(cluster, Producer, 2, 1, resources=half())
    t0 = time.monotonic()
    slow = group.on(0).sleep(5.0)
    bad = group.on(1).fail()
    with pytest.raises(WorkerError, match="fail"):
        wait_all(slow, bad)
    assert time.monotonic() - t0 < 4.0, "did not fail fast"
    with pytest.raises(WorkerTimeout, match=r"no answer within 0.5 s \(the timeout given to this wait\)"):
        group.on(1).sleep(5.0).wait(timeout_s=0.5)
    group.shutdown()


def test_channel_get_times_out_instead_of_hanging(cluster):
    consumers = WorkerGroup(cluster, Consumer, 1, resources=half())
    channel = Channel("never", consumers, timeout_s=0.5)
    with pytest.raises(WorkerError, match="ChannelTimeout: channel 'never' key 0: no answer within 0.5 s"):
        consumers.remote.consume(channel, [0], 1).wait()
    consumers.shutdown()


def test_shutting_down_a_local_group_ends_a_get_that_waits():
    """On the local backend a rank's calls run in a thread, which the interpreter joins at exit: a
    rank left blocked in a channel get by a failure elsewhere would keep the program alive for the
    get's whole timeout. Shutting its group down ends the get at once."""
    with Cluster(ClusterConfig(backend="local", timeout_s=60)) as c:
        consumers = WorkerGroup(c, Consumer, 1, name="sink")
        waiting = consumers.remote.consume(Channel("never", consumers), [0], 1)
        time.sleep(0.2)  # the rank is in its get
        t0 = time.monotonic()
        consumers.shutdown()
        with pytest.raises(WorkerError, match="ChannelClosed: channel 'never' key 0: worker group sink was shut down"):
            waiting.wait(timeout_s=10)
        assert time.monotonic() - t0 < 2.0


def test_every_wait_names_its_seconds_and_config_key():
    """A call waits up to cluster.timeout_s, a phase (as_phase) up to cluster.phase_timeout_s, a
    channel message up to cluster.timeout_s (a phase-long message: phase_timeout_s); each
    timeout says so, naming the producer of a channel when it is known."""
    cfg = ClusterConfig(backend="local", timeout_s=0.3, phase_timeout_s=0.6, start_timeout_s=5)
    with Cluster(cfg) as c:
        group = WorkerGroup(c, Producer, 1, 1, name="slow")
        with pytest.raises(WorkerTimeout, match=r"slow\[rank 0\] failed in sleep\(\): no answer within 0.3 s "
                                                r"\(cluster.timeout_s\).*raise cluster.timeout_s if it is slow") as info:
            group.remote.sleep(3.0).wait()
        assert exit_code_of(info.value) == 5
        assert format_failure(info.value).startswith("Timed out (exit code 5): sleep() failed: no answer within 0.3 s")
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeout, match=r"no answer within 0.6 s \(cluster.phase_timeout_s\)"):
            group.remote.sleep(3.0).as_phase().wait()
        assert 0.5 < time.monotonic() - t0 < 2.5
        consumers = WorkerGroup(c, Consumer, 1, name="sink")
        for channel, seconds, key in ((Channel("obs", consumers, source="env"), "0.3", "cluster.timeout_s"),
                                      (Channel("batches", consumers, phase=True), "0.6", "cluster.phase_timeout_s")):
            with pytest.raises(WorkerTimeout) as info:
                consumers.remote.consume(channel, [0], 1).wait(timeout_s=5)
            assert f"ChannelTimeout: channel {channel.name!r} key 0: no answer within {seconds} s ({key})" in str(info.value)
            assert ("Worker group env is stuck or dead" in str(info.value)) == (channel.name == "obs")
        group.shutdown(), consumers.shutdown()


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError, match=r"cluster.timeout_s must be > 0 seconds \(got 0\)"):
        ClusterConfig(timeout_s=0)


def test_handle_passes_results_between_groups_without_the_driver(cluster):
    a = WorkerGroup(cluster, Producer, 1, 3, resources=half())
    b = WorkerGroup(cluster, Consumer, 1, resources=half())
    who = a.remote.whoami()
    assert b.remote.identity(who.handle(0)).result()[:2] == (0, 1)
    a.shutdown()
    b.shutdown()


def test_dead_worker_process_is_reported(ray_cluster):
    group = WorkerGroup(ray_cluster, Producer, 1, 1, name="doomed", resources=half())
    with pytest.raises(WorkerError, match=r"doomed\[rank 0\].*died"):
        group.remote.die().wait(timeout_s=60)


def test_socket_frames_round_trip_arrays_out_of_band():
    from embodied.runtime.socket_transport import decode, encode

    arr = np.arange(100_000, dtype=np.float32).reshape(100, 1000)
    frames = encode(("obs", 3, "producer", 7, {"rgb": arr, "n": 5}))
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == arr.nbytes  # the array travels as its own frame
    name, key, producer, seq, item = decode([bytearray(f) for f in frames])
    assert (name, key, producer, seq, item["n"]) == ("obs", 3, "producer", 7, 5)
    np.testing.assert_array_equal(item["rgb"], arr)


def test_ray_ranks_on_this_machine_receive_over_sockets(ray_cluster):
    from embodied.runtime.socket_transport import this_host

    consumers = WorkerGroup(ray_cluster, Consumer, 2, resources=half())
    endpoints = consumers.endpoints()
    assert all(e.address is not None and e.address[0] == this_host() for e in endpoints)
    assert len({e.address[1] for e in endpoints}) == 2
    consumers.shutdown()


def test_socket_inbox_close_refuses_new_producers():
    from embodied.runtime.mailbox import Mailbox
    from embodied.runtime.socket_transport import SocketInbox, SocketOutbox, inbox_of

    box = Mailbox()
    inbox = SocketInbox(box)
    assert inbox_of(box) is inbox and inbox_of(Mailbox()) is None
    SocketOutbox().send(inbox.path, ("c", 0, "p", 0, 7))
    assert box.get("c", 0, None, timeout_s=10) == 7
    inbox.close()
    assert inbox_of(box) is None
    with pytest.raises(OSError):  # a producer that connects now is refused, not silently served
        SocketOutbox().send(inbox.path, ("c", 0, "p", 1, 8))


def test_channel_falls_back_to_ray_when_the_socket_is_gone(ray_cluster):
    producers = WorkerGroup(ray_cluster, Producer, 1, 1, resources=half())
    consumers = WorkerGroup(ray_cluster, Consumer, 1, resources=half())
    (endpoint,) = consumers.endpoints()
    assert endpoint.address is not None  # a same-machine producer would use the socket...
    assert consumers.remote.close_socket_inbox().wait() == [True]  # ...which is now gone
    channel = Channel("data", consumers)
    c = consumers.remote.consume(channel, [0], 5)
    wait_all(c, producers.remote.produce(channel, 5, 1))
    assert c.result()[0] == [1000 + i for i in range(5)]
    producers.shutdown()
    consumers.shutdown()
