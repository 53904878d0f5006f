"""The embodied workflow: env workers, rollout workers and a trainer, PPO or GRPO.

The macro flow of one iteration, as plain sequential code::

    rollout.load_weights(trainer.export_weights())      # versioned weight sync (WeightSyncer)
    env.interact(T)  ||  rollout.generate(T)            # chunks pipelined through channels
    trainer.train(trajectories)                         # the algorithm: advantages + update

Where workers run and how the env batch is chunked comes from the plan (``plan.*``). With
``algo.staleness=1`` the trainer updates on the previous iteration's batch while this one is
collected. GRPO (``algo.name=grpo``) starts every iteration with the envs reset in groups from
shared initial states.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embodied.algorithms import build_algorithm
from embodied.runtime import Channel, Cluster, GroupFuture, RankResources, WorkerError, WorkerGroup, wait_all
from embodied.checkpoint import check_compatible
from embodied.threads import thread_env
from embodied.runtime.weights import WeightSyncer, state_of
from pipelines.collect import resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.evaluate import evaluate_policy
from pipelines.layout import Machine, RankPlacement
from pipelines.onpolicy.planning import macro_flow_of, machine_of, measured_factors, plan_embodied, trainer_micro_batch
from pipelines.probes import MIN_THREAD_SCALING, profile_embodied
from pipelines.preflight import preflight
from pipelines.onpolicy.workers import BlockRoute, EnvWorker, Pinning, RolloutWorker, StreamWorker, TrainerWorker
from pipelines.workflow import WORKFLOWS, Layout, Workflow, WorkflowSpec
from policies.registry import build_policy
from scheduler import SHARED, STREAMS, Plan, PlanResult, Profile
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
        return plan_embodied(self.cfg, profile, self.resources(), self.machine().multi_node)

    def discover(self, cluster: Cluster) -> Machine:
        return machine_of(self.cfg, cluster)

    def ranks(self) -> dict[str, int]:
        w = self.cfg.workers
        return {"env": w.env, "rollout": w.rollout, "trainer": w.trainer}

    @staticmethod
    def plan_ranks(plan: Plan) -> dict[str, int]:
        """The ranks a plan sets, whatever ``workers.*`` say: a ``shared`` plan runs the rollout
        as ``plan.lanes`` one-thread ranks (its lanes), a ``streams`` plan one env and one rollout
        rank per stream in its layout (run as one :class:`StreamWorker` per stream, which takes
        both ranks' cores and reservation)."""
        if plan.mode == SHARED:
            return {"rollout": plan.lanes}
        if plan.mode == STREAMS:
            return {"env": plan.lanes, "rollout": plan.lanes}
        return {}

    def ranks_for(self, plan: Plan) -> dict[str, int]:
        return {**self.ranks(), **self.plan_ranks(plan)}

    @staticmethod
    def env_split(layout: Layout) -> int:
        """Env ranks per configured env worker (a ``streams`` plan: one per stream; else 1)."""
        return layout.plan.lanes if layout.plan.mode == STREAMS else 1

    def env_chunks(self, layout: Layout) -> int:
        """Chunks each env rank steps (a ``streams`` plan: the plan's chunks spread over its streams)."""
        return layout.num_chunks // self.env_split(layout)

    def measured_factors(self, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
        return measured_factors(profile, layout, self.cfg, metrics)

    def _pinnings(self, layout: Layout, profile: Profile | None) -> dict[str, tuple[Pinning, ...]]:
        """Each rank's pinning (unplanned: not pinned, configured threads)."""
        w = self.cfg.workers
        if profile is None:
            configured = {"env": w.rollout_threads, "rollout": w.rollout_threads, "trainer": w.trainer_threads}
            return {c: (Pinning(None, configured[c]),) * len(layout.ranks_of(c)) for c in self.components}

        def pinning(component: str, rank: RankPlacement) -> Pinning:
            # One torch thread per core only where the probes showed the component scales with
            # cores; small models run fastest on one thread (more threads only spin and contend).
            # Env ranks run one thread: their cores go to their env processes. A shared plan's env
            # and rollout lanes run one thread each on the whole pool (the OS shares its cores).
            cores = rank.cores
            scales = component != "env" and profile[component].cost.scaling_exponent >= MIN_THREAD_SCALING
            if layout.plan.mode == SHARED and component in ("env", "rollout"):
                scales = False
            return Pinning(cores, len(cores) if cores is not None and scales else 1)

        return {c: tuple(pinning(c, r) for r in layout.ranks_of(c)) for c in self.components}

    def _rank_resources(self, component: str, layout: Layout) -> list[RankResources]:
        """What each rank of ``component`` reserves from Ray: its CPUs, its GPUs (the layout's
        share, or one whole GPU that Ray picks for a CUDA worker outside a GPU plan), custom
        resources, its node (unless custom resources choose the nodes), thread variables. The ranks
        a plan sets (:meth:`plan_ranks`: a shared plan's lanes, a streams plan's env and rollout
        ranks) split their component's ``workers.<component>_cpus`` between them."""
        w = self.cfg.workers
        cpus = {"env": w.env_cpus, "rollout": w.rollout_cpus, "trainer": w.trainer_cpus}[component]
        device = {"env": "cpu", "rollout": w.rollout_device, "trainer": w.trainer_device}[component]
        custom = {"env": w.env_resources, "rollout": w.rollout_resources, "trainer": w.trainer_resources}[component]
        threads = w.trainer_threads if component == "trainer" else w.rollout_threads
        if component in self.plan_ranks(layout.plan):  # lanes or streams share the component's reservation
            cpus /= len(layout.ranks_of(component))
        out = []
        for rank in layout.ranks_of(component):
            num_gpus = rank.num_gpus if rank.gpus is not None else (1.0 if device.startswith("cuda") else 0.0)
            env_vars = {**thread_env(threads), **rank.env_vars()}
            out.append(RankResources(cpus, num_gpus, env_vars, dict(custom), None if custom else rank.node))
        return out

    def _offloads(self, component: str, layout: Layout) -> bool:
        """Whether ``component`` leaves its devices between its phases (``plan.offload``, else the plan)."""
        forced = self.cfg.plan.offload
        if component == "trainer" and forced is None and self.cfg.workers.trainer_strategy == "fsdp" and layout.offloads("trainer"):
            LOG.warning("[m2flow] the plan offloads the trainer between phases; its FSDP shards stay on their devices")
            return False
        return component in (forced if forced is not None else layout.plan.offload)

    def _trainer_micro_batch(self, layout: Layout) -> int | None:
        return trainer_micro_batch(self.cfg.algo.micro_batch_size, layout.plan.train_microbatch, self.cfg.workers.trainer)

    def _stream_resources(self, layout: Layout) -> list[RankResources]:
        """A streams plan's stream ranks: each reserves what its stream's env and rollout ranks would."""
        env, rollout = self._rank_resources("env", layout), self._rank_resources("rollout", layout)
        return [RankResources(e.num_cpus + r.num_cpus, r.num_gpus, r.env_vars,
                              {k: e.custom.get(k, 0) + r.custom.get(k, 0) for k in {*e.custom, *r.custom}}, r.node)
                for e, r in zip(env, rollout)]

    def _checked_requests(self, cluster: Cluster, layout: Layout) -> dict[str, list[RankResources]]:
        """Every rank's Ray reservation under ``layout`` (a streams plan: ``stream`` ranks in place
        of env and rollout ranks), refused at once if the cluster cannot hold them."""
        if layout.plan.mode == STREAMS:
            requests = {"stream": self._stream_resources(layout), "trainer": self._rank_resources("trainer", layout)}
        else:
            requests = {c: self._rank_resources(c, layout) for c in self.components}
        cluster.check_capacity({c: [{"CPU": r.num_cpus, "GPU": r.num_gpus, **r.custom} for r in ranks]
                                for c, ranks in requests.items()})
        return requests

    # --- running -----------------------------------------------------------------------------------
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        cfg, w = self.cfg, self.cfg.workers
        self.layout, self.profile_, self.priced_on = layout, profile, profile
        pins = self._pinnings(layout, profile)
        requests = self._checked_requests(cluster, layout)
        self.cluster_ = cluster
        self.env = self.rollout = self.stream = None
        if layout.plan.mode == STREAMS:
            self.stream = self._stream_group(layout, pins["rollout"], requests["stream"])
        else:
            self.env = self._env_group(layout, pins["env"], requests["env"])
        self.obs_space, self.action_space = self.stepper.call("spaces", ranks=[0]).result()
        if self.stream is None:
            self.rollout = self._rollout_group(layout, pins["rollout"], requests["rollout"])
        self.trainer = WorkerGroup(
            cluster, TrainerWorker, w.trainer, cfg, self.obs_space, self.action_space, pins["trainer"],
            self._offloads("trainer", layout), self._trainer_micro_batch(layout),
            name="trainer", resources=requests["trainer"],
        )
        if w.trainer > 1 or w.trainer_strategy == "fsdp":  # the ranks' process group
            host, port = self.trainer.call("rendezvous", ranks=[0]).result()
            described = self._wait_trainer(self.trainer.call("join", host, port))[0]
            LOG.debug(f"[embodied] trainer: {described} via {host}:{port}")
        self._connect(layout)

    def _env_group(self, layout: Layout, pins: tuple[Pinning, ...], requests: list[RankResources]) -> WorkerGroup:
        """The layout's env ranks (a streams plan's, else ``workers.env``)."""
        return WorkerGroup(
            self.cluster_, EnvWorker, len(layout.ranks_of("env")), self.cfg, self.env_chunks(layout), pins,
            self.algorithm.grouped, self.env_split(layout), name="env", resources=requests,
        )

    def _rollout_group(self, layout: Layout, pins: tuple[Pinning, ...], requests: list[RankResources]) -> WorkerGroup:
        """The layout's rollout ranks (a shared plan's lanes, else ``workers.rollout``)."""
        return WorkerGroup(
            self.cluster_, RolloutWorker, len(layout.ranks_of("rollout")), self.cfg, self.obs_space, self.action_space,
            layout.num_chunks, pins, self.algorithm.needs_critic, self.algorithm.grouped, self._offloads("rollout", layout),
            name="rollout", resources=requests,
        )

    def _stream_group(self, layout: Layout, pins: tuple[Pinning, ...], requests: list[RankResources]) -> WorkerGroup:
        """A streams plan's ranks: one :class:`StreamWorker` (env and policy in one process) per
        stream, pinned as the stream's rollout rank (its cores, the rollout's threads)."""
        return WorkerGroup(
            self.cluster_, StreamWorker, layout.plan.lanes, self.cfg, self.env_chunks(layout),
            pins, self.algorithm.needs_critic, self.algorithm.grouped,
            self._offloads("rollout", layout), name="stream", resources=requests,
        )

    @property
    def stepper(self) -> WorkerGroup:
        """The group that steps the envs: the env workers, or a streams plan's streams."""
        group = self.stream if self.stream is not None else self.env
        assert group is not None, "no env ranks before build()"
        return group

    @property
    def acting(self) -> WorkerGroup:
        """The group that acts with the synced weights and sends the batches: the rollout workers,
        or a streams plan's streams."""
        group = self.stream if self.stream is not None else self.rollout
        assert group is not None, "no rollout ranks before build()"
        return group

    def _connect(self, layout: Layout) -> None:
        if self.stream is None:  # a stream's env and policy share a process: no channel between them
            self.obs_channel = Channel("observations", self.rollout, source="env")
            self.action_channel = Channel("actions", self.env, route=BlockRoute(self.env_chunks(layout)), source="rollout")
        # every trainer rank waits for a whole collection's batch (on its own key): a phase, not one message
        self.traj_channel = Channel("trajectories", self.trainer, phase=True, source=self.acting.name)

    def apply(self, layout: Layout) -> None:
        pins = self._pinnings(layout, self.profile_)
        streams = layout.plan.mode == STREAMS
        if streams:
            rebuild = ["stream"] if self.stream is None or self.stream.num_ranks != layout.plan.lanes else []
        else:
            rebuild = [c for c in ("env", "rollout") if getattr(self, c) is None or len(layout.ranks_of(c)) != getattr(self, c).num_ranks]
        # groups of another shape (lanes, streams, or streams <-> separate env and rollout workers) end
        # before new ranks reserve their resources
        gone = [c for c in ("env", "rollout", "stream") if getattr(self, c) is not None and (c in rebuild or (c == "stream") != streams)]
        for component in gone:
            getattr(self, component).shutdown()
            setattr(self, component, None)
        if rebuild:
            requests = self._checked_requests(self.cluster_, layout)
            if "stream" in rebuild:
                self.stream = self._stream_group(layout, pins["rollout"], requests["stream"])
            if "env" in rebuild:
                self.env = self._env_group(layout, pins["env"], requests["env"])
            if "rollout" in rebuild:
                self.rollout = self._rollout_group(layout, pins["rollout"], requests["rollout"])
        calls = [self.trainer.call("configure", pins["trainer"], self._offloads("trainer", layout), self._trainer_micro_batch(layout))]
        if streams and not rebuild:  # new ranks are built for the layout already
            calls.append(self.stream.call("configure", self.env_chunks(layout), pins["rollout"],
                                          self._offloads("rollout", layout)).as_phase())  # rebuilds the envs
        if not streams and "env" not in rebuild:
            calls.append(self.env.call("configure", self.env_chunks(layout), pins["env"], self.env_split(layout)).as_phase())
        if not streams and "rollout" not in rebuild:
            calls.append(self.rollout.call("configure", layout.num_chunks, pins["rollout"], self._offloads("rollout", layout)))
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
        for group in (getattr(self, name, None) for name in ("env", "rollout", "stream", "trainer")):
            if group is None:
                continue
            out[group.name] = [{"rank": i, "host": loc.node, "node_id": loc.node_id, "pid": loc.pid} if loc else {"rank": i}
                               for i, loc in enumerate(group.locations)]
        return out

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        """Sync weights, collect T decisions from every env, train. With ``algo.staleness=1`` the
        trainer updates on the previous iteration's batch while this one is collected (the first
        iteration only collects; the ``last`` one also trains on its own batch)."""
        cfg = self.cfg
        assert self.layout is not None, "iterate() before build()"
        t0 = time.perf_counter()
        weights = self.trainer.call("export_weights")  # rank 0's payload; one copy per node reads it
        self._wait_trainer(weights, self.acting.call("load_weights", weights.handle(0)))
        t_sync = time.perf_counter()
        T = cfg.algo.rollout_steps
        batches = self.acting.num_ranks  # this collection's: one per rank that sends one
        if self.stream is not None:  # each stream steps its envs and acts in them: one call makes both halves
            env_f = roll_f = self.stream.call("collect", T, self.traj_channel, iteration).as_phase()
        else:
            env_f = self.env.call("interact", T, self.obs_channel, self.action_channel, iteration).as_phase()
            roll_f = self.rollout.call("generate", T, self.obs_channel, self.action_channel, self.traj_channel).as_phase()
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

    def close(self) -> None:
        """Stop the worker groups (env processes end with their worker, as when the cluster
        shuts down): the cluster can run another layout's workers next (a benchmark measuring
        several plans in one cluster)."""
        for name in ("env", "rollout", "stream", "trainer"):
            group = getattr(self, name, None)
            if group is not None:
                group.shutdown()
                setattr(self, name, None)

    def drain(self, lr: float) -> None:
        if self.pending:
            self._wait_trainer(self._train_call(lr, self.pending))
            self.pending = 0

    def _train_call(self, lr: float, batches: int) -> GroupFuture:
        """Train on one collection: its ``batches`` batches (one per rank that collected it)."""
        return self.trainer.call("train", self.traj_channel, batches, lr).as_phase()

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
        return self._wait_trainer(self.trainer.call("state"))[0]  # rank 0's: whole tensors

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Every trainer rank continues from the same state, whatever number of ranks wrote it."""
        self._wait_trainer(self.trainer.call("load_state", state["model"], state.get("optimizer"), state["version"],
                                             state.get("generator")))

    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        policy = build_policy(self.cfg.policy, *spaces)
        check_compatible(WeightSyncer().tensors(policy), checkpoint, where=f"checkpoint {checkpoint}")

    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Evaluate the trainer's current weights in this process."""
        payload = self._wait_trainer(self.trainer.call("export_weights"))[0]
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
