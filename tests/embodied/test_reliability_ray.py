"""The runtime on real Ray: actors named after their worker class, group and rank; each worker's
output in its own log file; failures that say where they happened; a local Ray that listens on
loopback only and keeps the terminal quiet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest
import ray

from embodied import logs
from embodied.errors import exit_code_of, format_failure, storage_error
from embodied.runtime import (
    ChannelTimeout,
    Cluster,
    ClusterConfig,
    RankResources,
    Worker,
    WorkerError,
    WorkerGroup,
    WorkerTimeout,
)

REPO = Path(__file__).resolve().parents[2]


def half() -> RankResources:
    return RankResources(num_cpus=0.5)


class EnvWorker(Worker):
    def __init__(self) -> None:
        print(f"rank {self.rank} starting")
        warnings.warn("float64 obs cast to float32", UserWarning)

    def pid(self) -> int:
        return os.getpid()

    def fail(self) -> None:
        err = ValueError("the simulator returned NaN")
        err.env_index, err.seed = 3, 1234  # what an env worker knows about where it failed
        raise err

    def die(self) -> None:
        os._exit(1)

    def disk_full(self) -> None:
        import errno

        raise storage_error("Writing the frame buffer", "/videos/x.mp4", OSError(errno.ENOSPC, "No space left on device"))

    def wait_for_nothing(self) -> None:
        raise ChannelTimeout("no message on 'actions' key 0 within 0.1 s")


def _title(pid: int) -> tuple[str, str]:
    """(comm, first cmdline word) of a process once Ray has set its idle title."""
    proc = psutil.Process(pid)
    for _ in range(50):
        name, cmd = proc.name(), proc.cmdline()[0]
        if "." not in name:  # "ray::EnvWorker.call" while a call runs
            return name, cmd
        time.sleep(0.05)
    return name, cmd


def test_actors_are_named_after_class_group_and_rank(ray_cluster):
    group = WorkerGroup(ray_cluster, EnvWorker, 2, name="env", resources=half())
    try:
        assert group.actor_names == ["env:0", "env:1"]
        assert {"env:0", "env:1"} <= set(ray.util.list_named_actors())
        for pid in group.remote.pid().wait():
            name, cmd = _title(pid)
            assert name == "ray::EnvWorker" and cmd == "ray::EnvWorker"
        assert ray.get_actor("env:1") is not None
    finally:
        group.shutdown()


def test_a_group_name_taken_in_this_session_gets_a_suffix(ray_cluster):
    first = WorkerGroup(ray_cluster, EnvWorker, 1, name="rollout", resources=half())
    second = WorkerGroup(ray_cluster, EnvWorker, 1, name="rollout", resources=half())
    try:
        assert first.actor_names == ["rollout:0"] and second.actor_names == ["rollout#2:0"]
        assert second.remote.pid().result() != first.remote.pid().result()
    finally:
        first.shutdown()
        second.shutdown()


def test_each_actor_writes_its_own_log_and_failures_say_where(ray_cluster, tmp_path):
    cluster = Cluster(ClusterConfig(backend="ray", timeout_s=60), run_dir=tmp_path)  # the running Ray, with a run dir
    group = WorkerGroup(cluster, EnvWorker, 1, name="sim", resources=half())
    try:
        assert group.log_paths == [tmp_path / "logs" / "sim-0.log"]
        pid = group.remote.pid().result()
        with pytest.raises(WorkerError) as info:
            group.remote.fail().wait()
        err = info.value
        assert exit_code_of(err) == 3
        assert err.where == {"group": "sim", "rank": 0, "node": group.locations[0].node, "pid": pid,
                             "env_index": 3, "seed": 1234, "log": str(tmp_path / "logs" / "sim-0.log")}
        assert group.locations[0].pid == pid
        assert f"Its output is in {tmp_path / 'logs' / 'sim-0.log'}." in format_failure(err)
    finally:
        group.shutdown()
    text = (tmp_path / "logs" / "sim-0.log").read_text()
    for needle in ("--- sim-0: pid", "rank 0 starting", "float64 obs cast to float32",
                   "raised ValueError: the simulator returned NaN", "Traceback (most recent call last)"):
        assert needle in text, needle


def test_a_dead_worker_is_reported_with_its_node_and_pid(ray_cluster):
    group = WorkerGroup(ray_cluster, EnvWorker, 1, name="doomed-env", resources=half())
    pid = group.remote.pid().result()
    with pytest.raises(WorkerError, match=r"doomed-env\[rank 0\].*died") as info:
        group.remote.die().wait()
    assert info.value.where["pid"] == pid and info.value.where["node"] == group.locations[0].node
    group.shutdown()


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_worker_keeps_the_kind_of_its_failure(ray_cluster, backend):
    """A full disk inside a worker exits 4 and a wait that timed out inside it exits 5, like the
    same failures in the driver; anything else a worker raises exits 3."""
    cluster = ray_cluster if backend == "ray" else Cluster(ClusterConfig(backend="local", timeout_s=30))
    group = WorkerGroup(cluster, EnvWorker, 1, name=f"kinds-{backend}", resources=half())
    try:
        with pytest.raises(WorkerError) as full:
            group.remote.disk_full().wait()
        assert exit_code_of(full.value) == 4
        assert format_failure(full.value).startswith(
            "Storage failed (exit code 4): disk_full() failed: StorageError: Writing the frame buffer failed at "
            "/videos/x.mp4: No space left on device")
        with pytest.raises(WorkerTimeout) as slow:
            group.remote.wait_for_nothing().wait()
        assert exit_code_of(slow.value) == 5
        with pytest.raises(WorkerError) as bug:
            group.remote.fail().wait()
        assert exit_code_of(bug.value) == 3
    finally:
        group.shutdown()


FRESH_CLUSTER = textwrap.dedent("""
    import json, os, signal, sys
    import psutil
    from pathlib import Path
    from embodied import logs
    from embodied.errors import exit_on_signals
    from embodied.runtime import Cluster, ClusterConfig, RankResources, WorkerGroup
    from tests.embodied.test_reliability_ray import EnvWorker

    run_dir = Path(sys.argv[1])
    out = {}
    with exit_on_signals(), logs.open_run_log(run_dir):
        ours = signal.getsignal(signal.SIGTERM)
        with Cluster(ClusterConfig(backend="ray", num_cpus=1, timeout_s=120), run_dir=run_dir) as cluster:
            out["sigterm_kept"] = signal.getsignal(signal.SIGTERM) is ours
            group = WorkerGroup(cluster, EnvWorker, 1, name="env", resources=RankResources(num_cpus=0.5))
            out["actor_pid"] = group.remote.pid().result()
            me = psutil.Process()
            procs = [me] + me.children(recursive=True)
            pids = {p.pid: p.name() for p in procs}
            out["processes"] = sorted(set(pids.values()))
            out["cmdlines"] = [" ".join(p.cmdline()) for p in procs]
            out["listening"] = sorted(
                {(pids[c.pid], c.laddr.ip) for c in psutil.net_connections(kind="inet")
                 if c.pid in pids and c.status == psutil.CONN_LISTEN})
    print(json.dumps(out))
""")


@pytest.fixture
def another_ray_on_this_machine():
    """A `ray start --head` cluster of someone else's, running while the test does (the way a
    second user's run or a lab's head node sits beside a run); stopped with its own process group."""
    ray_cli = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", "--port=0", "--num-cpus=1", "--node-ip-address=127.0.0.1",
         "--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not any(p.name() == "gcs_server" for p in psutil.Process(head.pid).children(recursive=True)):
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.5)
        yield head.pid
    finally:
        # Ctrl-C, as its user would stop it: `ray start --block` exits in ~3 s on SIGINT, while on
        # SIGTERM to its group it outlives a 30 s wait
        os.killpg(head.pid, signal.SIGINT)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)


@pytest.mark.slow
def test_a_fresh_local_ray_listens_on_loopback_only_and_keeps_the_terminal_quiet(tmp_path, another_ray_on_this_machine):
    """A new local cluster (its own process: Ray starts once per process), even with another Ray
    cluster running on the machine (ray.init() alone would join that one): every TCP socket
    listening in the driver or a Ray process it started is bound to loopback; Ray's token notice
    and the workers' output go to the run's log files, not the terminal; Ray keeps the program's
    SIGTERM handler."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("RAY_AUTH_MODE", logs.DEBUG_ENV, logs.RUN_DIR_ENV, "RAY_ADDRESS"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-c", FRESH_CLUSTER, str(tmp_path)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"gcs_server", "raylet", "ray::EnvWorker"} <= set(out["processes"])
    # a run dir (no log streaming to the driver) and one machine: no log monitor, no autoscaler monitor
    assert not [c for c in out["cmdlines"] if "log_monitor.py" in c or "autoscaler/_private/monitor.py" in c], out["cmdlines"]
    assert out["listening"], "no listening socket found: is psutil able to see them?"
    for name, ip in out["listening"]:
        assert ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1"), f"{name} listens on {ip}"
    assert out["sigterm_kept"]
    terminal = result.stdout + result.stderr
    assert "Token authentication" not in terminal and "rank 0 starting" not in terminal
    assert "float64 obs cast" not in terminal
    driver_log = (tmp_path / "logs" / "driver.log").read_text()
    assert "Token authentication is enabled" in driver_log
    worker_log = (tmp_path / "logs" / "env-0.log").read_text()
    assert "rank 0 starting" in worker_log and "float64 obs cast to float32" in worker_log
