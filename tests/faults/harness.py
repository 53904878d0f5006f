"""Running `python -m pipelines.cli train ...` as a user would, injecting faults, and checking what
it leaves: the terminal, the exit code, the run's files, and every process it started.

:class:`Run` starts the CLI in its own session (``start_new_session=True``, like a terminal job)
and watches its process tree from the outside while it runs (psutil, every 0.2 s), so that after
the end :meth:`Run.leftovers` can name anything of the run still running: a process seen in the
tree, or any process whose command line names the run dir or its Ray session, or whose
environment names the run dir. None of it relies on the watchdog's own bookkeeping.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[2]
#: Profiles measured once for the whole suite.
CACHE = fresh_cache("embodied-faults-cache-")
FAULTY_ENV = "tests.faults.faulty_env:FaultyCartPole"
#: A tiny CartPole run on the faulty env: 4 envs, 128 env steps per iteration, one eval episode.
TINY = [
    "cartpole_ppo", f"env.id={FAULTY_ENV}", "env.num_envs=4", "algo.rollout_steps=32", "env.max_episode_steps=200",
    "algo.epochs=2", "logging.wandb=false", "eval.episodes=1", "eval.num_envs=1", "plan.profile=false",
]
STEPS_PER_ITERATION = 4 * 32
_SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")


def cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": CACHE, "WANDB_MODE": "offline"}
    for key in ("EMBODIED_DEBUG", "EMBODIED_RUN_DIR", "EMBODIED_LOG_LABEL", "EMBODIED_RUN_TOKEN", "RAY_ADDRESS"):
        env.pop(key, None)
    return env


class Run:
    """One ``embodied train`` process (see the module docstring)."""

    def __init__(self, run_dir: Path, *args: str, tmp: Path) -> None:
        self.run_dir = Path(run_dir)
        self.args = args
        self.out_path, self.err_path = tmp / f"{self.run_dir.name}-{id(self)}.out", tmp / f"{self.run_dir.name}-{id(self)}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "train", *args], cwd=ROOT, env=cli_env(),
            stdout=self._out, stderr=self._err, start_new_session=True,
        )
        self.seen: dict[int, tuple[float, str]] = {}  # pid -> (create time, name) of every process of the tree
        self.sessions: set[str] = set()
        self.listening: set[tuple[str, str]] = set()  # (process name, address) of every listening TCP socket
        self._stop = threading.Event()
        self._tracker = threading.Thread(target=self._track, daemon=True)
        self._tracker.start()

    # --- watching ------------------------------------------------------------------------------
    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _track(self) -> None:
        while not self._stop.is_set():
            for p in self.tree():
                try:  # names change (a process sets its title after it starts): keep the latest
                    self.seen[p.pid] = (p.create_time(), p.name())
                    self.sessions.update(_SESSION.findall(" ".join(p.cmdline())))
                except psutil.Error:
                    pass
            self._stop.wait(0.2)

    def record_listening(self) -> None:
        """Every listening TCP socket of the run's processes now."""
        pids = {p.pid: p for p in self.tree()}
        for c in psutil.net_connections(kind="inet"):
            if c.pid in pids and c.status == psutil.CONN_LISTEN:
                try:
                    self.listening.add((pids[c.pid].name(), c.laddr.ip))
                except psutil.Error:
                    pass

    def find(self, name: str, timeout_s: float = 60) -> psutil.Process:
        """A process of the run whose name (psutil: the full title) starts with ``name``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.tree():
                try:
                    if p.name().startswith(name) or " ".join(p.cmdline()).startswith(name):
                        return p
                except psutil.Error:
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no process {name!r} in the run's tree: {[p.name() for p in self.tree()]}\n{self.stderr}")

    def rows(self) -> list[dict[str, Any]]:
        return read_rows(self.run_dir)

    def wait_rows(self, n: int, timeout_s: float = 180) -> None:
        """Wait until ``metrics.jsonl`` holds ``n`` rows (the run is mid-training)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.proc.returncode}) before {n} rows:\n{self.stderr}")
            try:
                if len(self.rows()) >= n:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"no {n} rows within {timeout_s} s:\n{self.stderr}")

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and text not in self.stderr:
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        assert text in self.stderr, f"{text!r} not on the terminal:\n{self.stderr}"

    # --- acting --------------------------------------------------------------------------------
    def kill(self, process: psutil.Process | None = None, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``process`` (default: the CLI itself)."""
        os.kill(process.pid if process is not None else self.proc.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the CLI's process group, as a terminal's Ctrl-C does."""
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout_s: float = 240) -> int:
        """Wait for the CLI to exit; its exit code."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the run did not end within {timeout_s} s:\n{self.stderr}") from None
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    @property
    def terminal(self) -> str:
        return self.stdout + self.stderr

    def paragraph(self) -> str:
        """The failure paragraph on the terminal, on one line."""
        text = self.stderr
        start = text.rfind("embodied: error: ")
        assert start >= 0, f"no failure paragraph on the terminal:\n{text}"
        return " ".join(text[start:].split())

    # --- what is left --------------------------------------------------------------------------
    def leftovers(self, within_s: float = 15) -> list[str]:
        """The run's processes still running ``within_s`` after the CLI ended (none: [])."""
        self._stop.set()
        self._tracker.join()
        deadline = time.monotonic() + within_s
        while True:
            left = self._still_running()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.3)

    def _still_running(self) -> list[str]:
        left = []
        run_dir = str(self.run_dir.resolve())
        for p in psutil.process_iter(["pid", "name", "create_time", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                    continue
                known = self.seen.get(p.pid)
                why = None
                if known is not None and abs(known[0] - p.info["create_time"]) < 0.01:
                    why = "in the run's process tree"
                else:
                    cmd = " ".join(p.cmdline())
                    if any(s in cmd for s in self.sessions) or str(self.run_dir) in cmd:
                        why = "its command line names the run"
                    elif p.environ().get("EMBODIED_RUN_DIR") == run_dir:
                        why = "its environment names the run dir"
                if why:
                    left.append(f"{p.pid} {p.info['name']} ({why})")
            except psutil.Error:
                pass
        return left

    def close(self) -> None:
        """Make sure nothing of this run outlives the test (whatever the test asserted)."""
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for entry in self._still_running():
            try:
                psutil.Process(int(entry.split()[0])).kill()
            except psutil.Error:
                pass
        self._out.close()
        self._err.close()


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_every_iteration_once(run_dir: Path, iterations: int | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl: complete rows 1..N, each iteration exactly once, env steps increasing;
    TensorBoard: one value per step, the same steps."""
    text = (Path(run_dir) / "metrics.jsonl").read_text()
    assert text.endswith("\n"), "metrics.jsonl ends in a torn line"
    rows = read_rows(run_dir)
    its = [r["iteration"] for r in rows]
    assert its == list(range(1, len(rows) + 1)), f"iterations in metrics.jsonl: {its}"
    if iterations is not None:
        assert len(rows) == iterations, its
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(set(steps)), steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("iteration")
    assert [e.step for e in events] == steps, ([e.step for e in events], steps)
    assert [int(e.value) for e in events] == its
    return rows


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run, for "untouched" checks."""
    return {str(p): p.read_bytes() for p in sorted(Path(run_dir).rglob("*")) if p.is_file()}


def cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """A short CLI call that is expected to end by itself."""
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
