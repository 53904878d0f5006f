"""Run a script on a disk that fills up: a real full file system where the machine allows it.

``run_on_small_disk(script, size_kib)`` runs ``python -c script DIR`` where DIR is

* a tmpfs of ``size_kib`` KiB mounted in a private mount namespace (``unshare -rm``): writes past
  its size fail with ENOSPC, exactly as on a full disk; or, where unprivileged namespaces are not
  allowed,
* a temp dir with the process's file size limit (RLIMIT_FSIZE) at ``size_kib`` KiB: writing a
  file past it fails with EFBIG (SIGXFSZ ignored), after a short write, like a disk filling up.

The script prints its findings (the files live only as long as it runs)."""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"],
                               capture_output=True, timeout=30)
    return probe.returncode == 0


def run_on_small_disk(script: str, size_kib: int, timeout: float = 120) -> tuple[subprocess.CompletedProcess, str]:
    """(the finished process, which limit was used: ``"ENOSPC"`` or ``"EFBIG"``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as d:
        if tmpfs_available():
            cmd = ["unshare", "-rm", "sh", "-c",
                   f'mount -t tmpfs -o size={size_kib}k tmpfs "$1" && exec "$2" -c "$3" "$1"',
                   "sh", d, sys.executable, script]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout), "ENOSPC"

        def limit() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size_kib * 1024, size_kib * 1024))

        cmd = [sys.executable, "-c", script, d]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=limit), "EFBIG"
