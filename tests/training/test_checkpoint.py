"""Checkpoints: exact round trip, integrity and identity checks, atomic swap, no pickle."""

import json
import re
from pathlib import Path

import pytest
import torch

from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.training.checkpoint import CheckpointError, checkpoint_path, load_checkpoint, read_meta, save_checkpoint

CFG = ModelConfig(vocab_size=50, num_layers=2, d_model=16, n_q_per_kv=2, n_kv=1, d_head=8, d_ff=24)
IDENTITY = {"model": CFG.to_dict(), "train": {"lr": 0.001, "steps": 10}, "data": "abc"}


def trained_pair(seed=0):
    torch.manual_seed(seed)
    model = Transformer(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        loss = model(torch.randint(0, 50, (2, 5))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def test_round_trip_restores_weights_optimizer_and_rng_exactly(tmp_path):
    model, opt = trained_pair()
    torch.manual_seed(123)
    save_checkpoint(tmp_path / "ck", model, IDENTITY, step=2, finished=False, optimizer=opt, summary={"x": 1.5})
    expected_draw = torch.rand(3)
    model2, opt2 = trained_pair(seed=1)
    meta = load_checkpoint(tmp_path / "ck", model2, IDENTITY, optimizer=opt2, restore_rng=True)
    assert meta["step"] == 2 and meta["summary"] == {"x": 1.5} and not meta["finished"]
    assert torch.equal(torch.rand(3), expected_draw)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])


def test_mismatched_identity_is_refused_naming_the_fields(tmp_path):
    model, _ = trained_pair()
    save_checkpoint(tmp_path / "ck", model, IDENTITY, step=10, finished=True)
    other = {**IDENTITY, "train": {"lr": 0.002, "steps": 10}}
    with pytest.raises(CheckpointError, match=r"train\.lr: 0\.001 \(checkpoint\) != 0\.002 \(requested\)") as e:
        load_checkpoint(tmp_path / "ck", model, other)
    assert "delete" in str(e.value) and "steps" not in str(e.value)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "meta"])
def test_corrupt_checkpoint_is_refused_with_what_to_do(tmp_path, damage):
    model, opt = trained_pair()
    path = tmp_path / "ck"
    save_checkpoint(path, model, IDENTITY, step=1, finished=False, optimizer=opt)
    weights = path / "model.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "remove":
        (path / "optimizer.safetensors").unlink()
    else:
        (path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=f"corrupt.*delete {re.escape(str(path))}"):
        read_meta(path)


def test_files_are_hashed_in_chunks_and_an_older_checkpoints_one_digest_a_file_still_verifies(tmp_path, monkeypatch):
    """Each `DIGEST_CHUNK` bytes of a file has its digest (the ranks of a sharded run hash and verify
    theirs in parallel): a flipped byte is found in its chunk; a checkpoint written before (one sha256
    a file) verifies as it did."""
    from spirelib.training import checkpoint

    monkeypatch.setattr(checkpoint, "DIGEST_CHUNK", 256)
    model, opt = trained_pair()
    path = tmp_path / "ck"
    save_checkpoint(path, model, IDENTITY, step=1, finished=False, optimizer=opt)
    meta = read_meta(path)
    weights = path / "model.safetensors"
    entry = meta["files"]["model.safetensors"]
    assert entry["size"] == weights.stat().st_size and len(entry["sha256"]) == -(-entry["size"] // 256) > 4
    assert meta["format"] == checkpoint.FORMAT == 2
    older = {**meta, "format": 1, "files": {name: checkpoint._sha256(path / name) for name in meta["files"]}}
    (path / "meta.json").write_text(json.dumps(older))
    assert read_meta(path)["step"] == 1
    data = bytearray(weights.read_bytes())
    data[3 * 256 + 7] ^= 0xFF  # the fourth chunk
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors is missing or fails its sha256"):
        read_meta(path)
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.safetensors is missing or fails its sha256"):
        read_meta(path)
    assert read_meta(path, verify=False)["step"] == 1


@pytest.mark.parametrize("found", [3, None])
def test_a_checkpoint_of_a_format_this_code_does_not_read_is_refused_saying_what_to_do(tmp_path, found):
    """A newer format (a later spire-workbook wrote it) is refused with the advice to update the
    checkout; a missing one, as any unreadable checkpoint, with the advice to delete it."""
    model, _ = trained_pair()
    path = tmp_path / "ck"
    save_checkpoint(path, model, IDENTITY, step=1, finished=True)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": found}))
    with pytest.raises(CheckpointError, match=f"has format {found}, this code reads formats \\[1, 2\\]") as e:
        read_meta(path)
    assert ("update this checkout" in str(e.value)) == (found == 3)
    assert f"delete {path}" in str(e.value)


def test_interrupted_swap_falls_back_to_the_previous_checkpoint(tmp_path):
    model, _ = trained_pair()
    path = tmp_path / "ck"
    save_checkpoint(path, model, IDENTITY, step=1, finished=False)
    save_checkpoint(path, model, IDENTITY, step=2, finished=False)
    assert read_meta(checkpoint_path(path))["step"] == 2
    path.rename(tmp_path / "ck.old")  # crash between "move current away" and "move new in"
    assert checkpoint_path(path) == tmp_path / "ck.old"
    assert checkpoint_path(tmp_path / "nothing") is None


def test_no_pickle_anywhere_in_the_library():
    root = Path(__file__).resolve().parents[2] / "spirelib"
    for f in root.rglob("*.py"):
        text = f.read_text()
        assert not re.search(r"torch\.(save|load)\(|import pickle|allow_pickle=True", text), f
