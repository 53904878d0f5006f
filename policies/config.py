"""Typed config of the policy (``policy.*`` keys)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embodied.errors import UserError


@dataclass
class PolicyConfig:
    """Which model acts, and its size."""

    name: str = "mlp"
    """Registered policy (``embodied recipes --all`` lists them): ``mlp``, ``cnn``, ..."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Widths of the hidden layers of the actor and critic MLPs."""
    activation: str = "tanh"
    """Hidden activation: ``tanh``, ``relu``, ``elu`` or ``gelu``."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""
    normalize_obs: bool = False
    """Normalize state observations with running mean/std statistics updated by the trainer."""
    action_chunk: int = 1
    """Actions predicted per observation (C, a VLA's action chunk): the env applies them one after
    another (``chunk_step``) and PPO treats the chunk as one decision. 1: one action per step."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra model-specific arguments."""
    path: str | None = None
    """Directory of a pretrained checkpoint, for the policies that load one (``openvla``,
    ``openvla_oft``: the official release layout, docs/vla.md); the same as ``policy.kwargs.path``.
    Other policies refuse it."""
    init: str | None = None
    """Weights to start from: a ``.safetensors`` file of the policy's tensors (a behaviour-cloning
    warm start's ``policy.safetensors``), a checkpoint dir, or a run dir (its latest checkpoint).
    Every tensor in it must be one of the policy's, of the same shape; the policy's tensors it
    lacks (a value head the warm start did not train) keep their initialisation. None: the
    model's own initialisation (``warmstart.*`` sets it after behaviour cloning)."""

    def kwargs_with_path(self) -> dict[str, Any]:
        """``kwargs`` with ``path`` set from ``policy.path`` (a checkpoint-loading policy's
        shorthand); refuses two different checkpoints."""
        kwargs = dict(self.kwargs)
        if self.path is not None:
            if kwargs.get("path") not in (None, self.path):
                raise UserError(f"policy.path={self.path!r} and policy.kwargs.path={kwargs['path']!r} name two checkpoints; give one.")
            kwargs["path"] = self.path
        return kwargs
