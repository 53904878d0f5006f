"""The reasoning workflow: GRPO on a causal language model with rule-checked rewards.

The macro flow of one iteration, as plain sequential code::

    rollout.load_weights(trainer.export_weights())          # versioned weight sync (WeightSyncer)
    prompts = reader.draws(iteration)                       # data.train_batch_size prompts, group ids
    rollout.generate(chunks) || reward.score(chunks) || trainer.train(chunks)
                                                            # chunk by chunk through channels

Each chunk is a set of whole prompts (whole GRPO groups): the rollout sends it to the reward
workers as soon as it is generated, they send it to the trainer as soon as it is scored, and the
trainer trains each minibatch as soon as its chunks are in. How many chunks, and on which cores each
worker runs, comes from the plan (``plan.*``); when the trainer shares cores with the rollout or
the reward it starts after them (the planner's phases), otherwise it trains while later chunks are
generated.

The Runner (``pipelines/runner.py``) drives it like any workflow: profile and plan, build, iterate,
checkpoints, evaluation (held-out accuracy), re-planning on drift, graceful stop, resume.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from embodied.checkpoint import check_compatible
from embodied.runtime import Channel, Cluster, WorkerGroup, wait_all
from embodied.runtime.weights import WeightSyncer
from pipelines.probes import MIN_THREAD_SCALING
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.planning import measured_factors, plan_reasoning, profile_reasoning, resources_of, macro_flow_of
from pipelines.reasoning.preflight import PreparedData, prepare
from pipelines.reasoning.prompts import PromptReader, chunk_prompts
from pipelines.reasoning.workers import start_groups
from pipelines.onpolicy.workers import Pinning
from pipelines.workflow import WORKFLOWS, Layout, Workflow, WorkflowSpec
from policies.registry import build_policy
from scheduler import PlanResult, Profile, Resources
from scheduler import MacroFlow

LOG = logging.getLogger("embodied")


class ReasoningWorkflow(Workflow):
    """Builds the rollout, reward and trainer groups and their channels, and runs GRPO iterations."""

    components = ("rollout", "reward", "trainer")
    unit = "prompts"
    headline = (("reward", "reward/mean"), ("acc", "reward/acc"), ("length", "response_length/mean"))
    throughput_metric = "perf/samples_per_s"

    def __init__(self, cfg: ReasoningConfig) -> None:
        super().__init__(cfg)
        self.data: PreparedData | None = None
        self.profile_: Profile | None = None
        self.streams = False  # the trainer trains while later chunks are generated
        self.groups: list[WorkerGroup] = []

    # --- inputs ------------------------------------------------------------------------------------
    def preflight(self) -> tuple[Any, ...]:
        """The warm start (when enabled), the model, the files, the verifiers and the prompt lengths."""
        self.prepared()
        return ()

    def prepared(self) -> PreparedData:
        if self.data is None:
            self.data = prepare(self.cfg, LOG.info)
            self.reader = PromptReader(self.data.train, self.cfg.data.train_batch_size, self.cfg.seed,
                                       self.cfg.data.shuffle)
        return self.data

    def describe(self) -> str:
        cfg = self.cfg
        return (f"{cfg.data.train_batch_size} prompts x {cfg.algo.group_size} responses of at most "
                f"{cfg.max_new_tokens} tokens, {cfg.algo.num_minibatches} minibatch(es), {cfg.algo.epochs} epoch(s)")

    # --- sizes -------------------------------------------------------------------------------------
    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.data.train_batch_size

    @property
    def total_steps(self) -> int:
        return self.cfg.total_prompts

    # --- planning ----------------------------------------------------------------------------------
    def resources(self) -> Resources:
        return resources_of(self.cfg)

    def macro_flow(self, metrics: dict[str, Any] | None = None) -> MacroFlow:
        return macro_flow_of(self.cfg)  # every iteration generates and trains the same samples

    def profile(self, cluster: Cluster, force: bool, log: Callable[[str], None]) -> Profile:
        return profile_reasoning(self.cfg, self.prepared().train, cluster, force=force, log=log)

    def plan(self, profile: Profile) -> PlanResult:
        return plan_reasoning(self.cfg, profile)

    def measured_factors(self, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
        return measured_factors(self.cfg, profile, layout, metrics)

    def _pinnings(self, layout: Layout, profile: Profile | None) -> dict[str, Pinning]:
        w = self.cfg.workers
        if profile is None:
            return {"rollout": Pinning(None, w.rollout_threads), "reward": Pinning(None, 1),
                    "trainer": Pinning(None, w.trainer_threads)}

        def threads(component: str) -> int:
            cores = layout.cores_of(component)
            return len(cores) if profile[component].cost.scaling_exponent >= MIN_THREAD_SCALING else 1

        return {c: Pinning(layout.cores_of(c), threads(c)) for c in self.components}

    def _trainer_offloads(self, layout: Layout) -> bool:
        forced = self.cfg.plan.offload
        return "trainer" in (forced if forced is not None else layout.plan.offload)

    def _streams(self, layout: Layout, profile: Profile | None) -> bool:
        """Whether the trainer has cores of its own (then it trains while generation goes on)."""
        if profile is None:
            return False
        generation = set(layout.cores_of("rollout")) | set(layout.cores_of("reward"))
        return not set(layout.cores_of("trainer")) & generation

    # --- running -----------------------------------------------------------------------------------
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        cfg = self.cfg
        self.prepared()
        self.layout, self.profile_ = layout, profile
        pin = self._pinnings(layout, profile)
        self.rollout, self.reward, self.trainer = start_groups(cluster, cfg, pin, self._trainer_offloads(layout))
        self.groups = [self.rollout, self.reward, self.trainer]
        self._connect(layout)

    def _connect(self, layout: Layout) -> None:
        # A chunk takes a phase of generation to arrive (a long response batch of a large model can
        # take minutes), so waits on either channel are bounded by cluster.phase_timeout_s.
        self.generated = Channel("generated", self.reward, phase=True, source="rollout")  # chunk c -> rank c % ranks
        self.scored = Channel("scored", self.trainer, phase=True, source="reward")
        self.streams = self._streams(layout, self.profile_)

    def apply(self, layout: Layout) -> None:
        pin = self._pinnings(layout, self.profile_)
        wait_all(
            self.rollout.remote.configure(pin["rollout"]),
            self.reward.remote.configure(pin["reward"]),
            self.trainer.remote.configure(pin["trainer"], self._trainer_offloads(layout)),
        )
        self.layout = layout
        self._connect(layout)

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        """Sync weights, then generate, score and train the iteration's prompts chunk by chunk."""
        cfg = self.cfg
        assert self.layout is not None, "iterate() before build()"
        t0 = time.perf_counter()
        weights = self.trainer.remote.export_weights()
        self.rollout.remote.load_weights(weights.handle(0)).wait()
        t_sync = time.perf_counter()
        k = self.layout.num_chunks
        chunks = chunk_prompts(self.reader.draws(iteration), k)
        rollout_f = self.rollout.remote.generate(chunks, self.generated).as_phase()
        reward_f = self.reward.remote.score(k, self.generated, self.scored).as_phase()
        if self.streams:
            train_f = self.trainer.remote.train(self.scored, k, lr).as_phase()
            wait_all(rollout_f, reward_f, train_f)
        else:  # the trainer shares cores with generation: it starts after it (the plan's phases)
            wait_all(rollout_f, reward_f)
            train_f = self.trainer.remote.train(self.scored, k, lr).as_phase()
        stats = dict(train_f.result())
        t_end = time.perf_counter()
        rollouts, rewards = rollout_f.wait(), reward_f.wait()
        errors = stats.pop("reward_error_messages", [])
        if errors:
            LOG.warning(f"[reasoning] iteration {iteration + 1}: the reward function reported errors, e.g. {errors[0]}")
        generate_s = sum(r["generate_s"] for r in rollouts)
        tokens = sum(r["response_tokens"] for r in rollouts)
        samples = cfg.samples_per_iteration
        plan = self.layout.plan
        metrics: dict[str, Any] = {
            "steps": cfg.data.train_batch_size,
            **stats,
            "perf/rollout_tokens_per_s": tokens / generate_s if generate_s > 0 else None,
            "perf/samples_per_s": samples / (t_end - t0),
            "perf/prompts_per_s": cfg.data.train_batch_size / (t_end - t0),
            "time/sync_s": t_sync - t0,
            "time/generate_s": generate_s,
            "time/reward_s": sum(r["reward_s"] for r in rewards),
            "time/iteration_s": t_end - t0,
            "plan/chunks": k,
            "plan/mode": plan.mode,
            "plan/streamed": self.streams,
            "plan/predicted_iteration_s": plan.predicted_iteration_s if self.profile_ is not None else None,
            "weights/version": rollouts[0]["version"],
        }
        if self.profile_ is not None:
            metrics["plan/measured_over_predicted"] = metrics["time/iteration_s"] / plan.predicted_iteration_s
        if iteration == 0:
            metrics.update(self.prepared().warm_start)
        return metrics

    # --- state -------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        return self.trainer.remote.state().result()

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.trainer.remote.load_state(state["model"], state.get("optimizer"), state["version"], state.get("generator")).wait()

    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        self.prepared()
        policy = build_policy(self.cfg.policy, None, None)
        check_compatible(WeightSyncer().tensors(policy), checkpoint, where=f"checkpoint {checkpoint}")

    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Held-out accuracy of the trainer's current weights (on rollout rank 0, its generation
        engine): ``eval/greedy_acc``, ``eval/sampled_acc``, ``eval/pass@N``."""
        val = self.prepared().val
        if not val:
            return {}
        weights = self.trainer.remote.export_weights()
        self.rollout.on(0).load_weights(weights.handle(0)).wait()
        ev = self.cfg.eval
        return self.rollout.on(0).evaluate(val, ev.samples, ev.batch_size, self.cfg.seed + 10_000_000).as_phase().result()

    def close(self) -> None:
        """Stop the verifier processes (math-verify) the rollout and reward workers may hold, then
        the workers (on a shared cluster they would keep their CPUs)."""
        groups, self.groups = self.groups, []
        for group in groups[:2]:  # rollout, reward
            try:
                group.remote.close().wait(timeout_s=30)
            except Exception:  # a failed run's workers may be gone; the cluster's shutdown ends them anyway
                LOG.debug(f"[reasoning] closing {group.name} failed", exc_info=True)
        for group in groups:
            group.shutdown()

WORKFLOWS.add("reasoning", WorkflowSpec(ReasoningConfig, ReasoningWorkflow),
              doc="Rollout, reward and trainer workers: GRPO on a causal language model with verifiable rewards.")
