"""Recipes: YAML files of config values bundled in ``pipelines/recipes/``, or any YAML path.

``RECIPES`` maps a recipe name to its file; ``embodied recipes`` lists them with their
``description``. Users add their own by passing a path, or ``RECIPES.add(name, path)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from embodied.config import load_yaml
from embodied.errors import UserError, did_you_mean
from embodied.registry import Registry

RECIPE_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "maniskill_pushcube_ppo"
RECIPES: Registry[Path] = Registry("recipe")

for _path in sorted(RECIPE_DIR.glob("*.yaml")):
    _desc = (yaml.safe_load(_path.read_text()) or {}).get("description", "")
    RECIPES.add(_path.stem, _path, doc=_desc)


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """(recipe name, config dict) of a bundled recipe name or a YAML file path."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        data = load_yaml(path)
        name = path.stem
    elif name_or_path in RECIPES:
        data = load_yaml(RECIPES.get(name_or_path))
        name = name_or_path
    else:
        raise UserError(
            f"Unknown recipe {name_or_path!r}.{did_you_mean(name_or_path, RECIPES.names())} "
            f"Bundled recipes: {', '.join(RECIPES.names())} (see `embodied recipes`), or give a path to a YAML file."
        )
    data.setdefault("recipe", name)
    return name, data
