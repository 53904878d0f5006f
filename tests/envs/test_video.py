"""Videos: real mp4 files read back with imageio; the overlay must be visible in the pixels."""

from __future__ import annotations

import functools
import os

import imageio.v2 as imageio
import numpy as np
import pytest

from embodied.errors import UserError
from envs.config import EnvConfig
from envs.serial import SerialVecEnv
from envs.video import VideoRecorder, frames_of, record_episodes, tile_frames

os.environ.setdefault("MUJOCO_GL", "egl")


def read_video(path) -> np.ndarray:
    reader = imageio.get_reader(path)
    try:
        return np.stack([frame for frame in reader])
    finally:
        reader.close()


def gradient_frames(n: int, size: int) -> np.ndarray:
    """(n, size, size, 3): a smooth, mid-gray gradient (compresses well, so text stands out)."""
    ramp = np.linspace(90, 150, size, dtype=np.float32)
    frame = np.stack([np.add.outer(ramp, ramp) / 2] * 3, axis=-1).astype(np.uint8)
    return np.stack([frame] * n)


def test_tile_frames_row_major_grid():
    frames = np.stack([np.full((2, 3, 3), i, np.uint8) for i in range(5)])
    grid = tile_frames(frames, num_cols=3)
    assert grid.shape == (4, 9, 3)
    assert grid[0, 0, 0] == 0 and grid[0, 3, 0] == 1 and grid[0, 6, 0] == 2 and grid[2, 0, 0] == 3 and grid[2, 3, 0] == 4
    assert (grid[2:, 6:] == 0).all()  # the empty cell


def test_recorder_writes_an_mp4_with_the_right_frames_and_visible_overlay(tmp_path):
    steps, n, size = 12, 4, 40  # 40 px tiles are upscaled x4 to 160 px
    frames = gradient_frames(n, size)
    reward = np.array([1.0, 0.5, -0.25, 0.0])
    success = np.array([True, False, False, False])
    with VideoRecorder(tmp_path / "videos", "with_text", fps=10) as rec:
        for t in range(steps):
            rec.add(frames, reward=reward, done=np.full(n, t == steps - 1), success=success)
    with VideoRecorder(tmp_path / "videos", "plain", fps=10, overlay=False) as plain:
        for _ in range(steps):
            plain.add(frames)
    video, base = read_video(rec.path), read_video(plain.path)
    assert rec.path == tmp_path / "videos" / "with_text.mp4" and rec.path.stat().st_size > 0
    assert video.shape == (steps, 320, 320, 3) == base.shape  # 2x2 grid of 160 px tiles
    assert rec.num_frames == steps
    diff = np.abs(video.astype(np.int16) - base.astype(np.int16)).mean(axis=-1)  # (T, H, W)
    text_region = diff[:, 0:40, 0:100]  # top-left corner of env 0's tile
    empty_region = diff[:, 100:160, 100:160]  # lower-right of the same tile: no text
    assert text_region.mean() > 10 * max(empty_region.mean(), 0.5)
    # env 0 succeeded: green "success" text in its tile, none in env 1's tile
    last = video[-1].astype(np.int16)

    def green(tile):
        return ((tile[..., 1] > 170) & (tile[..., 0] < 140) & (tile[..., 2] < 140)).sum()

    assert green(last[:80, :160]) > 20 and green(last[:80, 160:]) == 0
    imageio.imwrite(tmp_path / "frame.png", video[-1])  # for a look by eye when debugging


def test_recorder_rejects_a_change_of_frame_size(tmp_path):
    rec = VideoRecorder(tmp_path, "bad")
    rec.add(gradient_frames(2, 32))
    with pytest.raises(ValueError, match="keep N, H, W fixed"):
        rec.add(gradient_frames(2, 48))
    rec.close()


def _pendulum_env(num_envs: int, size: int = 64) -> SerialVecEnv:
    import gymnasium as gym

    fn = functools.partial(gym.make, "InvertedPendulum-v5", render_mode="rgb_array", width=size, height=size)
    return SerialVecEnv([fn] * num_envs)


def test_record_episodes_on_a_rendering_env(tmp_path):
    pytest.importorskip("mujoco")
    env = _pendulum_env(3)
    rng = np.random.default_rng(0)
    try:
        path = record_episodes(
            env,
            lambda obs: rng.uniform(-3, 3, (3, 2, 1)).astype(np.float32),  # action chunks (N, C, A)
            tmp_path / "videos",
            name="pendulum",
            num_episodes=1,
            max_steps=200,
            seed=0,
            fps=30,
        )
    finally:
        env.close()
    video = read_video(path)
    assert path.name == "pendulum.mp4"
    assert video.shape[1:] == (256, 256, 3)  # 3 envs in a 2x2 grid of 128 px tiles (64 px upscaled)
    assert 2 <= video.shape[0] <= 201  # the reset frame + one per env step
    assert video[:, :, 128:].std() > 1  # rendered pixels, not an empty grid


def test_frames_of_needs_rgb_or_render():
    from envs.registry import make_vec_env

    env = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=2))
    obs = env.reset(seed=0)
    with pytest.raises(UserError, match="obs_mode=rgb"):
        frames_of(env, obs)
    frames = frames_of(env, {"rgb": np.zeros((2, 8, 8, 3), np.float32)})
    assert frames.dtype == np.uint8 and frames.shape == (2, 8, 8, 3)
    env.close()
