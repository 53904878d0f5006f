"""Macro flows: a :class:`MacroFlow` describes one iteration; its kind turns it into a task graph.

Kinds live in :data:`FLOW_KINDS` (a registry of builder specs, no if/elif on the kind):

``embodied``
    Per chunk c, a strict alternation
    ``rollout t0 → env t0 → rollout t1 → env t1 → … → env t(T-1) → rollout tT``, the message
    protocol of ``pipelines/onpolicy/workers.py``: the env worker first sends the chunk's current
    observation (carried over from the last iteration, or the reset on the very first one; free
    in steady state, so not a task), ``rollout t`` infers actions (and values, log-probs) for the
    observation of step t, ``env t`` steps the chunk's envs with them, and ``rollout tT`` computes
    the bootstrap values of the final observation (costed like an inference call). After every
    chunk's ``rollout tT``, the trainer trains ``train_epochs`` epochs on all
    ``num_envs * rollout_steps`` samples (``train_samples``: those an episodic iteration's episodes
    took; PPO needs the whole batch before its first epoch), in
    calls of ``train_microbatch`` samples. Then weights sync to the rollout workers.
    In ``shared`` mode (:data:`FlowKind.pool`: env and rollout) the env tasks run on lane
    ``"env"`` and chunk c's rollout tasks on lane ``"rollout {c % lanes}"``, each priced at one
    thread, sharing the pool's cores (see :mod:`scheduler.simulate`). In ``streams`` mode chunk c's
    env and rollout tasks both run on stream c's cores (``Plan.stream_devices``), priced at that
    many threads: each stream alternates on its own cores, the streams side by side, and its env
    and rollout tasks share one process (``Task.process``: no message between them).
    A plan whose GPU simulator overlaps its GPUs with the rollout (``Plan.gpu_sharing ==
    "overlap"``) runs the env tasks on lane ``"env"`` and all rollout tasks on lane ``"rollout"``,
    priced on their devices, the GPUs' pool slowing overlapping tasks by ``Profile.gpu_contention``.
    With ``train_overlap`` (steady state of one-step-stale training, ``algo.staleness=1``) the trainer
    trains on the *previous* iteration's samples, so its epochs wait for no message of this
    iteration: they start as soon as their devices are free, and the weight sync follows both.

``reasoning``
    Per chunk c (a set of whole prompts, i.e. whole GRPO groups): ``rollout c`` generates
    ``prompts * group_size`` samples, ``reward c`` scores them, ``trainer epoch 0 c`` trains on them
    as they arrive (streaming); later epochs run over the whole batch. Then weights sync.

Component names are fixed per kind and must be keys of the :class:`~scheduler.Profile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from scheduler._json import check_keys
from scheduler.graph import WORK, Dep, Task, call_sizes, chunk_sizes
from scheduler.plans import GPU_OVERLAP, SHARED, STREAMS, Plan
from scheduler.profile import WEIGHT_SYNC, Profile


@dataclass(frozen=True)
class MacroFlow:
    """One iteration of a macro flow. Build it with :meth:`embodied` or :meth:`reasoning`."""

    kind: str
    """A key of :data:`FLOW_KINDS`: ``"embodied"`` or ``"reasoning"``."""
    num_envs: int = 0
    """embodied: parallel envs in one iteration, summed over all env workers (the plan divides them)."""
    rollout_steps: int = 0
    """embodied: control steps T per env per iteration."""
    num_prompts: int = 0
    """reasoning: prompts per iteration."""
    group_size: int = 0
    """reasoning: samples generated per prompt (one GRPO group)."""
    train_epochs: int = 1
    """Passes of the trainer over the iteration's samples."""
    train_minibatch: int | None = None
    """embodied: samples per optimizer step (PPO minibatch); None = all. Micro-batches never cross it."""
    train_overlap: bool = False
    """embodied: the trainer trains on the previous iteration's samples while this iteration's are
    collected (one weight version of staleness). Only devices the trainer does not share can overlap."""
    train_samples: int | None = None
    """embodied: samples the trainer trains on; None = every decision, ``num_envs * rollout_steps``.
    An episodic iteration (GRPO: a chunk stops once its episodes are over) trains on the decisions
    its episodes took."""
    ranks: tuple[tuple[str, int], ...] = ()
    """Worker processes (ranks) of the components that declare them, e.g. ``(("rollout", 1),
    ("trainer", 2))``; a rank takes whole devices. The ranks of a data-parallel component (the
    kind's trainer) each own devices: a multiple of the ranks in CPU cores, one GPU per rank.
    Another component's ranks share its CPU cores, and its GPUs evenly, one GPU each. A
    component's cost model is that of all its ranks together (for the trainer: a call of
    ``batch`` samples spread over the ranks, gradient combination included). Components not
    named here may use any devices."""

    def __post_init__(self) -> None:
        spec = flow_kind(self.kind)
        if self.train_epochs < 1:
            raise ValueError(f"MacroFlow.train_epochs must be >= 1, got {self.train_epochs}")
        object.__setattr__(self, "ranks", tuple(sorted((str(c), int(n)) for c, n in self.ranks)))
        bad = [(c, n) for c, n in self.ranks if n < 1 or c not in spec.components]
        if bad:
            raise ValueError(f"MacroFlow.ranks names components of the {self.kind} workflow ({', '.join(spec.components)}) "
                             f"with at least 1 rank each, got {bad}")
        spec.validate(self)

    def ranks_of(self, component: str) -> int | None:
        """The declared ranks of ``component`` (None: not declared)."""
        return dict(self.ranks).get(component)

    def rank_devices_fit(self, component: str, devices: int, kind: str) -> bool:
        """Whether ``devices`` devices of ``kind`` suit the declared ranks of ``component``."""
        ranks = self.ranks_of(component)
        if ranks is None:
            return True
        if component in self.spec.data_parallel:
            return devices == ranks if kind == "gpu" else devices % ranks == 0
        return kind != "gpu" or ranks % devices == 0

    @classmethod
    def embodied(
        cls, num_envs: int, rollout_steps: int, train_epochs: int = 1, train_minibatch: int | None = None,
        train_overlap: bool = False, ranks: Mapping[str, int] | None = None, train_samples: int | None = None,
    ) -> MacroFlow:
        return cls("embodied", num_envs=num_envs, rollout_steps=rollout_steps, train_epochs=train_epochs,
                   train_minibatch=train_minibatch, train_overlap=train_overlap, ranks=tuple((ranks or {}).items()),
                   train_samples=train_samples)

    @property
    def samples(self) -> int:
        """embodied: the samples the trainer trains on in one iteration."""
        return self.train_samples if self.train_samples is not None else self.num_envs * self.rollout_steps

    @classmethod
    def reasoning(cls, num_prompts: int, group_size: int, train_epochs: int = 1,
                  ranks: Mapping[str, int] | None = None) -> MacroFlow:
        return cls("reasoning", num_prompts=num_prompts, group_size=group_size, train_epochs=train_epochs,
                   ranks=tuple((ranks or {}).items()))

    @property
    def spec(self) -> FlowKind:
        return flow_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ranks"] = dict(self.ranks)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MacroFlow:
        check_keys("MacroFlow", data, [f.name for f in fields(cls)], required=("kind",))
        return cls(**{**data, "ranks": tuple(dict(data.get("ranks") or {}).items())})


@dataclass(frozen=True)
class FlowKind:
    """How one kind of workflow maps onto components, phases and tasks."""

    components: tuple[str, ...]
    """Components the planner places, in flow order."""
    phases: Mapping[str, int]
    """Component -> phase index; a device runs one phase after the other (context switch between)."""
    phase_names: tuple[str, ...]
    hybrid_shared: tuple[str, ...]
    """Components that span all their eligible devices in hybrid mode (the others are disjoint)."""
    data_parallel: tuple[str, ...]
    """Components whose ranks each own devices (see ``MacroFlow.ranks``)."""
    validate: Callable[[MacroFlow], None]
    chunk_total: Callable[[MacroFlow], int]
    """How many items the chunks partition (envs or prompts): the upper bound of ``num_chunks``."""
    memory_items: Callable[[MacroFlow, int, int | None], dict[str, int]]
    """``(workflow, num_chunks, train_microbatch)`` -> items each component holds per call (all devices)."""
    microbatch_candidates: Callable[[MacroFlow], tuple[int, ...]]
    """Actor micro-batch sizes worth trying, largest first."""
    build: Callable[[MacroFlow, Plan, Profile], list[Task]]
    """The work tasks (no context switches) of one iteration under a plan."""
    pool: tuple[str, ...] = ()
    """Components that float over one shared pool of CPU cores in ``shared`` mode, one worker
    thread each, the first being the lane component (its chunks spread over ``Plan.lanes``
    workers); empty: the kind has no shared mode."""


def flow_kind(kind: str) -> FlowKind:
    try:
        return FLOW_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown workflow kind {kind!r}; known: {sorted(FLOW_KINDS)}") from None


# --------------------------------------------------------------------------------------- helpers


def _require_positive(workflow: MacroFlow, names: tuple[str, ...], unused: tuple[str, ...]) -> None:
    for name in names:
        if getattr(workflow, name) < 1:
            raise ValueError(f"{workflow.kind} workflow needs {name} >= 1, got {getattr(workflow, name)}")
    defaults = {f.name: f.default for f in fields(MacroFlow)}
    for name in unused:
        if getattr(workflow, name) != defaults[name]:
            raise ValueError(f"{workflow.kind} workflow does not use {name}; leave it at {defaults[name]!r}")


def _powers_of_two_below(cap: int, unit: int = 1) -> tuple[int, ...]:
    """``cap`` and ``unit * 2**i < cap``, largest first."""
    out = [cap]
    size = unit
    while size < cap:
        out.append(size)
        size *= 2
    return tuple(sorted(set(out), reverse=True))


def _weight_sync(plan: Plan, profile: Profile, after: str, phase: int, target: str = "rollout") -> list[Task]:
    """The weight sync trainer -> ``target`` as a task on the target's devices (omitted if it is free)."""
    devices = plan.placement[target]
    local_s = profile[WEIGHT_SYNC].cost.time_s(1, len(devices)) if WEIGHT_SYNC in profile.components else 0.0
    crosses = plan.placement["trainer"] != devices or profile.cross_process_messages
    if local_s == 0.0 and not (crosses and profile.message_s(profile[target].weights_mib) > 0):
        return []
    dep = Dep(after, profile[target].weights_mib)
    return [Task(WEIGHT_SYNC, WEIGHT_SYNC, devices, local_s, (dep,), (phase, WORK, 0, 0, 0), kind="sync")]


# -------------------------------------------------------------------------------------- embodied


def _embodied_validate(w: MacroFlow) -> None:
    _require_positive(w, ("num_envs", "rollout_steps"), ("num_prompts", "group_size"))
    if w.train_samples is not None and w.train_samples < 1:
        raise ValueError(f"train_samples must be >= 1, got {w.train_samples}")
    if w.train_minibatch is not None and not 1 <= w.train_minibatch <= w.samples:
        raise ValueError(f"train_minibatch must lie in [1, samples ({w.samples})], got {w.train_minibatch}")


def _embodied_memory_items(w: MacroFlow, num_chunks: int, microbatch: int | None) -> dict[str, int]:
    largest_call = w.train_minibatch or w.samples  # calls never cross a minibatch
    return {
        "env": w.num_envs,  # every env's state stays resident, not only the running chunk
        "rollout": max(chunk_sizes(w.num_envs, num_chunks)),
        "trainer": min(microbatch or largest_call, largest_call),
    }


def _embodied_microbatches(w: MacroFlow) -> tuple[int, ...]:
    return _powers_of_two_below(w.train_minibatch or w.samples)


def _embodied_build(w: MacroFlow, plan: Plan, profile: Profile) -> list[Task]:
    env, rollout, trainer = profile["env"], profile["rollout"], profile["trainer"]
    env_devices, rollout_devices, trainer_devices = (plan.placement[c] for c in ("env", "rollout", "trainer"))
    sizes = chunk_sizes(w.num_envs, plan.num_chunks)
    shared = plan.mode == SHARED  # env and rollout workers float over their pool, one thread each
    if plan.mode == STREAMS:  # chunk c: env and rollout ranks of stream c, on its cores
        env_on, rollout_on = plan.stream_devices("env"), plan.stream_devices("rollout")
    else:
        env_on, rollout_on = (env_devices,) * len(sizes), (rollout_devices,) * len(sizes)
    env_s = [env.cost.time_s(s, 1 if shared else len(env_on[c])) for c, s in enumerate(sizes)]
    rollout_s = [rollout.cost.time_s(s, 1 if shared else len(rollout_on[c])) for c, s in enumerate(sizes)]
    overlap = plan.gpu_sharing == GPU_OVERLAP  # env and rollout workers side by side on their GPUs
    env_lane = "env" if shared or overlap else None
    rollout_lane = [f"rollout {c % plan.lanes}" if shared else "rollout" if overlap else None for c in range(len(sizes))]
    process = [f"stream {c}" if plan.mode == STREAMS else None for c in range(len(sizes))]  # env and policy: one process
    steps = w.rollout_steps
    tasks: list[Task] = []
    for t in range(steps + 1):
        for c, size in enumerate(sizes):
            obs = () if t == 0 else (Dep(f"env t{t - 1} c{c}", size * env.output_mib_per_item),)
            tasks.append(Task(f"rollout t{t} c{c}", "rollout", rollout_on[c], rollout_s[c], obs, (0, WORK, t, c, 0), t, c,
                              lane=rollout_lane[c], process=process[c]))
            if t < steps:
                actions = (Dep(f"rollout t{t} c{c}", size * rollout.output_mib_per_item),)
                tasks.append(Task(f"env t{t} c{c}", "env", env_on[c], env_s[c], actions, (0, WORK, t, c, 1), t, c,
                                  lane=env_lane, process=process[c]))

    sample_mib = env.output_mib_per_item + rollout.output_mib_per_item
    trajectories = tuple(Dep(f"rollout t{steps} c{c}", size * steps * sample_mib) for c, size in enumerate(sizes))
    samples = w.samples
    minibatches = call_sizes(samples, w.train_minibatch)
    calls = [b for mb in minibatches for b in call_sizes(mb, plan.train_microbatch)]
    epoch_s = sum(trainer.cost.time_s(b, len(trainer_devices)) for b in calls)
    deps: tuple[Dep, ...] = () if w.train_overlap else trajectories  # overlap: last iteration's samples
    for e in range(w.train_epochs):
        name = f"trainer epoch {e}"
        tasks.append(Task(name, "trainer", trainer_devices, epoch_s, deps, (1, WORK, e, 0, 0)))
        deps = (Dep(name),)
    return tasks + _weight_sync(plan, profile, after=deps[0].task, phase=2)


# ------------------------------------------------------------------------------------- reasoning


def _reasoning_validate(w: MacroFlow) -> None:
    _require_positive(w, ("num_prompts", "group_size"), ("num_envs", "rollout_steps", "train_minibatch", "train_overlap",
                                                          "train_samples"))


def _reasoning_memory_items(w: MacroFlow, num_chunks: int, microbatch: int | None) -> dict[str, int]:
    chunk_samples = max(chunk_sizes(w.num_prompts, num_chunks)) * w.group_size
    trainer = microbatch or w.num_prompts * w.group_size
    if w.train_epochs == 1:  # only the streamed epoch, whose calls never exceed a chunk
        trainer = min(trainer, chunk_samples)
    return {"rollout": chunk_samples, "reward": chunk_samples, "trainer": trainer}


def _reasoning_microbatches(w: MacroFlow) -> tuple[int, ...]:
    return _powers_of_two_below(w.num_prompts * w.group_size, unit=w.group_size)


def _reasoning_build(w: MacroFlow, plan: Plan, profile: Profile) -> list[Task]:
    rollout, reward, trainer = profile["rollout"], profile["reward"], profile["trainer"]
    rollout_devices, reward_devices, trainer_devices = (plan.placement[c] for c in ("rollout", "reward", "trainer"))
    group = w.group_size

    def train_s(samples: int) -> float:
        return sum(trainer.cost.time_s(b, len(trainer_devices)) for b in call_sizes(samples, plan.train_microbatch, group))

    tasks: list[Task] = []
    for c, prompts in enumerate(chunk_sizes(w.num_prompts, plan.num_chunks)):
        samples = prompts * group
        tasks.append(Task(f"rollout c{c}", "rollout", rollout_devices, rollout.cost.time_s(samples, len(rollout_devices)),
                          (), (0, WORK, c, 0, 0), chunk=c))
        responses = (Dep(f"rollout c{c}", samples * rollout.output_mib_per_item),)
        tasks.append(Task(f"reward c{c}", "reward", reward_devices, reward.cost.time_s(samples, len(reward_devices)),
                          responses, (0, WORK, c, 1, 0), chunk=c))
        scored = (Dep(f"reward c{c}", samples * (rollout.output_mib_per_item + reward.output_mib_per_item)),)
        tasks.append(Task(f"trainer epoch 0 c{c}", "trainer", trainer_devices, train_s(samples), scored, (1, WORK, 0, c, 0), chunk=c))
    last = f"trainer epoch 0 c{plan.num_chunks - 1}"
    epoch_s = train_s(w.num_prompts * group)
    for e in range(1, w.train_epochs):
        # The previous epoch's last call ends after all its calls (same devices, in order).
        deps = (Dep(last),)
        last = f"trainer epoch {e}"
        tasks.append(Task(last, "trainer", trainer_devices, epoch_s, deps, (1, WORK, e, 0, 0)))
    return tasks + _weight_sync(plan, profile, after=last, phase=2)


FLOW_KINDS: dict[str, FlowKind] = {
    "embodied": FlowKind(
        components=("env", "rollout", "trainer"),
        phases={"env": 0, "rollout": 0, "trainer": 1},
        phase_names=("rollout", "train"),
        hybrid_shared=("trainer",),
        data_parallel=("trainer",),
        validate=_embodied_validate,
        chunk_total=lambda w: w.num_envs,
        memory_items=_embodied_memory_items,
        microbatch_candidates=_embodied_microbatches,
        build=_embodied_build,
        pool=("rollout", "env"),
    ),
    "reasoning": FlowKind(
        components=("rollout", "reward", "trainer"),
        phases={"rollout": 0, "reward": 0, "trainer": 1},
        phase_names=("generate", "train"),
        hybrid_shared=("trainer",),
        data_parallel=("trainer",),
        validate=_reasoning_validate,
        chunk_total=lambda w: w.num_prompts,
        memory_items=_reasoning_memory_items,
        microbatch_candidates=_reasoning_microbatches,
        build=_reasoning_build,
    ),
}
"""Registry of workflow kinds. Add a kind by adding an entry; nothing else branches on the kind."""
