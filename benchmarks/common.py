"""Helpers shared by the benchmarks: where a result goes, what it records about how and where it
ran, and the host's speed around a measurement.

Every benchmark writes one JSON result, ``benchmarks/results/<benchmark>[_<variant>][_<name>].json``
(:func:`result_path`: ``<variant>`` is a mode of the benchmark, such as ``quick``; ``--name`` adds a
name of the user's; ``--out PATH`` writes it elsewhere), with the command that ran it, the machine
and the commit (:func:`save_result`); a picture it draws goes beside it (:func:`beside`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine_info() -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "ray", "gymnasium", "mujoco", "mani_skill", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        gpu = None
    from embodied.profiler import hardware_fingerprint

    return {
        "cpu_cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        # the model and vector units: hosts of one size differ 3-4x in speed and in their
        # floating-point sums (docs/benchmarks.md), so every result says which one it ran on
        "cpu_model": hardware_fingerprint()["cpu"],
        "cpu_vector_units": cpu_vector_units(),
        "gpu": gpu,
        "python": platform.python_version(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d"),
    }


def commit_info() -> dict[str, Any]:
    """The commit of this checkout and whether its tracked files had changes (``None`` each outside
    a git checkout): which code a result measured."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if commit is not None else None
    return {"commit": commit, "dirty": None if changes is None else bool(changes)}


def add_output_args(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """``--name`` and ``--out``, the options of where ``benchmark``'s result goes (:func:`result_path`)."""
    parser.add_argument("--name", default=None,
                        help=f"a name for this result: benchmarks/results/{benchmark}[_<variant>]_<NAME>.json")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the result JSON to this path instead (its pictures beside it)")


def result_path(benchmark: str, args: argparse.Namespace, variant: str | None = None) -> Path:
    """Where ``benchmark``'s result goes: ``args.out`` when given, else
    ``RESULTS/<benchmark>[_<variant>][_<args.name>].json`` (a name that already starts with the
    benchmark's stem is not repeated: ``--name m2flow_sweep_quiet`` is ``m2flow_sweep_quiet.json``)."""
    if getattr(args, "out", None) is not None:
        return Path(args.out)
    stem = "_".join(part for part in (benchmark, variant) if part)
    name = getattr(args, "name", None)
    if name:
        stem = name if name == stem or name.startswith(f"{stem}_") else f"{stem}_{name}"
    return RESULTS / f"{stem}.json"


def beside(path: Path, suffix: str) -> Path:
    """The file beside the result ``path`` that shares its stem: ``beside(results/x.json, ".png")``
    is ``results/x.png``, ``"_timeline.png"`` gives ``results/x_timeline.png``. Its folder is made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(path.stem + suffix)


def save_result(path: Path, benchmark: str, argv: Sequence[str] | None, result: dict[str, Any],
                also: Sequence[Path] = ()) -> Path:
    """Write ``result`` to ``path`` as JSON after what every result records (the benchmark, the
    command that ran it: :func:`command_of`, :func:`machine_info`, :func:`commit_info`), and print
    where it went (and the files ``also`` written beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"benchmark": benchmark, "command": command_of(benchmark, argv), "machine": machine_info(),
            "commit": commit_info()}
    path.write_text(json.dumps({**head, **result}, indent=2) + "\n")
    print("wrote " + " and ".join(str(p) for p in (path, *also)), flush=True)
    return path


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` to ``RESULTS/<name>.json`` with the machine and the commit it ran on."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), "commit": commit_info(), **result}, indent=2) + "\n")
    return path


def cpu_vector_units() -> list[str]:
    """The SIMD extensions of this CPU that change which kernels torch runs (Linux; else [])."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]


def command_of(benchmark: str, argv: Sequence[str] | None) -> str:
    """The command that ran ``benchmarks.<benchmark>`` with ``argv`` (None: this process's own
    arguments, as ``main()`` called from the shell gets them)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python -m", f"benchmarks.{benchmark}", *args])


def host_reference_s(repeats: int = 5) -> float:
    """Seconds of a fixed one-thread workload (a chain of 192 x 192 float32 matmuls and tanh,
    ~50-70 ms), the median of ``repeats``: the host's one-core speed at this moment. Shared vCPUs
    drift by 20-30% within minutes (clocks, steal, neighbours); timed next to two measurements
    minutes apart, it says how much of their difference that speed explains."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(192, 192, generator=gen) / 14.0
        x = torch.randn(192, 192, generator=gen)
        samples = []
        for _ in range(repeats):
            y = x
            start = time.perf_counter()
            for _ in range(300):
                y = torch.tanh(a @ y)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)
    finally:
        torch.set_num_threads(threads)


_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int] | None:
    """This machine's CPU time so far, all cores, in clock ticks by kind (``/proc/stat``; None
    where there is none). ``steal`` is the time a VM's vCPUs were ready but the hypervisor ran
    something else."""
    try:
        with open("/proc/stat") as f:
            values = f.readline().split()[1:1 + len(_CPU_FIELDS)]
    except OSError:
        return None
    return dict(zip(_CPU_FIELDS, map(int, values)))


def steal_share(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """The share of the CPU time between two :func:`cpu_times` that the hypervisor stole."""
    if before is None or after is None:
        return None
    total = sum(after[k] - before[k] for k in after)
    return (after["steal"] - before["steal"]) / total if total > 0 else None


def synchronize(device: Any) -> None:
    """Wait for ``device``'s queued work (CUDA); a no-op on the CPU. Call before reading a clock."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def host_window() -> Iterator[dict[str, float | None]]:
    """Around a measurement: ``reference_s``, the mean of :func:`host_reference_s` just before and
    just after it (the host's speed meanwhile), and ``steal``, the :func:`steal_share` during it;
    both filled in when the block ends."""
    host: dict[str, float | None] = {}
    before, ticks = host_reference_s(), cpu_times()
    yield host
    host["steal"] = steal_share(ticks, cpu_times())
    host["reference_s"] = (before + host_reference_s()) / 2
