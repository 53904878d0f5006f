"""The embodied workflow: env workers, rollout workers and a trainer, PPO or GRPO.

The macro flow of one iteration, as plain sequential code::

    rollout.load_weights(trainer.export_weights())      # versioned weight sync (WeightSyncer)
    env.interact(T)  ||  rollout.generate(T)            # chunks pipelined through channels (a switch
                                                        # plan's shared GPU: env and rollout take turns)
    trainer.train(trajectories)                         # the algorithm: advantages + update

Where workers run and how the env batch is chunked comes from the plan (``plan.*``). With
``algo.staleness=1`` the trainer updates on the previous iteration's batch while this one is
collected. GRPO (``algo.name=grpo``) starts every iteration with the envs reset in groups, each
group from one initial state. How the env and rollout halves run (their worker groups, channels,
reconfiguration) is the plan mode's (:mod:`pipelines.onpolicy.modes`); the trainer is the same in
every mode.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embodied.algorithms import build_algorithm
from embodied.runtime import Channel, Cluster, GroupFuture, WorkerError, WorkerGroup, wait_all
from embodied.checkpoint import check_compatible
from embodied.runtime.weights import WeightSyncer, state_of
from pipelines.collect import resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.evaluate import evaluate_policy
from pipelines.layout import Machine, RankPlacement
from pipelines.onpolicy.planning import macro_flow_of, machine_of, measured_factors, plan_embodied, trainer_micro_batch
from pipelines.probes import MIN_THREAD_SCALING, profile_embodied
from pipelines.preflight import preflight
from pipelines.onpolicy.chunks import Pinning
from pipelines.onpolicy.spans import overlap_s
from pipelines.onpolicy.modes import ModeSetup, Requests, RunMode, amounts, capacity_of, mode_of, offloads, requests, shortfall
from pipelines.onpolicy.workers import TrainerWorker
from pipelines.workflow import WORKFLOWS, Layout, Workflow, WorkflowSpec
from policies.registry import build_policy
from scheduler import Plan, PlanResult, Profile
from scheduler import MacroFlow

LOG = logging.getLogger("embodied")
RETURN_WINDOW = 20
EVAL_SEED_OFFSET = 10_000_000  # evaluation episodes start from seeds apart from training's


class EmbodiedWorkflow(Workflow):
    """Builds the worker groups and channels of the embodied macro flow and runs its iterations."""

    components = ("env", "rollout", "trainer")

    def __init__(self, cfg: EmbodiedConfig) -> None:
        super().__init__(cfg)
        self.algorithm = build_algorithm(cfg.algo)
        self.profile_: Profile | None = None
        self.mode: RunMode | None = None  # the plan mode's env and rollout groups (set by build and apply)
        self.trainer: WorkerGroup | None = None
        self.capacity: dict[str, float] | None = None  # the CPUs and GPUs ranks may reserve (None: not checked)
        # staleness 1: the batches of the last collection that await training (one per rank that sent
        # one; the plan may have changed the number of ranks since), 0: none
        self.pending = 0
        # train/* episode metrics average the last RETURN_WINDOW finished episodes: the episodes that
        # finish inside one iteration alone are biased towards short ones. Grouped (GRPO) they
        # average the iteration's rollouts (every env's first episode): a window of the last ones
        # to end would hold the iteration's slowest episodes, its failures.
        self.recent: deque[dict[str, float]] = deque(maxlen=RETURN_WINDOW)

    def preflight(self) -> tuple[Any, Any]:
        """The env builds and the policy fits it: (observation_space, action_space)."""
        return preflight(self.cfg)

    def describe(self) -> str:
        cfg = self.cfg
        workflow = macro_flow_of(cfg)
        steps = "steps" if cfg.policy.action_chunk == 1 else f"chunks of {cfg.policy.action_chunk} actions"
        return f"{workflow.num_envs} envs x {workflow.rollout_steps} {steps}, {workflow.train_epochs} epochs"

    # --- sizes -------------------------------------------------------------------------------------
    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.steps_per_iteration

    @property
    def total_steps(self) -> int:
        return self.cfg.algo.total_env_steps

    # --- planning ----------------------------------------------------------------------------------
    def macro_flow(self, metrics: dict[str, Any] | None = None) -> MacroFlow:
        return macro_flow_of(self.cfg, metrics)

    def profile(self, cluster: Cluster, force: bool, log: Callable[[str], None]) -> Profile:
        return profile_embodied(self.cfg, cluster, force=force, log=log)

    def plan(self, profile: Profile) -> PlanResult:
        """The planner's candidates; on a cluster whose reservations are checked, only those whose
        ranks it can hold (:meth:`shortfall`), so the plan chosen is one the runtime can build."""
        shortfall_of = self.shortfall if self.capacity is not None else None
        return plan_embodied(self.cfg, profile, self.resources(), self.machine().multi_node, shortfall_of)

    def discover(self, cluster: Cluster) -> Machine:
        self.capacity = capacity_of(cluster)
        return machine_of(self.cfg, cluster)

    def shortfall(self, plan: Plan) -> str | None:
        """What ``plan``'s ranks would reserve beyond :attr:`capacity` (None: they fit, or it is not checked)."""
        if self.capacity is None:
            return None
        return shortfall(requests(self.cfg, self.layout_of(plan)), self.capacity)

    def ranks(self) -> dict[str, int]:
        w = self.cfg.workers
        return {"env": w.env, "rollout": w.rollout, "trainer": w.trainer}

    def ranks_for(self, plan: Plan) -> dict[str, int]:
        """The configured ranks, with those ``plan``'s mode sets (:meth:`RunMode.ranks`)."""
        return {**self.ranks(), **mode_of(plan).ranks(plan)}

    def measured_factors(self, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
        return measured_factors(profile, layout, self.cfg, metrics)

    def _pinnings(self, layout: Layout, profile: Profile | None) -> dict[str, tuple[Pinning, ...]]:
        """Each rank's pinning (unplanned: not pinned, configured threads)."""
        w = self.cfg.workers
        if profile is None:
            configured = {"env": w.rollout_threads, "rollout": w.rollout_threads, "trainer": w.trainer_threads}
            return {c: (Pinning(None, configured[c]),) * len(layout.ranks_of(c)) for c in self.components}
        floating = mode_of(layout.plan).floating

        def pinning(component: str, rank: RankPlacement) -> Pinning:
            # One torch thread per core only where the probes showed the component scales with
            # cores; small models run fastest on one thread (more threads only spin and contend).
            # Env ranks run one thread: their cores go to their env processes. Components that float
            # on a pool (RunMode.floating) run one thread each on the whole pool (the OS shares its cores).
            cores = rank.cores
            scales = component != "env" and component not in floating and \
                profile[component].cost.scaling_exponent >= MIN_THREAD_SCALING
            return Pinning(cores, len(cores) if cores is not None and scales else 1)

        return {c: tuple(pinning(c, r) for r in layout.ranks_of(c)) for c in self.components}

    def _trainer_micro_batch(self, layout: Layout) -> int | None:
        return trainer_micro_batch(self.cfg.algo.micro_batch_size, layout.plan.train_microbatch, self.cfg.workers.trainer)

    def _checked_requests(self, layout: Layout) -> Requests:
        """Every rank's Ray reservation under ``layout`` (:func:`requests`), refused at once if the
        cluster cannot hold them."""
        wanted = requests(self.cfg, layout)
        self.cluster_.check_capacity(amounts(wanted))
        return wanted

    # --- running -----------------------------------------------------------------------------------
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        cfg, w = self.cfg, self.cfg.workers
        self.layout, self.profile_, self.priced_on = layout, profile, profile
        self.cluster_ = cluster
        pins = self._pinnings(layout, profile)
        wanted = self._checked_requests(layout)
        self.mode = mode_of(layout.plan)(ModeSetup(cfg, cluster, self.algorithm.needs_critic, self.algorithm.grouped))
        self.mode.start(layout, pins, wanted)
        assert self.mode.spaces is not None
        self.obs_space, self.action_space = self.mode.spaces
        self.trainer = WorkerGroup(
            cluster, TrainerWorker, w.trainer, cfg, self.obs_space, self.action_space, pins["trainer"],
            offloads(cfg, "trainer", layout), self._trainer_micro_batch(layout),
            name="trainer", resources=wanted["trainer"],
        )
        if w.trainer > 1 or w.trainer_strategy == "fsdp":  # the ranks' process group
            host, port = self.trainer.on(0).rendezvous().result()
            described = self._wait_trainer(self.trainer.remote.join(host, port))[0]
            LOG.debug(f"[embodied] trainer: {described} via {host}:{port}")
        self._connect(layout)

    def _connect(self, layout: Layout) -> None:
        self.mode.connect(layout)
        # every trainer rank waits for a whole collection's batch (on its own key): a phase, not one message
        self.traj_channel = Channel("trajectories", self.trainer, phase=True, source=self.mode.acting.name)

    def apply(self, layout: Layout) -> None:
        """Run ``layout`` from the next iteration. A mode of the running one's wiring takes its
        groups over and reconfigures them; another wiring's groups end before the new mode's
        ranks reserve their resources."""
        pins = self._pinnings(layout, self.profile_)
        mode = mode_of(layout.plan)(self.mode.setup)
        if mode.wiring == self.mode.wiring:
            mode.adopt(self.mode)
            calls = mode.reconfigure(layout, pins, self._checked_requests)
        else:
            self.mode.shutdown()
            mode.start(layout, pins, self._checked_requests(layout))
            calls = []
        self.mode = mode
        calls.append(self.trainer.remote.configure(pins["trainer"], offloads(self.cfg, "trainer", layout),
                                                   self._trainer_micro_batch(layout)))
        wait_all(*calls)
        self.layout = layout
        self._connect(layout)

    def _wait_trainer(self, *futures: GroupFuture) -> list[Any]:
        """Wait for calls that involve the trainer ranks; the results of the first. When one
        rank fails because another died (a collective lost its peer), the dead rank is named."""
        try:
            wait_all(*futures)
        except WorkerError as err:
            if err.group == self.trainer.name and self.trainer.num_ranks > 1:
                dead = self.trainer.first_dead(err.method)
                if dead is not None and dead.rank != err.rank:
                    raise dead from err
            raise
        return futures[0].wait()

    def locations(self) -> dict[str, list[dict[str, Any]]]:
        """Where every rank of every worker group runs: host, Ray node id, pid."""
        out: dict[str, list[dict[str, Any]]] = {}
        for group in self._groups():
            out[group.name] = [{"rank": i, "host": loc.node, "node_id": loc.node_id, "pid": loc.pid} if loc else {"rank": i}
                               for i, loc in enumerate(group.locations)]
        return out

    def _groups(self) -> list[WorkerGroup]:
        """The running worker groups: the mode's, then the trainer (none before :meth:`build`)."""
        return [*(self.mode.groups() if self.mode is not None else []), *([self.trainer] if self.trainer is not None else [])]

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        """Sync weights, collect T decisions from every env, train. With ``algo.staleness=1`` the
        trainer updates on the previous iteration's batch while this one is collected (the first
        iteration only collects; the ``last`` one also trains on its own batch)."""
        cfg = self.cfg
        assert self.layout is not None, "iterate() before build()"
        t0 = time.perf_counter()
        weights = self.trainer.remote.export_weights()  # rank 0's payload; one copy per node reads it
        self._wait_trainer(weights, self.mode.load_weights(weights.handle(0)))
        t_sync = time.perf_counter()
        batches = self.mode.acting.num_ranks  # this collection's: one per rank that sends one
        env_f, roll_f = self.mode.collect(cfg.algo.rollout_steps, self.traj_channel, iteration)
        overlap = cfg.algo.staleness > 0
        train_f = self._train_call(lr, self.pending) if overlap and self.pending else None
        wait_all(*((env_f,) if env_f is roll_f else (env_f, roll_f)))
        t_rollout = time.perf_counter()
        stats: dict[str, Any] = self._wait_trainer(train_f)[0] if train_f is not None else {}
        if not overlap or last:
            stats = self._wait_trainer(self._train_call(lr, batches))[0]
            self.pending = 0
        else:
            self.pending = batches
        t_train = time.perf_counter()

        env_out, roll_out = env_f.wait(), roll_f.wait()
        episodes = [e for out in env_out for e in out["episodes"]]
        self.recent.extend(episodes)
        steps = sum(int(out["env_steps"]) for out in env_out)  # taken (action chunks may end early)
        decisions = [d for out in env_out for d in out["decisions"]]  # per chunk (episodic: until its episodes ended)
        nonfinite = sum(int(out.get("nonfinite_episodes", 0)) for out in env_out)
        if nonfinite:
            LOG.warning(f"[embodied] {nonfinite} episode(s) ended on NaN/inf from the env in iteration {iteration + 1} "
                        "(env.nonfinite=drop); the env workers' logs name them")
        plan = self.layout.plan
        metrics: dict[str, Any] = {
            "steps": steps,
            **self._episode_metrics(episodes),
            "perf/env_steps_per_s": steps / (t_train - t0),
            "perf/rollout_env_steps_per_s": steps / (t_rollout - t_sync),
            "time/sync_s": t_sync - t0,
            "time/rollout_s": t_rollout - t_sync,
            "time/overlap_wait_s": t_train - t_rollout if overlap else None,
            "time/iteration_s": t_train - t0,
            "time/sim_s": float(np.mean([o["sim_s"] for o in env_out])),
            "time/infer_s": float(np.mean([o["infer_s"] for o in roll_out])),
            "time/env_rollout_overlap_s": self._env_rollout_overlap_s(env_out, roll_out),
            "rollout/decisions": float(np.mean(decisions)),
            "env/nonfinite_episodes": nonfinite,
            "plan/chunks": plan.num_chunks,
            "plan/mode": plan.mode,
            "plan/predicted_iteration_s": None,  # planned runs: set below, for the iteration as it ran
            "weights/version": roll_out[0]["version"],
            "offload/rollout_offload_s": float(np.mean([o["offload_s"] for o in roll_out])) if "offload_s" in roll_out[0] else None,
            "offload/rollout_onload_s": float(np.mean([o["onload_s"] for o in roll_out])) if "onload_s" in roll_out[0] else None,
            **stats,
        }
        if self.priced_on is not None:  # the prediction for the iteration as it ran (episodic: it may end early)
            predicted = self.predicted_as_ran(plan, self.priced_on, metrics)
            metrics["plan/predicted_iteration_s"] = predicted
            if "time/train_s" in stats:
                metrics["plan/measured_over_predicted"] = metrics["time/iteration_s"] / predicted
        return metrics

    def _env_rollout_overlap_s(self, env_out: list[dict[str, Any]], roll_out: list[dict[str, Any]]) -> float | None:
        """Seconds of the collection in which an env rank simulated while a rollout rank decided
        (:func:`~pipelines.onpolicy.spans.overlap_s`): 0 where they take turns (a ``switch``
        plan), the pipelining's overlap otherwise; None where the ranks run on several nodes,
        whose clocks do not compare."""
        assert self.layout is not None
        if len({r.node for c in ("env", "rollout") for r in self.layout.ranks_of(c)}) > 1:
            return None
        return overlap_s([s for out in env_out for s in out["sim_spans"]], [s for out in roll_out for s in out["infer_spans"]])

    def close(self) -> None:
        """Stop the worker groups (env processes end with their worker, as when the cluster
        shuts down): the cluster can run another layout's workers next (a benchmark measuring
        several plans in one cluster)."""
        if self.mode is not None:
            self.mode.shutdown()
        if self.trainer is not None:
            self.trainer.shutdown()
            self.trainer = None

    def drain(self, lr: float) -> None:
        if self.pending:
            self._wait_trainer(self._train_call(lr, self.pending))
            self.pending = 0

    def _train_call(self, lr: float, batches: int) -> GroupFuture:
        """Train on one collection: its ``batches`` batches (one per rank that collected it)."""
        return self.trainer.remote.train(self.traj_channel, batches, lr).as_phase()

    def _episode_metrics(self, episodes: list[dict[str, float]]) -> dict[str, Any]:
        window = episodes if self.algorithm.grouped else list(self.recent)
        out: dict[str, Any] = {"train/episodes": len(episodes)}
        if window:
            out["train/episode_return"] = float(np.mean([e["return"] for e in window]))
            out["train/episode_length"] = float(np.mean([e["length"] for e in window]))
            succ = [e["success"] for e in window if "success" in e]
            out["train/success_rate"] = float(np.mean(succ)) if succ else None
        else:
            out["train/episode_return"] = None
        return out

    # --- state -------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        return self._wait_trainer(self.trainer.remote.state())[0]  # rank 0's: whole tensors

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Every trainer rank continues from the same state, whatever number of ranks wrote it."""
        self._wait_trainer(self.trainer.remote.load_state(state["model"], state.get("optimizer"), state["version"],
                                             state.get("generator")))

    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        policy = build_policy(self.cfg.policy, *spaces)
        check_compatible(WeightSyncer().tensors(policy), checkpoint, where=f"checkpoint {checkpoint}")

    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Evaluate the trainer's current weights in this process."""
        payload = self._wait_trainer(self.trainer.remote.export_weights())[0]
        return evaluate_weights(self.cfg, self.obs_space, self.action_space, state_of(payload), video_dir)


def policy_with_weights(cfg: EmbodiedConfig, obs_space: Any, action_space: Any, state: dict[str, Any] | None) -> Any:
    """The policy of ``cfg`` on the rollout device, with ``state`` loaded (all tensors, or the
    trainable ones over a frozen base); ``state`` None keeps the config's own weights (a
    pretrained ``policy.path``, ``policy.init``)."""
    import torch

    policy = build_policy(cfg.policy, obs_space, action_space).to(resolve_device(cfg.workers.rollout_device))
    if state is None:
        return policy
    missing, unexpected = policy.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing):
        raise ValueError(f"weights do not fit the policy: missing {sorted(trainable & set(missing))}, unexpected {sorted(unexpected)}")
    return policy


def evaluate_weights(cfg: EmbodiedConfig, obs_space: Any, action_space: Any, state: dict[str, Any] | None,
                     video_dir: Path | None) -> dict[str, Any]:
    """Build the policy, load ``state`` (see :func:`policy_with_weights`) and evaluate it on
    ``cfg.eval`` episodes."""
    policy = policy_with_weights(cfg, obs_space, action_space, state)
    return evaluate_policy(
        policy, cfg.env, cfg.eval.episodes, seed=cfg.seed + EVAL_SEED_OFFSET,
        num_envs=cfg.eval.num_envs or min(cfg.eval.episodes, cfg.env.num_envs),
        deterministic=cfg.eval.deterministic, device=resolve_device(cfg.workers.rollout_device), video_dir=video_dir,
    )


WORKFLOWS.add("embodied", WorkflowSpec(EmbodiedConfig, EmbodiedWorkflow),
              doc="Env workers, rollout workers and a trainer: PPO or GRPO on an embodied policy.")
