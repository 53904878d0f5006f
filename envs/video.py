"""Videos of vectorized rollouts: envs tiled into a grid, each tile labelled with its episode's
return and success, written as mp4 (H.264 through imageio-ffmpeg) into a run's ``videos/`` folder.

Two entry points:

* :class:`VideoRecorder` streams frames you already have: call :meth:`VideoRecorder.add` once per
  env step with the (N, H, W, 3) frames (``VecEnv.render()`` or ``obs["rgb"]``) and that step's
  reward / done / success, then :meth:`VideoRecorder.close` to get the mp4's path.
* :func:`record_episodes` runs a policy in a VecEnv until the shown envs finished their episodes
  and records it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import UserError
from envs.base import Array, Obs, StepResult, VecEnv, to_numpy

SUCCESS_COLOR = (80, 230, 80)
TEXT_COLOR = (255, 255, 255)
FAIL_COLOR = (255, 110, 90)


class NoFrames(UserError):
    """The env gives nothing to film: no ``rgb`` observation and ``render()`` returns None."""


def as_uint8_frames(frames: Array) -> np.ndarray:
    """(N, H, W, 3) uint8 from numpy/torch frames, uint8 or float in [0, 1]; (H, W, 3) becomes N=1."""
    arr = np.asarray(to_numpy(frames))
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] not in (3, 4):
        raise ValueError(f"frames must be (N, H, W, 3), got shape {arr.shape}")
    arr = arr[..., :3]
    if arr.dtype != np.uint8:
        arr = np.clip(np.rint(arr.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    return arr


def tile_frames(frames: np.ndarray, num_cols: int | None = None) -> np.ndarray:
    """(N, H, W, 3) -> one (rows * H, cols * W, 3) image, row-major, black where no env."""
    n, h, w, _ = frames.shape
    cols = num_cols or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = np.zeros((rows * h, cols * w, 3), np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = frames[i]
    return grid


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def draw_text(frame: np.ndarray, lines: list[tuple[str, tuple[int, int, int]]], font_size: int) -> np.ndarray:
    """``frame`` with ``(text, rgb)`` lines in its top-left corner, on a dark box for contrast."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(frame)
    draw = ImageDraw.Draw(image, "RGBA")
    font = _font(font_size)
    pad = max(1, font_size // 4)
    y = pad
    for text, color in lines:
        left, top, right, bottom = draw.textbbox((pad, y), text, font=font)
        draw.rectangle((left - pad, top - pad, right + pad, bottom + pad), fill=(0, 0, 0, 160))
        draw.text((pad, y), text, fill=color, font=font)
        y = bottom + 2 * pad
    return np.asarray(image)


class VideoRecorder:
    """Writes ``<video_dir>/<name>.mp4`` from per-step frames of up to ``max_envs`` envs.

    video_dir:     folder of the video (created), e.g. ``runs/<run>/videos``.
    name:          file name without ``.mp4``.
    fps:           frames per second of the video.
    max_envs:      the first ``max_envs`` envs of the batch are shown.
    num_cols:      grid columns (default: a square-ish grid).
    overlay:       draw each env's running return and success on its tile.
    min_tile_size: tiles smaller than this many pixels are upscaled by an integer factor
                   (nearest neighbour) so the overlay text stays readable.
    """

    def __init__(
        self,
        video_dir: str | Path,
        name: str = "rollout",
        fps: int = 20,
        max_envs: int = 16,
        num_cols: int | None = None,
        overlay: bool = True,
        min_tile_size: int = 128,
    ) -> None:
        self.path = Path(video_dir) / f"{name}.mp4"
        self.fps = fps
        self.max_envs = max_envs
        self.num_cols = num_cols
        self.overlay = overlay
        self.min_tile_size = min_tile_size
        self.num_frames = 0
        self.frame_shape: tuple[int, int, int] | None = None
        self._writer: Any = None
        self._returns: np.ndarray | None = None  # (n,) running return of the current episode
        self._success: np.ndarray | None = None  # (n,) success seen in the current episode
        self._episode: np.ndarray | None = None  # (n,) episode counter per env

    def add(
        self,
        frames: Array,
        reward: Array | None = None,
        done: Array | None = None,
        success: Array | None = None,
    ) -> None:
        """Append one video frame made of ``frames`` (N, H, W, 3) of one env step.

        ``reward`` (N,) is added to each env's running return, ``success`` (N,) marks the episode
        successful, and ``done`` (N,) shows the finished episode's totals on this frame and starts
        counting the next episode from the next call.
        """
        shown = as_uint8_frames(frames)[: self.max_envs]
        n = shown.shape[0]
        if self._returns is None:
            self._returns = np.zeros(n, np.float64)
            self._success = np.zeros(n, bool)
            self._episode = np.zeros(n, np.int64)
        assert self._success is not None and self._episode is not None
        if reward is not None:
            self._returns += to_numpy(reward)[:n].astype(np.float64)
        if success is not None:
            self._success |= to_numpy(success)[:n].astype(bool)
        ended = np.zeros(n, bool) if done is None else to_numpy(done)[:n].astype(bool)
        self._write(self._render(shown, ended))
        self._returns[ended] = 0.0
        self._success[ended] = False
        self._episode[ended] += 1

    def add_step(self, frames: Array, result: StepResult) -> None:
        """:meth:`add` with the reward, done and success of a :class:`StepResult`."""
        done = to_numpy(result.terminated).astype(bool) | to_numpy(result.truncated).astype(bool)
        self.add(frames, result.reward, done, result.info.get("success"))

    def _render(self, frames: np.ndarray, ended: np.ndarray) -> np.ndarray:
        h, w = frames.shape[1:3]
        scale = max(1, math.ceil(self.min_tile_size / max(1, min(h, w))))
        if scale > 1:
            frames = frames.repeat(scale, axis=1).repeat(scale, axis=2)
        if self.overlay:
            assert self._returns is not None and self._success is not None and self._episode is not None
            font_size = int(np.clip(frames.shape[2] // 10, 10, 24))
            labelled = []
            for i, frame in enumerate(frames):
                lines = [(f"env {i} ep {self._episode[i]}", TEXT_COLOR), (f"return {self._returns[i]:.2f}", TEXT_COLOR)]
                if self._success[i]:
                    lines.append(("success", SUCCESS_COLOR))
                elif ended[i]:
                    lines.append(("failed", FAIL_COLOR))
                labelled.append(draw_text(frame, lines, font_size))
            frames = np.stack(labelled)
        grid = tile_frames(frames, self.num_cols)
        # H.264 in yuv420p needs even sides
        return np.pad(grid, ((0, grid.shape[0] % 2), (0, grid.shape[1] % 2), (0, 0)))

    def _write(self, image: np.ndarray) -> None:
        if self._writer is None:
            import imageio.v2 as imageio

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.frame_shape = image.shape
            self._writer = imageio.get_writer(
                self.path, fps=self.fps, codec="libx264", quality=8, pixelformat="yuv420p", macro_block_size=1
            )
        elif image.shape != self.frame_shape:
            raise ValueError(f"frame of shape {image.shape} after frames of {self.frame_shape}; keep N, H, W fixed")
        self._writer.append_data(image)
        self.num_frames += 1

    def close(self) -> Path:
        """Finish the file; returns its path (no file when no frame was added)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path

    def __enter__(self) -> VideoRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Finish the file; a recording that raised leaves no (partial) file."""
        self.close()
        if exc_type is not None:
            self.path.unlink(missing_ok=True)


def frames_of(env: VecEnv, obs: Obs) -> np.ndarray:
    """The frames to record for ``obs``: ``obs["rgb"]`` when present, else ``env.render()``."""
    if "rgb" in obs:
        return as_uint8_frames(obs["rgb"])
    frames = env.render()
    if frames is None:
        raise NoFrames(
            "Cannot record a video: the env has no 'rgb' observation and render() returned nothing. "
            "Use env.obs_mode=rgb (or state+rgb), or an env that renders (robosuite/LIBERO: env.kwargs.render=true)."
        )
    return as_uint8_frames(frames)


def record_episodes(
    env: VecEnv,
    policy: Callable[[Obs], Array],
    video_dir: str | Path,
    name: str = "episodes",
    num_episodes: int = 1,
    max_steps: int = 1000,
    seed: int | None = None,
    fps: int = 20,
    max_envs: int = 16,
    num_cols: int | None = None,
) -> Path:
    """Roll ``policy`` out in ``env`` from a reset and write ``<video_dir>/<name>.mp4``.

    policy:       obs -> actions (N, A), or a chunk (N, C, A) that is applied step by step (one
                  frame per env step).
    num_episodes: stop once each shown env finished this many episodes (or after ``max_steps``).
    Frames come from ``obs["rgb"]`` or ``env.render()``; at the step an episode ends the tile
    shows its last frame (``final_obs["rgb"]`` when the env provides it) with the final return.
    Returns the video's path. When it raises (:class:`NoFrames` from an env without a renderer,
    or the env's own error from ``render()``) no partial file is left.
    """
    shown = min(max_envs, env.num_envs)
    finished = np.zeros(shown, np.int64)
    obs = env.reset(seed=seed)
    with VideoRecorder(video_dir, name, fps=fps, max_envs=max_envs, num_cols=num_cols) as recorder:
        recorder.add(frames_of(env, obs))
        steps = 0
        while steps < max_steps and (finished < num_episodes).any():
            actions = policy(obs)
            chunk = actions if len(tuple(actions.shape)) == 2 + len(env.action_space.shape or ()) else actions[:, None]
            for j in range(chunk.shape[1]):
                result = env.step(chunk[:, j])
                obs = result.obs
                frames = frames_of(env, obs)
                done = to_numpy(result.terminated).astype(bool) | to_numpy(result.truncated).astype(bool)
                if done.any() and result.final_obs is not None and "rgb" in result.final_obs:
                    final = as_uint8_frames(result.final_obs["rgb"])
                    frames = np.where(done[:, None, None, None], final, frames)
                recorder.add_step(frames, result)
                finished += done[:shown]
                steps += 1
                if steps >= max_steps or (finished >= num_episodes).all():
                    break
    return recorder.path
