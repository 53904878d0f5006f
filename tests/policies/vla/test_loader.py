"""Checkpoints in the official layout load with every tensor in place, and the model computes
what OpenVLA computes: a timm-style reference forward written here (fused qkv, layer scale
``scale_factor``, no-embed-class positions, second-to-last block), the projector, and a Llama
loaded from the same ``language_model.*`` tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from embodied.errors import UserError  # noqa: E402
from policies.vla.keymap import dino_attention_names  # noqa: E402
from policies.vla.loader import load_openvla  # noqa: E402
from policies.vla.processor import ImageProcessor, PromptTokenizer  # noqa: E402
from policies.vla.tiny import write_tiny_checkpoint  # noqa: E402

INSTRUCTIONS = ["pick up the red cube", "open the drawer and put the bowl inside the cabinet"]


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("model*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def timm_features(t: dict[str, torch.Tensor], prefix: str, spec: dict, pixels: torch.Tensor) -> torch.Tensor:
    """timm ``VisionTransformer.get_intermediate_layers(n={depth - 2})[0]`` (no final norm), written out."""
    w = {k[len(prefix):]: v.float() for k, v in t.items() if k.startswith(prefix)}
    d, heads, dino = spec["hidden_size"], spec["num_heads"], spec["family"] == "dinov2"
    x = F.conv2d(pixels, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=spec["patch_size"])
    x = x.flatten(2).transpose(1, 2) + w["pos_embed"]  # no_embed_class: positions on the patches only
    batch = x.shape[0]
    if dino:
        x = torch.cat([w["cls_token"].expand(batch, -1, -1), w["reg_token"].expand(batch, -1, -1), x], dim=1)
    tokens = x.shape[1]
    for i in range(spec["num_layers"] - 1):  # blocks 0 .. depth - 2
        b = f"blocks.{i}."
        h = F.layer_norm(x, (d,), w[b + "norm1.weight"], w[b + "norm1.bias"], eps=1e-6)
        qkv = F.linear(h, w[b + "attn.qkv.weight"], w[b + "attn.qkv.bias"])
        q, k, v = qkv.reshape(batch, tokens, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        attention = ((q @ k.transpose(-2, -1)) * (d // heads) ** -0.5).softmax(-1)
        h = (attention @ v).transpose(1, 2).reshape(batch, tokens, d)
        h = F.linear(h, w[b + "attn.proj.weight"], w[b + "attn.proj.bias"])
        x = x + (h * w[b + "ls1.scale_factor"] if dino else h)
        h = F.layer_norm(x, (d,), w[b + "norm2.weight"], w[b + "norm2.bias"], eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, w[b + "mlp.fc1.weight"], w[b + "mlp.fc1.bias"])), w[b + "mlp.fc2.weight"], w[b + "mlp.fc2.bias"])
        x = x + (h * w[b + "ls2.scale_factor"] if dino else h)
    return x[:, 1 + spec["num_register_tokens"] :] if dino else x


def reference_logits(path: Path, pixels: torch.Tensor, prompt_ids: list[int]) -> torch.Tensor:
    """OpenVLA's forward for ONE sample (no padding): towers, projector, patches after BOS, Llama."""
    config = json.loads((path / "config.json").read_text())
    t = {k: v.float() for k, v in checkpoint_tensors(path).items()}
    towers = config["embodied_vision_towers"]
    prefixes = ["vision_backbone.featurizer.", "vision_backbone.fused_featurizer."]
    channels = torch.split(pixels, 3, dim=1)
    patches = torch.cat([timm_features(t, p, s, c) for p, s, c in zip(prefixes, towers, channels)], dim=2)
    layers = sorted({k.split(".")[1] for k in t if k.startswith("projector.")})  # fc1, fc2 (, fc3)
    for i, layer in enumerate(layers):
        patches = F.linear(patches, t[f"projector.{layer}.weight"], t[f"projector.{layer}.bias"])
        if i + 1 < len(layers):
            patches = F.gelu(patches)
    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    llama = LlamaForCausalLM(LlamaConfig(**text)).eval()
    llama.load_state_dict({k[len("language_model."):]: v for k, v in t.items() if k.startswith("language_model.")})
    embeddings = llama.get_input_embeddings()(torch.tensor([prompt_ids]))
    sequence = torch.cat([embeddings[:, :1], patches, embeddings[:, 1:]], dim=1)
    with torch.no_grad():
        return llama(inputs_embeds=sequence).logits[0]  # (1 + P + len - 1, vocab)


@pytest.fixture(scope="module")
def fused_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("fused"), num_shards=3)


@pytest.mark.parametrize("variant", ["fused", "single"])
def test_model_equals_the_reference_forward(variant: str, fused_checkpoint: Path, tmp_path: Path) -> None:
    path = fused_checkpoint if variant == "fused" else write_tiny_checkpoint(tmp_path, {"dino_width": 0}, num_shards=1)
    loaded = load_openvla(path)
    model, config = loaded.model.eval(), loaded.config
    assert config.use_fused_vision_backbone == (variant == "fused")
    assert model.projector.fc3 is not None if variant == "fused" else model.projector.fc3 is None
    prompts = PromptTokenizer(loaded.tokenizer, 1, config.pad_token_id)
    pixels = ImageProcessor(config.towers)(torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8))
    batch = prompts(INSTRUCTIONS)  # different lengths: the first prompt is padded
    with torch.no_grad():
        logits = model(pixels[:, None], batch)  # (B, 1 + P + L, vocab)
        features = model.vision_backbone(pixels)  # (B, P, vision_dim)
    towers = json.loads((path / "config.json").read_text())["embodied_vision_towers"]
    t = checkpoint_tensors(path)
    prefixes = ["vision_backbone.featurizer.", "vision_backbone.fused_featurizer."]
    expected_features = torch.cat(
        [timm_features(t, p, s, c) for p, s, c in zip(prefixes, towers, torch.split(pixels, 3, dim=1))], dim=2
    )
    assert (features - expected_features).abs().max() < 1e-5
    for row, text in enumerate(INSTRUCTIONS):
        ids = prompts.token_ids(text)
        expected = reference_logits(path, pixels[row : row + 1], ids)
        got = torch.cat([logits[row, : 1 + config.num_patches], logits[row, -(len(ids) - 1) :]])  # drop the pads
        assert got.shape == expected.shape
        assert (got - expected).abs().max() < 2e-5  # logits of magnitude ~4; float32 summation order only


def test_every_checkpoint_key_is_loaded_or_dropped_by_name(fused_checkpoint: Path) -> None:
    loaded = load_openvla(fused_checkpoint)
    keys = set(checkpoint_tensors(fused_checkpoint))
    report = loaded.report
    assert set(report.loaded) | set(report.dropped) == keys
    assert not set(report.loaded) & set(report.dropped)
    # Dropped: the last block (2 of 3) of each tower, the final norms, SigLIP's attention pool.
    expected_dropped = {
        k for k in keys
        if ".blocks.2." in k or k.endswith("featurizer.norm.weight") or k.endswith("featurizer.norm.bias") or ".attn_pool." in k
    }
    assert set(report.dropped) == expected_dropped
    assert len(expected_dropped) == (12 + 2) + 2 + 12 + 2 + 13
    # Spot checks of the mapping: qkv split in q, k, v order; the zero CLS position slot; layer scale.
    t = checkpoint_tensors(fused_checkpoint)
    dino = loaded.model.vision_backbone.featurizer
    qkv = t["vision_backbone.featurizer.blocks.1.attn.qkv.weight"]
    state = loaded.model.state_dict()
    block = "vision_backbone.featurizer.encoder.layer.1."
    _, k_proj, _, _ = dino_attention_names(state, block)  # k_proj, or attention.key in transformers 5.17
    torch.testing.assert_close(state[f"{block}attention.{k_proj}.weight"], qkv[64:128], rtol=0, atol=0)
    positions = dino.embeddings.position_embeddings
    assert positions.shape == (1, 17, 64) and positions[0, 0].abs().max() == 0
    torch.testing.assert_close(dino.embeddings.position_embeddings[:, 1:], t["vision_backbone.featurizer.pos_embed"])
    torch.testing.assert_close(dino.encoder.layer[0].layer_scale2.lambda1, t["vision_backbone.featurizer.blocks.0.ls2.scale_factor"])
    assert len(dino.encoder.layer) == 2 and len(loaded.model.vision_backbone.fused_featurizer.encoder.layers) == 2


def test_dino_attention_names_follow_the_installed_transformers_layout() -> None:
    block = "vision_backbone.featurizer.encoder.layer.0."
    newer = {f"{block}attention.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    older = {f"{block}attention.attention.{n}.weight" for n in ("query", "key", "value")} | {f"{block}attention.output.dense.weight"}
    assert dino_attention_names(newer, block) == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert dino_attention_names(older, block) == ("attention.query", "attention.key", "attention.value", "output.dense")
    for names in (dino_attention_names(newer, block), dino_attention_names(older, block)):
        keys = newer if names[0] == "q_proj" else older
        assert {f"{block}attention.{n}.weight" for n in names} == keys  # every projection named, none invented


def test_dtype_comes_from_the_config_unless_asked(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, dtype="bfloat16")
    assert load_openvla(path).model.projector.fc1.weight.dtype == torch.bfloat16
    model = load_openvla(path, dtype="float32").model
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    stored = checkpoint_tensors(path)["projector.fc1.weight"]
    torch.testing.assert_close(model.projector.fc1.weight, stored.float(), rtol=0, atol=0)


def _rewrite_first_shard(path: Path, edit) -> None:
    shard = sorted(path.glob("model-*.safetensors"))[0]
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard))


def test_an_unexpected_key_is_named(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["vision_backbone.featurizer.blocks.0.attn.extra"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(UserError, match=r"blocks\.0\.attn\.extra"):
        load_openvla(path)


def test_a_missing_key_is_named(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["projector.fc2.bias"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(UserError, match=r"lacks 1 key.*'projector\.fc2\.bias'"):
        load_openvla(path)


def test_a_wrong_shape_is_named(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=2)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    key = "vision_backbone.fused_featurizer.blocks.1.mlp.fc1.weight"
    shard = path / index[key]
    tensors = load_file(str(shard))
    tensors[key] = tensors[key][:, :-1].contiguous()
    save_file(tensors, str(shard))
    with pytest.raises(UserError, match=r"fused_featurizer\.blocks\.1\.mlp\.fc1\.weight' has shape \(152, 47\)"):
        load_openvla(path)


def test_a_missing_shard_or_config_is_a_user_error(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="model-00002-of-00002.safetensors"):
        load_openvla(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no config.json"):
        load_openvla(empty)
    with pytest.raises(UserError, match="does not exist"):
        load_openvla(tmp_path / "missing")


def test_oft_components_load_with_module_prefixes(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, proprio_dim=5, l1_head=True)
    raw = torch.load(path / "action_head--1000_checkpoint.pt", weights_only=True)
    assert all(k.startswith("module.") for k in raw)
    loaded = load_openvla(path, oft=True)
    model = loaded.model
    assert sorted(loaded.report.components) == ["action_head", "proprio_projector"]
    assert model.proprio_projector.proprio_dim == 5 and model.action_head.action_dim == 7
    torch.testing.assert_close(model.action_head.model.fc1.weight, raw["module.model.fc1.weight"], rtol=0, atol=0)
    # the non-OFT model ignores the component files
    assert not hasattr(load_openvla(path).model, "action_head")


def test_oft_component_mismatch_and_unsupported_variants(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, l1_head=True)
    file = path / "action_head--1000_checkpoint.pt"
    state = torch.load(file, weights_only=True)
    state["module.model.extra.weight"] = torch.zeros(1)
    torch.save(state, file)
    with pytest.raises(UserError, match="extra"):
        load_openvla(path, oft=True)
    torch.save({}, path / "vision_backbone--1000_checkpoint.pt")
    with pytest.raises(UserError, match="FiLM"):
        load_openvla(path, oft=True)


def test_unsupported_backbone_is_a_user_error(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.pop("embodied_vision_towers")
    config["vision_backbone_id"] = "dinoclip-vit-l-336px"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="not supported.*Supported: dinosiglip-vit-so-224px"):
        load_openvla(path)


def test_openvla_7b_architecture_builds_on_meta_and_its_key_plan_covers_it() -> None:
    """openvla-7b's config.json (the diff-to-defaults text_config) gives the official shapes."""
    from policies.vla.config import VLAConfig
    from policies.vla.loader import build_model, plan_for

    config = VLAConfig.from_dict({
        "vision_backbone_id": "dinosiglip-vit-so-224px", "use_fused_vision_backbone": True,
        "image_resize_strategy": "resize-naive", "pad_token_id": 32000, "pad_to_multiple_of": 64,
        "text_config": {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16", "vocab_size": 32064},
        "torch_dtype": "bfloat16", "n_action_bins": 256,
    })
    assert config.vocab_size == 32000 and config.dtype == "bfloat16" and config.num_patches == 256
    model = build_model(config, oft=False, attn_implementation="sdpa")  # parameters on the meta device
    plan = plan_for(model)  # raises when the plan and the module disagree
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["vision_backbone.featurizer.embeddings.position_embeddings"] == (1, 257, 1024)
    assert shapes["vision_backbone.featurizer.embeddings.register_tokens"] == (1, 4, 1024)
    assert shapes["vision_backbone.fused_featurizer.embeddings.position_embedding.weight"] == (256, 1152)
    assert shapes["vision_backbone.fused_featurizer.encoder.layers.25.mlp.fc1.weight"] == (4304, 1152)
    assert shapes["projector.fc1.weight"] == (8704, 2176) and shapes["projector.fc3.weight"] == (4096, 4096)
    assert shapes["language_model.lm_head.weight"] == (32064, 4096)
    assert len(model.vision_backbone.featurizer.encoder.layer) == 23  # of 24: the last one is dropped
    assert len(model.vision_backbone.fused_featurizer.encoder.layers) == 26  # of 27
    assert "vision_backbone.featurizer.blocks.23.attn.qkv.weight" in plan.dropped
    assert "vision_backbone.fused_featurizer.attn_pool.kv.weight" in plan.dropped
    assert model.llm.config.rms_norm_eps == 1e-6  # LlamaConfig's default, as the HF export ran
    total = sum(p.numel() for p in model.parameters())
    assert 7.45e9 < total < 7.55e9  # 7.541B with the dropped blocks and head (note: openvla-from-transformers)


def _official_config(path: Path, backbone_id: str, drop_llm_sizes: bool = False) -> None:
    """config.json as the official release writes it: no tower sizes (and, with ``drop_llm_sizes``,
    a text_config without the Llama's sizes but its head count)."""
    file = path / "config.json"
    config = json.loads(file.read_text())
    config.pop("embodied_vision_towers")
    config["vision_backbone_id"] = backbone_id
    if drop_llm_sizes:
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
            config["text_config"].pop(key)
    file.write_text(json.dumps(config))


SMALL_TOWERS = {"dino_width": 128, "siglip_width": 128, "vision_heads": 2}  # heads of width 64, as timm's


def test_official_layout_with_small_towers_takes_its_sizes_from_the_tensors(tmp_path: Path) -> None:
    from policies.vla.tiny import tiny_config

    reference = load_openvla(write_tiny_checkpoint(tmp_path / "with_sizes", SMALL_TOWERS))
    path = write_tiny_checkpoint(tmp_path / "official", SMALL_TOWERS)
    _official_config(path, "dinosiglip-vit-s-32px", drop_llm_sizes=True)
    loaded = load_openvla(path)
    assert loaded.config.towers == tiny_config(SMALL_TOWERS).towers  # heads, MLP, registers, image size
    assert loaded.model.llm.config.hidden_size == 64 and loaded.model.llm.config.num_key_value_heads == 4
    # every checkpoint key loaded or dropped, every model tensor filled by a key or built, by name
    report, model = loaded.report, loaded.model
    assert set(report.loaded) | set(report.dropped) == set(checkpoint_tensors(path))
    tensors = set(model.state_dict()) | {name for name, _ in model.named_buffers()}
    assert set(report.filled) | {k for k in report.built if k in tensors} == tensors
    assert not set(report.filled) & set(report.built)
    assert "vision_backbone.featurizer.embeddings.position_embeddings[:, 0]" in report.built
    assert "vision_backbone.featurizer.embeddings.mask_token" in report.built
    assert "language_model.model.rotary_emb.inv_freq" in report.built
    prompts = PromptTokenizer(loaded.tokenizer, 1, loaded.config.pad_token_id)
    pixels = ImageProcessor(loaded.config.towers)(torch.randint(0, 256, (1, 32, 32, 3), dtype=torch.uint8))
    with torch.no_grad():
        got = model.eval()(pixels[:, None], prompts(INSTRUCTIONS[:1]))
        expected = reference.model.eval()(pixels[:, None], prompts(INSTRUCTIONS[:1]))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_released_backbone_id_with_other_sizes_is_one_sentence(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)
    _official_config(path, "dinosiglip-vit-so-224px")
    with pytest.raises(UserError) as error:
        load_openvla(path)
    message = str(error.value)
    assert message.startswith(
        "the checkpoint's DINOv2 tower (vision_backbone.featurizer.*) has hidden size 64, 3 layers, MLP size 256, "
        "patch size 8 and 16 patches, the config (vision_backbone_id 'dinosiglip-vit-so-224px') asks for "
        "1024, 24, 4096, 14 and 256: "
    )
    assert message.count(". ") == 0 and "\n" not in message and "blocks." not in message  # one sentence, no key list


def test_llm_sizes_that_disagree_with_text_config_are_one_sentence(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)
    file = path / "config.json"
    config = json.loads(file.read_text())
    config["text_config"]["num_hidden_layers"] = 4
    file.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"^the checkpoint's Llama \(language_model\.\*\) has hidden size 64 and 2 layers, "
                       r"text_config asks for 64 and 4: config\.json is not the config of these weights\.$"):
        load_openvla(path)


def test_a_missing_part_is_counted_by_part(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)
    tensors = load_file(str(path / "model.safetensors"))
    for key in [k for k in tensors if ".fused_featurizer.blocks.1." in k]:
        del tensors[key]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(UserError, match=r"^the checkpoint lacks 12 key\(s\) the model needs, 12 in the second vision "
                       r"tower \(vision_backbone\.fused_featurizer\.\*\), e\.g\. '[^']+'\.$"):
        load_openvla(path)


def timm_shapes(prefix: str, family: str, width: int, depth: int, mlp: int, patches: int, patch: int = 14) -> dict:
    """The shapes of the keys a timm tower's sizes are read from (as a safetensors header has them)."""
    shapes = {prefix + "pos_embed": (1, patches, width), prefix + "patch_embed.proj.weight": (width, 3, patch, patch)}
    if family == "dinov2":
        shapes.update({prefix + "cls_token": (1, 1, width), prefix + "reg_token": (1, 4, width)})
    for i in range(depth):
        shapes.update({f"{prefix}blocks.{i}.mlp.fc1.weight": (mlp, width), f"{prefix}blocks.{i}.norm1.weight": (width,)})
    return shapes


def openvla_7b_shapes(dino_width: int = 1024, dino_depth: int = 24, dino_mlp: int = 4096) -> dict:
    shapes = {
        **timm_shapes("vision_backbone.featurizer.", "dinov2", dino_width, dino_depth, dino_mlp, 256),
        **timm_shapes("vision_backbone.fused_featurizer.", "siglip", 1152, 27, 4304, 256),
        "language_model.model.embed_tokens.weight": (32064, 4096),
    }
    for i in range(32):
        shapes[f"language_model.model.layers.{i}.mlp.gate_proj.weight"] = (11008, 4096)
        shapes[f"language_model.model.layers.{i}.self_attn.k_proj.weight"] = (4096, 4096)
    return shapes


OPENVLA_7B_CONFIG = {
    "vision_backbone_id": "dinosiglip-vit-so-224px", "use_fused_vision_backbone": True, "image_sizes": [224, 224],
    "text_config": {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16", "vocab_size": 32064},
    "torch_dtype": "bfloat16",
}


def test_the_released_sizes_are_the_check_of_a_released_backbone_id() -> None:
    from policies.vla.config import BACKBONES, VLAConfig
    from policies.vla.sizes import check_sizes, with_checkpoint_sizes

    shapes = openvla_7b_shapes()
    config = VLAConfig.from_dict(with_checkpoint_sizes(dict(OPENVLA_7B_CONFIG), shapes))
    assert config.towers == BACKBONES["dinosiglip-vit-so-224px"]
    assert config.llama_config().num_attention_heads == 32 and config.llama_config().num_key_value_heads == 32
    check_sizes(config, shapes)  # openvla-7b's own tensors pass
    small = openvla_7b_shapes(dino_width=384, dino_depth=12, dino_mlp=1536)  # a DINOv2-S/14 in its place
    config = VLAConfig.from_dict(with_checkpoint_sizes(dict(OPENVLA_7B_CONFIG), small))
    with pytest.raises(UserError, match=r"^the checkpoint's DINOv2 tower \(vision_backbone\.featurizer\.\*\) has hidden size "
                       r"384, 12 layers and MLP size 1536, the config \(vision_backbone_id 'dinosiglip-vit-so-224px'\) "
                       r"asks for 1024, 24 and 4096: config\.json is not the config of these weights\.$"):
        check_sizes(config, small)
    # the same towers under an id of no released size: sizes and heads (width 64, SigLIP so400m 16) from the tensors
    config = VLAConfig.from_dict(with_checkpoint_sizes({**OPENVLA_7B_CONFIG, "vision_backbone_id": "dinosiglip-vit-s"}, small))
    assert [(t.hidden_size, t.num_layers, t.num_heads, t.mlp_size, t.image_size) for t in config.towers] == [
        (384, 12, 6, 1536, 224), (1152, 27, 16, 4304, 224)]
    check_sizes(config, small)


def test_a_head_count_the_tensors_cannot_hold_comes_from_a_partial_towers_entry(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)  # widths 64 and 48, 2 heads each
    file = path / "config.json"
    config = json.loads(file.read_text())
    config["embodied_vision_towers"] = [{"num_heads": 2}, {"num_heads": 2}]
    file.write_text(json.dumps(config))
    loaded = load_openvla(path)
    assert [(t.hidden_size, t.num_heads, t.mlp_size) for t in loaded.config.towers] == [(64, 2, 256), (48, 2, 152)]


def test_a_tower_width_no_head_rule_covers_asks_for_the_head_count(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, num_shards=1)  # SigLIP width 48: no multiple of 64
    _official_config(path, "dinosiglip-vit-tiny")
    with pytest.raises(UserError, match=r"^the checkpoint's SigLIP tower \(vision_backbone\.fused_featurizer\.\*\) has "
                       r"width 48, no multiple of timm's head width 64, and no tensor holds its head count"):
        load_openvla(path)
