"""Tiny Qwen2-architecture causal LMs with a byte-level tokenizer, written to a local directory.

No model hub is reachable here, so tests and the CPU reasoning demo build their model from scratch:
:func:`write_tiny_model` writes a randomly initialised ``Qwen2ForCausalLM`` and its tokenizer with
``save_pretrained``, in the layout ``AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer.from_pretrained`` load.

The tokenizer is Qwen2's own class (``Qwen2Tokenizer``: byte-level BPE, Qwen's pre-tokenizer
regex) with a vocabulary of the 256 bytes and **no merges**, so every byte is one token: ASCII text
is tokenized character by character ("47+85=" is 6 tokens). It is built offline with
``tokenizers``. ``AutoTokenizer`` maps every ``qwen2`` checkpoint to ``Qwen2Tokenizer`` and
rebuilds its pipeline from the vocabulary, so another tokenizer class would not survive the round
trip; this one does, unchanged.

Special tokens follow Qwen2.5 so that what users know carries over:

* ``style="base"`` (Qwen2.5 base): EOS = PAD = ``<|endoftext|>``; ``generation_config.eos_token_id``
  is that one id. PAD equal to EOS is the case where masking by token id hides the EOS.
* ``style="chat"`` (Qwen2.5-Instruct): the tokenizer's EOS is ``<|im_end|>``, PAD is
  ``<|endoftext|>``, ``generation_config.eos_token_id`` lists both, and the tokenizer carries a
  ChatML chat template (``<|im_start|>role\\ncontent<|im_end|>\\n``).
* ``add_bos=True`` (Llama style): a ``<s>`` BOS token is prepended to every encoded text.

Ids: bytes 0-255 in GPT-2's byte-to-unicode order, then ``<|endoftext|>`` (256), ``<|im_start|>``
(257), ``<|im_end|>`` (258) and, with ``add_bos``, ``<s>`` (259).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from embodied.errors import UserError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BOS = "<s>"

#: Qwen2.5's ChatML template (without the tool-calling branches), for ``style="chat"``.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass
class TinyModelConfig:
    """Size and tokenizer of a tiny Qwen2 causal LM (random init). The default size (~0.2M
    parameters with the embeddings) is the one the SFT warm start is calibrated for."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 3
    """Decoder blocks."""
    num_heads: int = 4
    """Attention heads (must divide ``hidden_size`` into an even head size)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention; must divide ``num_heads``)."""
    intermediate_size: int = 256
    """Hidden width of each block's SwiGLU feed-forward layer."""
    max_position_embeddings: int = 128
    """Longest prompt + response in tokens."""
    style: Literal["base", "chat"] = "base"
    """``base``: EOS = PAD = <|endoftext|>; ``chat``: EOS <|im_end|>, PAD <|endoftext|>, both EOS ids
    in the generation config, and a ChatML chat template."""
    add_bos: bool = False
    """Prepend a ``<s>`` BOS token to every encoded text (Llama style)."""
    seed: int = 0
    """Seed of the random initialisation."""


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of the bytes 0-255 that byte-level BPE uses (GPT-2's table):
    printable Latin-1 bytes stand for themselves, the others map to code points from 256 up."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]  # "!".."~", "¡".."¬", "®".."ÿ"
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(256 + shift)
            shift += 1
    return [symbols[byte] for byte in range(256)]


def tiny_vocab(cfg: TinyModelConfig) -> dict[str, int]:
    """Token -> id: the 256 byte symbols, then the special tokens."""
    tokens = byte_symbols() + [ENDOFTEXT, IM_START, IM_END] + ([BOS] if cfg.add_bos else [])
    return {token: i for i, token in enumerate(tokens)}


def build_tokenizer(cfg: TinyModelConfig):
    """A ``Qwen2Tokenizer`` whose BPE has no merges: one token per byte (built offline)."""
    from transformers import Qwen2Tokenizer

    chat = cfg.style == "chat"
    tokenizer = Qwen2Tokenizer(
        vocab=tiny_vocab(cfg),
        merges=[],
        eos_token=IM_END if chat else ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=BOS if cfg.add_bos else None,
        add_bos_token=cfg.add_bos,
        additional_special_tokens=[IM_START, IM_END],
    )
    if chat:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def write_tiny_model(directory: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Write a randomly initialised tiny Qwen2 causal LM and its tokenizer to ``directory``.

    Returns the directory; ``AutoModelForCausalLM.from_pretrained(directory)`` and
    ``AutoTokenizer.from_pretrained(directory)`` load it (``policy.kwargs.model_path``).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = cfg or TinyModelConfig()
    _check(cfg)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(cfg)
    vocab = tiny_vocab(cfg)
    eos_ids = [vocab[IM_END], vocab[ENDOFTEXT]] if cfg.style == "chat" else [vocab[ENDOFTEXT]]
    bos_id = vocab[BOS] if cfg.add_bos else None
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_ids[0],
        pad_token_id=vocab[ENDOFTEXT],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0], pad_token_id=vocab[ENDOFTEXT]
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _check(cfg: TinyModelConfig) -> None:
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_position_embeddings"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"tiny model {name}={value!r} must be a positive integer.")
    if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 2:
        raise UserError(
            f"tiny model num_heads={cfg.num_heads} must divide hidden_size={cfg.hidden_size} into an even head size "
            "(rotary embeddings rotate pairs)."
        )
    if cfg.num_heads % cfg.num_kv_heads:
        raise UserError(f"tiny model num_kv_heads={cfg.num_kv_heads} must divide num_heads={cfg.num_heads}.")
    if cfg.style not in ("base", "chat"):
        raise UserError(f"tiny model style={cfg.style!r} must be 'base' or 'chat'.")
