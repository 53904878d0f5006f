from __future__ import annotations

import json
import os

import pytest
import torch

from embodied.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from embodied.errors import UserError


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
    return model, opt


def test_round_trip_restores_model_and_optimizer_exactly(tmp_path):
    model, opt = _model_and_optimizer()
    save_checkpoint(tmp_path / "checkpoints", 7, model.state_dict(), opt.state_dict(), {"env_steps": 123, "version": 7})
    tensors, opt_state, state = load_checkpoint(tmp_path)
    assert state["iteration"] == 7 and state["env_steps"] == 123
    model2, opt2 = _model_and_optimizer()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    model2.load_state_dict(tensors)
    opt2.load_state_dict(opt_state)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for idx in s1["state"]:
        for name, v in s1["state"][idx].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(s2["state"][idx][name]))
    # one more identical step from both gives identical weights
    x = torch.randn(5, 3)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.allclose(a, b)


def test_no_pickle_files_and_latest_pointer(tmp_path):
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    for it in (1, 2, 3, 4):
        save_checkpoint(root, it, model.state_dict(), opt.state_dict(), {"env_steps": it}, keep=2)
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_000003", "iter_000004"]
    assert (root / "latest").read_text().strip() == "iter_000004"
    assert find_checkpoint(tmp_path).name == "iter_000004"
    files = {p.suffix for p in root.rglob("*") if p.is_file() and p.name != "latest"}
    assert files <= {".safetensors", ".json"}


def test_interrupted_write_leaves_latest_intact(tmp_path, monkeypatch):
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, model.state_dict(), opt.state_dict(), {"env_steps": 1})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(os, "fsync", killed)  # the first fsync: state.json of iteration 2, before any rename
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(root, 2, model.state_dict(), opt.state_dict(), {"env_steps": 2})
    monkeypatch.undo()
    # the half-written checkpoint is in a temp dir; latest still points at a complete one
    _, _, state = load_checkpoint(tmp_path)
    assert state["iteration"] == 1
    assert not (root / "iter_000002").exists()


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        find_checkpoint(tmp_path / "nope")
    (tmp_path / "run").mkdir()
    with pytest.raises(UserError, match="No checkpoint"):
        find_checkpoint(tmp_path / "run")
