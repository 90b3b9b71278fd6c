"""EAGLE-3's objective (`training.eagle3`): its loss is the mean over the k steps of the forward-KL
distillation (as cross-entropy) of step j at entry p against the target's distribution at position
p + j, over the draft vocabulary when reduced (checked against logits computed by hand); through
the unchanged trainer the loss falls, and a run stopped and resumed ends bit for bit where an
uninterrupted one does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spirelib.model.config import Eagle3Config, ModelConfig
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.transformer import Transformer
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.eagle3 import Eagle3Objective, new_eagle3_draft
from spirelib.training.train import Session, TrainingRun, Validation, train

V = 32
CFG = ModelConfig(vocab_size=V, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)


def pattern_docs(n_tokens=3000, seed=0):
    """A learnable stream, mostly t -> (3t + 1) mod V, with random restarts (test_train's)."""
    rng = np.random.default_rng(seed)
    t = np.empty(n_tokens, np.int64)
    t[0] = 0
    for i in range(1, n_tokens):
        t[i] = rng.integers(V) if rng.random() < 0.1 else (3 * t[i - 1] + 1) % V
    return FlatDocs(t, np.array([0]), np.array([n_tokens]))


DOCS, VAL = pattern_docs(), pattern_docs(800, seed=1)


def bigram_target() -> Transformer:
    """A frozen target that knows the pattern: its unembedding reads the next token of t off the
    embedding of t (blocks near identity), so its distributions are sharp and learnable."""
    torch.manual_seed(0)
    target = Transformer(CFG)
    with torch.no_grad():
        target.reset_parameters(0.02)
        target.embed.weight.copy_(torch.eye(V, CFG.d_model) * 4)
        nxt = (3 * torch.arange(V) + 1) % V
        target.unembed.weight.zero_()
        target.unembed.weight[nxt, :V] = torch.eye(V) * 3
    return target.eval().requires_grad_(False)


@pytest.mark.parametrize("draft_vocab", [None, 12], ids=["full-vocab", "reduced-vocab"])
def test_the_loss_is_stepwise_distillation_against_the_target_at_p_plus_j(draft_vocab):
    target = bigram_target()
    torch.manual_seed(1)
    model = new_eagle3_draft(target, Eagle3Config(draft_vocab=draft_vocab, k=3), DOCS.tokens).double()
    target = target.double()
    batch = torch.from_numpy(DOCS.tokens[:4 * 13].reshape(4, 13))  # (B, T + 1), T = 12
    loss, metrics = Eagle3Objective(target)(model, batch)
    inputs, T = batch[:, :-1], 12
    with torch.no_grad():
        target_logits = target(inputs)  # (B, T, V): position t predicts token t + 1
        hidden = model.unrolled_hidden(inputs, target.residual_stream(inputs, layers=model.target_layers), 3)
    steps, alphas = [], []
    for j in range(3):
        z = model.head(model.norm(hidden[:, j, : T - 1 - j]))  # entries 1 .. T - 1 - j
        p_logits = target_logits[:, 1 + j :]  # positions 1 + j .. T - 1
        if draft_vocab:
            p_logits = p_logits[..., model.d2t]
        p, log_q = torch.softmax(p_logits, -1), torch.log_softmax(z, -1)
        steps.append(-(p * log_q).sum(-1).mean())
        alphas.append(torch.minimum(p, log_q.exp()).sum(-1).mean())
    torch.testing.assert_close(loss, torch.stack(steps).mean(), rtol=1e-9, atol=1e-12)
    for j in range(3):
        torch.testing.assert_close(metrics[f"alpha_{j + 1}"], alphas[j], rtol=1e-9, atol=1e-12)
    loss.backward()
    assert model.fc.weight.grad is not None and model.fc.weight.grad.abs().sum() > 0
    assert model.embed.weight.grad is None, "the embedding is frozen"


def run(tmp_path, cfg, name="run", draft_vocab=12, stop_at=None):
    target = bigram_target()
    torch.manual_seed(cfg.seed)
    model = new_eagle3_draft(target, Eagle3Config(draft_vocab=draft_vocab, k=3), DOCS.tokens)
    identity = {"kind": "eagle3-draft", "draft_vocab": draft_vocab}
    return train(model, Eagle3Objective(target), DOCS, cfg, run=TrainingRun(tmp_path / name, identity),
                 validation=Validation(VAL), session=Session("cpu", progress=False, stop_at=stop_at))


SMALL = TrainConfig(batch_size=4, seq_len=16, steps=24, lr=1e-2, warmup_fraction=0.1, eval_every=12, eval_windows=8,
                    checkpoint_every=8, log_every=4)


def test_the_trainer_trains_it_and_resumes_it_bit_for_bit(tmp_path):
    full = run(tmp_path, SMALL, "full")
    train_losses = [e["loss"] for e in full.metrics if e["kind"] == "train"]
    vals = [e for e in full.metrics if e["kind"] == "val"]
    assert train_losses[-1] < 0.7 * train_losses[0], train_losses
    assert vals[-1]["alpha"] > vals[0]["alpha"] and "alpha_3" in vals[-1]
    stopped = run(tmp_path, SMALL, "stopped", stop_at=12)
    assert not stopped.reused
    resumed = run(tmp_path, SMALL, "stopped")
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert torch.equal(resumed.model.d2t, full.model.d2t)


def test_the_token_budget_counts_the_trainable_parameters_only():
    target = bigram_target()
    model = new_eagle3_draft(target, Eagle3Config(draft_vocab=12), DOCS.tokens)
    n = model.trainable_parameters()
    d = CFG.d_model
    assert n == sum(p.numel() for p in model.parameters()) - V * d  # all but the embedding
    assert n == 3 * d * d + 2 * d * (4 + 2 * 2) * 8 + 4 * 8 * d + 3 * d * 48 + 4 * d + 12 * d
    assert TrainConfig(batch_size=4, seq_len=16, tokens_per_param=20).total_steps(n) == -(-20 * n // 64)
    with pytest.raises(ValueError, match="train_tokens"):
        new_eagle3_draft(target, Eagle3Config(draft_vocab=12))
    assert isinstance(model, Eagle3DraftModel) and model.d2t.shape == (12,)


def test_training_through_the_flash_tree_attention_matches_the_dense_one(tmp_path, monkeypatch):
    """The CPU trainer's attention (`model.eagle3._tree_attention`: the flash kernel) against the dense
    (N, N) form it replaced, through the same 24 steps: every logged loss and the validation metrics
    agree to 1e-5 relative (fp32 rounding; measured 1e-7-1e-6), the weights to 1e-4."""
    from spirelib.model import eagle3

    flash = run(tmp_path, SMALL, "flash")
    monkeypatch.setattr(eagle3, "_tree_attention", eagle3._dense_tree_attention)
    dense = run(tmp_path, SMALL, "dense")
    assert len(flash.metrics) == len(dense.metrics)
    for a, b in zip(flash.metrics, dense.metrics):
        for key in ("loss", "val_loss", "alpha"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5), (key, a["step"])
    for k, v in dense.model.state_dict().items():
        torch.testing.assert_close(flash.model.state_dict()[k], v, rtol=1e-4, atol=1e-6, msg=k)
