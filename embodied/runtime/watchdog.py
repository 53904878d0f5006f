"""The run's watchdog: a small process that outlives a killed driver and stops what the run started.

A driver killed with ``kill -9`` (or by the out-of-memory killer) runs no ``finally`` block: the
processes it started stay. Ray's GCS and raylet notice at once and its workers within seconds,
but Ray's dashboard and runtime-env agents keep running (and listening) for about a minute, and an
env process stuck in a simulator never notices at all.

:func:`start_watchdog` (the ``embodied train`` command calls it first) gives this process a fresh
run token in the environment variable ``EMBODIED_RUN_TOKEN``, which every process started from
then on inherits: env processes, the local Ray's GCS, raylet and agents, and every Ray worker
(``Cluster`` also passes it on to the workers of a cluster it joins). It starts this module as a
script in its own session (Ctrl-C to the terminal's process group does not reach it; it
imports only the standard library). The watchdog waits for the driver to end, however it ends
(``pidfd_open``, or polling its parent), learning meanwhile the session of the Ray node the
driver starts (its GCS and raylet are the driver's children) and the processes its raylet starts
(Ray's agents overwrite their environment with their title); then it stops every process whose
environment holds the token, that the raylet started, or whose command line names that
session, that did not end by
itself within a second: SIGTERM, then SIGKILL after ``grace_s``. After a clean end nothing is
left and it exits quietly; otherwise it writes one line to stderr naming what it stopped.

Linux only (it reads ``/proc``); elsewhere :func:`start_watchdog` returns None.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

#: Environment variable holding the run's token (inherited by every process the run starts).
RUN_TOKEN_ENV = "EMBODIED_RUN_TOKEN"
#: Seconds between SIGTERM and SIGKILL for the run's leftover processes.
GRACE_S = 2.0

_SESSION = re.compile(r"(session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+)")
_started: subprocess.Popen | None = None


def start_watchdog(grace_s: float = GRACE_S) -> subprocess.Popen | None:
    """Tag this process's future children with a new run token and start the watchdog that
    stops them once this process ends (see the module docstring). Returns the watchdog process,
    or None where it cannot run (not Linux). Call it before starting any process of the run."""
    global _started
    if not sys.platform.startswith("linux") or not Path("/proc/self/environ").exists():
        return None
    token = uuid.uuid4().hex
    os.environ[RUN_TOKEN_ENV] = token
    env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}  # the watchdog spares itself anyway
    _started = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid()), token, str(grace_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True,
    )
    return _started


# --- the watchdog process (standard library only) -----------------------------------------------


class RayNodes:
    """What the watchdog learns while the driver lives about the Ray node it started: the
    session name (in its processes' command lines), and the processes its raylet starts (Ray's
    agents rewrite their whole command line and environment with their process title, so
    neither the run token nor the session can be read from them later)."""

    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.raylets: set[int] = set()
        self.started: dict[int, bytes] = {}
        """Processes the raylet started: pid -> start time (``/proc/PID/stat`` field 22)."""

    def learn(self, driver: int) -> None:
        """Look at the driver's children (its GCS and raylet) and at the raylet's (agents, workers).
        A child is read again each time until it is a raylet: a child caught between fork and
        exec still shows the driver's command line."""
        for pid in children_of(driver):
            if pid in self.raylets:
                continue
            cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            program = cmd.split(" ", 1)[0]
            if program.endswith(("gcs_server", "raylet")):
                self.sessions.update(_SESSION.findall(cmd))
            if program.endswith("raylet"):
                self.raylets.add(pid)
        for raylet in self.raylets:
            for pid in children_of(raylet):
                if pid not in self.started:
                    self.started[pid] = start_time(pid)

    def still_running(self) -> set[int]:
        """The processes the raylet started that still run (the same ones: start times match)."""
        return {pid for pid, t in self.started.items() if t and start_time(pid) == t and _alive(pid)}


def start_time(pid: int) -> bytes:
    """``pid``'s start time since boot (b"" when it is gone): with the pid, it names one process."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rindex(b")") + 2 :].split() if stat else []
    return fields[19] if len(fields) > 19 else b""


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux 3.5+: ``/proc/PID/task/TID/children``)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        out.extend(int(x) for x in _read(f"/proc/{pid}/task/{tid}/children").split())
    return out


def wait_for_exit(pid: int, nodes: RayNodes, every_s: float = 1.0) -> None:
    """Block until process ``pid`` (this process's parent) has ended, learning its Ray nodes
    every ``every_s`` meanwhile."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Python < 3.9, Linux < 5.3) or already gone
        while os.getppid() == pid:
            nodes.learn(pid)
            time.sleep(every_s)
        return
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    nodes.learn(pid)
    while not poller.poll(int(every_s * 1000)):
        nodes.learn(pid)
    os.close(fd)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and stat[stat.rindex(b")") + 2 :][:1] != b"Z"


def processes_of(token: str, nodes: RayNodes, spare: set[int]) -> dict[int, str]:
    """The running processes of the run with ``token`` (``{pid: name}``): those whose
    environment holds the token, those of the Ray node the driver started (its session in the
    command line) and those its raylet started."""
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    ray = nodes.still_running()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spare:
            continue
        pid = int(entry)
        cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        if pid in ray or any(s in cmd for s in nodes.sessions) or needle in _read(f"/proc/{pid}/environ").split(b"\0"):
            if _alive(pid):
                found[pid] = _read(f"/proc/{pid}/comm").decode(errors="replace").strip()
    return found


def stop(pids: dict[int, str], grace_s: float) -> None:
    """SIGTERM every process of ``pids``, SIGKILL those still running after ``grace_s``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


#: Seconds the run's processes get to end by themselves after the driver (after a clean end the
#: driver's forkserver and resource tracker exit on their own within milliseconds).
SETTLE_S = 1.0


def reap(token: str, nodes: RayNodes, grace_s: float, settle_s: float = SETTLE_S) -> dict[int, str]:
    """Stop every process of the run still running ``settle_s`` after the driver ended (a few
    rounds: a dying process may have started another); returns what was stopped."""
    deadline = time.monotonic() + settle_s
    while processes_of(token, nodes, spare={os.getpid()}) and time.monotonic() < deadline:
        time.sleep(0.1)
    stopped: dict[int, str] = {}
    for _ in range(3):
        left = processes_of(token, nodes, spare={os.getpid()})
        if not left:
            break
        stopped.update(left)
        stop(left, grace_s)
    return stopped


def main(argv: list[str]) -> int:
    driver, token, grace_s = int(argv[0]), argv[1], float(argv[2]) if len(argv) > 2 else GRACE_S
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    nodes = RayNodes()
    if os.getppid() == driver:
        wait_for_exit(driver, nodes)
    stopped = reap(token, nodes, grace_s)
    if stopped:
        names = sorted(set(stopped.values()))
        try:
            sys.stderr.write(f"embodied: the run's driver (pid {driver}) has ended; stopped {len(stopped)} process(es) "
                             f"it had started: {', '.join(names)}\n")
            sys.stderr.flush()
        except OSError:  # the terminal is gone
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
