"""The real-size π0 recipes (LIBERO and ManiSkill, PPO and GRPO): each resolves with πRL's settings
and takes a checkpoint through ``policy.path=DIR``; their ``policy.kwargs`` pass the π0 options'
checks. Nothing here builds a model (3.3B parameters)."""

from __future__ import annotations

import pytest

from embodied.errors import UserError
from pipelines.cli import build_train_config, main
from policies.pi0.factory import parse_kwargs

RECIPES = ("libero_pi0_ppo", "libero_pi0_grpo", "maniskill_pi0_ppo", "maniskill_pi0_grpo")


@pytest.mark.parametrize("name", RECIPES)
def test_every_real_size_pi0_recipe_resolves_for_a_gpu_with_a_checkpoint(name: str, capsys) -> None:
    cfg = build_train_config([name, "policy.path=/data/pi0_sft"])
    assert cfg.policy.name == "pi0" and cfg.policy.path == "/data/pi0_sft" and "tiny" not in cfg.policy.kwargs
    assert cfg.workers.rollout_device == cfg.workers.trainer_device == "cuda"
    options = parse_kwargs(cfg.policy.kwargs_with_path(), "pi0")
    assert options["path"] == "/data/pi0_sft" and options["dtype"] == "bfloat16" and options["lora_rank"] == 32
    assert cfg.policy.action_chunk == 5
    assert cfg.algo.rollout_steps * cfg.policy.action_chunk == cfg.env.max_episode_steps  # one episode per iteration
    assert bool(options["add_value_head"]) == (cfg.algo.name == "ppo")
    assert main(["config", name, "policy.kwargs"]) == 0
    assert "noise_method" in capsys.readouterr().out
    with pytest.raises(UserError, match="exactly one of policy.kwargs.path"):
        parse_kwargs(build_train_config([name]).policy.kwargs_with_path(), "pi0")  # no checkpoint given


def test_the_recipes_carry_pi_rls_flow_settings() -> None:
    libero_ppo = build_train_config(["libero_pi0_ppo"])
    kw = libero_ppo.policy.kwargs
    assert (kw["noise_method"], kw["noise_level"], kw["num_steps"], kw["value_after_vlm"]) == ("flow_sde", 0.5, 4, 0)
    assert (libero_ppo.algo.lr, libero_ppo.algo.epochs, libero_ppo.algo.max_grad_norm, libero_ppo.algo.entropy_coeff) == (5e-6, 4, 1.0, 0.0)
    assert (libero_ppo.algo.clip_ratio, libero_ppo.algo.clip_ratio_c, libero_ppo.algo.value_clip) == (0.2, 3.0, 0.2)
    assert libero_ppo.env.num_envs == 64 and kw["cameras"] == ["rgb", "rgb/wrist"]

    libero_grpo = build_train_config(["libero_pi0_grpo"])
    assert (libero_grpo.algo.group_size, libero_grpo.algo.epochs, libero_grpo.algo.max_grad_norm) == (8, 2, 2.0)
    assert libero_grpo.algo.filter_groups and libero_grpo.env.kwargs["task_every"] == libero_grpo.algo.group_size
    assert libero_grpo.env.num_envs == 10 * libero_grpo.algo.group_size  # the suite's 10 tasks

    maniskill_ppo = build_train_config(["maniskill_pi0_ppo"])
    kw = maniskill_ppo.policy.kwargs
    assert (kw["noise_method"], kw["noise_logvar_range"], kw["logprob_level"]) == ("flow_noise", [0.08, 0.16], "token")
    assert (maniskill_ppo.algo.lr, maniskill_ppo.algo.entropy_coeff, maniskill_ppo.algo.bootstrap_terminated) == (7.91e-6, 0.005, True)

    maniskill_grpo = build_train_config(["maniskill_pi0_grpo"])
    assert maniskill_grpo.policy.kwargs["noise_method"] == "flow_noise" and maniskill_grpo.algo.name == "grpo"
    assert maniskill_grpo.env.num_envs % maniskill_grpo.algo.group_size == 0
