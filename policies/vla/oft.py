"""OpenVLA-OFT: a whole action chunk in one forward pass with bidirectional attention.

The input is ``[BOS, patches (+ one proprio token), PAD..., prompt ..."▁", K placeholders, STOP]``
with K = C * A. The placeholders' input embeddings are zero (OFT's "empty action embeddings"; the
official code embeds placeholder ids and multiplies them by ~mask) and STOP is the tokenizer's
EOS (2). Every layer attends bidirectionally: OFT's transformers fork makes all attention masks
bidirectional; transformers 5 does it per call with ``is_causal=False``. The hidden states at
the last prompt token and the first K - 1 placeholders (the usual shift by one) give

* the **discrete head**: the LM head's action-token logits, one independent distribution per
  token; what RL samples and scores (RLinf, SimpleVLA-RL);
* the **L1 regression head** (official OFT checkpoints): an MLPResNet from each action step's A
  hidden states to its A normalized actions.

The proprio projector, when the checkpoint has one, appends the normalized robot state as one
token after the patches (``_process_proprio_features``).
"""

from __future__ import annotations

import torch

from policies.vla.config import VLAConfig
from policies.vla.heads import L1RegressionActionHead, ProprioProjector
from policies.vla.model import OpenVLA
from policies.vla.processor import PromptBatch


class OpenVLAOFT(OpenVLA):
    """OpenVLA with parallel decoding, and OFT's optional proprio projector and L1 action head."""

    def __init__(
        self,
        config: VLAConfig,
        attn_implementation: str = "sdpa",
        proprio_dim: int = 0,
        l1_action_dim: int = 0,
    ) -> None:
        super().__init__(config, attn_implementation)
        hidden = self.hidden_size
        self.proprio_projector = ProprioProjector(hidden, proprio_dim) if proprio_dim else None
        self.action_head = L1RegressionActionHead(hidden, hidden, l1_action_dim) if l1_action_dim else None

    @property
    def stop_id(self) -> int:
        """OFT's STOP token: the language model's EOS id (2 for Llama-2)."""
        return int(self.llm.config.eos_token_id)

    def prefix(self, pixel_values: torch.Tensor, proprio: torch.Tensor | None = None) -> torch.Tensor:
        """Patch embeddings of every image, then the proprio token when the model has a projector:
        (B, N * P (+ 1), H). ``proprio``: (B, D) normalized state."""
        patches = self.embed_images(pixel_values)
        if self.proprio_projector is None:
            return patches
        if proprio is None:
            raise ValueError("this OFT model has a proprio projector and needs the robot state")
        token = self.proprio_projector(proprio.to(patches.dtype))  # (B, H)
        return torch.cat([patches, token[:, None]], dim=1)

    def parallel(
        self,
        prefix: torch.Tensor,
        prompt: PromptBatch,
        num_tokens: int,
        action_embeds: torch.Tensor | None = None,
        bidirectional: bool = True,
    ) -> torch.Tensor:
        """Hidden states (B, K, H) that predict the K action tokens, from one forward pass.

        ``action_embeds`` (B, K, H) replace the zero placeholder embeddings (OFT's diffusion variant
        puts noisy-action embeddings there); ``bidirectional=False`` runs the same sequence causally
        (not OFT: for comparison only). Entry 0 is the last prompt token (the value head's input).
        """
        batch = prefix.shape[0]
        if action_embeds is None:
            action_embeds = prefix.new_zeros(batch, num_tokens, prefix.shape[2])
        stop = self.embed_tokens(torch.full((batch, 1), self.stop_id, dtype=torch.long, device=prefix.device))
        inputs = self.sequence(prefix, prompt, torch.cat([action_embeds.to(prefix.dtype), stop], dim=1))
        hidden = self.decode(inputs, bidirectional=bidirectional)  # (B, L + K + 1, H)
        return hidden[:, -num_tokens - 2 : -2]

    def l1_actions(self, action_hidden: torch.Tensor) -> torch.Tensor:
        """The L1 head's normalized actions (B, C, A) from :meth:`parallel`'s hidden states."""
        if self.action_head is None:
            raise ValueError("this OFT model has no L1 regression action head")
        return self.action_head.predict_action(action_hidden).float()
