"""Episodes into ManiSkill's trajectory format (``.h5`` + ``.json``), for envs that are not ManiSkill's.

    writer = TrajectoryWriter("demos/x.h5", camera="corner")
    writer.add(frames, actions, rewards, terminated, truncated, success, {"episode_seed": 3, ...})
    writer.close()
    writer.write_json({"env_info": {...}, "source_type": "scripted", ...})      # demos/x.json

It writes what ManiSkill's ``RecordEpisode`` writes, so that ManiSkill's readers
(``ManiSkillTrajectoryDataset``) and :func:`pipelines.demos.load_demos` read both alike:

* ``traj_<i>`` groups (i = 0, 1, ... in the order of :meth:`TrajectoryWriter.add`) with ``obs``: one
  (T+1, D) float32 array when the frames hold ``state`` alone, otherwise a group with ``state``
  (T+1, D) and ``sensor_data/<camera>/rgb`` (T+1, H, W, 3) uint8, gzip level 5 as ManiSkill
  compresses frames (the contract's ``rgb`` is ``camera``'s, ``rgb/<name>`` camera ``name``'s);
  ``actions`` (T, A) float32; ``terminated``, ``truncated``, ``success`` (T,) bool; ``rewards`` (T,) float32;
* the JSON: the caller's entries, with ``episodes`` (``episode_id``, ``elapsed_steps`` and the
  caller's fields of each episode) added.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: ManiSkill's compression of camera frames (``RecordEpisode``: gzip beats png on frame sequences).
FRAME_COMPRESSION = {"compression": "gzip", "compression_opts": 5}


class TrajectoryWriter:
    """An open ``.h5`` file that episodes are added to; :meth:`write_json` writes the ``.json`` beside it."""

    def __init__(self, path: str | Path, camera: str) -> None:
        import h5py

        self.path = Path(path)
        self.camera = camera
        self.episodes: list[dict[str, Any]] = []
        self._h5 = h5py.File(self.path, "w")

    def add(
        self,
        frames: list[dict[str, np.ndarray]],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        success: np.ndarray,
        episode: dict[str, Any],
    ) -> None:
        """One episode: ``frames`` its T+1 observations (the reset's first), ``actions`` (T, A),
        the per-step ``rewards``, ``terminated``, ``truncated``, ``success`` (T,); ``episode`` the
        JSON fields of its entry (``episode_id`` and ``elapsed_steps`` are added)."""
        steps = len(actions)
        if len(frames) != steps + 1:
            raise ValueError(f"TrajectoryWriter.add: {len(frames)} frames for {steps} actions; expected {steps + 1} (the reset's first)")
        episode_id = len(self.episodes)
        group = self._h5.create_group(f"traj_{episode_id}", track_order=True)
        stacked = {key: np.stack([f[key] for f in frames]) for key in frames[0]}
        if set(stacked) == {"state"}:
            group.create_dataset("obs", data=stacked["state"].astype(np.float32))
        else:
            obs = group.create_group("obs", track_order=True)
            if "state" in stacked:
                obs.create_dataset("state", data=stacked["state"].astype(np.float32))
            for key, value in stacked.items():
                if key == "rgb" or key.startswith("rgb/"):
                    camera = self.camera if key == "rgb" else key.split("/", 1)[1]
                    sensors = obs.require_group("sensor_data")
                    sensors.create_group(camera).create_dataset("rgb", data=value.astype(np.uint8), **FRAME_COMPRESSION)
        group.create_dataset("actions", data=np.asarray(actions, np.float32))
        group.create_dataset("terminated", data=np.asarray(terminated, bool))
        group.create_dataset("truncated", data=np.asarray(truncated, bool))
        group.create_dataset("success", data=np.asarray(success, bool))
        group.create_dataset("rewards", data=np.asarray(rewards, np.float32))
        self.episodes.append({"episode_id": episode_id, **episode, "elapsed_steps": steps})

    def close(self) -> None:
        """Close the ``.h5`` (again: nothing)."""
        self._h5.close()

    def write_json(self, meta: dict[str, Any]) -> None:
        """Write ``meta`` with the ``episodes`` added to the ``.json`` beside the ``.h5``."""
        data = {**meta, "episodes": self.episodes}
        self.path.with_suffix(".json").write_text(json.dumps(data, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
