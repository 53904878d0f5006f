"""Argument checks and masked reductions shared by the RL math.

Every public function in :mod:`embodied.rl` validates its inputs up front and raises a
``ValueError`` that names the function, the argument, the shape it got and the shape it wanted,
so that a transposed ``(B, T)`` batch fails loudly instead of broadcasting into wrong numbers.
"""

from __future__ import annotations

import torch


def _fmt(shape: tuple[int, ...] | torch.Size) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_tensor(fn: str, name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fn}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_rank(fn: str, name: str, x: object, ndim: int, layout: str) -> torch.Tensor:
    """``x`` is a tensor with ``ndim`` dims; ``layout`` (e.g. ``"(T, B)"``) is for the message."""
    x = check_tensor(fn, name, x)
    if x.ndim != ndim:
        raise ValueError(
            f"{fn}: `{name}` must have {ndim} dimension(s) {layout}, got shape {_fmt(x.shape)}"
        )
    return x


def check_shape(
    fn: str, name: str, x: object, shape: tuple[int, ...] | torch.Size, layout: str, like: str
) -> torch.Tensor:
    """``x`` has exactly ``shape``; ``like`` names the argument the shape was taken from."""
    x = check_tensor(fn, name, x)
    if tuple(x.shape) != tuple(shape):
        expected = f"{layout} = {_fmt(shape)}" if layout else _fmt(shape)
        raise ValueError(
            f"{fn}: `{name}` must have shape {expected} to match `{like}`, got {_fmt(x.shape)}"
        )
    return x


def check_floating(fn: str, name: str, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise ValueError(f"{fn}: `{name}` must be a floating-point tensor, got {x.dtype}")


def check_mask(
    fn: str, name: str, mask: object, shape: tuple[int, ...] | torch.Size, like: str
) -> torch.Tensor:
    """A boolean mask of exactly ``shape`` (True = valid sample)."""
    mask = check_shape(fn, name, mask, shape, "", like)
    if mask.dtype != torch.bool:
        raise ValueError(f"{fn}: `{name}` must be a bool tensor (True = valid), got {mask.dtype}")
    return mask


def as_bool(fn: str, name: str, x: torch.Tensor) -> torch.Tensor:
    """Episode flags as bool; 0/1 numbers are accepted and read as ``x != 0``."""
    if x.dtype == torch.bool:
        return x
    if x.is_complex():
        raise ValueError(f"{fn}: `{name}` must be bool (or 0/1 numbers), got {x.dtype}")
    return x != 0


def check_range(fn: str, name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise ValueError(f"{fn}: `{name}` must be in [{low}, {high}], got {value}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is True (all entries when ``mask`` is None).

    Masked-out entries are selected away with ``torch.where`` rather than multiplied by 0, so a
    NaN or inf in padding cannot leak into the result. An all-False mask gives 0, not NaN: a
    minibatch made only of padding then contributes nothing instead of poisoning the update.
    """
    if mask is None:
        return x.mean()
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    count = mask.sum().clamp(min=1).to(x.dtype)
    return total / count


def check_count(fn: str, name: str, value: object, *, positive: bool = False) -> None:
    """``value`` is None, a non-negative (or, with ``positive``, > 0) number, or a 0-d tensor.

    Counts arrive as Python numbers from a config or as 0-d tensors summed on the device (no host
    sync), so only Python numbers can be range-checked here.
    """
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.ndim != 0:
            raise ValueError(
                f"{fn}: `{name}` must be a number or a 0-d tensor, got shape {_fmt(value.shape)}"
            )
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{fn}: `{name}` must be a number or a 0-d tensor, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{fn}: `{name}` must be > 0, got {value}")
    if not value >= 0:
        raise ValueError(f"{fn}: `{name}` must be >= 0, got {value}")


def masked_sum(x: torch.Tensor, mask: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is True; padding is selected away, so NaN there cannot leak."""
    if mask is not None:
        x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)
