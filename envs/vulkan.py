"""Activate the project's software Vulkan (Mesa lavapipe) for SAPIEN/ManiSkill, in-process.

``scripts/setup_vulkan.sh`` unpacks lavapipe under ``<venv>/vulkan`` on machines without an
NVIDIA GPU. :func:`ensure_vulkan_env` makes SAPIEN use it without anyone sourcing a script:

* ``VK_ICD_FILENAMES`` / ``VK_DRIVER_FILES`` point the Vulkan loader at the patched ICD json,
  whose ``library_path`` is absolute, so the driver itself needs no library search path;
* the driver's own dependencies that the system has in an older version (libdrm from
  backports) are preloaded by absolute path with ``RTLD_GLOBAL``: ``LD_LIBRARY_PATH`` is read by
  the dynamic loader only when a process starts, so setting it now would not reach the
  ``dlopen`` of the driver in this process, but an already-loaded library with the same soname is;
* without a system Vulkan loader, ``SAPIEN_VULKAN_LIBRARY_PATH`` names the unpacked
  ``libvulkan.so.1`` (SAPIEN dlopens the loader from that variable);
* ``LD_LIBRARY_PATH`` is still prepended, for processes started later (they inherit it);
* ``XDG_RUNTIME_DIR`` gets a private writable directory if unset.

Call it before ``import sapien`` / ``import mani_skill``. Variables the user set are kept; with an
NVIDIA GPU, or when the setup is absent, nothing changes.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

_PRELOAD = ("libdrm.so.2", "libdrm_amdgpu.so.1")
_activated: Path | None = None


def vulkan_dir() -> Path | None:
    """The ``vulkan`` folder written by scripts/setup_vulkan.sh, or None.

    Looked up in ``$EMBODIED_VULKAN_DIR``, the running venv (``sys.prefix``), then the repo's
    ``.venv`` next to this package.
    """
    candidates = []
    if os.environ.get("EMBODIED_VULKAN_DIR"):
        candidates.append(Path(os.environ["EMBODIED_VULKAN_DIR"]))
    candidates.append(Path(sys.prefix) / "vulkan")
    candidates.append(Path(__file__).resolve().parent.parent / ".venv" / "vulkan")
    for path in candidates:
        if (path / "lvp_icd.json").is_file():
            return path
    return None


def has_nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version")


def ensure_vulkan_env() -> Path | None:
    """Point this process (and its future children) at the project's lavapipe, if set up.

    Returns the vulkan folder used, or None when nothing was done (NVIDIA GPU, the user's own
    ``VK_ICD_FILENAMES``/``VK_DRIVER_FILES``, or no setup found). Safe to call many times.
    """
    global _activated
    if _activated is not None:
        return _activated
    if sys.platform != "linux" or has_nvidia_gpu():
        return None
    if os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES"):
        user_icd = os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES", "")
        folder = vulkan_dir()
        if folder is None or Path(user_icd) != folder / "lvp_icd.json":
            return None  # the user's own choice of driver
    folder = vulkan_dir()
    if folder is None:
        return None
    icd = folder / "lvp_icd.json"
    libdir = Path(json.loads(icd.read_text())["ICD"]["library_path"]).parent
    os.environ.setdefault("VK_ICD_FILENAMES", str(icd))
    os.environ.setdefault("VK_DRIVER_FILES", str(icd))
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if str(libdir) not in paths:
        os.environ["LD_LIBRARY_PATH"] = ":".join([str(libdir), *paths])
    if not os.environ.get("XDG_RUNTIME_DIR"):
        xdg = folder / "xdg"
        xdg.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(xdg)
    loader = libdir / "libvulkan.so.1"
    if loader.exists():
        os.environ.setdefault("SAPIEN_VULKAN_LIBRARY_PATH", str(loader))
    for name in _PRELOAD:
        lib = libdir / name
        if lib.exists():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    _activated = folder
    return folder
