"""The config reference is generated from the code: every key documented, docs/config.md current."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodied.errors import UserError
from pipelines import config_reference as ref
from pipelines.cli import all_recipe_configs, build_train_config, main

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    expected = ref.render_markdown(all_recipe_configs())
    current = (ROOT / "docs" / "config.md").read_text()
    assert current == expected, "docs/config.md is stale: run `embodied config --markdown > docs/config.md`"


def test_every_key_of_every_recipe_is_documented():
    for name, cfg in all_recipe_configs().items():
        undocumented = [k.key for k in ref.all_key_docs(cfg).values() if not k.doc]
        assert undocumented == [], f"{name}: keys without a doc string: {undocumented}"


def test_reference_lists_every_key_and_the_recipes_values():
    configs = all_recipe_configs()
    text = ref.render_markdown(configs)
    for cfg in configs.values():
        for key in ref.all_key_docs(cfg):
            assert f"| `{key}` |" in text
    assert "- `algo.lr` = `0.001`" in text  # cartpole_ppo's learning rate, not the default 3e-4


def test_one_key_shows_value_default_and_doc():
    cfg = build_train_config(["cartpole_ppo", "algo.gamma=0.9"])
    text = ref.format_key("cartpole_ppo", cfg, "algo.gamma")
    assert text.splitlines()[0] == "algo.gamma (float): 0.9 in cartpole_ppo, default 0.99"
    assert "Discount factor per env step" in text
    section = ref.format_key("cartpole_ppo", cfg, "eval")
    assert "eval.episodes (int)" in section and "eval.video (bool)" in section


def test_unknown_key_is_a_user_error_with_a_suggestion():
    cfg = build_train_config(["cartpole_ppo"])
    with pytest.raises(UserError, match="Did you mean 'algo.gamma'"):
        ref.format_key("cartpole_ppo", cfg, "algo.gama")


def test_cli(capsys):
    assert main(["config", "cartpole_ppo", "algo.lr=0.01"]) == 0
    out = capsys.readouterr().out
    assert "algo.lr = 0.01   [float; default 0.0003]" in out and "[algo]" in out
    assert main(["config", "cartpole_ppo", "algo.nope"]) == 2
    assert "Unknown config key 'algo.nope'" in capsys.readouterr().err
