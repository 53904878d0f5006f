"""How long `make test`'s setup takes from nothing: a fresh venv set up by ``scripts/setup.sh`` with
each installer (uv, the default, and pip), timed, with the CPU-seconds the machine spent and
whether both installed the same versions.

    python -m benchmarks.setup_time [--profile full] [--installers uv pip] [--name setup_time]

Each run creates a new venv in a temporary directory (deleted after), so nothing is reused but
what the installers cache themselves; run it on a quiet machine (a fresh full setup is minutes
of CPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, cpu_times, result_path, save_result

ROOT = Path(__file__).resolve().parents[1]
INSTALLERS = ("uv", "pip")


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine has spent busy (:func:`benchmarks.common.cpu_times`, all but
    idle and iowait): an install's child processes (compilers, unpackers, uv's threads) count,
    which ``resource`` of one process misses."""
    ticks = cpu_times()
    if ticks is None:
        raise SystemExit("needs /proc/stat (Linux)")
    return sum(v for k, v in ticks.items() if k not in ("idle", "iowait")) / os.sysconf("SC_CLK_TCK")


def time_setup(installer: str, profile: str) -> dict[str, Any]:
    """One fresh setup with ``installer``: wall and busy CPU seconds, and its ``pip freeze``."""
    with tempfile.TemporaryDirectory(prefix="embodied-setup-") as tmp:
        venv = Path(tmp) / "venv"
        env = {**os.environ, "EMBODIED_INSTALLER": installer}
        cpu0, t0 = busy_cpu_s(), time.perf_counter()
        proc = subprocess.run(["bash", "scripts/setup.sh", str(venv), profile], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, busy_cpu_s() - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"setup with {installer} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        freeze = subprocess.run([str(venv / "bin/python"), "-m", "pip", "freeze", "--exclude-editable"],
                                capture_output=True, text=True, check=True).stdout.split()
        used = next((line for line in proc.stdout.splitlines() if line.startswith("[setup] installing with")), "")
    return {"installer": installer, "reported": used, "wall_s": round(wall, 1), "busy_cpu_s": round(cpu, 1),
            "packages": sorted(p for p in freeze if not p.lower().startswith("uv=="))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="full", choices=["train", "full"])
    parser.add_argument("--installers", nargs="+", default=list(INSTALLERS), choices=INSTALLERS)
    add_output_args(parser, "setup_time")
    args = parser.parse_args(argv)
    if shutil.which("bash") is None:
        raise SystemExit("needs bash")
    runs = [time_setup(installer, args.profile) for installer in args.installers]
    for run in runs:
        print(f"{run['installer']:>4}: {run['wall_s']:6.1f} s wall, {run['busy_cpu_s']:6.1f} CPU-s, "
              f"{len(run['packages'])} packages  ({run['reported']})")
    same = len({tuple(r["packages"]) for r in runs}) == 1
    print(f"same versions installed: {same}")
    result = {"profile": args.profile, "same_packages": same,
              "runs": [{k: v for k, v in r.items() if k != "packages"} | {"num_packages": len(r["packages"])} for r in runs]}
    save_result(result_path("setup_time", args), "setup_time", argv, result)
    return result


if __name__ == "__main__":
    main()
