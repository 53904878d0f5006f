"""Behaviour-cloning warm start: demonstrations as the policy sees them, the clone's NLL through the
policy contract, the cached result, ``policy.init``, and experts from a trained run."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embodied.checkpoint import save_checkpoint
from embodied.config import save_yaml
from embodied.errors import UserError
from envs.adapters.color_reach import expert as reach_expert
from envs.config import EnvConfig
from envs.registry import make_vec_env
from pipelines.cli import build_train_config
from pipelines.config import WarmStartConfig
from pipelines.demonstrations import chunks_of, collect_demonstrations, load_expert
from pipelines.warmstart import behaviour_clone, nll, run_warm_start, split_episodes
from policies.base import INSTRUCTION_KEY
from policies.config import PolicyConfig
from policies.registry import build_policy, load_init

REACH = EnvConfig(id="ColorReach-v0", num_envs=4, obs_mode="state+rgb", image_size=32)


def reach_env(num_envs: int = 4):
    return make_vec_env(dataclasses.replace(REACH, num_envs=num_envs), seed=0)


def tiny_vla(env, value_head: int = 1, chunk: int = 1):
    torch.manual_seed(0)
    cfg = PolicyConfig(name="openvla", action_chunk=chunk, kwargs={"tiny": {}, "value_head": value_head})
    return build_policy(cfg, env.observation_space, env.action_space)


def test_chunks_of_repeats_the_last_action_past_the_end():
    actions = np.arange(6, dtype=np.float32).reshape(3, 2)  # (L=3, A=2)
    assert chunks_of(actions, 1) is actions
    chunked = chunks_of(actions, 2)  # (3, 2, 2)
    assert chunked.tolist() == [[[0, 1], [2, 3]], [[2, 3], [4, 5]], [[4, 5], [4, 5]]]


def test_demonstrations_are_the_experts_actions_on_what_the_policy_sees():
    env = reach_env()
    try:
        demos = collect_demonstrations(env, reach_expert, episodes=10, seed=3, noise=0.5)
    finally:
        env.close()
    assert demos.episodes == 10 and demos.attempted >= 10 and demos.succeeded is not None
    n = len(demos)
    assert demos.obs["rgb"].shape == (n, 32, 32, 3) and demos.obs["state"].shape == (n, 8)
    assert demos.obs[INSTRUCTION_KEY].shape == (n,) and set(demos.obs[INSTRUCTION_KEY]) <= {"move to the red target", "move to the blue target"}
    # the recorded action is the expert's on the recorded frame, though the env executed it with noise
    assert np.allclose(demos.actions, reach_expert({"state": demos.obs["state"]}))
    # frames of one episode are consecutive and its number counts up
    assert (np.diff(demos.episode) >= 0).all() and set(demos.episode) == set(range(10))


def test_only_successful_episodes_are_kept_unless_asked():
    def lazy(obs):
        return np.zeros((len(obs["state"]), 2), np.float32)  # never moves: never succeeds (targets keep their distance)

    env = reach_env()
    try:
        with pytest.raises(UserError, match="successful_only=false"):
            collect_demonstrations(env, lazy, episodes=2, seed=0, max_attempts=4)
        demos = collect_demonstrations(env, lazy, episodes=2, seed=0, successful_only=False)
    finally:
        env.close()
    assert demos.episodes == 2 and (demos.actions == 0).all()


def test_validation_holds_out_whole_episodes():
    env = reach_env()
    try:
        demos = collect_demonstrations(env, reach_expert, episodes=10, seed=0)
    finally:
        env.close()
    train, val = split_episodes(demos, 0.2, seed=0)
    assert len(set(demos.episode[val])) == 2 and not set(demos.episode[val]) & set(demos.episode[train])
    assert len(train) + len(val) == len(demos)
    assert len(split_episodes(demos, 0.0, seed=0)[1]) == 0


def test_the_clone_lowers_the_nll_of_the_demonstrations_through_the_policy_contract():
    env = reach_env()
    try:
        demos = collect_demonstrations(env, reach_expert, episodes=24, seed=1)
        policy = tiny_vla(env)
    finally:
        env.close()
    tokens = policy.encode_actions(torch.as_tensor(demos.actions))
    assert tokens.shape == (len(demos), 1, 2) and tokens.dtype == torch.long
    # the tokens de-tokenize to the demonstrated actions within half a bin ((high - low) / 256 / 2)
    assert np.abs(policy.action_stats.unnormalize(policy.model.action_tokenizer.decode(tokens))[:, 0].numpy() - demos.actions).max() <= 1 / 255 + 1e-6
    cfg = WarmStartConfig(expert="x:y", epochs=6, batch_size=32, lr=1e-3, val_fraction=0.25)
    metrics = behaviour_clone(policy, demos, cfg, seed=0)
    assert metrics["bc/epochs"] == 6 and metrics["bc/stop_reason"] == "epochs"
    assert metrics["bc/val_nll_last"] < metrics["bc/val_nll_first"] - 1.0  # from ~log(256) = 5.5
    # nll is the mean negative log-likelihood per action token, as evaluate() scores it
    obs = {k: (v[:5] if k == INSTRUCTION_KEY else torch.as_tensor(v[:5])) for k, v in demos.obs.items()}
    with torch.no_grad():
        expected = -policy.evaluate(obs, tokens[:5]).logprobs.mean()
        assert float(nll(policy, obs, tokens[:5])) == pytest.approx(float(expected))
    # trained: the actor's tensors, not the value head's (no loss reached it)
    assert "value_head.net.0.weight" not in metrics["bc/trained"] and "model.projector.fc1.weight" in metrics["bc/trained"]


def test_stop_at_success_and_time_budget():
    env = reach_env()
    try:
        demos = collect_demonstrations(env, reach_expert, episodes=4, seed=1)
        policy = tiny_vla(env)
    finally:
        env.close()
    rates = iter([0.1, 0.6, 0.9])
    metrics = behaviour_clone(policy, demos, WarmStartConfig(expert="x:y", epochs=5, stop_at_success=0.5), lambda: next(rates))
    assert (metrics["bc/epochs"], metrics["bc/stop_reason"], metrics["bc/success"]) == (2, "success", 0.6)
    metrics = behaviour_clone(policy, demos, WarmStartConfig(expert="x:y", epochs=5, time_budget_s=1e-9))
    assert (metrics["bc/epochs"], metrics["bc/stop_reason"]) == (1, "time")


def test_run_warm_start_caches_and_its_file_initialises_ppo_and_grpo_policies(tmp_path):
    overrides = ["warmstart.episodes=8", "warmstart.epochs=1", "warmstart.num_envs=4", "env.num_envs=4"]
    cfg = build_train_config(["colorreach_openvla_ppo_tiny", "warmstart.stop_at_success=0", *overrides])
    first = run_warm_start(cfg, root=tmp_path)
    second = run_warm_start(cfg, root=tmp_path)
    assert not first.cached and second.cached and first.path == second.path and first.path.name == "policy.safetensors"
    assert second.metrics == json.loads(json.dumps(first.metrics, default=str))
    other = run_warm_start(build_train_config(["colorreach_openvla_ppo_tiny", "warmstart.stop_at_success=0", *overrides,
                                               "warmstart.lr=3e-4"]), root=tmp_path)
    assert other.path != first.path and len(list(tmp_path.iterdir())) == 2  # no work dirs left behind

    tensors = load_file(str(first.path))
    assert tensors and not any(k.startswith("value_head.") for k in tensors)
    env = reach_env()
    try:
        for value_head in (1, 0):  # PPO keeps its critic's initialisation; GRPO has none
            fresh = tiny_vla(env, value_head=value_head)
            counts = load_init(fresh, first.path)
            assert counts["loaded"] == len(tensors)
            state = fresh.state_dict()
            assert all(torch.equal(state[k], v) for k, v in tensors.items())
    finally:
        env.close()
    # run_dir record of a run
    assert json.loads(second.write_summary(tmp_path).read_text())["path"] == str(first.path)


def test_policy_init_refuses_tensors_that_do_not_fit(tmp_path):
    env = reach_env()
    try:
        policy = tiny_vla(env)
    finally:
        env.close()
    save_file({"no_such.weight": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    with pytest.raises(UserError, match="no_such.weight"):
        load_init(policy, tmp_path / "a.safetensors")
    save_file({"value_head.net.0.weight": torch.zeros(3, 3)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(UserError, match=r"value_head.net.0.weight \(3, 3\)"):
        load_init(policy, tmp_path / "b.safetensors")
    with pytest.raises(UserError, match="does not exist"):
        load_init(policy, tmp_path / "missing.safetensors")


def test_an_expert_from_a_trained_run_acts_greedily_on_the_state(tmp_path):
    cfg = build_train_config(["colorreach_openvla_ppo_tiny", "env.obs_mode=state", "policy.name=mlp",
                              "policy.kwargs={}", "policy.hidden_sizes=[8]", "warmstart.expert=null"])
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, kwargs={}))
    state_space = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (8,), np.float32)})
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    torch.manual_seed(1)
    trained = build_policy(cfg.policy, state_space, action_space)
    save_yaml(cfg, tmp_path / "config.yaml")
    save_checkpoint(tmp_path / "checkpoints", 3, trained.state_dict(), None, {"env_steps": 0, "version": 3})

    env = reach_env()
    try:
        act = load_expert(str(tmp_path), env.observation_space, env.action_space, "ColorReach-v0")
        obs = env.reset(seed=0)
        with torch.no_grad():
            expected = trained.act({"state": torch.as_tensor(obs["state"])}, deterministic=True).actions.numpy()
        assert np.allclose(act({**obs, INSTRUCTION_KEY: np.array(env.instructions)}), expected)
        with pytest.raises(UserError, match="trained on ColorReach-v0"):
            load_expert(str(tmp_path), env.observation_space, env.action_space, "PushCube-v1")
        with pytest.raises(UserError, match="set env.obs_mode=state"):
            load_expert(str(tmp_path), gym.spaces.Dict({"rgb": env.observation_space["rgb"]}), env.action_space, "ColorReach-v0")
    finally:
        env.close()
    with pytest.raises(UserError, match="neither a run dir"):
        load_expert("not_a_thing", state_space, action_space, "ColorReach-v0")
    with pytest.raises(UserError, match="cannot import"):
        load_expert("no.such.module:expert", state_space, action_space, "ColorReach-v0")
