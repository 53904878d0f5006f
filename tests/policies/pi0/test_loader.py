"""Checkpoints in the published layouts (LeRobot's export, openpi's PyTorch conversion) load with
every key in place, and the loaded model computes what π0 computes: a reference forward written
here from the checkpoint's own tensors, with openpi's semantics (one joint sequence [prefix;
suffix], the cumulative block mask, positions from the real tokens, per-stream projections of
every layer, π0's action-time MLP or π0.5's adaRMS time conditioning)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from embodied.errors import UserError  # noqa: E402
from policies.pi0.inputs import ByteTokenizer, Normalizer, prompt_texts, tokenize  # noqa: E402
from policies.pi0.loader import load_pi0  # noqa: E402
from policies.pi0.tiny import tiny_pi0, tiny_stats, write_checkpoint  # noqa: E402

LOW, HIGH = [-1.0, -2.0, 0.0], [1.0, 2.0, 4.0]


def written(tmp_path: Path, pi05: bool, layout: str) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    source = tiny_pi0(pi05, {}, LOW, HIGH, state_dim=3)
    with torch.no_grad():  # weights large enough that every path (a mask entry, a gate) moves the velocity
        for param in source.model.parameters():
            param.normal_(0.0, 0.3)
    path = write_checkpoint(tmp_path / layout, source.model, tiny_stats(pi05, LOW, HIGH, 3), layout)
    return path, load_file(str(path / "model.safetensors"))


# -- the reference: openpi's computation on the checkpoint's tensors -----------------------------------


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + weight)


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (theta 10000) of x (B, heads, T, hd) at positions (B, T)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(0, x.shape[-1], 2).float() / x.shape[-1]))
    angle = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def reference_velocity(w: dict[str, torch.Tensor], prefix_embs: torch.Tensor, prefix_pad: torch.Tensor, state: torch.Tensor,
                       x_t: torch.Tensor, t: torch.Tensor, pi05: bool, depth: int, head_dim: int) -> torch.Tensor:
    """openpi's ``PI0Pytorch.forward`` up to the velocity, on tensors named as in the checkpoint."""
    vlm = "paligemma_with_expert.paligemma.language_model.model." if "paligemma_with_expert.paligemma.language_model.model.norm.weight" in w \
        else "paligemma_with_expert.paligemma.model.language_model."
    exp = "paligemma_with_expert.gemma_expert.model."
    lin = lambda x, name: F.linear(x, w[name + ".weight"], w.get(name + ".bias"))  # noqa: E731
    width = w["action_in_proj.weight"].shape[0]
    fraction = torch.linspace(0, 1, width // 2, dtype=torch.float64)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = t.double()[:, None] * (2 * math.pi / period)[None]
    time = torch.cat([angle.sin(), angle.cos()], -1).float()
    actions = lin(x_t, "action_in_proj")
    batch, horizon = actions.shape[:2]
    if pi05:
        cond = F.silu(lin(F.silu(lin(time, "time_mlp_in")), "time_mlp_out"))
        suffix, starts = actions, [1] + [0] * (horizon - 1)
    else:
        mlp = "time_mlp" if "time_mlp_in.weight" in w else "action_time_mlp"
        fused = lin(F.silu(lin(torch.cat([actions, time[:, None].expand_as(actions)], -1), f"{mlp}_in")), f"{mlp}_out")
        suffix, starts, cond = torch.cat([lin(state, "state_proj")[:, None], fused], 1), [1, 1] + [0] * (horizon - 1), None
    pad = torch.cat([prefix_pad, torch.ones(batch, suffix.shape[1], dtype=torch.bool)], 1)
    att = torch.tensor([0] * prefix_embs.shape[1] + starts)[None].expand(batch, -1)
    cumsum = torch.cumsum(att, 1)
    mask = (cumsum[:, None, :] <= cumsum[:, :, None]) & pad[:, None, :] & pad[:, :, None]
    positions = torch.cumsum(pad.long(), 1) - 1
    P = prefix_embs.shape[1]

    def norm(x: torch.Tensor, name: str, adaptive: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not adaptive:
            return rms(x, w[name + ".weight"]), None
        scale, shift, gate = lin(cond, name + ".dense")[:, None].chunk(3, -1)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + scale) + shift, gate

    streams = [prefix_embs, suffix]
    for layer in range(depth):
        qs, ks, vs, gates = [], [], [], []
        for i, (x, base) in enumerate(zip(streams, (vlm, exp))):
            h, g = norm(x, f"{base}layers.{layer}.input_layernorm", pi05 and i == 1)
            split = lambda y: y.view(batch, y.shape[1], -1, head_dim).transpose(1, 2)  # noqa: E731
            qs.append(split(lin(h, f"{base}layers.{layer}.self_attn.q_proj")))
            ks.append(split(lin(h, f"{base}layers.{layer}.self_attn.k_proj")))
            vs.append(split(lin(h, f"{base}layers.{layer}.self_attn.v_proj")))
            gates.append(g)
        q, k, v = (torch.cat(z, 2) for z in (qs, ks, vs))
        q, k = rotate(q, positions), rotate(k, positions)
        k, v = (z.repeat_interleave(q.shape[1] // z.shape[1], 1) for z in (k, v))
        scores = (q @ k.transpose(-1, -2)) * head_dim**-0.5
        scores = scores.masked_fill(~mask[:, None], -2.3819763e38)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, q.shape[2], -1)
        new = []
        for i, (x, base) in enumerate(zip(streams, (vlm, exp))):
            piece = out[:, :P] if i == 0 else out[:, P:]
            y = lin(piece, f"{base}layers.{layer}.self_attn.o_proj")
            x = x + y if gates[i] is None else x + y * gates[i]
            h, g = norm(x, f"{base}layers.{layer}.post_attention_layernorm", pi05 and i == 1)
            m = f"{base}layers.{layer}.mlp"
            y = lin(F.gelu(lin(h, m + ".gate_proj"), approximate="tanh") * lin(h, m + ".up_proj"), m + ".down_proj")
            new.append(x + y if g is None else x + y * g)
        streams = new
    out, _ = norm(streams[1], f"{exp}norm", pi05)
    return lin(out[:, -horizon:], "action_out_proj")


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
@pytest.mark.parametrize("layout", ["lerobot", "openpi"])
def test_published_layout_loads_every_key_and_matches_the_reference(tmp_path: Path, pi05: bool, layout: str) -> None:
    torch.set_num_threads(1)
    path, checkpoint = written(tmp_path, pi05, layout)
    loaded = load_pi0(path)
    model, report = loaded.model.eval(), loaded.report
    assert report is not None
    assert set(report.filled.values()) | set(report.dropped) == set(checkpoint)  # every key accounted for
    assert set(report.filled) == set(model.state_dict())  # every parameter filled
    assert set(report.dropped) == {k for k in checkpoint if k.endswith("lm_head.weight")}
    for target, key in report.filled.items():
        assert torch.equal(model.state_dict()[target], checkpoint[key]), target
    config = model.config
    assert (config.pi05, config.chunk_size, config.max_action_dim, config.vision.image_size) == (pi05, 4, 8, 32)

    batch = 2
    torch.manual_seed(1)
    images = torch.rand(batch, 2, 3, 32, 32) * 2 - 1
    image_mask = torch.tensor([[True, True], [True, False]])  # a missing camera slot
    state = torch.rand(batch, 3) * 2 - 1
    texts = prompt_texts(["pick up the cube", "open the drawer"], state, pi05)
    tokens, token_mask = tokenize(ByteTokenizer(config.vocab_size), texts, config.tokenizer_max_length)
    padded_state = F.pad(state, (0, config.max_state_dim - 3))
    x_t, t = torch.randn(batch, 4, 8), torch.tensor([1.0, 0.37])
    with torch.no_grad():
        cache = model.encode_prefix(images, image_mask, tokens, token_mask)
        got = model.velocity(model.expert_features(cache, padded_state, x_t, t))
        features = model.paligemma.get_image_features(images.flatten(0, 1)).pooler_output.reshape(batch, -1, config.vlm.width)
        embed = checkpoint[next(k for k in checkpoint if k.endswith("language_model.embed_tokens.weight")
                                or k.endswith("language_model.model.embed_tokens.weight"))]
        prefix = torch.cat([features, embed[tokens] * math.sqrt(config.vlm.width)], 1)
        prefix_pad = torch.cat([image_mask[:, :, None].expand(batch, 2, 16).reshape(batch, -1), token_mask], 1)
        weights = {k.removeprefix("model."): v for k, v in checkpoint.items()}
        want = reference_velocity(weights, prefix, prefix_pad, padded_state, x_t, t, pi05, config.vlm.depth, config.vlm.head_dim)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_statistics_are_applied_as_openpi_does(tmp_path: Path, pi05: bool) -> None:
    path, _ = written(tmp_path, pi05, "lerobot")
    loaded = load_pi0(path)
    x = torch.tensor([[0.0, 0.5, -1.0]])
    got = loaded.action_norm.unnormalize(x)
    if pi05:  # quantiles: (x + 1) / 2 * (q99 - q01 + 1e-6) + q01
        want = torch.tensor([[0.0, 1.0, 0.0]]) + torch.tensor([[0.5, 0.75, 0.0]]) * 1e-6
    else:  # mean/std: x * (std + 1e-6) + mean, mean (0, 0, 2), std (1, 2, 2)
        want = torch.tensor([[0.0, 1.0, 0.0]]) + x * 1e-6
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(loaded.action_norm.normalize(got), x, atol=1e-6)
    assert loaded.state_norm is not None and loaded.state_norm.kind == ("quantile" if pi05 else "mean_std")


def test_a_variant_that_does_not_fit_the_tensors_is_one_sentence(tmp_path: Path) -> None:
    path, _ = written(tmp_path, False, "lerobot")
    meta = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**meta, "action_expert_variant": "gemma_300m"}))
    with pytest.raises(UserError, match=r"action expert has .*width=16.* 'gemma_300m' with .*width=1024"):
        load_pi0(path)


def test_an_unknown_or_missing_key_is_named(tmp_path: Path) -> None:
    path, checkpoint = written(tmp_path, True, "lerobot")
    save_file({**checkpoint, "model.extra_head.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(UserError, match="model.extra_head.weight"):
        load_pi0(path)
    del checkpoint["model.action_out_proj.bias"]
    save_file(checkpoint, str(path / "model.safetensors"))
    with pytest.raises(UserError, match="action_out_proj.bias"):
        load_pi0(path)


def test_config_type_and_tensors_must_agree(tmp_path: Path) -> None:
    path, _ = written(tmp_path, True, "lerobot")
    meta = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**meta, "type": "pi0"}))
    with pytest.raises(UserError, match="adaRMS"):
        load_pi0(path)


def test_normalizer_by_hand() -> None:
    quantile = Normalizer.from_stats({"q01": [0.0], "q99": [2.0]}, True, "test")
    assert quantile.normalize(torch.tensor([1.5])).item() == pytest.approx(0.5, abs=1e-5)
    mean_std = Normalizer.from_stats({"mean": [1.0], "std": [2.0]}, False, "test")
    assert mean_std.normalize(torch.tensor([5.0])).item() == pytest.approx(2.0, abs=1e-5)
    with pytest.raises(UserError, match="q01"):
        Normalizer.from_stats({"mean": [1.0], "std": [2.0]}, True, "the action statistics")
