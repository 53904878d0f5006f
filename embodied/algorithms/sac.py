"""SAC (Haarnoja et al. 2018) and RLPD (Ball et al. 2023): off-policy actor-critic on a replay buffer.

    sac = build_off_policy(cfg, obs_dim, action_low, action_high, device)
    stats = sac.update(buffer_sample, generator)     # one gradient step of the critics, actor, temperature

One update on a batch (M samples, E critics, ``rewards``/``discounts`` from the buffer's n-step sums):

    a', logp'  = actor(next_obs)                                     # tanh-squashed Gaussian, rsample
    y          = rewards + discounts * (min over a random subset of the target critics Q'(next_obs, a')
                                        - alpha * logp')               # the soft TD target
    critic     : sum over the E critics of mean (Q_e(obs, actions) - y)**2
    actor      : mean(alpha * logp - Q(obs, a))  with a, logp = actor(obs); Q: min of the critics (SAC),
                 their mean (RLPD)                                    # every ``policy_frequency`` updates
    temperature: mean(-log_alpha * (logp + target_entropy))           # automatic entropy tuning
    targets    : Q' <- tau * Q + (1 - tau) * Q'                       # every ``target_network_frequency``

SAC: two critics, both in the target's min. RLPD: ``num_qs`` (10) layer-normed critics, the min of a
random ``num_min_qs`` (2) of them, and every batch half demonstrations (the workflow's sampling).
The math is in pure functions below (shapes checked by the tests on hand-computed numbers); the
classes hold networks and optimizers. Noise comes from the caller's generator, so a run resumed
from a checkpoint (the generator's state included) takes the same updates.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from embodied.algorithms.base import ALGORITHMS
from embodied.rl.replay import ReplaySample

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # the actor's log-std range (CleanRL's and ManiSkill's)


@dataclass
class SACConfig:
    """The off-policy algorithm's hyperparameters (``algo.*``): ManiSkill's SAC baseline by default."""

    name: Literal["sac", "rlpd"] = "sac"
    """``sac``: twin critics, Polyak-averaged targets, automatic entropy tuning. ``rlpd``: SAC with a
    layer-normed critic ensemble (``num_qs``), the min of a random ``num_min_qs`` of them as the target,
    the actor on their mean, and each batch ``demo_ratio`` demonstrations."""
    lr: float = 3e-4
    """Adam learning rate of the actor (and of the critics unless ``q_lr``)."""
    anneal_lr: bool = False
    """Decay the learning rates linearly to 0 over the run."""
    q_lr: float | None = None
    """Adam learning rate of the critics and the temperature; None: ``lr``."""
    gamma: float = 0.8
    """Discount per env step (ManiSkill's manipulation tasks: 0.8; locomotion: 0.99)."""
    tau: float = 0.01
    """Polyak step of the target critics: Q' <- tau * Q + (1 - tau) * Q'."""
    batch_size: int = 1024
    """Samples per gradient step."""
    n_step: int = 1
    """Steps summed into a return before bootstrapping (within an episode; see embodied/rl/replay.py)."""
    alpha: float = 0.2
    """Entropy temperature when ``autotune`` is off (else its start is 1.0, log 0)."""
    autotune: bool = True
    """Tune the temperature so the policy's entropy tracks ``target_entropy``."""
    target_entropy: float | None = None
    """Entropy target of ``autotune``; None: -(action dims) for SAC, -(action dims)/2 for RLPD."""
    policy_frequency: int = 1
    """Updates between actor (and temperature) steps; each then takes this many steps (TD3's delay, as CleanRL)."""
    target_network_frequency: int = 1
    """Updates between Polyak steps of the target critics."""
    bootstrap_terminated: bool = False
    """Bootstrap on termination too (tasks that terminate on success); a time limit always bootstraps."""
    backup_entropy: bool = True
    """Subtract ``alpha * logp'`` of the next action in the target (the soft backup)."""
    num_qs: int | None = None
    """Critics in the ensemble; None: 2 (SAC), 10 (RLPD)."""
    num_min_qs: int | None = None
    """Critics in the target's min, drawn at random each update; None: all of them (SAC), 2 (RLPD)."""
    critic_layer_norm: bool | None = None
    """LayerNorm after each hidden layer of the critics; None: off (SAC), on (RLPD)."""
    actor_q: Literal["min", "mean"] | None = None
    """How the critics' values combine in the actor's loss; None: ``min`` (SAC), ``mean`` (RLPD)."""
    demo_ratio: float = 0.5
    """RLPD: the share of every batch drawn from the demonstrations (symmetric sampling: 0.5)."""
    hidden_sizes: list[int] | None = None
    """Hidden layers of the actor and of each critic; None: [256, 256, 256] (ManiSkill's baseline)."""
    max_grad_norm: float | None = None
    """Clip each network's gradient norm; None: no clipping (ManiSkill, CleanRL)."""

    def __post_init__(self) -> None:
        problems = []
        if self.lr <= 0 or (self.q_lr is not None and self.q_lr <= 0):
            problems.append(f"algo.lr and algo.q_lr must be > 0 (got {self.lr}, {self.q_lr})")
        if not 0 <= self.gamma <= 1 or not 0 < self.tau <= 1:
            problems.append(f"algo.gamma must be in [0, 1] and algo.tau in (0, 1] (got {self.gamma}, {self.tau})")
        for key in ("batch_size", "n_step", "policy_frequency", "target_network_frequency"):
            if getattr(self, key) < 1:
                problems.append(f"algo.{key} must be >= 1 (got {getattr(self, key)})")
        qs = self.critics
        if qs < 1 or not 1 <= self.min_critics <= qs:
            problems.append(f"algo.num_qs must be >= 1 and algo.num_min_qs in [1, num_qs] (got {qs}, {self.min_critics})")
        if not 0 <= self.demo_ratio <= 1:
            problems.append(f"algo.demo_ratio must be in [0, 1] (got {self.demo_ratio})")
        if self.alpha < 0:
            problems.append(f"algo.alpha must be >= 0 (got {self.alpha})")
        if problems:
            raise ValueError("; ".join(problems))

    # the settings in effect (the algorithm's defaults where a key is None)
    @property
    def critics(self) -> int:
        return self.num_qs if self.num_qs is not None else (10 if self.name == "rlpd" else 2)

    @property
    def min_critics(self) -> int:
        return self.num_min_qs if self.num_min_qs is not None else (2 if self.name == "rlpd" else self.critics)

    @property
    def layer_norm(self) -> bool:
        return self.critic_layer_norm if self.critic_layer_norm is not None else self.name == "rlpd"

    @property
    def actor_combine(self) -> str:
        return self.actor_q or ("mean" if self.name == "rlpd" else "min")

    @property
    def hidden(self) -> list[int]:
        return list(self.hidden_sizes) if self.hidden_sizes is not None else [256, 256, 256]

    @property
    def critic_lr(self) -> float:
        return self.q_lr if self.q_lr is not None else self.lr

    def entropy_target(self, action_dim: int) -> float:
        if self.target_entropy is not None:
            return self.target_entropy
        return -action_dim / 2 if self.name == "rlpd" else -float(action_dim)


# --- the math --------------------------------------------------------------------------------------


def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor, scale: torch.Tensor,
                      bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions ``tanh(mean + std * noise) * scale + bias`` (M, A) and their log-probability (M,):
    the Gaussian's, minus ``log(scale * (1 - tanh(u)**2) + 1e-6)`` per dimension (the change of
    variables of the squashing, with CleanRL's epsilon). All (M, A); ``scale``/``bias`` (A,)."""
    _same_shape("squashed_gaussian", mean=mean, log_std=log_std, noise=noise)
    u = mean + log_std.exp() * noise
    squashed = torch.tanh(u)
    gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    logprob = (gaussian - torch.log(scale * (1 - squashed.pow(2)) + 1e-6)).sum(-1)
    return squashed * scale + bias, logprob


def soft_td_target(rewards: torch.Tensor, discounts: torch.Tensor, next_q: torch.Tensor, next_logprob: torch.Tensor,
                   alpha: float | torch.Tensor, backup_entropy: bool = True) -> torch.Tensor:
    """``rewards + discounts * (min_e next_q[e] - alpha * next_logprob)`` (M,). ``next_q`` (E, M):
    the target critics that enter the min; ``discounts`` is 0 where the episode terminated."""
    if next_q.dim() != 2 or next_q.shape[1] != rewards.shape[0]:
        raise ValueError(f"soft_td_target: next_q must be (E, M={rewards.shape[0]}), got {tuple(next_q.shape)}")
    _same_shape("soft_td_target", rewards=rewards, discounts=discounts, next_logprob=next_logprob)
    value = next_q.min(0).values
    if backup_entropy:
        value = value - alpha * next_logprob
    return rewards + discounts * value


def critic_loss(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the E critics of each one's mean squared error to ``target``: ``q`` (E, M), ``target`` (M,)."""
    if q.dim() != 2 or q.shape[1] != target.shape[0]:
        raise ValueError(f"critic_loss: q must be (E, M={target.shape[0]}), got {tuple(q.shape)}")
    return (q - target.unsqueeze(0)).pow(2).mean(1).sum()


def actor_loss(logprob: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """``mean(alpha * logprob - q)`` over the batch: ``logprob``, ``q`` (M,)."""
    _same_shape("actor_loss", logprob=logprob, q=q)
    return (alpha * logprob - q).mean()


def temperature_loss(log_alpha: torch.Tensor, logprob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``mean(-exp(log_alpha) * (logprob + target_entropy))`` (the form of CleanRL and ManiSkill):
    alpha rises while the policy's entropy (-logprob) is below the target. ``logprob`` (M,) detached."""
    return (-log_alpha.exp() * (logprob.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- tau * source + (1 - tau) * target``, parameter by parameter."""
    for t, s in zip(target.parameters(), source.parameters()):
        t.lerp_(s, tau)


def _same_shape(fn: str, **tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{fn}: {', '.join(shapes)} must have one shape, got {shapes}")


# --- the networks ----------------------------------------------------------------------------------


def _mlp(sizes: list[int], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], out))
    return nn.Sequential(*layers)


class SquashedGaussianActor(nn.Module):
    """A tanh-squashed Gaussian policy on a flat state (M, D) -> actions in the env's bounds (M, A)."""

    def __init__(self, obs_dim: int, action_low: Any, action_high: Any, hidden: list[int]) -> None:
        super().__init__()
        low, high = torch.as_tensor(action_low, dtype=torch.float32), torch.as_tensor(action_high, dtype=torch.float32)
        self.trunk = _mlp([obs_dim, *hidden[:-1]], hidden[-1]) if len(hidden) > 1 else nn.Linear(obs_dim, hidden[0])
        self.mean = nn.Linear(hidden[-1], low.numel())
        self.log_std = nn.Linear(hidden[-1], low.numel())
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-std (M, A), the log-std squashed into [LOG_STD_MIN, LOG_STD_MAX]."""
        h = torch.relu(self.trunk(state))
        log_std = torch.tanh(self.log_std(h))
        return self.mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def sample(self, state: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled actions (M, A) (reparameterized) and their log-probabilities (M,)."""
        mean, log_std = self(state)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return squashed_gaussian(mean, log_std, noise, self.scale, self.bias)

    def mode(self, state: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``tanh(mean) * scale + bias`` (M, A)."""
        return torch.tanh(self(state)[0]) * self.scale + self.bias


class EnsembleLinear(nn.Module):
    """E independent linear layers applied at once: (E, M, in) -> (E, M, out)."""

    def __init__(self, ensemble: int, in_features: int, out_features: int) -> None:
        super().__init__()
        members = [nn.Linear(in_features, out_features) for _ in range(ensemble)]  # nn.Linear's own init per member
        self.weight = nn.Parameter(torch.stack([m.weight.detach().T for m in members]))  # (E, in, out)
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in members]).unsqueeze(1))  # (E, 1, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class QEnsemble(nn.Module):
    """E critics Q(s, a) evaluated together: state (M, D), actions (M, A) -> (E, M)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], ensemble: int, layer_norm: bool) -> None:
        super().__init__()
        sizes = [obs_dim + action_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers.append(EnsembleLinear(ensemble, a, b))
            if layer_norm:
                layers.append(nn.LayerNorm(b))
            layers.append(nn.ReLU())
        layers.append(EnsembleLinear(ensemble, sizes[-1], 1))
        self.net = nn.Sequential(*layers)
        self.ensemble = ensemble

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([state, actions], -1).unsqueeze(0).expand(self.ensemble, -1, -1)  # (E, M, D + A)
        return self.net(x).squeeze(-1)


# --- the algorithm ---------------------------------------------------------------------------------


def flat_state(obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The ``state`` observation as (M, D) float32."""
    state = obs["state"]
    return state.reshape(state.shape[0], -1).float()


@ALGORITHMS.register("sac")
class SAC:
    """SAC: twin critics with Polyak targets, a tanh-squashed Gaussian actor, automatic entropy tuning (workflow offpolicy).

    Holds the actor, the critic ensemble and its targets, the temperature, and their optimizers."""

    name: ClassVar[str] = "sac"
    off_policy: ClassVar[bool] = True

    def __init__(self, cfg: SACConfig, obs_dim: int, action_low: Any, action_high: Any, device: torch.device | str = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        action_dim = int(torch.as_tensor(action_low).numel())
        self.actor = SquashedGaussianActor(obs_dim, action_low, action_high, cfg.hidden).to(self.device)
        self.critic = QEnsemble(obs_dim, action_dim, cfg.hidden, cfg.critics, cfg.layer_norm).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.zeros(1, device=self.device, requires_grad=cfg.autotune)
        if not cfg.autotune:
            self.log_alpha.data.fill_(math.log(cfg.alpha) if cfg.alpha > 0 else -float("inf"))
        self.target_entropy = cfg.entropy_target(action_dim)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.critic_lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def set_lr(self, lr: float) -> None:
        """The Runner's learning rate for the actor; the critics' and temperature's in proportion."""
        ratio = lr / self.cfg.lr
        for opt, base in ((self.actor_optimizer, self.cfg.lr), (self.critic_optimizer, self.cfg.critic_lr),
                          (self.alpha_optimizer, self.cfg.critic_lr)):
            for group in opt.param_groups:
                group["lr"] = base * ratio

    def update(self, batch: ReplaySample, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch`` (see the module docstring); its statistics (0-d tensors,
        on the device: reading them would synchronize a GPU every step)."""
        cfg = self.cfg
        obs, next_obs = flat_state(batch.obs), flat_state(batch.next_obs)
        with torch.no_grad():
            next_actions, next_logprob = self.actor.sample(next_obs, generator)
            next_q = self.critic_target(next_obs, next_actions)  # (E, M)
            if cfg.min_critics < cfg.critics:  # RLPD: the min of a random subset
                subset = torch.randperm(cfg.critics, generator=generator, device=generator.device if generator else None)
                next_q = next_q[subset[:cfg.min_critics].to(next_q.device)]
            target = soft_td_target(batch.rewards, batch.discounts, next_q, next_logprob, self.alpha, cfg.backup_entropy)
        q = self.critic(obs, batch.actions)
        q_loss = critic_loss(q, target)
        self.critic_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self._clip(self.critic)
        self.critic_optimizer.step()
        self.updates += 1
        stats = {"losses/qf_loss": q_loss.detach(), "losses/qf_values": q.detach().mean()}
        if self.updates % cfg.policy_frequency == 0:
            stats.update(self._actor_steps(obs, generator))
        if self.updates % cfg.target_network_frequency == 0:
            polyak_update(self.critic_target, self.critic, cfg.tau)
        return stats

    def _actor_steps(self, obs: torch.Tensor, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        self.critic.requires_grad_(False)  # the actor's loss moves the actor only
        try:
            for _ in range(cfg.policy_frequency):
                actions, logprob = self.actor.sample(obs, generator)
                q = self.critic(obs, actions)
                q = q.min(0).values if cfg.actor_combine == "min" else q.mean(0)
                loss = actor_loss(logprob, q, self.alpha)
                self.actor_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self._clip(self.actor)
                self.actor_optimizer.step()
                stats = {"losses/actor_loss": loss.detach(), "losses/entropy": -logprob.detach().mean()}
                if cfg.autotune:
                    a_loss = temperature_loss(self.log_alpha, logprob, self.target_entropy)
                    self.alpha_optimizer.zero_grad(set_to_none=True)
                    a_loss.backward()
                    self.alpha_optimizer.step()
                    stats["losses/alpha_loss"] = a_loss.detach()
        finally:
            self.critic.requires_grad_(True)
        stats["losses/alpha"] = self.alpha.squeeze()
        return stats

    def _clip(self, module: nn.Module) -> None:
        if self.cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(module.parameters(), self.cfg.max_grad_norm)

    # --- state -------------------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor training changes, by name (``actor.*``, ``critic.*``, ``critic_target.*``, ``log_alpha``)."""
        out = {f"actor.{k}": v for k, v in self.actor.state_dict().items()}
        out.update({f"critic.{k}": v for k, v in self.critic.state_dict().items()})
        out.update({f"critic_target.{k}": v for k, v in self.critic_target.state_dict().items()})
        out["log_alpha"] = self.log_alpha.detach()
        out["updates"] = torch.tensor([self.updates], dtype=torch.int64)
        return out

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for prefix, module in (("actor.", self.actor), ("critic.", self.critic), ("critic_target.", self.critic_target)):
            module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
        with torch.no_grad():
            self.log_alpha.copy_(tensors["log_alpha"].to(self.device))
        self.updates = int(tensors["updates"][0])

    def optimizer_state(self) -> dict[str, Any]:
        """The three optimizers' states as one torch optimizer ``state_dict`` (groups in order actor,
        critic, temperature; parameter ids numbered across them), as checkpoints store one."""
        return merge_optimizer_states([o.state_dict() for o in self._optimizers()])

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        for opt, part in zip(self._optimizers(), split_optimizer_state(state, [len(o.param_groups) for o in self._optimizers()])):
            opt.load_state_dict(part)

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer]


@ALGORITHMS.register("rlpd")
class RLPD(SAC):
    """RLPD: SAC with a layer-normed critic ensemble, a random-subset min target and half of each batch demonstrations."""

    name: ClassVar[str] = "rlpd"


def build_off_policy(cfg: SACConfig, obs_dim: int, action_low: Any, action_high: Any, device: torch.device | str = "cpu") -> SAC:
    """The registered off-policy algorithm ``cfg.name``."""
    return ALGORITHMS.get(cfg.name)(cfg, obs_dim, action_low, action_high, device)


def merge_optimizer_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Several optimizers' ``state_dict`` as one (parameter ids renumbered consecutively)."""
    merged: dict[str, Any] = {"state": {}, "param_groups": []}
    offset = 0
    for state in states:
        for group in state["param_groups"]:
            merged["param_groups"].append({**group, "params": [p + offset for p in group["params"]]})
        for idx, entry in state["state"].items():
            merged["state"][int(idx) + offset] = entry
        offset += sum(len(g["params"]) for g in state["param_groups"])
    return merged


def split_optimizer_state(state: dict[str, Any], groups_per_optimizer: list[int]) -> list[dict[str, Any]]:
    """Inverse of :func:`merge_optimizer_states`, given each optimizer's number of param groups."""
    out, g, offset = [], 0, 0
    for n in groups_per_optimizer:
        groups = state["param_groups"][g:g + n]
        ids = [p for group in groups for p in group["params"]]
        out.append({"param_groups": [{**group, "params": [p - offset for p in group["params"]]} for group in groups],
                    "state": {int(i) - offset: state["state"][i] for i in state["state"] if int(i) in ids}})
        g, offset = g + n, offset + len(ids)
    return out
