"""Small heads on the language model's hidden states.

* :class:`ValueHead` (PPO critic, RLinf's ``ValueHead`` / RL4VLA's): ``Linear(H, 512) - GELU -
  Linear(512, 128) - GELU - Linear(128, 1, bias=False)`` on the last prompt token's hidden state.
* :class:`L1RegressionActionHead` (OpenVLA-OFT ``prismatic/models/action_heads.py``): an MLPResNet
  from the A hidden states of one action step, concatenated (A * H), to the A normalized actions.
* :class:`ProprioProjector` (OFT ``prismatic/models/projectors.py``): proprio (D,) -> one LLM token.

Parameter names follow the official modules so their ``*--checkpoint.pt`` files load 1:1.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """Hidden state (B, H) -> value (B,)."""

    def __init__(self, hidden_size: int, widths: tuple[int, int] = (512, 128)) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, widths[0]), nn.GELU(),
            nn.Linear(widths[0], widths[1]), nn.GELU(),
            nn.Linear(widths[1], 1, bias=False),
        )
        for layer in self.net:  # RLinf's init: kaiming (fan_out) hidden layers, a small last layer
            if isinstance(layer, nn.Linear) and layer.out_features > 1:
                nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(layer.bias)
        nn.init.normal_(self.net[-1].weight, std=0.02)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden).squeeze(-1)


class MLPResNetBlock(nn.Module):
    """x + ReLU(Linear(LayerNorm(x))), as ``ffn = Sequential(LayerNorm, Linear, ReLU)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    """LayerNorm - Linear - ReLU - blocks - LayerNorm - Linear."""

    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.relu = nn.ReLU()
        self.mlp_resnet_blocks = nn.ModuleList(MLPResNetBlock(hidden_dim) for _ in range(num_blocks))
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """Action hidden states (B, C * A, H) -> normalized actions (B, C, A).

    Official sizes: input_dim = hidden_dim = 4096 (the LLM width), 2 blocks, about 151M parameters.
    """

    def __init__(self, input_dim: int, hidden_dim: int, action_dim: int, num_blocks: int = 2) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.model = MLPResNet(num_blocks, input_dim * action_dim, hidden_dim, action_dim)

    def predict_action(self, action_hidden: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = action_hidden.shape
        if tokens % self.action_dim:
            raise ValueError(f"{tokens} action hidden states are not whole steps of {self.action_dim} dimensions")
        steps = action_hidden.reshape(batch, tokens // self.action_dim, -1)  # (B, C, A * H)
        return self.model(steps)  # (B, C, A)


class ProprioProjector(nn.Module):
    """Proprio (B, D) -> one LLM embedding (B, H): ``fc1`` (D -> H), GELU, ``fc2`` (H -> H)."""

    def __init__(self, llm_dim: int, proprio_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)
        self.act_fn1 = nn.GELU()

    @property
    def proprio_dim(self) -> int:
        return self.fc1.in_features

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act_fn1(self.fc1(proprio)))
