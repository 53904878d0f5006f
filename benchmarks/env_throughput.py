"""Env throughput: the raw simulator loop vs the same envs through our env contract, side by side.

For each workload (ManiSkill PushCube state, ManiSkill PushCube rgb 128x128, MuJoCo HalfCheetah):

* ``raw``: one process steps ``k`` single envs by hand (``env.step``, reset after a done), made
  exactly as our adapter makes them (same kwargs) but without any of our code;
* ``serial``: the same ``k`` envs through :class:`SerialVecEnv` in this process;
* ``mp xP``: ``P * k`` envs through :class:`MultiprocessVecEnv` with ``P`` worker processes
  (``k`` envs per process), for ``P`` = 1..N;
* ``raw xP``: ``P`` raw loops in ``P`` processes at once, ``k`` envs each, no parent in the way:
  what the machine itself gives ``P`` simulating processes (shared caches, memory bandwidth, the
  hypervisor);
* ``raw xP lockstep``: the same, but every process waits after each batch step until all have
  done it (spinning on shared memory with a core each, else a blocking barrier), as one
  synchronous step over ``P`` shards must: the batch waits for its slowest shard. The ceiling
  for ``mp xP``, whose parent adds the messaging and shares the cores;
* ``mp x1 chunk8``: one worker, ``chunk_step`` with 8 actions per env (one message per chunk);
* ``mp x1 kK`` (full run): one worker with ``K`` envs, against its own ``raw kK`` loop, to show
  how the per-message cost depends on the batch per process.

Every variant runs once per round, rounds interleave the variants (the machine may be shared:
interleaving spreads outside load over all of them), and each variant reports its best and
median round. Ratios against the raw loop with the same envs per process:

* ``per_core``: steps/s divided by the cores it can use (``min(P, cores)``) over raw steps/s,
  best round against best round; ``per_core_paired``: the median over rounds of the same ratio
  within each round (slow drift of the host cancels, a disturbed window does not);
* ``worker_cpu``: steps per CPU-second of the env workers only (for raw/serial: the process),
  i.e. how much of a core's simulation throughput our workers keep;
* ``cpu``: steps per CPU-second of every process involved (parent + workers); both CPU ratios
  come from the OS's accounting and are much less sensitive to other load on the machine;
* ``vs_lockstep``: ``mp xP`` against ``raw xP lockstep`` (best rounds; ``_paired``: median of
  the per-round ratios): what our workers keep of what a synchronous batch over ``P`` processes
  can get on this machine.

    python -m benchmarks.env_throughput            # full (~9 min on 2 cores)
    python -m benchmarks.env_throughput --quick    # ~2.5 min
    python -m benchmarks.env_throughput --only halfcheetah

Writes ``benchmarks/results/env_throughput.json`` (``env_throughput_quick.json`` with --quick).
"""

from __future__ import annotations

import os

# One thread per simulating process, in this process (the raw loop) as in the env workers.
for _key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS"):
    os.environ.setdefault(_key, "1")

import warnings  # noqa: E402

# gymnasium's float64->float32 Box warnings and ManiSkill's numpy deprecations, once per env: noise here
warnings.filterwarnings("ignore", category=UserWarning, module="gymnasium")
warnings.filterwarnings("ignore", category=DeprecationWarning)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common import add_output_args, result_path, save_result  # noqa: E402
from envs.base import VecEnv  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.multiprocess import MultiprocessVecEnv  # noqa: E402
from envs.registry import make_vec_env  # noqa: E402


@dataclass
class Workload:
    name: str
    cfg: EnvConfig  # num_envs is set per variant
    envs_per_proc: int
    window_s: float  # measuring time per variant per round
    make_raw: Callable[[EnvConfig], Any]  # one raw single env
    sweep: tuple[int, ...] = ()  # other envs-per-process counts for one worker (full mode)
    chunk: int = 0  # also run one worker with chunk_step of this many actions (0: no)


@dataclass
class Variant:
    name: str
    procs: int
    num_envs: int
    step: Callable[[], int]  # steps every env once; returns the env steps done
    cpu_s: Callable[[], tuple[float, float]]  # CPU seconds so far: (all processes, env workers only)
    close: Callable[[], None]
    rounds: list[dict[str, float]] = field(default_factory=list)
    reference: str = "raw"  # the raw loop this variant is compared with
    same_procs: str | None = None  # the raw loops in as many processes in lockstep, if measured
    window: Callable[[float], dict[str, float]] | None = None  # measures itself (default: :func:`measure`)


# --- raw simulator loops ------------------------------------------------------------------------------


def raw_maniskill(cfg: EnvConfig) -> Any:
    """A ManiSkill CPU env exactly as the adapter makes it, with ManiSkill's own CPUGymWrapper."""
    from envs.adapters.maniskill_adapter import make_raw_maniskill, maniskill_registry

    maniskill_registry()
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    return CPUGymWrapper(make_raw_maniskill(cfg, "physx_cpu", 1))


def raw_gymnasium(cfg: EnvConfig) -> Any:
    import gymnasium as gym

    return gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **cfg.kwargs)


def this_process_cpu_s() -> tuple[float, float]:
    cpu = time.process_time()
    return cpu, cpu


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (10 ms resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def raw_variant(workload: Workload, actions: np.ndarray, k: int, name: str = "raw") -> Variant:
    loops = _RawLoops(workload, actions, k)
    return Variant(name, 1, k, loops.step, this_process_cpu_s, loops.close, reference=name)


class _RawLoops:
    """``k`` raw envs stepped in a loop, as :func:`raw_variant` does (also in a child process)."""

    def __init__(self, workload: Workload, actions: np.ndarray, k: int) -> None:
        self.envs = [workload.make_raw(workload.cfg) for _ in range(k)]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)
        self.actions = actions
        self.t = 0

    def step(self) -> int:
        row = self.actions[self.t % len(self.actions)]
        self.t += 1
        for i, env in enumerate(self.envs):
            _, _, terminated, truncated, _ = env.step(row[i])
            if terminated or truncated:
                env.reset()
        return len(self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _Lockstep:
    """A barrier over ``raw xP lockstep``'s processes, after every batch step.

    With a core per process it spins (yielding) on a shared counter per process, as our env
    workers spin for their next command; with more processes than cores it blocks (on a
    semaphore per process, which the last to arrive releases), as our workers then block.
    Process 0 decides when a window ends: it posts the decision for batch ``n`` before the
    barrier (double-buffered, so a fast process cannot overwrite it before a slow one has read
    it) and every process reads it after, so all stop at the same batch."""

    def __init__(self, ctx: Any, procs: int, spin: bool) -> None:
        self.procs = procs
        self.counts = ctx.RawArray("q", procs) if spin else None  # spinning: batches done per process
        self.arrived = ctx.RawValue("q", 0)  # blocking: arrivals over all batches so far
        self.lock = None if spin else ctx.Lock()
        self.go = [] if spin else [ctx.Semaphore(0) for _ in range(procs)]
        self.stop = ctx.RawArray("b", 2)

    def wait(self, index: int, batch: int, end: float) -> bool:
        """After this process's ``batch``-th batch step (counted over all windows): wait for the
        others; whether the window is over."""
        stop = self.stop
        if index == 0:
            stop[batch % 2] = time.perf_counter() >= end
        if self.counts is not None:
            counts = np.frombuffer(self.counts, dtype=np.int64)
            counts[index] = batch
            while counts.min() < batch:
                os.sched_yield()
        else:
            assert self.lock is not None
            with self.lock:
                self.arrived.value += 1
                last = self.arrived.value == self.procs * batch
            if last:  # everyone else waits for this batch: release each once
                for other, go in enumerate(self.go):
                    if other != index:
                        go.release()
            else:
                self.go[index].acquire()
        return bool(stop[batch % 2])


def _raw_loop_child(conn: Any, workload: Workload, actions: np.ndarray, k: int, lockstep: _Lockstep | None, index: int) -> None:
    """One of ``raw xP``'s processes: on ("run", start, end) step from ``start`` until ``end``
    (perf_counter is system-wide on Linux) and reply (steps, CPU seconds); with ``lockstep``,
    wait for all the others after every batch step."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    loops = _RawLoops(workload, actions, k)
    for _ in range(3):
        loops.step()
    conn.send("ready")
    batch = 0  # batch steps in lockstep so far, over all windows (every process has done as many)
    try:
        while True:
            message = conn.recv()
            if message is None:
                break
            _, start, end = message
            while time.perf_counter() < start:
                pass
            steps, cpu0 = 0, time.process_time()
            while True:
                steps += loops.step()
                if lockstep is not None:
                    batch += 1
                    if lockstep.wait(index, batch, end):
                        break
                elif time.perf_counter() >= end:
                    break
            conn.send((steps, time.process_time() - cpu0))
    finally:
        loops.close()


def raw_procs_variant(workload: Workload, act_dim: int, k: int, procs: int, cores: int, lockstep: bool = False) -> Variant:
    """``raw xP``: ``procs`` raw loops in as many processes at once, started and stopped together;
    ``lockstep``: with a barrier after every batch step (``raw xP lockstep``)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = _Lockstep(ctx, procs, spin=procs <= cores) if lockstep else None
    conns, children = [], []
    for p in range(procs):
        parent_conn, child_conn = ctx.Pipe()
        args = (child_conn, workload, random_actions(k, act_dim, seed=p), k, barrier, p)
        child = ctx.Process(target=_raw_loop_child, args=args, daemon=True)
        child.start()
        child_conn.close()
        conns.append(parent_conn)
        children.append(child)
    for conn in conns:
        if conn.recv() != "ready":
            raise RuntimeError("a raw loop process failed to start")

    def window(window_s: float) -> dict[str, float]:
        start = time.perf_counter() + 0.01  # every child spins to the same start
        for conn in conns:
            conn.send(("run", start, start + window_s))
        replies = [conn.recv() for conn in conns]  # the parent sleeps meanwhile
        wall = max(window_s, time.perf_counter() - start)  # lockstep: the last batch may end late
        steps, cpu = sum(r[0] for r in replies), sum(r[1] for r in replies)
        return {"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu, "steps_per_worker_cpu_s": steps / cpu, "steps": steps}

    def close() -> None:
        for conn in conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
        del shared[:]

    # The barrier's shared memory lives on this process's multiprocessing heap: were it garbage
    # collected here, the next allocation would reuse the block the children still use.
    shared = [barrier]

    def unused() -> Any:
        raise AssertionError("raw xP measures itself")

    name = f"raw x{procs}" + (" lockstep" if lockstep else "")
    return Variant(name, procs, procs * k, unused, unused, close, window=window)


def contract_variant(
    name: str, env: VecEnv, actions: np.ndarray, procs: int, reference: str = "raw", chunk: int = 0
) -> Variant:
    env.reset(seed=0)
    t = [0]
    workers = list(env.pids) if isinstance(env, MultiprocessVecEnv) else []

    def step() -> int:
        if chunk:  # one message per chunk; envs whose episode ended inside it skip the rest
            batch = np.stack([actions[(t[0] + j) % len(actions)] for j in range(chunk)], axis=1)  # (N, C, A)
            t[0] += chunk
            return int(env.chunk_step(batch).valid.sum())
        env.step(actions[t[0] % len(actions)])
        t[0] += 1
        return env.num_envs

    def cpu_s() -> tuple[float, float]:
        if not workers:
            return this_process_cpu_s()
        worker_cpu = sum(process_cpu_s(pid) for pid in workers)
        return time.process_time() + worker_cpu, worker_cpu

    return Variant(name, procs, env.num_envs, step, cpu_s, env.close, reference=reference)


def random_actions(num_envs: int, act_dim: int, seed: int = 0) -> np.ndarray:
    # (T, N, A) float32 in the usual [-1, 1] action box
    return np.random.default_rng(seed).uniform(-1, 1, (16, num_envs, act_dim)).astype(np.float32)


# --- measurement --------------------------------------------------------------------------------------


def measure(variant: Variant, window_s: float, warmup_steps: int = 3) -> dict[str, float]:
    for _ in range(warmup_steps):
        variant.step()
    steps = 0
    (cpu0, worker0), t0 = variant.cpu_s(), time.perf_counter()
    while True:
        steps += variant.step()
        wall = time.perf_counter() - t0
        if wall >= window_s:
            break
    cpu1, worker1 = variant.cpu_s()
    return {
        "steps_per_s": steps / wall,
        "steps_per_cpu_s": steps / max(cpu1 - cpu0, 1e-9),
        "steps_per_worker_cpu_s": steps / max(worker1 - worker0, 1e-9),
        "steps": steps,
    }


def run_workload(workload: Workload, procs_list: list[int], rounds: int, cores: int) -> dict[str, Any]:
    k = workload.envs_per_proc
    print(f"\n== {workload.name}: {k} envs per process, procs {procs_list}, {rounds} rounds of {workload.window_s:.1f} s", flush=True)
    t_start = time.perf_counter()
    act_dim = None
    variants: list[Variant] = []
    try:
        ours_inproc = make_vec_env(EnvConfig(**{**workload.cfg.__dict__, "num_envs": k, "backend": "inprocess"}))
        act_dim = int(np.prod(ours_inproc.action_space.shape))
        variants.append(raw_variant(workload, random_actions(k, act_dim), k))
        variants.append(contract_variant("serial", ours_inproc, random_actions(k, act_dim), 1))
        for procs in procs_list:
            env = make_multiprocess(workload, procs, k)
            variants.append(contract_variant(f"mp x{procs}", env, random_actions(procs * k, act_dim), procs))
            if procs > 1:
                variants[-1].same_procs = f"raw x{procs} lockstep"
                variants.append(raw_procs_variant(workload, act_dim, k, procs, cores))
                variants.append(raw_procs_variant(workload, act_dim, k, procs, cores, lockstep=True))
        if workload.chunk:
            env = make_multiprocess(workload, 1, k)
            variants.append(contract_variant(f"mp x1 chunk{workload.chunk}", env, random_actions(k, act_dim), 1, chunk=workload.chunk))
        for kk in workload.sweep:
            variants.append(raw_variant(workload, random_actions(kk, act_dim), kk, name=f"raw k{kk}"))
            env = make_multiprocess(workload, 1, kk)
            variants.append(contract_variant(f"mp x1 k{kk}", env, random_actions(kk, act_dim), 1, reference=f"raw k{kk}"))
        setup_s = time.perf_counter() - t_start
        for r in range(rounds):
            for variant in variants:
                variant.rounds.append(variant.window(workload.window_s) if variant.window else measure(variant, workload.window_s))
            print(f"  round {r + 1}: " + ", ".join(f"{v.name} {v.rounds[-1]['steps_per_s']:.0f}/s" for v in variants), flush=True)
    finally:
        for variant in variants:
            variant.close()
    best = {v.name: {key: max(x[key] for x in v.rounds) for key in v.rounds[0]} for v in variants}
    reference = {v.name: v for v in variants}
    results = []
    for v in variants:
        mine, raw = best[v.name], best[v.reference]
        same = {}
        if v.same_procs is not None:
            same = {
                "vs_lockstep": round(mine["steps_per_s"] / best[v.same_procs]["steps_per_s"], 3),
                "vs_lockstep_paired": round(
                    statistics.median(x["steps_per_s"] / r["steps_per_s"] for x, r in zip(v.rounds, reference[v.same_procs].rounds)), 3
                ),
            }
        results.append(
            {
                "variant": v.name,
                "procs": v.procs,
                "num_envs": v.num_envs,
                "envs_per_proc": v.num_envs // v.procs,
                "reference": v.reference,
                "steps_per_s": round(mine["steps_per_s"], 1),
                "steps_per_s_median": round(statistics.median(x["steps_per_s"] for x in v.rounds), 1),
                "steps_per_cpu_s": round(mine["steps_per_cpu_s"], 1),
                "steps_per_worker_cpu_s": round(mine["steps_per_worker_cpu_s"], 1),
                "per_core_vs_raw": round(mine["steps_per_s"] / min(v.procs, cores) / raw["steps_per_s"], 3),
                "per_core_vs_raw_paired": round(
                    statistics.median(
                        x["steps_per_s"] / min(v.procs, cores) / r["steps_per_s"] for x, r in zip(v.rounds, reference[v.reference].rounds)
                    ),
                    3,
                ),
                "worker_cpu_vs_raw": round(mine["steps_per_worker_cpu_s"] / raw["steps_per_worker_cpu_s"], 3),
                "cpu_vs_raw": round(mine["steps_per_cpu_s"] / raw["steps_per_cpu_s"], 3),
                "speedup_vs_raw": round(mine["steps_per_s"] / raw["steps_per_s"], 3),
                **same,
            }
        )
    return {
        "envs_per_proc": k,
        "config": {key: value for key, value in workload.cfg.__dict__.items() if key not in ("num_envs", "num_procs", "backend")},
        "setup_s": round(setup_s, 1),
        "rounds": rounds,
        "window_s": workload.window_s,
        "results": results,
    }


def make_multiprocess(workload: Workload, procs: int, per_proc: int) -> VecEnv:
    cfg = {**workload.cfg.__dict__, "num_envs": procs * per_proc, "num_procs": procs, "backend": "multiprocess"}
    return make_vec_env(EnvConfig(**cfg))


def print_table(name: str, report: dict[str, Any]) -> None:
    print(f"\n{name} ({report['envs_per_proc']} envs per process; ratios against the raw loop with as many envs per process)")
    print(
        f"  {'variant':<13} {'envs':>5} {'steps/s':>9} {'median':>9} {'per core':>9} {'paired':>7} {'worker cpu':>11} "
        f"{'all cpu':>8} {'speedup':>8} {'vs lockstep':>12}"
    )
    for row in report["results"]:
        print(
            f"  {row['variant']:<13} {row['num_envs']:>5} {row['steps_per_s']:>9.0f} {row['steps_per_s_median']:>9.0f} "
            f"{row['per_core_vs_raw']:>9.3f} {row['per_core_vs_raw_paired']:>7.3f} {row['worker_cpu_vs_raw']:>11.3f} "
            f"{row['cpu_vs_raw']:>8.3f} {row['speedup_vs_raw']:>8.2f} "
            + (f"{row['vs_lockstep']:>6.3f} ({row['vs_lockstep_paired']:.3f})" if "vs_lockstep" in row else "")
        )


def workloads(quick: bool) -> list[Workload]:
    scale = 0.5 if quick else 1.0
    return [
        Workload(
            "maniskill_pushcube_state", EnvConfig(id="PushCube-v1", obs_mode="state"), 4, 1.2 * scale, raw_maniskill,
            sweep=() if quick else (1, 16), chunk=8,
        ),
        Workload("maniskill_pushcube_rgb128", EnvConfig(id="PushCube-v1", obs_mode="rgb", image_size=128), 2, 2.4 * scale, raw_maniskill),
        Workload(
            "mujoco_halfcheetah_state", EnvConfig(id="HalfCheetah-v5", obs_mode="state"), 32, 1.0 * scale, raw_gymnasium,
            sweep=() if quick else (8, 128), chunk=8,
        ),
    ]


def extra_machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    for pkg in ("sapien", "mani_skill", "mujoco", "gymnasium"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = None
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "cpu_model": model,
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions_more": info,
        "git_commit": commit,
        "vulkan": os.environ.get("VK_ICD_FILENAMES") or "driver default",
        "datetime_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter windows, procs 1..2")
    parser.add_argument("--only", default=None, help="run only workloads whose name contains this")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--max-procs", type=int, default=None, help="largest process count in the scaling runs")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one workload, print JSON
    add_output_args(parser, "env_throughput")
    args = parser.parse_args(argv)
    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    cores = len(os.sched_getaffinity(0))
    max_procs = args.max_procs or (2 if args.quick else min(4, max(2, cores * 2)))
    procs_list = [p for p in (1, 2, 4) if p <= max_procs]
    rounds = args.rounds or (2 if args.quick else 5)
    if args.one:  # a child run: this workload only, its report as the last line of stdout
        (workload,) = [w for w in workloads(args.quick) if w.name == args.one]
        print(RESULT_MARK + json.dumps(run_workload(workload, procs_list, rounds, cores)), flush=True)
        return
    load_before = os.getloadavg()
    start = time.perf_counter()
    reports = {}
    for workload in workloads(args.quick):
        if args.only and args.only not in workload.name:
            continue
        reports[workload.name] = run_in_child(workload.name, args)
    for name, report in reports.items():
        print_table(name, report)
    result = {
        "quick": args.quick,
        "machine_more": {**extra_machine_info(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "total_s": round(time.perf_counter() - start, 1),
        "workloads": reports,
        "notes": (
            "raw: k single envs stepped by hand in one process, made with the adapter's kwargs. serial: the same k "
            "envs through SerialVecEnv. mp xP: P*k envs through MultiprocessVecEnv with P worker processes. "
            "Ratios are against the raw loop with the same envs per process (best rounds): per_core_vs_raw = "
            "steps/s / min(P, cores) / raw steps/s; worker_cpu_vs_raw = steps per CPU-second of the env workers "
            "/ raw's; cpu_vs_raw = steps per CPU-second of all processes (parent + workers) / raw's; "
            "per_core_vs_raw_paired = median over rounds of the per-core ratio within each round. raw xP: P raw loops in "
            "P processes at once (the machine's own scaling); raw xP lockstep: the same with a barrier after every batch step "
            "(a synchronous batch); vs_lockstep = mp xP steps/s / raw xP lockstep steps/s. One thread "
            "per simulating process; each workload runs in a fresh process. The machine may be shared: see loadavg."
        ),
    }
    print(f"\n{len(reports)} workload(s) in {result['total_s']:.0f} s")
    save_result(result_path("env_throughput", args, "quick" if args.quick else None), "env_throughput", argv, result)


RESULT_MARK = "ENV_THROUGHPUT_RESULT "


def run_in_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one workload in a fresh interpreter: in-process variants then start from a clean process
    (simulators keep state across env instances, e.g. renderers, that would skew later workloads)."""
    cmd = [sys.executable, "-m", "benchmarks.env_throughput", "--one", name]
    for flag, value in (("--quick", args.quick), ("--rounds", args.rounds), ("--max-procs", args.max_procs)):
        if value is True:
            cmd.append(flag)
        elif value not in (None, False):
            cmd += [flag, str(value)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    report = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(RESULT_MARK):
            report = json.loads(line[len(RESULT_MARK):])
        else:
            print(line, end="", flush=True)
    if proc.wait() != 0 or report is None:
        raise RuntimeError(f"benchmark workload {name} failed (exit code {proc.returncode})")
    return report


if __name__ == "__main__":
    main()
