"""The run directory: created only after every check passed; never overwrites another run; one
trainer at a time.

A run holds an exclusive ``flock`` on ``<run_dir>/.lock`` for as long as it lives (the file also
names its pid, host and start time). The kernel drops the lock when the process ends, however it
ends, so a crashed run never leaves its dir locked; a second ``embodied train`` into the same dir,
or a ``resume=`` of a run that is still training, is refused with a :class:`UserError` naming the
holder. (On NFS, ``flock`` works across machines where the server supports NFSv4 locks.)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.checkpoint import list_checkpoints
from embodied.config import save_yaml
from embodied.errors import UserError, resume_command, storage_error

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"


class RunDirLock:
    """An exclusive lock on a run dir (see the module docstring). ``release`` (or the end of the
    process) frees it."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self._fd = fd

    @classmethod
    def acquire(cls, run_dir: str | Path) -> RunDirLock:
        """Lock ``run_dir`` (which must exist) or raise a UserError naming the process holding it."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise storage_error("Creating the run dir's lock file", path, err) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise storage_error("Locking the run dir", path, err) from err
            raise UserError(f"Run dir {str(run_dir)!r} is in use by {_describe(cls.holder(run_dir))}. Wait for that "
                            "run to finish (or stop it), or choose another run.dir.") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(info) + "\n").encode())
        except OSError as err:
            os.close(fd)
            raise storage_error("Writing the run dir's lock file", path, err) from err
        return cls(run_dir, fd)

    @classmethod
    def ensure_free(cls, run_dir: str | Path) -> None:
        """Raise the UserError of :meth:`acquire` when another process holds ``run_dir``'s lock;
        writes nothing (for a check that does not take the lock)."""
        run_dir = Path(run_dir)
        try:
            fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
        except OSError:
            return  # no lock file: no holder
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"Run dir {str(run_dir)!r} is in use by {_describe(cls.holder(run_dir))}. Wait for that "
                                "run to finish (or stop it), or choose another run.dir.") from None
        finally:
            os.close(fd)

    @staticmethod
    def holder(run_dir: str | Path) -> dict[str, Any] | None:
        """What the lock file says about its holder (pid, host, started), or None if unreadable.
        Says nothing about whether the lock is held: a free lock keeps its last holder's info."""
        try:
            info = json.loads((Path(run_dir) / LOCK_FILE).read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def _describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (it has not written its pid yet)"
    return f"pid {info.get('pid')} on host {info.get('host')} (started {info.get('started')})"


@dataclass
class RunDir:
    path: Path
    lock: RunDirLock | None = field(default=None, repr=False)

    @classmethod
    def create(cls, cfg, resume: bool = False) -> RunDir:
        """Create (or, on resume, reopen) the run dir of ``cfg``, lock it and save the resolved
        config. Every check comes first: a path that is a file, an existing run (without resume),
        a dir that is not a run (with resume), a run still training: UserError, nothing written."""
        if cfg.run.dir:
            path = Path(cfg.run.dir)
        else:
            path = Path("runs") / f"{cfg.recipe or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        for p in (path, *path.parents):
            if p.exists() and not p.is_dir():
                what = "run.dir" if p == path else f"run.dir's parent {str(p)!r}"
                raise UserError(f"{what} {str(p)!r} is a file, not a directory: choose another run.dir.")
        if resume:
            if not (path / CONFIG_FILE).is_file():
                raise UserError(f"resume={str(path)!r} is not a run dir (no config.yaml in it).")
            lock = RunDirLock.acquire(path)
        else:
            if path.exists() and any(p.name != LOCK_FILE for p in path.iterdir()):
                raise UserError(
                    f"Run dir {str(path)!r} already exists and is not empty. Continue it with "
                    f"`{resume_command(path)}` (a run with no checkpoint yet starts again from its beginning), "
                    "or choose another run.dir."
                )
            try:
                path.mkdir(parents=True, exist_ok=True)
            except PermissionError:
                raise UserError(f"Cannot create run dir {str(path)!r}: permission denied. Choose another run.dir.") from None
            except OSError as err:
                raise storage_error("Creating the run dir", path, err) from err
            lock = RunDirLock.acquire(path)
            if any(p.name != LOCK_FILE for p in path.iterdir()):  # another run got here first
                lock.release()
                raise UserError(f"Run dir {str(path)!r} was just created by another run; choose another run.dir.")
        try:
            _save_config(cfg, path / CONFIG_FILE)
        except BaseException:
            lock.release()
            raise
        return cls(path, lock)

    def close(self) -> None:
        """Release the run dir's lock (also released when the process ends)."""
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` saved a checkpoint (intact or not): without one, ``resume=``
    starts it again from its beginning."""
    root = Path(run_dir) / "checkpoints"
    return (root / "latest").is_file() or bool(list_checkpoints(root))


def _save_config(cfg: Any, path: Path) -> None:
    """Write the resolved config atomically (a resume replaces the old one only when complete)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_yaml(cfg, tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise storage_error("Writing config.yaml", path, err) from err
