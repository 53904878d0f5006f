"""The run directory: created only after the config is valid; never overwrites another run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from embodied.config import save_yaml
from embodied.errors import UserError


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, cfg, resume: bool = False) -> RunDir:
        """Create (or, on resume, reopen) the run dir of ``cfg`` and save the resolved config."""
        if cfg.run.dir:
            path = Path(cfg.run.dir)
        else:
            path = Path("runs") / f"{cfg.recipe or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        if resume:
            if not (path / "config.yaml").is_file():
                raise UserError(f"resume={str(path)!r} is not a run dir (no config.yaml in it).")
        elif path.exists() and any(path.iterdir()):
            raise UserError(
                f"Run dir {str(path)!r} already exists and is not empty. Continue it with "
                f"resume={path}, or choose another run.dir."
            )
        path.mkdir(parents=True, exist_ok=True)
        save_yaml(cfg, path / "config.yaml")
        return cls(path)
