"""OpenVLA's action bin math and BOUNDS_Q99 statistics, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.errors import UserError
from policies.vla.actions import ActionTokenizer, BoundsQ99, select_stats


def test_tokens_match_openvla_bin_math_by_hand() -> None:
    tokenizer = ActionTokenizer(vocab_size=32000)
    assert tokenizer.first_id == 31744
    # bins = linspace(-1, 1, 256): digitize(-1) = 1 -> 31999; digitize(1) = 256 -> 31744;
    # 0 lies in [bins[127], bins[128]) = [-1/255, 1/255) -> digitize 128 -> 31872.
    actions = torch.tensor([-1.0, 1.0, 0.0, -5.0, 5.0, -1.0 + 2.0 / 255], dtype=torch.float64)
    assert tokenizer.encode(actions).tolist() == [31999, 31744, 31872, 31999, 31744, 31998]
    # decode: center[clip(32000 - id - 1, 0, 254)], center[i] = -1 + (2 i + 1) / 255
    centers = tokenizer.decode(torch.tensor([31999, 31872, 31745, 31744, 100, 32010]))
    expected = [-1 + 1 / 255, -1 + 255 / 255, -1 + 509 / 255, -1 + 509 / 255, -1 + 509 / 255, -1 + 1 / 255]
    torch.testing.assert_close(centers, torch.tensor(expected, dtype=torch.float64))


def test_tokens_equal_numpy_digitize_and_ids_follow_the_vocabulary() -> None:
    values = np.random.default_rng(0).uniform(-1.2, 1.2, size=2000)
    bins = np.linspace(-1, 1, 256)
    for vocab in (32000, 512):  # the tiny models' text vocabulary
        tokenizer = ActionTokenizer(vocab_size=vocab)
        expected = vocab - np.digitize(np.clip(values, -1, 1), bins)
        assert tokenizer.encode(torch.from_numpy(values)).tolist() == expected.tolist()
        assert tokenizer.first_id == vocab - 256


def test_round_trip_within_half_a_bin() -> None:
    tokenizer = ActionTokenizer(vocab_size=512)
    actions = torch.rand(5000, dtype=torch.float64) * 2 - 1
    tokens = tokenizer.encode(actions)
    assert ((tokens >= 256) & (tokens < 512)).all()
    error = (tokenizer.decode(tokens) - actions).abs()
    assert error.max() <= 1 / 255 + 1e-12  # half of the bin width 2 / 255
    # bins <-> token ids
    assert tokenizer.to_bin(torch.tensor([256, 511])).tolist() == [0, 255]
    assert tokenizer.from_bin(torch.tensor([0, 255])).tolist() == [256, 511]


def test_bounds_q99_by_hand() -> None:
    stats = BoundsQ99([-1.0, 0.0, 2.0], [1.0, 4.0, 6.0], mask=[True, True, False])
    normalized = torch.tensor([[-1.0, 0.0, 0.5], [1.0, 0.5, -0.3]])
    # 0.5 (a + 1)(q99 - q01) + q01 where masked; the last dimension passes through
    expected = torch.tensor([[-1.0, 2.0, 0.5], [1.0, 3.0, -0.3]], dtype=torch.float64)
    torch.testing.assert_close(stats.unnormalize(normalized), expected)
    raw = torch.tensor([[0.0, 1.0, 7.0], [9.0, -3.0, 1.0]])
    torch.testing.assert_close(
        stats.normalize(raw), torch.tensor([[0.0, -0.5, 7.0], [1.0, -1.0, 1.0]], dtype=torch.float64), atol=1e-7, rtol=0
    )
    # OFT's proprio normalization clips every dimension, the unmasked one too
    torch.testing.assert_close(
        stats.normalize_proprio(raw), torch.tensor([[0.0, -0.5, 1.0], [1.0, -1.0, 1.0]], dtype=torch.float64), atol=1e-7, rtol=0
    )
    oft = BoundsQ99([0.0], [1.0], eps=1e-8)  # OFT adds 1e-8 to the range
    assert oft.unnormalize(torch.tensor([1.0])).item() == pytest.approx(1.0 + 1e-8, abs=1e-15)


def test_select_stats() -> None:
    one = {"bridge_orig": {"action": {"q01": [0.0], "q99": [1.0]}}}
    assert select_stats(one, None)[0] == "bridge_orig"
    two = {**one, "fractal": {"action": {"q01": [0.0], "q99": [1.0]}}}
    with pytest.raises(UserError, match="set policy.kwargs.unnorm_key"):
        select_stats(two, None)
    with pytest.raises(UserError, match="Did you mean 'bridge_orig'"):
        select_stats(two, "bridge_orig2")
    with pytest.raises(UserError, match="no dataset statistics"):
        select_stats({}, None)
