"""The VLA recipes: each loads (``embodied config`` too), carries RLinf's published settings, takes a
real checkpoint through ``policy.path=DIR`` (here a tiny one written in the official layout), and
its tiny variant builds a policy for its env's spaces."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import UserError
from pipelines.cli import build_train_config, main
from policies.registry import build_policy

FULL = ("maniskill_openvla_ppo", "maniskill_openvlaoft_grpo", "libero_openvlaoft_grpo")
TINY = tuple(f"{name}_tiny" for name in FULL) + ("colorreach_openvla_ppo_tiny", "colorreach_openvla_grpo_tiny")


@pytest.mark.parametrize("name", FULL + TINY)
def test_every_vla_recipe_loads_and_embodied_config_prints_it(name: str, capsys) -> None:
    cfg = build_train_config([name])
    assert cfg.recipe == name and cfg.policy.name in ("openvla", "openvla_oft")
    assert main(["config", name, "algo.clip_ratio_c"]) == 0
    assert "algo.clip_ratio_c" in capsys.readouterr().out
    if name in FULL:
        assert cfg.policy.path is None and "tiny" not in cfg.policy.kwargs  # the user's checkpoint: policy.path=DIR
        assert cfg.workers.rollout_device == cfg.workers.trainer_device == "cuda"
    else:
        assert cfg.policy.kwargs["tiny"] == {} and cfg.workers.trainer_device == "cpu"


def test_rlinf_settings_are_the_defaults() -> None:
    ppo = build_train_config(["maniskill_openvla_ppo"])
    assert (ppo.algo.name, ppo.algo.lr, ppo.algo.gamma, ppo.algo.gae_lambda) == ("ppo", 1e-4, 0.99, 0.95)
    assert (ppo.algo.clip_low, ppo.algo.clip_high, ppo.algo.clip_ratio_c, ppo.algo.value_clip) == (0.2, 0.2, 3.0, 0.2)
    assert (ppo.algo.max_grad_norm, ppo.algo.entropy_coeff, ppo.algo.micro_batch_size) == (10.0, 0.0, 40)
    assert ppo.env.num_envs * ppo.algo.rollout_steps // ppo.algo.num_minibatches == 640  # RLinf's global batch
    assert ppo.policy.kwargs["lora_rank"] == 32 and ppo.policy.kwargs["value_head"] == 1
    assert ppo.policy.kwargs["logprob_level"] == "action" and ppo.policy.kwargs["dtype"] == "bfloat16"

    grpo = build_train_config(["maniskill_openvlaoft_grpo"])
    assert (grpo.algo.name, grpo.algo.estimator, grpo.algo.group_size, grpo.algo.outcome) == ("grpo", "grpo", 8, "success")
    assert (grpo.algo.clip_low, grpo.algo.clip_high, grpo.algo.clip_ratio_c, grpo.algo.lr) == (0.2, 0.28, 3.0, 1e-4)
    assert grpo.env.num_envs == 256 and grpo.policy.action_chunk == 8
    assert grpo.algo.rollout_steps * grpo.policy.action_chunk == grpo.env.max_episode_steps  # one episode per iteration
    assert grpo.policy.kwargs["value_head"] == 0 and grpo.policy.kwargs["logprob_level"] == "token"

    libero = build_train_config(["libero_openvlaoft_grpo"])
    assert libero.env.id == "libero_10" and libero.env.max_episode_steps == 512 and libero.policy.action_chunk == 8
    assert (libero.algo.lr, libero.algo.max_grad_norm, libero.algo.clip_high, libero.algo.filter_groups) == (2e-5, 1.0, 0.28, True)
    assert libero.policy.kwargs["temperature"] == 1.6 and libero.policy.kwargs["lora_rank"] == 0
    assert libero.policy.kwargs["unnorm_key"] == "libero_10_no_noops" and libero.policy.kwargs["center_crop"] == 1
    # every group runs one task, and the groups cover the suite's 10 tasks
    every = libero.env.kwargs["task_every"]
    assert every == libero.algo.group_size and libero.env.num_envs == 10 * every


def test_grpo_tiny_groups_share_one_goal() -> None:
    cfg = build_train_config(["colorreach_openvla_grpo_tiny"])
    assert cfg.env.kwargs["task_every"] == cfg.algo.group_size


@pytest.mark.parametrize("name,oft", [("maniskill_openvla_ppo", False), ("maniskill_openvlaoft_grpo", True)])
def test_policy_path_loads_a_checkpoint_in_the_official_layout(tmp_path, name: str, oft: bool) -> None:
    from policies.vla.tiny import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "ckpt", action_dim=7, l1_head=oft, num_shards=2)
    # the recipe as a user runs it, in float32 on this CPU
    cfg = build_train_config([name, f"policy.path={tmp_path / 'ckpt'}", "policy.kwargs.dtype=float32"])
    obs = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})
    policy = build_policy(cfg.policy, obs, gym.spaces.Box(-1.0, 1.0, (7,), np.float32))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("value_head.") for n in trainable)  # LoRA rank 32
    assert any("lora_" in n for n in trainable) and (policy.value_head is None) == oft
    assert policy.action_chunk == cfg.policy.action_chunk

    with pytest.raises(UserError, match="name two checkpoints"):
        build_policy(build_train_config([name, "policy.path=/a", "policy.kwargs.path=/b"]).policy, obs,
                     gym.spaces.Box(-1.0, 1.0, (7,), np.float32))


def test_without_a_checkpoint_the_full_recipe_says_how_to_give_one() -> None:
    cfg = build_train_config(["maniskill_openvla_ppo"])
    obs = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})
    with pytest.raises(UserError, match="policy.path=DIR"):
        build_policy(cfg.policy, obs, gym.spaces.Box(-1.0, 1.0, (7,), np.float32))


def test_policy_path_is_refused_by_policies_without_checkpoints() -> None:
    cfg = build_train_config(["cartpole_ppo", "policy.path=/some/dir"])
    with pytest.raises(UserError, match="loads no pretrained checkpoint"):
        build_policy(cfg.policy, gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (4,))}), gym.spaces.Discrete(2))
