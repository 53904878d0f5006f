"""The run's watchdog: once the driver ends, however it ends, nothing it started keeps running;
processes of other runs are left alone; a clean end is silent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog reads /proc")

REPO = Path(__file__).resolve().parents[2]

# A "driver": starts the watchdog, then a child that ignores SIGTERM and a grandchild (a shell
# running sleep, as a simulator process would), prints their pids and the watchdog's, then waits.
DRIVER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from embodied.runtime.watchdog import start_watchdog
    watchdog = start_watchdog(grace_s=0.5)
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    shell = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    print(watchdog.pid, stubborn.pid, shell.pid, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
    stubborn.kill(); os.killpg(shell.pid, signal.SIGKILL); stubborn.wait(); shell.wait()
""")


def _start(mode: str) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    deadline = time.monotonic() + 10  # the shell has started its sleep
    while mode == "hang" and not psutil.Process(pids[2]).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, pids


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_driver_leaves_nothing_running():
    bystander = subprocess.Popen(["sleep", "600"])  # not of the run: must survive
    try:
        driver, (watchdog, stubborn, shell) = _start("hang")
        grandchildren = [c.pid for c in psutil.Process(shell).children()]
        assert grandchildren and all(_running(p) for p in (watchdog, stubborn, shell, *grandchildren))
        driver.send_signal(signal.SIGKILL)
        _, err = driver.communicate(timeout=30)  # stderr closes when the watchdog is done too
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in (watchdog, stubborn, shell, *grandchildren)):
            time.sleep(0.1)
        left = [p for p in (watchdog, stubborn, shell, *grandchildren) if _running(p)]
        assert not left, f"still running: {left}"
        assert f"the run's driver (pid {driver.pid}) has ended; stopped 3 process(es)" in err, err
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_clean_end_is_silent():
    driver, (watchdog, *_) = _start("exit")
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 0 and err == ""
    psutil.Process(watchdog).wait(timeout=10) if _running(watchdog) else None
    assert not _running(watchdog)


def test_a_raylet_caught_before_its_exec_is_learned_once_it_runs(tmp_path):
    """A child read between fork and exec shows this process's command line; once it has become
    the raylet, the next look learns it and the processes it starts."""
    from embodied.runtime.watchdog import RayNodes

    raylet = tmp_path / "raylet"  # a program named like Ray's (a shell), which starts a child ("an agent")
    raylet.symlink_to("/bin/sh")
    go_r, go_w = os.pipe()
    pid = os.fork()  # Popen would return only after the exec
    if pid == 0:
        try:
            os.close(go_w)
            os.read(go_r, 1)  # exec once the test has looked
            os.execv(str(raylet), [str(raylet), "-c", "sleep 600 & wait"])
        finally:
            os._exit(127)
    os.close(go_r)
    child = psutil.Process(pid)
    try:
        nodes = RayNodes()
        # this process's children: the child, and a Ray node an earlier test of this process started
        nodes.learn(os.getpid())  # the child has not exec'd yet
        assert pid not in nodes.raylets
        os.write(go_w, b"x")
        deadline = time.monotonic() + 10
        agents: set[int] = set()
        while not agents and time.monotonic() < deadline:
            time.sleep(0.1)
            nodes.learn(os.getpid())
            agents = {p for p in nodes.still_running() if psutil.Process(p).ppid() == pid}
        assert pid in nodes.raylets
        assert agents == {c.pid for c in child.children()}
    finally:
        for p in child.children():
            p.kill()
        child.kill()
        os.waitpid(pid, 0)
        os.close(go_w)
