"""``Cluster``: where workers run. A local Ray by default, an existing Ray cluster on request,
or in-process (``backend="local"``) for debugging with breakpoints and for fast tests.

A local Ray (no ``cluster.address``) listens on the loopback interface only: its GCS, raylet,
object manager, runtime-env agent, every worker's and the driver's gRPC server, and the dashboard
(when enabled) bind to 127.0.0.1, so nothing on the network can reach them. Joining a cluster
across machines is an explicit ``cluster.address``. Token authentication stays on (Ray's
default); its notice goes to the run's log file, not the terminal.

With a run dir (``Cluster(cfg, run_dir=...)``) every Ray actor writes its output to
``<run_dir>/logs/<group>-<rank>.log`` and Ray does not stream worker output to the terminal
(``log_to_driver=False``; ``EMBODIED_DEBUG=1`` turns streaming back on). See ``embodied.logs``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from embodied import logs
from embodied.runtime.watchdog import RUN_TOKEN_ENV

log = logging.getLogger(__name__)

#: Environment of every process that runs torch (Ray workers get it at start; the CLI sets it in the
#: driver before torch loads). GOMP_SPINCOUNT: after each parallel region, the OpenMP threads of
#: torch's CPU build spin ~300k iterations (milliseconds) before they sleep; between two policy calls
#: that spinning holds the cores the simulator processes need. Measured on 2 cores (PushCube, 16
#: envs in 2 processes, 3 ms of MLP inference between steps): env.step 14-15 ms with the default,
#: 7.2-7.7 ms with 3000 (as fast as with no torch work between steps), while a 3x256 MLP's
#: inference (0.08 ms) and training step (2.7 ms) keep their speed (OMP_WAIT_POLICY=PASSIVE, the
#: blunt fix, makes them 5x and 2x slower). A value the user set is kept.
TORCH_PROCESS_ENV = {"GOMP_SPINCOUNT": "3000"}


def apply_torch_process_env() -> None:
    """Set :data:`TORCH_PROCESS_ENV` in this process where the user did not (before torch loads)."""
    for key, value in TORCH_PROCESS_ENV.items():
        os.environ.setdefault(key, value)


@dataclass
class ClusterConfig:
    """Where and how workers run (``cluster.*`` keys)."""

    backend: Literal["ray", "local"] = "ray"
    """``ray``: every worker is a Ray actor (real processes). ``local``: every worker is a plain
    object in this process, each with its own thread (debugging, breakpoints, fast tests)."""
    address: str | None = None
    """Ray cluster to join, ``HOST:PORT`` of its head (see docs/cluster.md); ``auto`` joins the one
    ``RAY_ADDRESS`` names, or else the one ``ray start`` started on this machine. None starts a
    new local Ray sized to this machine, listening on loopback only (whatever else runs here)."""
    num_cpus: int | None = None
    """CPUs given to a local Ray (default: all cores of this machine)."""
    num_gpus: int | None = None
    """GPUs given to a local Ray (default: all visible CUDA devices)."""
    dashboard: bool = False
    """Start Ray's dashboard (bound to 127.0.0.1 only). Needs Ray's dashboard packages
    (``pip install "ray[default]"`` of the installed Ray version); checked when the config is read."""
    timeout_s: float = 120.0
    """Longest wait for one message on a channel (an env step's output, a decision's actions)
    or one call that is not a whole phase (weights, state, spaces, one shape of the env probe).
    A stuck worker then fails the run with a message naming it and this key, instead of hanging.
    Above ``env.timeout_s``, so an env process's own message comes first; far above the slowest
    single step we know (a LIBERO or ManiSkill reset with asset loading: seconds; a VLA's
    inference: about a second)."""
    start_timeout_s: float = 600.0
    """Longest wait for a worker group to start: Ray starting the process, imports (torch, a
    simulator), building envs and models (a VLA's weights from disk), and free CPUs/GPUs for it."""
    phase_timeout_s: float = 3600.0
    """Longest wait for a call that is a whole phase of an iteration: collecting its rollouts,
    training on them (a VLA's epochs take many minutes), rebuilding the envs for a new plan; and
    for a message that takes a phase to produce (the rollout's batch for the trainer). Hangs
    inside a phase are caught sooner by the ``timeout_s`` of each message."""

    def __post_init__(self) -> None:
        problems = [f"cluster.{key} must be > 0 seconds (got {getattr(self, key)})"
                    for key in ("timeout_s", "start_timeout_s", "phase_timeout_s") if not getattr(self, key) > 0]
        if self.dashboard and self.address is None:
            missing = dashboard_missing()
            if missing is not None:
                problems.append(
                    f"cluster.dashboard=true needs Ray's dashboard, which is not installed here ({missing}): install it "
                    f"with `pip install \"ray[default]=={_ray_version()}\"`, or set cluster.dashboard=false "
                    "(ray.util.list_named_actors() lists the workers without it)")
        if problems:
            raise ValueError("; ".join(problems))


def dashboard_missing() -> str | None:
    """Why Ray's dashboard cannot start here (its optional packages, ``ray[default]``, missing),
    or None when it can."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what ray.init imports to start it)
    except ImportError as err:
        return str(err)
    return None


def _ray_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return "<your Ray version>"


#: Where a local Ray listens (loopback only).
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeInfo:
    """One live node: its Ray node id (None on the local backend), CPUs and GPUs."""

    node_id: str | None
    cpus: float
    gpus: float


class Cluster:
    """A handle on the compute the run uses. ``with Cluster(cfg) as cluster: ...`` shuts it down.

    ``run_dir``: the run whose ``logs/`` the workers write to (default: the one of the open run
    log, ``EMBODIED_RUN_DIR``); None keeps worker output where Ray puts it (streamed to the
    terminal). When Ray is already initialised in this process, the cluster uses it as it is."""

    def __init__(self, cfg: ClusterConfig | None = None, run_dir: str | Path | None = None) -> None:
        self.cfg = cfg or ClusterConfig()
        self.backend = self.cfg.backend
        env_run_dir = os.environ.get(logs.RUN_DIR_ENV)
        self.run_dir: Path | None = Path(run_dir) if run_dir is not None else (Path(env_run_dir) if env_run_dir else None)
        self._started_ray = False
        if self.backend == "ray":
            self._init_ray()

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        # Workers inherit this; keep the driver's imports (the project packages) importable.
        env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)}
        env_vars.update({k: os.environ.get(k, v) for k, v in TORCH_PROCESS_ENV.items()})
        if logs.debug_enabled():
            env_vars[logs.DEBUG_ENV] = "1"
        if self.run_dir is not None:  # any Ray worker of this job knows where the run's logs go
            env_vars[logs.RUN_DIR_ENV] = str(self.run_dir.resolve())
        if os.environ.get(RUN_TOKEN_ENV):  # the watchdog finds the workers by it (also on a joined cluster)
            env_vars[RUN_TOKEN_ENV] = os.environ[RUN_TOKEN_ENV]
        run_log = logs.current_run_log()
        if run_log is not None:
            run_log.adopt_ray_loggers()  # Ray's own messages (its token-auth notice) -> the log file
        kwargs: dict = dict(
            include_dashboard=self.cfg.dashboard,
            dashboard_host=LOCAL_HOST,
            logging_level=logging.DEBUG if run_log is not None else logging.WARNING,
            # a run log holds Ray's logger as adopted; without one Ray prints its warnings itself
            configure_logging=run_log is None,
            # with a run dir every worker writes its own log; streaming it would clutter the terminal
            log_to_driver=self.run_dir is None or logs.debug_enabled(),
            runtime_env={"env_vars": env_vars},
        )
        with _keep_sigterm_handler():
            if self.cfg.address is not None:
                ray.init(address=self.cfg.address, **kwargs)
            else:
                num_cpus = self.cfg.num_cpus or os.cpu_count() or 1
                num_gpus = self.cfg.num_gpus if self.cfg.num_gpus is not None else _cuda_count()
                os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
                # Ray prestarts one idle worker per CPU for the job's runtime env; every worker of a
                # run is an actor with thread variables of its own, for which Ray starts a process
                # anyway, so the prestarted ones only cost ~0.7 CPU-s each (measured: ray::IDLE)
                os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
                # address="local" and no RAY_ADDRESS: always a new local Ray, never the cluster a
                # `ray start` on this machine recorded in /tmp/ray/ray_current_cluster (joining one
                # is cluster.address=auto)
                with _loopback_only(), _lean_head(log_monitor=kwargs["log_to_driver"]), _without_env("RAY_ADDRESS"):
                    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address=LOCAL_HOST, **kwargs)
                node_ip = ray.util.get_node_ip_address()
                if node_ip != LOCAL_HOST:
                    log.warning("the local Ray listens on %s, not only on %s (Ray changed how it resolves "
                                "the node address)", node_ip, LOCAL_HOST)
        self._started_ray = True
        if not kwargs["log_to_driver"]:
            _raylet_messages_to_log(True)

    @property
    def num_cpus(self) -> float:
        if self.backend == "ray":
            import ray

            return float(ray.cluster_resources().get("CPU", 1))
        return float(self.cfg.num_cpus or os.cpu_count() or 1)

    @property
    def num_gpus(self) -> float:
        if self.backend == "ray":
            import ray

            return float(ray.cluster_resources().get("GPU", 0))
        return float(self.cfg.num_gpus if self.cfg.num_gpus is not None else _cuda_count())

    def nodes(self) -> list[NodeInfo]:
        """The live nodes of the cluster with their resources (one node, this machine, on the
        local backend)."""
        if self.backend != "ray":
            return [NodeInfo(None, self.num_cpus, self.num_gpus)]
        import ray

        return [NodeInfo(node["NodeID"], float(node["Resources"].get("CPU", 0)), float(node["Resources"].get("GPU", 0)))
                for node in ray.nodes() if node.get("Alive")]

    def check_capacity(self, requests: dict[str, list[dict[str, float]]]) -> None:
        """Raise a UserError when worker groups ask for more of a resource than the local Ray has:
        they would wait for it until ``cluster.start_timeout_s``. ``requests``: group name ->
        ``{resource: amount}`` of each rank (``CPU``, ``GPU``, custom resources). A joined cluster
        (``cluster.address``) may grow (an autoscaler): not checked."""
        if self.backend != "ray" or self.cfg.address is not None:
            return
        import ray

        from embodied.errors import UserError

        have = ray.cluster_resources()
        wanted: dict[str, float] = {}
        parts: dict[str, list[str]] = {}
        for group, ranks in requests.items():
            for rank in ranks:
                for name, amount in rank.items():
                    wanted[name] = wanted.get(name, 0.0) + amount
            for name in {n for rank in ranks for n, a in rank.items() if a > 0}:
                parts.setdefault(name, []).append(f"{group} {sum(r.get(name, 0.0) for r in ranks):g}")
        short = [f"{wanted[n]:g} {n} ({', '.join(parts[n])}), the cluster has {have.get(n, 0):g}"
                 for n in sorted(wanted) if wanted[n] > have.get(n, 0) + 1e-9]
        if short:
            raise UserError("The worker groups ask for more than the cluster has: " + "; ".join(short) + ". Lower "
                            "workers.<group>_cpus / _resources, run fewer ranks (workers.<group>), or give the cluster "
                            "more (cluster.num_cpus, cluster.num_gpus for a local Ray; nodes for a cluster).")

    def shutdown(self) -> None:
        if self.backend == "ray" and self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False
            _raylet_messages_to_log(False)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Let ``ray.init(_node_ip_address="127.0.0.1")`` keep the loopback address.

    Ray replaces a loopback node address with the machine's network address
    (``services.resolve_ip_for_localhost``) except where it does not support multi-node clusters
    (``ray_constants.ENABLE_RAY_CLUSTER`` false, as on macOS/Windows). Every Ray process then binds
    its servers to the node address, i.e. 127.0.0.1. Only the start of a new local cluster runs
    in this block; ``tests/embodied/test_reliability_ray.py`` checks the result on every Ray
    upgrade."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


@contextlib.contextmanager
def _lean_head(log_monitor: bool) -> Iterator[None]:
    """Start a new local cluster without the processes a one-machine run does not use.

    ``ray.init`` starts, beside the GCS and the raylet, an autoscaler monitor (nothing to scale on
    a local cluster) and a log monitor (it streams the workers' output to the driver, which a run
    with a run dir does not ask for: every worker writes its own log). Each is a Python process;
    together they cost 1.5-2.2 CPU-s and ~1 s of ``ray.init`` per run on a 2-core host (measured
    per process from /proc on a tiny run and on a bare ``ray.init``). ``ray start`` has switches
    for both (``--no-monitor``, ``--include-log-monitor``); ``ray.init`` builds its ``RayParams``
    without them, so inside this block their defaults change. Only the start of a new local
    cluster runs in it; ``tests/embodied/test_reliability_ray.py`` checks which processes come up
    on every Ray upgrade."""
    from ray._private import parameter

    original = parameter.RayParams

    class LeanRayParams(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", log_monitor)
            super().__init__(*args, **kwargs)

    parameter.RayParams = LeanRayParams
    try:
        yield
    finally:
        parameter.RayParams = original


@contextlib.contextmanager
def _without_env(key: str) -> Iterator[None]:
    """``os.environ`` without ``key`` inside the block."""
    saved = os.environ.pop(key, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[key] = saved


#: Ray's function printing the "(raylet) A worker died ..." messages (None: not replaced).
_RAY_PRINT_TO_STDSTREAM = None
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _raylet_messages_to_log(on: bool) -> None:
    """Send the error messages Ray's driver thread prints as ``(raylet) ...`` (a worker died, an
    actor's OOM kill; with colour codes, whatever ``log_to_driver`` says) to Ray's logger
    ``ray.raylet``, i.e. to driver.log and not the terminal (the failure paragraph tells the
    user); ``on=False`` puts Ray's printing back."""
    global _RAY_PRINT_TO_STDSTREAM
    from ray._private import worker as ray_worker

    if on and _RAY_PRINT_TO_STDSTREAM is None:
        original = _RAY_PRINT_TO_STDSTREAM = ray_worker.print_to_stdstream
        raylet_log = logging.getLogger("ray.raylet")

        def to_log(data: dict, ignore_prefix: bool) -> None:
            if data.get("pid") != "raylet":
                return original(data, ignore_prefix)
            for line in data.get("lines", []):
                raylet_log.warning("(raylet) %s", _ANSI.sub("", str(line)))

        ray_worker.print_to_stdstream = to_log
    elif not on and _RAY_PRINT_TO_STDSTREAM is not None:
        ray_worker.print_to_stdstream = _RAY_PRINT_TO_STDSTREAM
        _RAY_PRINT_TO_STDSTREAM = None


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` installs its own SIGTERM handler (``sys.exit``); keep the one the program set
    (``embodied.errors.exit_on_signals``: exit code 143 after cleanup). Ray's stays where the
    program had none."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(before):
            signal.signal(signal.SIGTERM, before)


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: no GPUs
        return 0
