"""A fresh ``EMBODIED_CACHE`` for the runs of one test process: profiles and warm starts are
measured afresh, as on a new machine, and the directory is removed when the process exits."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def fresh_cache(prefix: str = "embodied-cache-") -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path
