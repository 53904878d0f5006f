"""Profiling and the workers' start are not silent: a run shows which probe runs (i of n) and when
its workers start; a Ctrl-C while it profiles ends the run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[2]
TINY = ("cartpole_ppo", "algo.total_env_steps=1024", "env.num_envs=4", "algo.rollout_steps=128", "logging.wandb=false",
        "logging.tensorboard=false", "eval.episodes=1", "plan.profile=true", "plan.reprofile=true", "plan.calibrate=0")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": fresh_cache(), "WANDB_MODE": "offline"}
    for key in ("RAY_AUTH_MODE", "EMBODIED_DEBUG", "EMBODIED_RUN_DIR", "EMBODIED_RUN_TOKEN"):
        env.pop(key, None)
    return env


def test_a_profiled_run_shows_each_probe_and_the_workers_start(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", *TINY, f"run.dir={tmp_path / 'run'}"],
                            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    probes = [line for line in lines if line.startswith("[m2flow] profiling ") and "/5: " in line]
    assert [p.split(":")[0] for p in probes] == [f"[m2flow] profiling {i}/5" for i in range(1, 6)], result.stderr
    assert "the env (4 shapes of CartPole-v1" in probes[0] and "the trainer" in probes[3]
    assert not any(line.startswith("  env     batch") for line in lines)  # the measurements go to the log only
    assert "  env     batch" in (tmp_path / "run" / "logs" / "driver.log").read_text()
    order = [next(i for i, line in enumerate(lines) if line.startswith(prefix))
             for prefix in ("[m2flow] profiling 1/5", "[m2flow] profiled in", "[embodied] starting the workers",
                            "[embodied] workers started in", "[train] ")]
    assert order == sorted(order), result.stderr


def test_ctrl_c_while_profiling_ends_the_run_at_once(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-u", "-m", "pipelines.cli", "train", *TINY, f"run.dir={run}"], cwd=ROOT,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    try:
        for line in proc.stderr:  # the run is profiling once its first probe started
            seen.append(line)
            if line.startswith("[m2flow] profiling 1/5"):
                break
        time.sleep(1.0)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        code = proc.wait(timeout=60)
        took_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(seen) + rest
    assert code == 130, text
    assert "SIGINT: aborting now" in text and "It happened while profiling and planning" in text.replace("\n", " "), text
    assert "stopping after the current iteration" not in text
    assert took_s < 30, took_s  # Ray and the probe's workers shut down: seconds, not the profile's minute
    log = (run / "logs" / "driver.log").read_text()
    assert "KeyboardInterrupt" in log
