"""Soak check: a training job left running for a long time must not grow. Every process of the job
(the driver, the watchdog, Ray's processes, the workers, the env processes) is sampled every few
seconds for its resident memory (RSS) and open file descriptors, with the job's shared memory
(the ``/dev/shm`` files its processes map) and ``/dev/shm`` as a whole; after a warm-up, the
growth from the start to the end of the rest is reported, per process and for the whole job.

    python -m benchmarks.soak [--minutes 60] [--interval-s 5] [--warmup-min 5] [RECIPE ...] [--set key=value ...]

Each recipe (default: the default job, ``maniskill_pushcube_ppo``) trains ``--minutes`` in a
temporary run dir (the warm-up counts from its first logged iteration on its settled plan, after
profiling, the workers' start and the calibration's candidate plans, which restart workers) (``algo.total_env_steps`` too large to finish; checkpoints as the recipe
says), then gets a Ctrl-C (SIGINT to its process group: the iteration finishes, a checkpoint is
written) and must end. Growth is the median of the last window of samples over the median of the
first window after the warm-up (each window a tenth of the samples after the warm-up, at least 3),
so one garbage-collection peak does not count; the target is under 5% (:data:`TARGET_PCT`) for
the job's total RSS, open files and shared memory. psutil is used when installed, else ``/proc``.
The result goes to ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result

ROOT = Path(__file__).resolve().parents[1]
#: Growth after the warm-up that counts as a leak, in percent.
TARGET_PCT = 5.0
#: The job's metrics whose growth is checked against :data:`TARGET_PCT`.
CHECKED = ("rss_mib", "open_fds", "shm_mib")
#: What every soak run adds to the recipe: never finishes on its own, no wandb, no video.
SOAK_OVERRIDES = ("algo.total_env_steps=1000000000000", "logging.wandb=false", "eval.every=0", "eval.video=false")
MIB = 1024 * 1024


# --- sampling -------------------------------------------------------------------------------------


def _children_proc(pid: int) -> list[int]:
    """Every descendant of ``pid`` from ``/proc`` (ppid of each process)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            parent_of[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parent_of.items() if pp == parent]
        tree += kids
        frontier += kids
    return tree


def _name_proc(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        if cmd:
            return cmd[:120]
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _rss_proc(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _fds_proc(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _shm_files(pid: int) -> dict[str, int]:
    """The ``/dev/shm`` files process ``pid`` maps (also those already unlinked, which stay while
    mapped), each with the bytes of its largest mapping."""
    files: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    path = parts[5].strip()
                    files[path] = max(files.get(path, 0), end - start)
    except (OSError, ValueError):
        pass
    return files


try:
    import psutil
except ImportError:  # /proc only
    psutil = None


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (psutil when installed, else ``/proc``)."""
    if psutil is None:
        return [pid, *_children_proc(pid)]
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _process_numbers(pid: int) -> tuple[str, int, int]:
    """(name, RSS bytes, open fds) of ``pid`` (psutil when installed, else ``/proc``)."""
    if psutil is None:
        return _name_proc(pid), _rss_proc(pid), _fds_proc(pid)
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name = " ".join(p.cmdline())[:120] or p.name()
            return name, p.memory_info().rss, p.num_fds()
    except (psutil.NoSuchProcess, psutil.ZombieProcess) as err:
        raise ProcessLookupError(pid) from err
    except psutil.AccessDenied as err:
        raise PermissionError(pid) from err


def sample(pid: int) -> dict[str, Any]:
    """One sample of the process tree of ``pid``: per process its RSS and open fds, and the job's
    shared memory (the mapped bytes of the distinct ``/dev/shm`` files its processes map) and
    ``/dev/shm``'s used bytes (all users of this machine)."""
    procs: dict[str, dict[str, Any]] = {}
    shm: dict[str, int] = {}
    for p in process_tree(pid):
        try:
            name, rss, fds = _process_numbers(p)
        except OSError:  # it ended meanwhile (or is not ours)
            continue
        procs[str(p)] = {"name": name, "rss_mib": rss / MIB, "open_fds": fds}
        for path, size in _shm_files(p).items():
            shm[path] = max(shm.get(path, 0), size)
    shm_bytes = sum(shm.values())
    try:
        st = os.statvfs("/dev/shm")
        dev_shm_used = (st.f_blocks - st.f_bfree) * st.f_frsize / MIB
    except OSError:
        dev_shm_used = None
    return {"t_s": time.monotonic(), "processes": procs, "shm_mib": shm_bytes / MIB, "dev_shm_used_mib": dev_shm_used}


# --- analysis -------------------------------------------------------------------------------------


def totals(s: dict[str, Any]) -> dict[str, float]:
    """The whole job's numbers of one sample."""
    procs = s["processes"].values()
    return {"rss_mib": sum(p["rss_mib"] for p in procs), "open_fds": sum(p["open_fds"] for p in procs),
            "shm_mib": s["shm_mib"], "dev_shm_used_mib": s["dev_shm_used_mib"], "processes": len(s["processes"])}


def growth(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Start (median of the first window), end (median of the last) and growth in percent of a
    series after the warm-up; None with fewer than two windows of samples."""
    vals = [float(v) for v in values if v is not None]
    window = max(3, len(vals) // 10)
    if len(vals) < 2 * window:
        return None
    start, end = statistics.median(vals[:window]), statistics.median(vals[-window:])
    pct = 0.0 if start == end else (100.0 * (end - start) / start if start else float("inf"))
    return {"start": round(start, 2), "end": round(end, 2), "growth_pct": round(pct, 2), "max": round(max(vals), 2)}


def analyze(samples: list[dict[str, Any]], warmup_s: float, ready_t_s: float | None = None) -> dict[str, Any]:
    """Growth of the job (:func:`totals`) and of each process that lived through the whole time after
    the warm-up, from the samples taken ``warmup_s`` after ``ready_t_s`` (when the job began its
    work; default: the first sample); ``ok`` when every metric of :data:`CHECKED` grew less than
    :data:`TARGET_PCT` (None when there are too few samples to say)."""
    if not samples:
        return {"samples": 0, "samples_after_warmup": 0, "warmup_s": warmup_s, "job": {}, "processes": [], "ok": None}
    t0 = samples[0]["t_s"]
    start = (t0 if ready_t_s is None else ready_t_s) + warmup_s
    after = [s for s in samples if s["t_s"] >= start]
    job_rows = [totals(s) for s in after]
    job = {key: growth([r[key] for r in job_rows]) for key in (*CHECKED, "dev_shm_used_mib", "processes")}
    lived = set(after[0]["processes"]) if after else set()
    for s in after[1:]:
        lived &= set(s["processes"])
    per_process = []
    for pid in sorted(lived, key=int):
        row = {"pid": int(pid), "name": after[-1]["processes"][pid]["name"]}
        for key in ("rss_mib", "open_fds"):
            row[key] = growth([s["processes"][pid][key] for s in after])
        per_process.append(row)
    checked = [job[k]["growth_pct"] for k in CHECKED if job.get(k)]
    return {
        "samples": len(samples), "samples_after_warmup": len(after), "warmup_s": warmup_s,
        "ready_after_s": None if ready_t_s is None else round(ready_t_s - t0, 1),
        "span_s": round(samples[-1]["t_s"] - t0, 1), "job": job, "processes": per_process,
        "ok": (all(g < TARGET_PCT for g in checked) if len(checked) == len(CHECKED) else None),
    }


# --- running a job --------------------------------------------------------------------------------


def soak(command: Sequence[str], seconds: float, interval_s: float, warmup_s: float, env: dict[str, str] | None = None,
         cwd: Path = ROOT, stop_timeout_s: float = 300.0, ready: Callable[[], bool] | None = None,
         log=print) -> dict[str, Any]:
    """Run ``command`` for ``seconds`` while sampling its process tree every ``interval_s``; then
    SIGINT to its process group (SIGTERM, then SIGKILL, if it does not end within
    ``stop_timeout_s``). ``ready``: whether the job has begun its work (a training job: its first
    iteration is logged); the warm-up counts from then. The :func:`analyze` result with the exit
    code and the samples' totals."""
    proc = subprocess.Popen(list(command), cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples: list[dict[str, Any]] = []
    ready_t: float | None = None if ready is not None else time.monotonic()
    t_end = time.monotonic() + seconds
    next_log = time.monotonic() + 60
    try:
        while time.monotonic() < t_end and proc.poll() is None:
            t = time.monotonic()
            samples.append(sample(proc.pid))
            if ready_t is None and ready is not None and ready():
                ready_t = t
                log(f"[soak] the job is at work after {t - samples[0]['t_s']:.0f} s; warm-up {warmup_s / 60:g} min more")
            if t >= next_log:
                row = totals(samples[-1])
                log(f"[soak] {len(samples)} samples, {(t_end - t) / 60:.1f} min left: {row['processes']} processes, "
                    f"RSS {row['rss_mib']:.0f} MiB, {row['open_fds']} open files, shm {row['shm_mib']:.0f} MiB")
                next_log = t + 60
            time.sleep(max(0.0, interval_s - (time.monotonic() - t)))
        ended_early = proc.poll() is not None
    finally:
        exit_code = _stop(proc, stop_timeout_s)
    stderr = proc.stderr.read() if proc.stderr else ""
    # a job that never began its work is measured from its start (and says so)
    result = analyze(samples, warmup_s, ready_t)
    result["ready"] = ready_t is not None
    result.update(exit_code=exit_code, ended_before_the_end=ended_early,
                  stderr_tail=stderr[-2000:] if ended_early else "",
                  series=[{"t_s": round(s["t_s"] - samples[0]["t_s"], 1), **{k: (round(v, 2) if isinstance(v, float) else v)
                                                                           for k, v in totals(s).items()}}
                          for s in samples])
    return result


def _stop(proc: subprocess.Popen, timeout_s: float) -> int:
    """Ctrl-C to the job's process group, then SIGTERM and SIGKILL; its exit code."""
    for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 30.0), (signal.SIGKILL, 30.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def train_command(recipe: str, run_dir: Path, overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "train", recipe, f"run.dir={run_dir}", *SOAK_OVERRIDES, *overrides]


def training_settled(run_dir: Path) -> bool:
    """Whether the run logged an iteration on its settled plan: after profiling, the workers'
    start and the calibration's measured candidate plans (rows with ``plan/calibrating``), each
    of which restarts workers."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return False
    for line in reversed(lines):
        try:
            return not json.loads(line).get("plan/calibrating")
        except ValueError:  # a row being written
            continue
    return False


def format_report(recipe: str, minutes: float, result: dict[str, Any]) -> str:
    began = (f"on its settled plan after {result['ready_after_s']:g} s" if result.get("ready")
             else "never on a settled plan: measured from its start")
    lines = [f"{recipe}: {minutes:g} min, {result['samples']} samples, {began}; {result['samples_after_warmup']} after "
             f"{result['warmup_s'] / 60:g} more min of warm-up; exit code {result['exit_code']}",
             f"  {'metric':<18} {'start':>10} {'end':>10} {'max':>10} {'growth':>8}"]
    for key, g in result["job"].items():
        if g is not None:
            lines.append(f"  {key:<18} {g['start']:>10.1f} {g['end']:>10.1f} {g['max']:>10.1f} {g['growth_pct']:>7.2f}%")
    lines.append(f"  within {TARGET_PCT:g}%: {result['ok']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from pipelines.recipes import DEFAULT_RECIPE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", default=[DEFAULT_RECIPE], help="recipes to soak, one after another")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time per recipe")
    parser.add_argument("--interval-s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup-min", type=float, default=None,
                        help="minutes after the first iteration on the settled plan left out before growth is measured (default: a "
                             "sixth of --minutes, at most 5)")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="config overrides for every recipe")
    add_output_args(parser, "soak")
    args = parser.parse_args(argv)
    warmup_min = args.warmup_min if args.warmup_min is not None else min(5.0, args.minutes / 6)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    runs = {}
    for recipe in args.recipes:
        with tempfile.TemporaryDirectory(prefix="embodied-soak-") as tmp:
            print(f"[soak] {recipe}: training {args.minutes:g} min, a sample every {args.interval_s:g} s", flush=True)
            run_dir = Path(tmp) / "run"
            result = soak(train_command(recipe, run_dir, args.overrides), args.minutes * 60, args.interval_s,
                          warmup_min * 60, env=env, ready=lambda: training_settled(run_dir))
        print(format_report(recipe, args.minutes, result), flush=True)
        runs[recipe] = {"minutes": args.minutes, "interval_s": args.interval_s, "overrides": list(args.overrides), **result}
    out = {"target_pct": TARGET_PCT, "checked": list(CHECKED), "runs": runs,
           "ok": all(r["ok"] for r in runs.values()) if runs else None}
    save_result(result_path("soak", args), "soak", argv, out)
    return out


if __name__ == "__main__":
    main()
