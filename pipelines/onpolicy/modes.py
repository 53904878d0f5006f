"""How each plan mode runs the env and rollout halves of the embodied workflow: one class per mode.

    mode = RUN_MODES.get(plan.mode)(setup)     # colocated, disaggregated, hybrid, shared, streams
    mode.start(layout, pins, requests(cfg, layout))  # its worker groups, reserving what the layout says
    mode.connect(layout)                       # its channels
    env_f, roll_f = mode.collect(T, trajectories, iteration)   # one collection (the same future in streams)
    mode.reconfigure(layout, pins, checked)    # another layout of a mode with the same wiring

A mode class also answers what a plan of its kind sets before anything runs: the ranks it sets
(:meth:`RunMode.ranks`), how it splits the configured env worker (:meth:`RunMode.env_split`), which
components float on a shared pool (:attr:`RunMode.floating`), what its ranks reserve from Ray
(:meth:`RunMode.requests`) and whether the runtime runs it as the planner models it for a config
(:meth:`RunMode.runs`). The trainer is the workflow's, the same in every mode.
"""

from __future__ import annotations

import logging
import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from embodied.registry import Registry
from embodied.runtime import Channel, Cluster, GroupFuture, RankResources, WorkerGroup
from embodied.threads import thread_env
from pipelines.config import EmbodiedConfig
from pipelines.layout import Layout
from pipelines.onpolicy.chunks import Pinning
from pipelines.onpolicy.workers import BlockRoute, EnvWorker, RolloutWorker, StreamWorker
from scheduler import GPU_SWITCH, MacroFlow, Plan, Profile, Resources, chunk_sizes, simulate

LOG = logging.getLogger("embodied")

Pins = dict[str, tuple[Pinning, ...]]
"""Component -> the pinning of each of its ranks."""
Requests = dict[str, list[RankResources]]
"""Worker group -> the Ray reservation of each of its ranks."""


@dataclass(frozen=True)
class ModeSetup:
    """What every mode builds its groups from: the config, the cluster, and what the algorithm
    asks of the rollout (``needs_critic``: record the critic's values; ``grouped``: GRPO's groups)."""

    cfg: EmbodiedConfig
    cluster: Cluster
    needs_critic: bool
    grouped: bool


def offloads(cfg: EmbodiedConfig, component: str, layout: Layout) -> bool:
    """Whether ``component`` leaves its devices between its phases (``plan.offload``, else the plan)."""
    forced = cfg.plan.offload
    if component == "trainer" and forced is None and cfg.workers.trainer_strategy == "fsdp" and layout.offloads("trainer"):
        LOG.warning("[m2flow] the plan offloads the trainer between phases; its FSDP shards stay on their devices")
        return False
    return component in (forced if forced is not None else layout.plan.offload)


def takes_turns(layout: Layout) -> bool:
    """Whether the env and the rollout take turns (never run at once): a ``switch`` plan
    (``Plan.gpu_sharing``) whose env and rollout share a device. The rollout then decides for no
    chunk while the env steps one (:meth:`RolloutWorker.configure`); an ``overlap`` plan, or none,
    pipelines the chunks, both resident, the env stepping chunk c+1 while chunk c is decided for."""
    plan = layout.plan
    return plan.gpu_sharing == GPU_SWITCH and bool(set(plan.placement["env"]) & set(plan.placement["rollout"]))


def simulator_device(cfg: EmbodiedConfig) -> str:
    """The device the env's simulator runs on (``workers.env_device``): the configured one, or with
    ``auto`` a batched simulator's own ``env.kwargs.device`` (its ``auto``: CUDA where torch sees
    a GPU), else the CPU. A ``cuda`` answer makes the env a GPU component for the planner and Ray."""
    configured = cfg.workers.env_device
    if configured != "auto":
        return configured
    if cfg.env.backend != "batched":
        return "cpu"
    own = str(cfg.env.kwargs.get("device", "auto"))
    if own == "auto":
        import torch  # only to ask whether a GPU is there

        return "cuda" if torch.cuda.is_available() else "cpu"
    return own


def rank_resources(cfg: EmbodiedConfig, component: str, layout: Layout, split: bool = False) -> list[RankResources]:
    """What each rank of ``component`` reserves from Ray: its CPUs, its GPUs (the layout's
    share, or one whole GPU that Ray picks for a CUDA worker outside a GPU plan; the env's on
    the device its simulator runs on, :func:`simulator_device`), custom
    resources, its node (unless custom resources choose the nodes), thread variables. ``split``:
    the ranks are ones a plan sets (a shared plan's lanes, a streams plan's env and rollout
    ranks), which split their component's ``workers.<component>_cpus`` between them."""
    w = cfg.workers
    cpus = {"env": w.env_cpus, "rollout": w.rollout_cpus, "trainer": w.trainer_cpus}[component]
    device = {"env": simulator_device(cfg), "rollout": w.rollout_device, "trainer": w.trainer_device}[component]
    custom = {"env": w.env_resources, "rollout": w.rollout_resources, "trainer": w.trainer_resources}[component]
    threads = w.trainer_threads if component == "trainer" else w.rollout_threads
    if split:
        cpus /= len(layout.ranks_of(component))
    out = []
    for rank in layout.ranks_of(component):
        num_gpus = rank.num_gpus if rank.gpus is not None else (1.0 if device.startswith("cuda") else 0.0)
        env_vars = {**thread_env(threads), **rank.env_vars()}
        out.append(RankResources(cpus, num_gpus, env_vars, dict(custom), None if custom else rank.node))
    return out


def requests(cfg: EmbodiedConfig, layout: Layout) -> Requests:
    """Every rank's Ray reservation under ``layout``: its mode's groups' and the trainer's (its
    ranks split ``workers.trainer_cpus``, the trainer's reservation however many ranks it runs)."""
    return {**mode_of(layout.plan).requests(cfg, layout), "trainer": rank_resources(cfg, "trainer", layout, split=True)}


def amounts(requests: Requests) -> dict[str, list[dict[str, float]]]:
    """``requests`` as :meth:`Cluster.check_capacity` reads them: each rank's ``{resource: amount}``."""
    return {group: [{"CPU": r.num_cpus, "GPU": r.num_gpus, **r.custom} for r in ranks] for group, ranks in requests.items()}


def capacity_of(cluster: Cluster) -> dict[str, float] | None:
    """The CPUs and GPUs the groups of a run may reserve on ``cluster``: a local Ray's; None where
    reservations are not checked (the local backend reserves nothing; a joined cluster may grow),
    as :meth:`Cluster.check_capacity` does."""
    if cluster.backend != "ray" or cluster.cfg.address is not None:
        return None
    return {"CPU": cluster.num_cpus, "GPU": cluster.num_gpus}


def shortfall(requests: Requests, capacity: dict[str, float]) -> str | None:
    """What ``requests`` ask for beyond ``capacity`` (``{"CPU": n, "GPU": m}``), in words, as
    :meth:`Cluster.check_capacity` says it; None when they fit. Custom resources choose nodes and
    are not compared."""
    per_group = {group: {n: sum(rank[n] for rank in ranks) for n in capacity} for group, ranks in amounts(requests).items()}
    short = []
    for name in sorted(capacity):
        wanted = sum(group[name] for group in per_group.values())
        if wanted > capacity[name] + 1e-9:
            parts = ", ".join(f"{g} {amount[name]:g}" for g, amount in per_group.items() if amount[name] > 0)
            short.append(f"{wanted:g} {name} ({parts}), the cluster has {capacity[name]:g}")
    return "; ".join(short) or None


def simulated_walls(profile: Profile, layout: Layout, flow: MacroFlow, resources: Resources) -> dict[str, float]:
    """The simulated wall seconds of every component's calls in one iteration of ``flow`` under
    ``layout``'s plan (the simulation's spans, which stretch where more threads than cores run)."""
    timeline = simulate(layout.plan, profile, flow, resources)
    calls = {s.label: (s.component, s.end_s - s.start_s) for s in timeline.spans if s.kind == "work"}
    walls: dict[str, float] = {}
    for component, seconds in calls.values():
        walls[component] = walls.get(component, 0.0) + seconds
    return walls


class RunMode(ABC):
    """The env and rollout worker groups of one kind of plan: how they are built, connected,
    reconfigured for another layout of the same wiring, and how one collection runs on them."""

    wiring: ClassVar[str]
    """Modes of one wiring run the same worker groups: re-planning between them hands the groups
    over (:meth:`adopt`); between wirings the old groups end before the new ones reserve."""
    group_names: ClassVar[tuple[str, ...]]
    """The attributes that hold the mode's worker groups, in flow order (None before :meth:`start`)."""
    floating: ClassVar[frozenset[str]] = frozenset()
    """Components whose ranks run one thread each, unpinned on the pool (the OS shares its cores)."""

    def __init__(self, setup: ModeSetup) -> None:
        self.setup = setup
        self.spaces: tuple[Any, Any] | None = None  # the env's (observation_space, action_space)

    # --- what a plan of this mode sets ----------------------------------------------------------------
    @staticmethod
    def ranks(plan: Plan) -> dict[str, int]:
        """The ranks a plan of this mode sets, whatever ``workers.*`` say."""
        return {}

    @staticmethod
    def env_split(plan: Plan) -> int:
        """Env ranks per configured env worker."""
        return 1

    @classmethod
    def env_chunks(cls, layout: Layout) -> int:
        """Chunks each env rank steps."""
        return layout.num_chunks // cls.env_split(layout.plan)

    @staticmethod
    def runs(cfg: EmbodiedConfig, multi_node: bool) -> bool:
        """Whether the runtime runs this mode as the planner models it for ``cfg``."""
        return True

    @classmethod
    @abstractmethod
    def requests(cls, cfg: EmbodiedConfig, layout: Layout) -> Requests:
        """What the ranks of this mode's groups reserve from Ray under ``layout`` (not the trainer's)."""

    @staticmethod
    @abstractmethod
    def predicted_collection_s(profile: Profile, layout: Layout, cfg: EmbodiedConfig, flow: MacroFlow,
                               resources: Resources) -> tuple[float, float]:
        """The profiled seconds of one env rank's and one rollout rank's calls in a collection of
        ``flow`` under ``layout`` (what ``time/sim_s`` and ``time/infer_s`` measure)."""

    # --- running ------------------------------------------------------------------------------------
    @abstractmethod
    def start(self, layout: Layout, pins: Pins, requests: Requests) -> None:
        """Create the groups for ``layout`` (and read the env's :attr:`spaces`)."""

    def connect(self, layout: Layout) -> None:
        """Create the channels between the groups (none by default)."""

    @property
    @abstractmethod
    def acting(self) -> WorkerGroup:
        """The group that acts with the synced weights and sends the batches to the trainer."""

    def groups(self) -> list[WorkerGroup]:
        """The running groups, in flow order."""
        return [g for g in (getattr(self, name) for name in self.group_names) if g is not None]

    def load_weights(self, weights: Any) -> GroupFuture:
        """Load a weight payload (a handle to the trainer's export) into every acting rank."""
        return self.acting.remote.load_weights(weights)

    @abstractmethod
    def collect(self, num_steps: int, trajectories: Channel, iteration: int) -> tuple[GroupFuture, GroupFuture]:
        """Start one collection of ``num_steps`` decisions per chunk, batches to ``trajectories``:
        the futures of the env half (its tallies) and of the rollout half (its inference stats);
        the same future where one call makes both."""

    def adopt(self, other: RunMode) -> None:
        """Take over the groups of ``other``, a mode of the same wiring (:meth:`connect` makes the
        channels anew)."""
        assert other.wiring == self.wiring and other.group_names == self.group_names
        self.spaces = other.spaces
        for name in self.group_names:
            setattr(self, name, getattr(other, name))

    @abstractmethod
    def reconfigure(self, layout: Layout, pins: Pins, checked: Callable[[Layout], Requests]) -> list[GroupFuture]:
        """Run ``layout`` on the groups: rebuild those whose number of ranks changes (ended
        before ``checked(layout)`` reserves the new ranks), reconfigure the others; the pending
        reconfiguration calls."""

    def shutdown(self) -> None:
        """End every group (env processes end with their worker)."""
        for group in self.groups():
            group.shutdown()
        for name in self.group_names:
            setattr(self, name, None)


RUN_MODES: Registry[type[RunMode]] = Registry("plan mode")


def mode_of(plan: Plan) -> type[RunMode]:
    """The class that runs ``plan``'s mode."""
    return RUN_MODES.get(plan.mode)


@RUN_MODES.register("colocated")
@RUN_MODES.register("disaggregated")
@RUN_MODES.register("hybrid")
class Pipelined(RunMode):
    """Env workers and rollout workers apart, the chunks pipelined over channels.

    ``workers.env`` env ranks and the rollout's ranks run in processes of their own: each env
    rank's chunks send observations to the rollout and step with the actions that come back over
    channels, chunk c+1 simulated while chunk c waits. Where the components sit (one pool, apart,
    or partly shared) is the layout's; the wiring is the same."""

    wiring = "channels"
    group_names = ("env", "rollout")

    def __init__(self, setup: ModeSetup) -> None:
        super().__init__(setup)
        self.env: WorkerGroup | None = None
        self.rollout: WorkerGroup | None = None
        self.observations: Channel | None = None  # env -> rollout (set by connect)
        self.actions: Channel | None = None  # rollout -> env

    @classmethod
    def requests(cls, cfg: EmbodiedConfig, layout: Layout) -> Requests:
        set_by_plan = cls.ranks(layout.plan)
        return {c: rank_resources(cfg, c, layout, split=c in set_by_plan) for c in ("env", "rollout")}

    @staticmethod
    def predicted_collection_s(profile: Profile, layout: Layout, cfg: EmbodiedConfig, flow: MacroFlow,
                               resources: Resources) -> tuple[float, float]:
        """Each env rank steps its ``k`` chunks T times; each rollout rank infers for k chunks of
        the whole batch T + 1 times, on its component's devices."""
        T, k = flow.rollout_steps, layout.num_chunks
        devices = {name: len(placed) for name, placed in layout.plan.placement.items()}
        env_s = profile["env"].cost.time_s(math.ceil(cfg.env.num_envs / k), devices["env"]) * T * k
        rollout_s = profile["rollout"].cost.time_s(math.ceil(flow.num_envs / k), devices["rollout"]) * (T + 1) * k
        return env_s, rollout_s

    def start(self, layout: Layout, pins: Pins, requests: Requests) -> None:
        self.env = self._env_group(layout, pins, requests)
        self.spaces = self.env.on(0).spaces().result()
        self.rollout = self._rollout_group(layout, pins, requests)

    def _env_group(self, layout: Layout, pins: Pins, requests: Requests) -> WorkerGroup:
        """The layout's env ranks (``workers.env``)."""
        s = self.setup
        return WorkerGroup(s.cluster, EnvWorker, len(layout.ranks_of("env")), s.cfg, self.env_chunks(layout), pins["env"],
                           s.grouped, self.env_split(layout.plan), name="env", resources=requests["env"])

    def _rollout_group(self, layout: Layout, pins: Pins, requests: Requests) -> WorkerGroup:
        """The layout's rollout ranks (a shared plan's lanes, else ``workers.rollout``)."""
        s = self.setup
        assert self.spaces is not None
        return WorkerGroup(s.cluster, RolloutWorker, len(layout.ranks_of("rollout")), s.cfg, *self.spaces,
                           layout.num_chunks, pins["rollout"], s.needs_critic, s.grouped, offloads(s.cfg, "rollout", layout),
                           takes_turns(layout), name="rollout", resources=requests["rollout"])

    def connect(self, layout: Layout) -> None:
        self.observations = Channel("observations", self.rollout, source="env")
        self.actions = Channel("actions", self.env, route=BlockRoute(self.env_chunks(layout)), source="rollout")

    @property
    def acting(self) -> WorkerGroup:
        assert self.rollout is not None, "no rollout ranks before start()"
        return self.rollout

    def collect(self, num_steps: int, trajectories: Channel, iteration: int) -> tuple[GroupFuture, GroupFuture]:
        assert self.env is not None and self.rollout is not None
        env_f = self.env.remote.interact(num_steps, self.observations, self.actions, iteration).as_phase()
        roll_f = self.rollout.remote.generate(num_steps, self.observations, self.actions, trajectories).as_phase()
        return env_f, roll_f

    def reconfigure(self, layout: Layout, pins: Pins, checked: Callable[[Layout], Requests]) -> list[GroupFuture]:
        cfg = self.setup.cfg
        rebuild = [c for c, g in (("env", self.env), ("rollout", self.rollout))
                   if g is None or len(layout.ranks_of(c)) != g.num_ranks]
        for component in rebuild:  # another number of ranks (lanes): they end before new ones reserve
            group = getattr(self, component)
            if group is not None:
                group.shutdown()
            setattr(self, component, None)
        if rebuild:
            requests = checked(layout)
            if "env" in rebuild:
                self.env = self._env_group(layout, pins, requests)
            if "rollout" in rebuild:
                self.rollout = self._rollout_group(layout, pins, requests)
        calls = []
        if "env" not in rebuild:
            calls.append(self.env.remote.configure(self.env_chunks(layout), pins["env"], self.env_split(layout.plan)).as_phase())
        if "rollout" not in rebuild:
            calls.append(self.rollout.remote.configure(layout.num_chunks, pins["rollout"], offloads(cfg, "rollout", layout),
                                                       takes_turns(layout)))
        return calls


@RUN_MODES.register("shared")
class Shared(Pipelined):
    """The pipelined wiring with the rollout as lanes that float with the env over one pool.

    The rollout runs as ``plan.lanes`` one-thread ranks (its lanes) that float with the env, one
    thread, over the whole pool unpinned; the lanes split the rollout's reservation. The planner prices the env as one thread and each lane as its own process: it
    needs an ``inprocess`` env (no env processes) with one env worker, and Ray workers (the local
    backend runs every worker in one process), on one node (a pool is one node's cores)."""

    floating = frozenset({"env", "rollout"})

    @staticmethod
    def ranks(plan: Plan) -> dict[str, int]:
        return {"rollout": plan.lanes}

    @staticmethod
    def runs(cfg: EmbodiedConfig, multi_node: bool) -> bool:
        return cfg.env.backend == "inprocess" and cfg.workers.env == 1 and cfg.cluster.backend == "ray" and not multi_node

    @staticmethod
    def predicted_collection_s(profile: Profile, layout: Layout, cfg: EmbodiedConfig, flow: MacroFlow,
                               resources: Resources) -> tuple[float, float]:
        """The simulated wall seconds of the env's calls and of one lane's: a call slowed down
        while more threads than cores run in the pool takes longer than its profiled cost, as it
        does when measured (:func:`simulated_walls`)."""
        walls = simulated_walls(profile, layout, flow, resources)
        return walls.get("env", 0.0), walls.get("rollout", 0.0) / layout.plan.lanes


@RUN_MODES.register("streams")
class Streams(RunMode):
    """One StreamWorker per stream: env chunk and policy in one process, no channel between.

    Each :class:`StreamWorker` holds the stream's env chunk and the policy that acts in it in one
    process, pinned to the stream's cores as its rollout rank (its cores, the rollout's
    threads), reserving what the stream's env and rollout ranks would. It needs one configured env
    worker (the streams split its envs) and Ray workers, on one node."""

    wiring = "streams"
    group_names = ("stream",)

    def __init__(self, setup: ModeSetup) -> None:
        super().__init__(setup)
        self.stream: WorkerGroup | None = None

    @staticmethod
    def ranks(plan: Plan) -> dict[str, int]:
        return {"env": plan.lanes, "rollout": plan.lanes}

    @staticmethod
    def env_split(plan: Plan) -> int:
        return plan.lanes

    @staticmethod
    def runs(cfg: EmbodiedConfig, multi_node: bool) -> bool:
        return cfg.workers.env == 1 and cfg.cluster.backend == "ray" and not multi_node

    @staticmethod
    def predicted_collection_s(profile: Profile, layout: Layout, cfg: EmbodiedConfig, flow: MacroFlow,
                               resources: Resources) -> tuple[float, float]:
        """Every stream's env and rollout rank makes its stream's one chunk's calls, on the
        stream's cores: the mean over the streams."""
        T = flow.rollout_steps
        streams = list(zip(chunk_sizes(flow.num_envs, layout.num_chunks), layout.plan.stream_devices("env")))
        env_s = statistics.mean(profile["env"].cost.time_s(n, len(cores)) for n, cores in streams) * T
        rollout_s = statistics.mean(profile["rollout"].cost.time_s(n, len(cores)) for n, cores in streams) * (T + 1)
        return env_s, rollout_s

    @classmethod
    def requests(cls, cfg: EmbodiedConfig, layout: Layout) -> Requests:
        env, rollout = (rank_resources(cfg, c, layout, split=True) for c in ("env", "rollout"))
        return {"stream": [RankResources(e.num_cpus + r.num_cpus, r.num_gpus, r.env_vars,
                                         {k: e.custom.get(k, 0) + r.custom.get(k, 0) for k in {*e.custom, *r.custom}}, r.node)
                           for e, r in zip(env, rollout)]}

    def start(self, layout: Layout, pins: Pins, requests: Requests) -> None:
        s = self.setup
        self.stream = WorkerGroup(s.cluster, StreamWorker, layout.plan.lanes, s.cfg, self.env_chunks(layout),
                                  pins["rollout"], s.needs_critic, s.grouped, offloads(s.cfg, "rollout", layout),
                                  name="stream", resources=requests["stream"])
        self.spaces = self.stream.on(0).spaces().result()

    @property
    def acting(self) -> WorkerGroup:
        assert self.stream is not None, "no stream ranks before start()"
        return self.stream

    def collect(self, num_steps: int, trajectories: Channel, iteration: int) -> tuple[GroupFuture, GroupFuture]:
        # each stream steps its envs and acts in them: one call makes both halves
        both = self.acting.remote.collect(num_steps, trajectories, iteration).as_phase()
        return both, both

    def reconfigure(self, layout: Layout, pins: Pins, checked: Callable[[Layout], Requests]) -> list[GroupFuture]:
        if self.stream is not None and self.stream.num_ranks == layout.plan.lanes:
            return [self.stream.remote.configure(self.env_chunks(layout), pins["rollout"],
                                                 offloads(self.setup.cfg, "rollout", layout)).as_phase()]  # rebuilds the envs
        if self.stream is not None:
            self.stream.shutdown()
            self.stream = None
        self.start(layout, pins, checked(layout))
        return []
