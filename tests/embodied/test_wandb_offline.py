"""An offline wandb run attempts no network connection (only loopback and Unix sockets to its own
``wandb-core`` service), and starts that service without error reporting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parents[2]

#: Runs in a fresh interpreter: an audit hook records every name lookup and every connect to a
#: non-loopback address, and the command line of every process started, then a MetricsLogger
#: logs three iterations to an offline wandb run.
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    attempts, processes = [], []

    def audit(event, args):
        if event == "socket.getaddrinfo" and args[0] not in ("localhost", "127.0.0.1", "::1", None):
            attempts.append(f"lookup {args[0]}:{args[1]}")
        elif event == "socket.connect" and isinstance(args[1], tuple) and args[1][0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(f"connect {args[1]}")
        elif event == "subprocess.Popen":
            processes.append([str(a) for a in (args[1] or [])])

    sys.addaudithook(audit)
    from embodied.metrics import MetricsLogger

    run_dir, mode = Path(sys.argv[1]), sys.argv[2] or None
    run_dir.mkdir()
    with MetricsLogger(run_dir, {"seed": 0}, tensorboard=False, wandb=True, wandb_mode=mode) as logger:
        for i in range(3):
            logger.log({"iteration": i + 1, "env_steps": 8 * (i + 1), "train/loss": 1.0 / (i + 1)})
        logger.summary({"env_steps": 24})
    print(json.dumps({"attempts": attempts, "processes": processes}))
""")


@pytest.mark.parametrize("mode, environ", [("offline", {}), ("", {}), ("", {"WANDB_MODE": "offline"})],
                         ids=["wandb_mode=offline", "project default", "WANDB_MODE=offline"])
def test_offline_wandb_attempts_no_network_connection(tmp_path, mode, environ):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run"), mode], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["attempts"] == [], seen["attempts"]
    core = [p for p in seen["processes"] if p and p[0].endswith("wandb-core")]
    assert core and all("--no-observability" in p for p in core), seen["processes"]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "the offline run was written"
