"""The workers of the off-policy flow: ActorEnvWorker -> (transitions) -> ReplayTrainerWorker.

Message protocol per iteration:

* ActorEnvWorker rank e steps each of its env chunks ``algo.rollout_steps`` times with its own copy
  of the actor (uniform random actions until the buffer holds ``algo.learning_starts``
  transitions), through the on-policy workflow's env loop (:class:`~pipelines.onpolicy.chunks.EnvChunks`),
  and puts one message per chunk on the ``transitions`` channel: ``(first env index, Transitions)``,
  time-major ``(T, b, ...)`` numpy arrays. Episodes go on across iterations.
* ReplayTrainerWorker (one rank) receives every chunk's message, puts the iteration's columns side
  by side in env order into the :class:`~embodied.rl.replay.ReplayBuffer`, and takes
  ``algo.utd`` gradient steps per new transition (with ``algo.overlap``: first the steps owed for
  the data it already holds, while the envs collect). The actor's weights, versioned by the
  update count, reach the env workers through the :class:`WeightSyncer` when the workflow syncs.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from embodied.algorithms.sac import SAC, SquashedGaussianActor, build_off_policy
from embodied.rl.replay import ReplayBuffer, ReplaySample, Transitions, mixed_sample
from embodied.runtime import Channel, Worker
from embodied.runtime.weights import WeightPayload, WeightSyncer
from embodied.seeding import seed_everything
from envs.base import random_actions, to_numpy
from pipelines.collect import EnvOutput, resolve_device
from pipelines.offpolicy.config import OffPolicyConfig
from pipelines.onpolicy.chunks import EnvChunks, Pinning

TRAINER_KEY = 0  # every chunk's transitions go to the one trainer rank
REPLAY_PREFIX, DEMOS_PREFIX = "replay.", "demos."


def chunks_config(cfg: OffPolicyConfig) -> SimpleNamespace:
    """What :class:`EnvChunks` reads of a config: the envs, the seed, the env ranks, and one action
    per decision (the actor acts every step)."""
    return SimpleNamespace(env=cfg.env, seed=cfg.seed, workers=SimpleNamespace(env=cfg.workers.env),
                           policy=SimpleNamespace(action_chunk=1))


def obs_dim_of(observation_space: Any) -> int:
    return int(np.prod(observation_space["state"].shape))


def build_actor(cfg: OffPolicyConfig, observation_space: Any, action_space: Any) -> SquashedGaussianActor:
    """The actor the trainer trains, as an env worker or an evaluation builds it."""
    return SquashedGaussianActor(obs_dim_of(observation_space), action_space.low, action_space.high, cfg.algo.hidden)


class TransitionRecorder:
    """One env chunk's steps of a collection as :class:`Transitions` (a ChunkPolicy's bookkeeping):
    each env output completes the transition of the observation and actions before it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.obs: dict[str, np.ndarray] | None = None
        self.actions: np.ndarray | None = None
        self.rows: list[dict[str, Any]] = []

    def observe(self, out: EnvOutput) -> dict[str, np.ndarray]:
        """Record ``out`` (the first output of a collection only sets the observation); the
        observation the next actions are taken in."""
        obs = {k: to_numpy(out.obs[k]) for k in self.keys}
        if out.rewards is not None:
            assert self.obs is not None and self.actions is not None
            done = (out.terminated[:, 0] | out.truncated[:, 0])
            next_obs = {k: v.copy() for k, v in obs.items()}
            if done.any() and out.final_obs is not None:
                for k in self.keys:
                    next_obs[k][done] = to_numpy(out.final_obs[k])[done]
            self.rows.append({"obs": self.obs, "actions": self.actions, "rewards": out.rewards[:, 0],
                              "next_obs": next_obs, "terminated": out.terminated[:, 0], "truncated": out.truncated[:, 0]})
        self.obs = obs
        return obs

    def act(self, actions: np.ndarray) -> np.ndarray:
        self.actions = actions
        return actions

    def finish(self) -> Transitions:
        """The recorded steps (T, b, ...); the recorder starts empty again."""
        rows, self.rows = self.rows, []
        stack = lambda name: np.stack([r[name] for r in rows])  # noqa: E731
        return Transitions(obs={k: np.stack([r["obs"][k] for r in rows]) for k in self.keys},
                           actions=stack("actions").astype(np.float32), rewards=stack("rewards").astype(np.float32),
                           next_obs={k: np.stack([r["next_obs"][k] for r in rows]) for k in self.keys},
                           terminated=stack("terminated"), truncated=stack("truncated"))


class ActingPolicy:
    """The actor in the env worker's process, as :meth:`EnvChunks.run` sees it (a ChunkPolicy):
    each chunk's output is recorded and its next actions sampled at once."""

    def __init__(self, worker: ActorEnvWorker, explore: bool) -> None:
        self.worker, self.explore = worker, explore
        self.next: dict[int, np.ndarray] = {}

    def observe(self, c: int, out: EnvOutput) -> None:
        w = self.worker
        obs = w.recorders[c].observe(out)
        t0 = time.perf_counter()
        n = len(next(iter(obs.values())))
        if self.explore:
            actions = random_actions(w.action_space, (n,), w.np_rng)
        else:
            with torch.no_grad():
                state = torch.as_tensor(obs["state"]).reshape(n, -1).float()
                actions = w.actor.sample(state, w.generator)[0].numpy()
        w.infer_s += time.perf_counter() - t0
        self.next[c] = w.recorders[c].act(actions)

    def actions(self, c: int) -> np.ndarray:
        return self.next[c]


class ActorEnvWorker(Worker):
    """Steps its env chunks with its copy of the actor and sends the transitions to the trainer."""

    def __init__(self, cfg: OffPolicyConfig, num_chunks: int, pinning: Pinning | None = None) -> None:
        self.cfg = cfg
        pinning = pinning or Pinning(None, cfg.workers.env_threads)
        self.chunks = EnvChunks(chunks_config(cfg))
        self.chunks.configure(self.rank, num_chunks, pinning)
        self.observation_space, self.action_space = self.chunks.spaces()
        self.actor = build_actor(cfg, self.observation_space, self.action_space)
        self.generator = torch.Generator().manual_seed(cfg.seed + 7919 * (self.rank + 1))  # the actor's exploration noise
        self.np_rng = np.random.default_rng(cfg.seed + 104_729 * (self.rank + 1))  # the random actions before learning
        keys = list(self.observation_space.spaces)
        self.recorders = [TransitionRecorder(keys) for _ in range(num_chunks)]
        self.syncer = WeightSyncer()
        self.version = -1
        self.infer_s = 0.0

    def spaces(self) -> tuple[Any, Any]:
        return self.observation_space, self.action_space

    def load_weights(self, payload: WeightPayload) -> int:
        self.version = self.syncer.load(self.actor, payload)
        return self.version

    def collect(self, num_steps: int, channel: Channel, explore: bool, iteration: int = 0) -> dict[str, Any]:
        """``num_steps`` steps of every chunk (``explore``: uniform random actions); sends each
        chunk's transitions and returns the env loop's tallies with the seconds of inference."""
        self.infer_s = 0.0
        tallies = self.chunks.run(num_steps, iteration, ActingPolicy(self, explore))
        for c, recorder in enumerate(self.recorders):
            channel.put(TRAINER_KEY, (self.chunks.first[c], recorder.finish()))
        return {**tallies, "infer_s": self.infer_s, "version": self.version}

    def close(self) -> None:
        self.chunks.close()


class ReplayTrainerWorker(Worker):
    """Holds the algorithm (actor, critics, temperature, optimizers), the replay buffer and the
    demonstrations; trains at ``algo.utd`` gradient steps per collected transition."""

    def __init__(self, cfg: OffPolicyConfig, observation_space: Any, action_space: Any, pinning: Pinning | None = None) -> None:
        seed_everything(cfg.seed)
        (pinning or Pinning(None, cfg.workers.trainer_threads)).apply()
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.trainer_device)
        low, high = action_space.low, action_space.high
        self.algo: SAC = build_off_policy(cfg.algo, obs_dim_of(observation_space), low, high, self.device)
        shapes = {k: tuple(s.shape) for k, s in observation_space.spaces.items()}
        self.obs_shapes, self.action_shape = shapes, tuple(action_space.shape)
        self.buffer = ReplayBuffer(cfg.algo.buffer_size, cfg.num_envs, shapes, self.action_shape, self.device)
        self.demos: ReplayBuffer | None = None
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed + 1)  # sampling and the updates' noise
        self.syncer = WeightSyncer()
        self.env_steps = 0
        self.owed = 0.0  # gradient steps owed for the data received (fractions carry over)

    # --- data --------------------------------------------------------------------------------------
    def add_demos(self, demos: Transitions) -> int:
        """Hold ``demos`` (T, 1, ...: episodes one after another) as the demonstration buffer; its size."""
        self.demos = ReplayBuffer(demos.num_steps * demos.num_envs, demos.num_envs, self.obs_shapes, self.action_shape, self.device)
        self.demos.extend(demos)
        return len(self.demos)

    def receive(self, channel: Channel, num_messages: int) -> int:
        """The iteration's transitions of every chunk, into the buffer in env order; returns how many."""
        parts = sorted(channel.get_batch(TRAINER_KEY, num_messages), key=lambda m: m[0])
        steps = Transitions.concat_envs([p for _, p in parts])
        self.buffer.extend(steps)
        n = steps.num_steps * steps.num_envs
        self.env_steps += n
        if len(self.buffer) >= self.cfg.algo.learning_starts:
            self.owed += self.cfg.algo.utd * n
        return n

    def buffer_size(self) -> int:
        return len(self.buffer)

    # --- training ----------------------------------------------------------------------------------
    def train(self, channel: Channel, num_messages: int, lr: float) -> dict[str, float]:
        """Receive one iteration's transitions and take the gradient steps owed: after receiving
        them, or with ``algo.overlap`` before (the steps owed for the earlier data, while the envs
        collect)."""
        t0 = time.perf_counter()
        if self.cfg.algo.overlap:
            stats = self.learn(lr)
            t_train = time.perf_counter()
            self.receive(channel, num_messages)
            train_s, wait_s = t_train - t0, time.perf_counter() - t_train
        else:
            self.receive(channel, num_messages)
            t_received = time.perf_counter()
            stats = self.learn(lr)
            train_s, wait_s = time.perf_counter() - t_received, t_received - t0
        return {**stats, "time/train_s": train_s, "time/trainer_wait_s": wait_s, "replay/size": float(len(self.buffer)),
                "replay/demos": float(len(self.demos)) if self.demos is not None else None}

    def learn(self, lr: float) -> dict[str, float]:
        """The gradient steps owed (:attr:`owed`, whole ones); their mean statistics."""
        n = int(self.owed)
        self.owed -= n
        self.algo.set_lr(lr)
        values: dict[str, list[torch.Tensor]] = {}  # the actor's statistics come every policy_frequency steps
        for _ in range(n):
            for k, v in self.algo.update(self.sample(), self.generator).items():
                values.setdefault(k, []).append(v)
        out: dict[str, float] = {"losses/updates": float(n), "charts/lr": lr, "weights/version": float(self.algo.updates)}
        if values:  # one read of the device for all of them
            means = torch.stack([torch.stack(v).float().mean() for v in values.values()]).tolist()
            out.update(dict(zip(values, means)))
        return out

    def sample(self) -> ReplaySample:
        cfg = self.cfg.algo
        ratio = cfg.demo_ratio if cfg.name == "rlpd" else 0.0
        return mixed_sample(self.buffer, self.demos, cfg.batch_size, ratio, self.generator, cfg.gamma, cfg.n_step,
                            cfg.bootstrap_terminated)

    # --- weights and state -------------------------------------------------------------------------
    def export_weights(self) -> WeightPayload:
        """The actor's weights, versioned by the gradient steps taken."""
        return self.syncer.export(self.algo.actor, self.algo.updates)

    def state(self, with_replay: bool) -> dict[str, Any]:
        """A checkpoint's state: the networks, the temperature and the counters under ``model``
        (with ``with_replay`` also ``replay.*`` and ``demos.*``), the three optimizers as one, the
        version and the generator of sampling and noise."""
        model = {k: v.detach().cpu() for k, v in self.algo.tensors().items()}
        model["trainer.env_steps"] = torch.tensor([self.env_steps], dtype=torch.int64)
        model["trainer.owed"] = torch.tensor([self.owed], dtype=torch.float64)
        if with_replay:
            model.update({REPLAY_PREFIX + k: v for k, v in self.buffer.state().items()})
            if self.demos is not None:
                model.update({DEMOS_PREFIX + k: v for k, v in self.demos.state().items()})
        return {"model": model, "optimizer": self.algo.optimizer_state(), "version": self.algo.updates,
                "generator": self.generator.get_state()}

    def load_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any] | None, generator: torch.Tensor | None) -> int:
        """Continue from a checkpoint's state; returns the transitions the buffer holds."""
        self.algo.load_tensors(model)
        if optimizer is not None:
            self.algo.load_optimizer_state(optimizer)
        self.env_steps = int(model["trainer.env_steps"][0])
        self.owed = float(model["trainer.owed"][0])
        replay = {k[len(REPLAY_PREFIX):]: v for k, v in model.items() if k.startswith(REPLAY_PREFIX)}
        if replay:
            self.buffer.load_state(replay)
        demos = {k[len(DEMOS_PREFIX):]: v for k, v in model.items() if k.startswith(DEMOS_PREFIX)}
        if demos:
            rows = int(demos["rewards"].shape[0]) * int(demos["rewards"].shape[1])
            self.demos = ReplayBuffer(rows, int(demos["rewards"].shape[1]), self.obs_shapes, self.action_shape, self.device)
            self.demos.load_state(demos)
        if generator is not None:
            self.generator.set_state(generator)
        return len(self.buffer)
