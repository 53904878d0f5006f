"""The off-policy workflow: env workers that act with a copy of the actor, a trainer with a replay
buffer, SAC or RLPD.

The macro flow of one iteration, as plain sequential code::

    if trainer.updates - synced >= algo.sync_every:          # every K gradient steps
        env.load_weights(trainer.export_weights())          # the actor's weights (WeightSyncer)
    env.collect(algo.rollout_steps)  ||  trainer.train()    # transitions -> channel -> replay buffer,
                                                            # then algo.utd gradient steps per transition

With ``algo.overlap`` the trainer takes the steps owed for the data it holds while the envs
collect, and adds the new transitions after (the envs act with weights one iteration old);
without it, it waits for the transitions and updates after (ManiSkill's order). Until the buffer
holds ``algo.learning_starts`` transitions the envs act uniformly at random and nothing trains.
RLPD reads its demonstrations (``demos.path``) or records ``demos.episodes`` episodes of
``demos.expert`` when it builds, and mixes them into every batch at ``algo.demo_ratio``.

The Runner drives it as any workflow on the light contract (fixed layout, no cost model: the
planner does not price a replay flow yet): progress, metrics, checkpoints (with the buffer when
``checkpoint.replay``: a resumed run samples what the run would have), evaluation, resume.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.algorithms.sac import build_off_policy
from embodied.checkpoint import MODEL_FILE, safetensors_specs, tensor_specs
from embodied.checkpoint_tensors import CheckpointMismatch
from embodied.errors import UserError
from embodied.runtime import Channel, Cluster, RankResources, WorkerGroup, wait_all
from embodied.runtime.weights import WeightSyncer
from envs.registry import make_vec_env
from pipelines.collect import resolve_device
from pipelines.evaluate import evaluate_policy
from pipelines.offpolicy.actor import ActorPolicy
from pipelines.offpolicy.config import OffPolicyConfig
from pipelines.offpolicy.demos import demonstrations
from pipelines.offpolicy.workers import DEMOS_PREFIX, REPLAY_PREFIX, ActorEnvWorker, ReplayTrainerWorker, build_actor, obs_dim_of
from pipelines.onpolicy.workflow import EVAL_SEED_OFFSET, RETURN_WINDOW
from pipelines.workflow import WORKFLOWS, Layout, Workflow, WorkflowSpec
from scheduler import Profile

LOG = logging.getLogger("embodied")


class OffPolicyWorkflow(Workflow):
    """Builds the env and trainer groups and the transitions channel; runs the off-policy iterations."""

    components = ("env", "trainer")

    def __init__(self, cfg: OffPolicyConfig) -> None:
        super().__init__(cfg)
        self.env: WorkerGroup | None = None
        self.trainer: WorkerGroup | None = None
        self.spaces: tuple[Any, Any] | None = None
        self.buffered = 0  # transitions in the trainer's buffer (after the last iteration)
        self.updates = 0  # the trainer's gradient steps
        self.synced: int | None = None  # the trainer's updates when the actors last got its weights
        self.recent: deque[dict[str, float]] = deque(maxlen=RETURN_WINDOW)

    def preflight(self) -> tuple[Any, Any]:
        """The env builds and has a ``state`` observation and a bounded continuous action space:
        (observation_space, action_space)."""
        env = make_vec_env(dataclasses.replace(self.cfg.env, num_envs=1), seed=self.cfg.seed)
        try:
            obs_space, action_space = env.observation_space, env.action_space
        finally:
            env.close()
        if "state" not in obs_space.spaces or not hasattr(action_space, "low"):
            raise UserError(f"{self.cfg.env.id}: SAC acts on a 'state' observation with continuous, bounded actions "
                            f"(got observations {list(obs_space.spaces)}, actions {action_space})")
        for path in self.cfg.demos.path or []:
            if not Path(path).is_file() or not Path(path).with_suffix(".json").is_file():
                raise UserError(f"demos.path: {path} is not a ManiSkill trajectory .h5 file with its .json beside it; the "
                                f"scripted expert writes them: `embodied demos {self.cfg.env.id} obs_mode=state out={path}`")
        expert = self.cfg.demos.expert
        if expert is not None and ":" not in expert and not Path(expert).expanduser().exists():
            raise UserError(f"demos.expert={expert!r} is neither a run dir nor 'package.module:function'. A trained "
                            f"state policy comes from e.g. `embodied train maniskill_pickcube_ppo run.dir={expert}`.")
        self.spaces = (obs_space, action_space)
        return obs_space, action_space

    def describe(self) -> str:
        a = self.cfg.algo
        return (f"{self.cfg.num_envs} envs x {a.rollout_steps} steps, {a.name} at utd {a.utd} "
                f"(batch {a.batch_size}, sync every {a.sync_every} updates)")

    # --- sizes -------------------------------------------------------------------------------------
    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.steps_per_iteration

    @property
    def total_steps(self) -> int:
        return self.cfg.algo.total_env_steps

    def ranks(self) -> dict[str, int]:
        return {"env": self.cfg.workers.env, "trainer": 1}

    # --- running -----------------------------------------------------------------------------------
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        cfg, w = self.cfg, self.cfg.workers
        self.layout = layout
        self.num_chunks = layout.plan.num_chunks
        self.env = WorkerGroup(cluster, ActorEnvWorker, w.env, cfg, self.num_chunks, name="env",
                               resources=RankResources(num_cpus=w.env_cpus))
        self.spaces = self.env.on(0).spaces().result()
        gpus = 1.0 if resolve_device(w.trainer_device).type == "cuda" else 0.0
        self.trainer = WorkerGroup(cluster, ReplayTrainerWorker, 1, cfg, *self.spaces, name="trainer",
                                   resources=RankResources(num_cpus=w.trainer_cpus, num_gpus=gpus))
        self.channel = Channel("transitions", self.trainer, phase=True, source="env")
        if cfg.demos.given:
            kept = self.trainer.remote.add_demos(demonstrations(cfg)).result()
            LOG.debug(f"[offpolicy] the trainer holds {kept} demonstration transitions")

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        """Sync the actors when due, collect ``algo.rollout_steps`` steps of every env while the
        trainer trains (see the module docstring)."""
        cfg = self.cfg
        assert self.env is not None and self.trainer is not None, "iterate() before build()"
        t0 = time.perf_counter()
        synced = self.synced is None or self.updates - self.synced >= cfg.algo.sync_every
        if synced:
            weights = self.trainer.remote.export_weights()
            wait_all(weights, self.env.remote.load_weights(weights.handle(0)))
            self.synced = self.updates
        t_sync = time.perf_counter()
        explore = self.buffered < cfg.algo.learning_starts
        env_f = self.env.remote.collect(cfg.algo.rollout_steps, self.channel, explore, iteration).as_phase()
        train_f = self.trainer.remote.train(self.channel, cfg.workers.env * self.num_chunks, lr).as_phase()
        wait_all(env_f, train_f)
        t_end = time.perf_counter()
        stats: dict[str, Any] = dict(train_f.result())
        env_out = env_f.wait()
        self.updates = int(stats["weights/version"])
        self.buffered = int(stats["replay/size"])
        episodes = [e for out in env_out for e in out["episodes"]]
        self.recent.extend(episodes)
        steps = sum(int(out["env_steps"]) for out in env_out)
        iteration_s = t_end - t0
        return {
            "steps": steps,
            **self._episode_metrics(len(episodes)),
            **stats,
            "perf/env_steps_per_s": steps / iteration_s,
            "perf/updates_per_s": stats["losses/updates"] / stats["time/train_s"] if stats["time/train_s"] > 0 else None,
            "time/sync_s": t_sync - t0,
            "time/iteration_s": iteration_s,
            "time/sim_s": float(np.mean([o["sim_s"] for o in env_out])),
            "time/infer_s": float(np.mean([o["infer_s"] for o in env_out])),
            "weights/synced": float(synced),
            "weights/lag": float(self.updates - min(int(o["version"]) for o in env_out)),
            "rollout/explore": float(explore),
            "env/nonfinite_episodes": sum(int(o.get("nonfinite_episodes", 0)) for o in env_out),
            "plan/chunks": self.num_chunks,
        }

    def drain(self, lr: float) -> None:
        """The gradient steps still owed (``algo.overlap``: those of the last iteration's data)."""
        if self.trainer is not None and self.cfg.algo.overlap:
            self.updates = int(self.trainer.remote.learn(lr).as_phase().result()["weights/version"])

    def _episode_metrics(self, finished: int) -> dict[str, Any]:
        """``train/*`` over the last RETURN_WINDOW finished episodes (an iteration of a few steps
        finishes few)."""
        out: dict[str, Any] = {"train/episodes": finished}
        window = list(self.recent)
        if not window:
            out["train/episode_return"] = None
            return out
        out["train/episode_return"] = float(np.mean([e["return"] for e in window]))
        out["train/episode_length"] = float(np.mean([e["length"] for e in window]))
        succ = [e["success"] for e in window if "success" in e]
        out["train/success_rate"] = float(np.mean(succ)) if succ else None
        return out

    def locations(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for group in (g for g in (self.env, self.trainer) if g is not None):
            out[group.name] = [{"rank": i, "host": loc.node, "node_id": loc.node_id, "pid": loc.pid} if loc else {"rank": i}
                               for i, loc in enumerate(group.locations)]
        return out

    def close(self) -> None:
        if self.env is not None:
            try:
                self.env.remote.close().wait(timeout_s=30)
            except Exception:  # a failed run's workers may be gone; the cluster's shutdown ends them anyway
                LOG.debug("[offpolicy] closing the env workers failed", exc_info=True)
            self.env.shutdown()
            self.env = None
        if self.trainer is not None:
            self.trainer.shutdown()
            self.trainer = None

    # --- state -------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        assert self.trainer is not None
        return self.trainer.remote.state(self.cfg.checkpoint.replay).result()

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: networks, optimizers, counters, the generator, and the
        buffers when the checkpoint holds them; the actors get the weights before the next steps."""
        assert self.trainer is not None
        self.buffered = self.trainer.remote.load_state(state["model"], state.get("optimizer"), state.get("generator")).result()
        self.updates = int(state["version"])
        self.synced = None

    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        """Every network tensor and counter of this config's trainer is in ``checkpoint`` with its
        shape and dtype (the buffers, saved or not, are not compared: ``checkpoint.replay`` may differ)."""
        obs_space, action_space = spaces or self.preflight()
        algo = build_off_policy(self.cfg.algo, obs_dim_of(obs_space), action_space.low, action_space.high, "cpu")
        expected = tensor_specs({**algo.tensors(), "trainer.env_steps": torch.zeros(1, dtype=torch.int64),
                                 "trainer.owed": torch.zeros(1, dtype=torch.float64)})
        found = {k: v for k, v in safetensors_specs(Path(checkpoint) / MODEL_FILE).items()
                 if not k.startswith((REPLAY_PREFIX, DEMOS_PREFIX))}
        diffs = [f"{k!r}: {found.get(k)} in the checkpoint, {expected.get(k)} in this config"
                 for k in sorted(expected.keys() | found.keys()) if expected.get(k) != found.get(k)]
        if diffs:
            raise CheckpointMismatch(f"checkpoint {checkpoint} does not fit the {self.cfg.algo.name} trainer this config "
                                     f"builds ({len(diffs)} differences): {'; '.join(diffs[:10])}. Resume with the config "
                                     "the run was started with (its config.yaml), or start a new run.", diffs)

    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Evaluate the trainer's current actor in this process (its mode with ``eval.deterministic``)."""
        assert self.trainer is not None and self.spaces is not None
        cfg = self.cfg
        actor = build_actor(cfg, *self.spaces)
        WeightSyncer().load(actor, self.trainer.remote.export_weights().result())
        device = resolve_device(cfg.workers.rollout_device)
        policy = ActorPolicy(actor).to(device)
        return evaluate_policy(
            policy, cfg.env, cfg.eval.episodes, seed=cfg.seed + EVAL_SEED_OFFSET,
            num_envs=cfg.eval.num_envs or min(cfg.eval.episodes, cfg.env.num_envs),
            deterministic=cfg.eval.deterministic, device=device, video_dir=video_dir,
        )


WORKFLOWS.add("offpolicy", WorkflowSpec(OffPolicyConfig, OffPolicyWorkflow),
              doc="Env workers that act with a copy of the actor and a trainer with a replay buffer: SAC or RLPD.")
