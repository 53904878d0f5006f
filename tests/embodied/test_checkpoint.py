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


# --- reliability: validation, fallback, retention, full disk, compatibility ------------------------

import json as _json  # noqa: E402
import textwrap  # noqa: E402

from embodied.checkpoint import (  # noqa: E402
    CheckpointMismatch,
    CorruptCheckpointError,
    check_compatible,
    checkpoint_problems,
    incompatibilities,
    latest_checkpoint,
    list_checkpoints,
    safetensors_specs,
)
from embodied.errors import exit_code_of  # noqa: E402
from tests.embodied.small_disk import run_on_small_disk  # noqa: E402


def _three_checkpoints(tmp_path, keep=5):
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    for it in (2, 4, 6):
        save_checkpoint(root, it, model.state_dict(), opt.state_dict(), {"env_steps": it * 10}, keep=keep)
    return root


def _truncate(path, keep_bytes):
    data = path.read_bytes()
    path.write_bytes(data[:keep_bytes])


def test_intact_checkpoint_lists_its_files_with_sizes(tmp_path):
    root = _three_checkpoints(tmp_path)
    ckpt = root / "iter_000006"
    state = _json.loads((ckpt / "state.json").read_text())
    assert state["files"] == {
        "model.safetensors": (ckpt / "model.safetensors").stat().st_size,
        "optimizer.safetensors": (ckpt / "optimizer.safetensors").stat().st_size,
    }
    assert checkpoint_problems(ckpt) == []
    specs = safetensors_specs(ckpt / "model.safetensors")
    assert {k: (s.dtype, s.shape) for k, s in specs.items()} == {
        "0.weight": ("F32", (4, 3)), "0.bias": ("F32", (4,)), "2.weight": ("F32", (2, 4)), "2.bias": ("F32", (2,)),
    }
    _, _, loaded = load_checkpoint(tmp_path)
    assert "files" not in loaded and loaded["iteration"] == 6


def test_truncated_latest_is_reported_with_the_intact_previous_one(tmp_path, caplog):
    root = _three_checkpoints(tmp_path)
    model_file = root / "iter_000006" / "model.safetensors"
    _truncate(model_file, model_file.stat().st_size - 10)
    with pytest.raises(CorruptCheckpointError) as info:
        find_checkpoint(tmp_path)
    err = info.value
    assert exit_code_of(err) == 4 and err.fallback == root / "iter_000004"
    msg = str(err)
    assert f"The latest checkpoint {root / 'iter_000006'} is corrupt" in msg
    assert "model.safetensors is" in msg and "state.json says" in msg
    assert f"The newest intact one is {root / 'iter_000004'} (iteration 4)" in msg and "resume_fallback=true" in msg
    with caplog.at_level("WARNING", logger="embodied.checkpoint"):
        assert find_checkpoint(tmp_path, fallback=True) == root / "iter_000004"
    assert f"Using the newest intact one, {root / 'iter_000004'}." in caplog.text
    _, _, state = load_checkpoint(tmp_path, fallback=True)
    assert state["iteration"] == 4 and state["env_steps"] == 40
    assert latest_checkpoint(tmp_path) == root / "iter_000004"


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("state_garbage", "state.json does not parse"),
        ("state_missing", "state.json is missing"),
        ("header_garbage", "header"),
        ("optimizer_missing", "optimizer.safetensors is missing"),
        ("padded", "longer than its tensors"),
        ("latest_names_missing_dir", "it does not exist"),
    ],
)
def test_every_kind_of_damage_is_detected_and_falls_back(tmp_path, damage, problem):
    root = _three_checkpoints(tmp_path)
    ckpt = root / "iter_000006"
    if damage == "state_garbage":
        (ckpt / "state.json").write_text('{"iteration": 6, "env_')
    elif damage == "state_missing":
        (ckpt / "state.json").unlink()
    elif damage == "header_garbage":
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        data[8:20] = b"\xff" * 12
        (ckpt / "model.safetensors").write_bytes(bytes(data))
    elif damage == "optimizer_missing":
        (ckpt / "optimizer.safetensors").unlink()
    elif damage == "padded":
        state = _json.loads((ckpt / "state.json").read_text())
        with open(ckpt / "model.safetensors", "ab") as f:
            f.write(b"\0" * 16)
        state["files"]["model.safetensors"] += 16  # sizes agree; the header check still sees it
        (ckpt / "state.json").write_text(_json.dumps(state))
    elif damage == "latest_names_missing_dir":
        (root / "latest").write_text("iter_000008\n")
    with pytest.raises(CorruptCheckpointError, match=problem):
        find_checkpoint(tmp_path)
    assert find_checkpoint(tmp_path, fallback=True) == root / ("iter_000006" if damage == "latest_names_missing_dir" else "iter_000004")


def test_a_corrupt_checkpoint_named_explicitly_is_never_replaced(tmp_path):
    root = _three_checkpoints(tmp_path)
    _truncate(root / "iter_000004" / "optimizer.safetensors", 5)
    with pytest.raises(CorruptCheckpointError, match="iter_000004 is corrupt"):
        find_checkpoint(root / "iter_000004", fallback=True)


def test_no_intact_checkpoint_says_start_again(tmp_path):
    root = _three_checkpoints(tmp_path)
    for ckpt in list_checkpoints(root):
        (ckpt / "state.json").unlink()
    with pytest.raises(CorruptCheckpointError, match="No earlier checkpoint is intact"):
        find_checkpoint(tmp_path, fallback=True)
    assert latest_checkpoint(tmp_path) is None


def test_keep_last_k_and_keep_must_be_positive(tmp_path):
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    for it in range(1, 6):
        save_checkpoint(root, it, model.state_dict(), None, {}, keep=1)
        assert [p.name for p in list_checkpoints(root)] == [f"iter_{it:06d}"]
    with pytest.raises(UserError, match="keep_checkpoints must be >= 1"):
        save_checkpoint(root, 6, model.state_dict(), None, {}, keep=0)
    assert [p.name for p in list_checkpoints(root)] == ["iter_000005"]


def test_stale_temporary_dirs_are_removed_on_the_next_save(tmp_path):
    model, _ = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, model.state_dict(), None, {})
    (root / ".tmp-iter_000002").mkdir()
    (root / ".tmp-iter_000002" / "model.safetensors").write_bytes(b"half")
    (root / ".latest.tmp").write_text("iter_0000")
    save_checkpoint(root, 2, model.state_dict(), None, {})
    assert sorted(p.name for p in root.iterdir()) == ["iter_000001", "iter_000002", "latest"]


def test_saving_after_a_fallback_removes_the_abandoned_later_checkpoints(tmp_path):
    root = _three_checkpoints(tmp_path)
    _truncate(root / "iter_000006" / "model.safetensors", 100)
    resumed = find_checkpoint(tmp_path, fallback=True)
    model, opt = _model_and_optimizer()
    save_checkpoint(root, 5, model.state_dict(), opt.state_dict(), {}, keep=5)
    assert resumed.name == "iter_000004"
    assert [p.name for p in list_checkpoints(root)] == ["iter_000002", "iter_000004", "iter_000005"]
    assert find_checkpoint(tmp_path).name == "iter_000005"


def test_full_disk_keeps_the_previous_checkpoint_and_latest():
    """A real full file system (tmpfs; else a file size limit): the failed save removes its
    temporary dir, raises StorageError naming the path and the free space; the previous
    checkpoint and latest stay intact and loadable; the next save works once space is back."""
    script = textwrap.dedent("""
        import json, sys, torch
        from pathlib import Path
        from embodied.checkpoint import save_checkpoint, load_checkpoint, checkpoint_problems
        from embodied.errors import StorageError, exit_code_of
        root = Path(sys.argv[1]) / "checkpoints"
        small = {"w": torch.arange(1000, dtype=torch.float32)}
        save_checkpoint(root, 1, small, None, {"env_steps": 1})
        out = {}
        try:
            save_checkpoint(root, 2, {"w": torch.zeros(400_000)}, None, {"env_steps": 2})  # 1.6 MB
        except StorageError as err:
            out["error"], out["code"], out["path"], out["free"] = str(err), exit_code_of(err), str(err.path), err.free_bytes
        out["entries"] = sorted(p.name for p in root.iterdir())
        out["latest"] = (root / "latest").read_text().strip()
        out["problems"] = checkpoint_problems(root / "iter_000001")
        model, _, state = load_checkpoint(root.parent)
        out["loaded"] = [state["iteration"], bool(torch.equal(model["w"], small["w"]))]
        save_checkpoint(root, 3, small, None, {"env_steps": 3}, keep=1)
        out["after"] = sorted(p.name for p in root.iterdir())
        print(json.dumps(out))
    """)
    result, how = run_on_small_disk(script, size_kib=512)
    assert result.returncode == 0, result.stderr
    out = _json.loads(result.stdout.strip().splitlines()[-1])
    assert out["code"] == 4
    assert out["path"].endswith("checkpoints/iter_000002")
    assert out["error"].startswith(f"Saving checkpoint iter_000002 failed at {out['path']}: ")
    assert "free on its file system" in out["error"] and out["free"] is not None
    if how == "ENOSPC":
        assert "No space left on device" in out["error"] and "Free some space" in out["error"]
    assert out["entries"] == ["iter_000001", "latest"]  # no .tmp-iter_000002 left behind
    assert out["latest"] == "iter_000001" and out["problems"] == [] and out["loaded"] == [1, True]
    assert out["after"] == ["iter_000003", "latest"]


def test_compatibility_names_every_difference(tmp_path):
    model, _ = _model_and_optimizer()
    save_checkpoint(tmp_path / "checkpoints", 1, model.state_dict(), None, {})
    ckpt = find_checkpoint(tmp_path)
    assert incompatibilities(model.state_dict(), ckpt) == []
    check_compatible(model.state_dict(), ckpt)  # fits: no error
    wider = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    other = {**wider.state_dict(), "3.weight": torch.zeros(1)}
    other["2.bias"] = other["2.bias"].double()
    del other["0.bias"]
    assert incompatibilities(other, ckpt) == [
        "'0.bias' (F32 (4,)) is in the checkpoint but not in the model",
        "'0.weight' has shape (4, 3) in the checkpoint, (8, 3) in the model",
        "'2.bias' has dtype F32 in the checkpoint, F64 in the model",
        "'2.weight' has shape (2, 4) in the checkpoint, (2, 8) in the model",
        "'3.weight' (F32 (1,)) is missing from the checkpoint",
    ]
    with pytest.raises(CheckpointMismatch) as info:
        check_compatible(other, ckpt, where=f"checkpoint {ckpt}")
    assert exit_code_of(info.value) == 2 and len(info.value.differences) == 5
    assert str(info.value).startswith(f"checkpoint {ckpt} does not fit the model built from this config (5 differences): ")
    # the loaded tensors work as well as the dir
    assert incompatibilities(other, load_checkpoint(ckpt)[0]) == incompatibilities(other, ckpt)

