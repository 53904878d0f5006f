"""Embodied PPO, the macro flow as plain sequential code.

    for each iteration:
        rollout.load_weights(trainer.export_weights())      # versioned weight sync
        env.interact(T)  ||  rollout.generate(T)          # chunks pipelined through channels
        trainer.train(trajectories)                         # GAE + PPO epochs

Where workers run and how the env batch is chunked comes from the plan (``plan.*``).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from embodied.checkpoint import load_checkpoint, save_checkpoint
from embodied.config import to_dict
from embodied.metrics import MetricsLogger, read_metrics
from embodied.progress import Progress
from embodied.runtime import Channel, Cluster, RankResources, WorkerGroup, wait_all
from embodied.seeding import seed_everything
from pipelines.config import TrainConfig
from pipelines.evaluate import evaluate_policy
from pipelines.rundir import RunDir
from pipelines.planning import Layout, measured_factors, plan_embodied, profile_embodied, rescale, resources_of, workflow_of
from pipelines.workers import BlockRoute, EnvWorker, Pinning, RolloutWorker, TrainerWorker, resolve_device
from scheduler import PlanResult, Profile
from policies.registry import build_policy

RETURN_WINDOW = 20
MIN_THREAD_SCALING = 0.3  # fitted parallel efficiency below which extra cores get no threads
REPLAN_WINDOW = 5  # iterations whose median drift triggers re-planning
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS")


class EmbodiedPPO:
    """Builds the worker groups and channels of the macro flow and runs it."""

    def __init__(self, cfg: TrainConfig, run: RunDir | None) -> None:
        self.cfg = cfg
        self.run = run
        self.layout = Layout.unplanned(cfg)
        self.profile: Profile | None = None
        self._drift: deque[dict[str, Any]] = deque(maxlen=REPLAN_WINDOW)
        self.iteration = 0
        self.env_steps = 0
        self._told_unchanged = False  # a drift that re-planning could not remove was logged
        self._pending = False  # staleness 1: the last collection's trajectories await training
        self.wall_s_before = 0.0
        # train/* episode metrics average the last RETURN_WINDOW finished episodes: the episodes that
        # finish inside one iteration alone are biased towards short ones.
        self.recent: deque[dict[str, float]] = deque(maxlen=RETURN_WINDOW)

    # --- setup -----------------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        return self.layout.num_chunks

    def _pinnings(self) -> tuple[Pinning, Pinning, Pinning]:
        """Worker placements of the current layout (unplanned: not pinned, configured threads)."""
        w, lay = self.cfg.workers, self.layout
        if self.profile is None:
            return Pinning(None, w.rollout_threads), Pinning(None, w.rollout_threads), Pinning(None, w.trainer_threads)
        return (
            Pinning(lay.env_cores, 1),
            Pinning(lay.rollout_cores, self._threads("rollout", lay.rollout_cores)),
            Pinning(lay.trainer_cores, self._threads("trainer", lay.trainer_cores)),
        )

    def _threads(self, component: str, cores: tuple[int, ...]) -> int:
        """One torch thread per core only where the probes showed the component scales with
        cores; small models run fastest on one thread (more threads only spin and contend)."""
        assert self.profile is not None
        scales = self.profile[component].cost.scaling_exponent >= MIN_THREAD_SCALING
        return len(cores) if scales else 1

    def _trainer_offloads(self) -> bool:
        forced = self.cfg.plan.offload
        return "trainer" in (forced if forced is not None else self.layout.plan.offload)

    def plan(self, cluster: Cluster, log=print) -> PlanResult | None:
        """Profile (cached) and plan; sets ``self.layout``. Returns the planner's result."""
        cfg = self.cfg
        if not cfg.plan.profile:
            self.layout = Layout.unplanned(cfg)
            return None
        self.profile = profile_embodied(cfg, cluster, force=cfg.plan.reprofile, log=log)
        result = plan_embodied(cfg, self.profile)
        self.layout = Layout.of(result.best, resources_of(cfg))
        log("[m2flow] candidate plans (predicted seconds per iteration):\n" + result.format_table(limit=8))
        bound = f"; no plan below {result.bound.iteration_s:.3f} s" if result.bound is not None else ""
        log(f"[m2flow] chosen: {result.best.mode}, {result.best.num_chunks} chunk(s), "
            f"predicted {result.best.predicted_iteration_s:.3f} s/iteration{bound}")
        return result

    def _build(self, cluster: Cluster) -> None:
        cfg, w = self.cfg, self.cfg.workers
        threads = {k: str(w.rollout_threads) for k in THREAD_ENV}
        env_p, roll_p, trainer_p = self._pinnings()
        self.env = WorkerGroup(
            cluster, EnvWorker, w.env, cfg, self.num_chunks, env_p, name="env",
            resources=RankResources(w.env_cpus, env_vars=threads),
        )
        self.obs_space, self.action_space = self.env.call("spaces", ranks=[0]).result()
        self.rollout = WorkerGroup(
            cluster, RolloutWorker, w.rollout, cfg, self.obs_space, self.action_space, self.num_chunks, roll_p,
            name="rollout", resources=RankResources(w.rollout_cpus, 1.0 if w.rollout_device.startswith("cuda") else 0.0, threads),
        )
        self.trainer = WorkerGroup(
            cluster, TrainerWorker, 1, cfg, self.obs_space, self.action_space, trainer_p, self._trainer_offloads(), name="trainer",
            resources=RankResources(
                w.trainer_cpus, 1.0 if w.trainer_device.startswith("cuda") else 0.0, {k: str(w.trainer_threads) for k in THREAD_ENV}
            ),
        )
        self._connect()

    def _connect(self) -> None:
        self.obs_channel = Channel("observations", self.rollout)
        self.action_channel = Channel("actions", self.env, route=BlockRoute(self.num_chunks))
        self.traj_channel = Channel("trajectories", self.trainer)

    def _apply_layout(self) -> None:
        """Reconfigure running workers for a new layout (between iterations)."""
        env_p, roll_p, trainer_p = self._pinnings()
        wait_all(
            self.env.call("configure", self.num_chunks, env_p),
            self.rollout.call("configure", self.num_chunks, roll_p),
            self.trainer.call("configure", trainer_p, self._trainer_offloads()),
        )
        self._connect()

    def _resume(self) -> None:
        model, optimizer, state = load_checkpoint(self.run.path)
        self.trainer.call("load_state", model, optimizer, state["version"]).wait()
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])
        self.wall_s_before = float(state.get("wall_s", 0.0))
        print(f"[embodied] resumed from {state['path']} at iteration {self.iteration}, {self.env_steps:,} env steps", flush=True)

    # --- the macro flow --------------------------------------------------------------------------
    def iterate(self) -> dict[str, Any]:
        """One iteration: sync weights, collect T steps from every env, train.

        With ``algo.staleness=1`` the trainer updates on the previous iteration's trajectories while
        this iteration's are collected (the first iteration only collects; the last one also trains
        on what it collected, so no batch is left untrained)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        weights = self.trainer.call("export_weights")
        self.rollout.call("load_weights", weights.handle(0)).wait()
        t_sync = time.perf_counter()
        env_f = self.env.call("interact", cfg.algo.rollout_steps, self.obs_channel, self.action_channel)
        roll_f = self.rollout.call("generate", cfg.algo.rollout_steps, self.obs_channel, self.action_channel, self.traj_channel)
        overlap = cfg.algo.staleness > 0
        train_f = self._train_call() if overlap and self._pending else None
        wait_all(env_f, roll_f)
        t_rollout = time.perf_counter()
        stats: dict[str, Any] = {}
        if train_f is not None:
            stats = train_f.result()
        last = self.iteration + 1 >= self.total_iterations
        if not overlap or last:
            stats = self._train_call().result()
            self._pending = False
        else:
            self._pending = True
        t_train = time.perf_counter()

        env_out, roll_out = env_f.wait(), roll_f.wait()
        episodes = [e for out in env_out for e in out["episodes"]]
        self.recent.extend(episodes)
        steps = sum(int(out["env_steps"]) for out in env_out)  # taken (action chunks may end early)
        self.env_steps += steps
        self.iteration += 1
        metrics: dict[str, Any] = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            **self._episode_metrics(episodes),
            "perf/env_steps_per_s": steps / (t_train - t0),
            "perf/rollout_env_steps_per_s": steps / (t_rollout - t_sync),
            "time/sync_s": t_sync - t0,
            "time/rollout_s": t_rollout - t_sync,
            "time/overlap_wait_s": t_train - t_rollout if overlap else None,
            "time/iteration_s": t_train - t0,
            "time/sim_s": float(np.mean([o["sim_s"] for o in env_out])),
            "time/infer_s": float(np.mean([o["infer_s"] for o in roll_out])),
            "plan/chunks": self.num_chunks,
            "plan/mode": self.layout.plan.mode,
            "plan/predicted_iteration_s": self.layout.plan.predicted_iteration_s if self.profile is not None else None,
            "weights/version": roll_out[0]["version"],
            **stats,
        }
        if self.profile is not None and "time/train_s" in stats:
            metrics["plan/measured_over_predicted"] = metrics["time/iteration_s"] / self.layout.plan.predicted_iteration_s
        return metrics

    def _train_call(self):
        return self.trainer.call("train", self.traj_channel, self.rollout.num_ranks, self._lr())

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.cfg.algo.total_env_steps / self.cfg.steps_per_iteration)

    def maybe_replan(self, metrics: dict[str, Any], log=print) -> str | None:
        """Re-plan when measured iteration times drift from the prediction: once the median of
        the last REPLAN_WINDOW iterations is off by more than ``plan.replan_threshold``, rescale
        each component's profiled cost by its measured median, plan again, and apply the new plan
        if it differs. Returns the reason (logged), or None."""
        cfg = self.cfg
        if self.profile is None or cfg.plan.replan_threshold <= 0 or "plan/measured_over_predicted" not in metrics:
            return None
        self._drift.append(metrics)
        if len(self._drift) < REPLAN_WINDOW:
            return None
        ratio = float(np.median([m["plan/measured_over_predicted"] for m in self._drift]))
        if abs(ratio - 1) <= cfg.plan.replan_threshold:
            return None
        keys = ("time/sim_s", "time/infer_s", "time/train_s")
        typical = {k: float(np.median([m[k] for m in self._drift])) for k in keys}
        self._drift.clear()
        factors = measured_factors(self.profile, self.layout, cfg, typical)
        self.profile = rescale(self.profile, factors)
        old = self.layout.plan
        result = plan_embodied(cfg, self.profile)
        changes = ", ".join(f"{name} {f:.2f}x" for name, f in factors.items())
        reason = (f"iterations {self.iteration - REPLAN_WINDOW + 1}-{self.iteration} took {ratio:.2f}x the predicted "
                  f"{old.predicted_iteration_s:.3f} s (measured/profiled per call: {changes})")
        new_layout = Layout.of(result.best, resources_of(cfg))
        if (new_layout.plan.mode, new_layout.plan.placement, new_layout.num_chunks) != (old.mode, old.placement, old.num_chunks):
            self.layout = new_layout
            self._apply_layout()
            self._told_unchanged = False
            reason += f"; re-planned: {old.mode}/{old.num_chunks} chunks -> {result.best.mode}/{result.best.num_chunks} chunks"
        else:
            self.layout = new_layout
            if self._told_unchanged:  # said once; repeating it every window is noise
                return None
            self._told_unchanged = True
            reason += f"; plan unchanged, prediction now {result.best.predicted_iteration_s:.3f} s"
        log(f"[m2flow] {reason}")
        return reason

    def _episode_metrics(self, episodes: list[dict[str, float]]) -> dict[str, Any]:
        window = list(self.recent)
        out: dict[str, Any] = {"train/episodes": len(episodes)}
        if window:
            out["train/episode_return"] = float(np.mean([e["return"] for e in window]))
            out["train/episode_length"] = float(np.mean([e["length"] for e in window]))
            succ = [e["success"] for e in window if "success" in e]
            out["train/success_rate"] = float(np.mean(succ)) if succ else None
        else:
            out["train/episode_return"] = None
        return out

    def _lr(self) -> float:
        algo = self.cfg.algo
        if not algo.anneal_lr:
            return algo.lr
        return algo.lr * max(0.0, 1.0 - self.env_steps / algo.total_env_steps)

    # --- run -------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        seed_everything(cfg.seed)
        total_iters = self.total_iterations
        logger = MetricsLogger(
            self.run.path, to_dict(cfg), cfg.logging.tensorboard, cfg.logging.wandb,
            cfg.logging.wandb_project, cfg.logging.wandb_mode, resume=cfg.resume is not None,
        )
        cluster = Cluster(cfg.cluster)
        progress = None
        try:
            result = self.plan(cluster)
            self._save_plan(result)
            self._build(cluster)
            if cfg.resume is not None:
                self._resume()
            # Whole iterations: the run does total_iterations * steps_per_iteration steps (>= the asked total).
            planned_steps = total_iters * cfg.steps_per_iteration
            progress = Progress(planned_steps, cfg.logging.progress, cfg.run.log_every_s, self.env_steps)
            t_start = time.perf_counter()
            last: dict[str, Any] = {}
            while self.iteration < total_iters:
                metrics = self.iterate()
                metrics["wall_s"] = self.wall_s_before + time.perf_counter() - t_start
                if cfg.eval.every and self.iteration % cfg.eval.every == 0 and self.iteration < total_iters:
                    metrics.update(self.evaluate(video=False))
                reason = self.maybe_replan(metrics)
                if reason is not None:
                    metrics["plan/replanned"] = reason
                    self._save_plan(None)
                logger.log(metrics, step=self.env_steps)
                progress.update(self.env_steps, metrics)
                last = metrics
                if cfg.run.checkpoint_every and self.iteration % cfg.run.checkpoint_every == 0:
                    self.checkpoint(metrics["wall_s"])
            progress.close()
            progress = None
            wall_s = self.wall_s_before + time.perf_counter() - t_start
            self.checkpoint(wall_s)
            final_eval = self.evaluate(video=cfg.eval.video)
            summary = {
                "recipe": cfg.recipe,
                "iterations": self.iteration,
                "env_steps": self.env_steps,
                "wall_s": wall_s,
                "train/episode_return": last.get("train/episode_return"),
                "train/success_rate": last.get("train/success_rate"),
                "perf/env_steps_per_s": self._mean_throughput(),
                **final_eval,
            }
            logger.summary(summary)
            return summary
        finally:
            if progress is not None:
                progress.close()
            logger.close()
            cluster.shutdown()

    def _save_plan(self, result: PlanResult | None) -> None:
        """Write the plan being executed (and the candidates it beat) to ``plan.json``."""
        if self.run is None:
            return
        data: dict[str, Any] = {"plan": self.layout.plan.to_dict(), "planned": self.profile is not None}
        if result is not None:
            data["candidates"] = [
                {"mode": m, "chunks": k, "placement": p, "predicted_s": t, "mean_utilization": u} for m, k, p, t, u in result.table()
            ]
            if result.bound is not None:
                data["bound"] = result.bound.to_dict()
        if self.profile is not None:
            data["workflow"] = workflow_of(self.cfg).to_dict()
            (self.run.path / "profile.json").write_text(json.dumps(self.profile.to_dict(), indent=2))
        (self.run.path / "plan.json").write_text(json.dumps(data, indent=2))

    def _mean_throughput(self) -> float | None:
        """Mean env steps/s over every iteration of the run (resumed ones included)."""
        rates = [r["perf/env_steps_per_s"] for r in read_metrics(self.run.path) if r.get("perf/env_steps_per_s")]
        return float(np.mean(rates)) if rates else None

    def checkpoint(self, wall_s: float) -> Path:
        state = self.trainer.call("state").result()
        return save_checkpoint(
            self.run.path / "checkpoints",
            self.iteration,
            state["model"],
            state["optimizer"],
            {"env_steps": self.env_steps, "version": state["version"], "wall_s": wall_s, "recipe": self.cfg.recipe},
            keep=self.cfg.run.keep_checkpoints,
        )

    def evaluate(self, video: bool) -> dict[str, Any]:
        """Evaluate the trainer's current weights in this process."""
        cfg = self.cfg
        payload = self.trainer.call("export_weights").result()
        video_dir = self.run.path / "videos" if video and self.run is not None else None
        return evaluate_from_weights(cfg, self.obs_space, self.action_space, payload["state"], video_dir)


def evaluate_from_weights(cfg: TrainConfig, obs_space: Any, action_space: Any, state: dict[str, Any], video_dir: Path | None) -> dict[str, Any]:
    import torch

    device = resolve_device(cfg.workers.rollout_device)
    policy = build_policy(cfg.policy, obs_space, action_space).to(device)
    policy.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in state.items()})
    return evaluate_policy(
        policy, cfg.env, cfg.eval.episodes, seed=cfg.seed + 10_000_000, num_envs=cfg.eval.num_envs or min(cfg.eval.episodes, cfg.env.num_envs),
        deterministic=cfg.eval.deterministic, device=device, video_dir=video_dir,
    )
