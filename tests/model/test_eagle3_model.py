"""The EAGLE-3 draft model (`model.eagle3`): its k-step training forward ("training-time test") equals
k inference steps through its own dense cache, entry for entry, with and without a reduced
vocabulary; the reduced vocabulary is the most frequent tokens and maps back to the target's ids
with probability zero elsewhere; the default target layers are EAGLE-3's."""

from __future__ import annotations

import pytest
import torch

from spirelib.model.config import Eagle3Config, ModelConfig
from spirelib.model.eagle3 import Eagle3DraftModel, _dense_tree_attention, _tree_attention, draft_vocabulary
from spirelib.model.transformer import Transformer

CFG = ModelConfig(vocab_size=41, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)


def randomized(model: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Every parameter random (norm gains 1 + noise), so no part of the layer is an identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else std * noise)
    return model


def target_and_draft(draft_vocab=None, seed=0):
    torch.manual_seed(seed)
    target = randomized(Transformer(CFG).double().eval(), seed)
    d2t = None if draft_vocab is None else torch.randperm(CFG.vocab_size)[:draft_vocab].sort().values
    draft = Eagle3DraftModel.from_target(target, Eagle3Config(draft_vocab=draft_vocab), d2t).double().eval()
    return target, randomized(draft, seed + 1)


@pytest.mark.parametrize("draft_vocab", [None, 13], ids=["full-vocab", "reduced-vocab"])
def test_k_unrolled_training_steps_equal_k_inference_steps(draft_vocab):
    """For every entry n of a window: the verified entries 1..n-1 written (`write_verified`), then k
    `step` calls from token n with the target's feature at n - 1, each later one on the teacher-forced
    token and the previous step's output, give the logits and hidden states of `unrolled_hidden`'s
    steps at entry n (fp64; only entries with n + j inside the window)."""
    target, draft = target_and_draft(draft_vocab)
    B, T, k = 2, 12, 4
    tokens = torch.randint(0, CFG.vocab_size, (B, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stream = target.residual_stream(tokens, layers=draft.target_layers)  # (3, B, T, d)
        unrolled = draft.unrolled_hidden(tokens, stream, k)  # (B, k, T - 1, d)
        fused = draft.fuse(stream)  # (B, T, d)
        checked = 0
        for n in range(1, T):
            cache = draft.new_cache(B, T + k)
            positions = torch.arange(1, n).expand(B, -1)
            draft.write_verified(cache, tokens[:, 1:n], fused[:, : n - 1], positions)
            hidden = fused[:, n - 1]
            for j in range(k):
                if n + j > T - 1:
                    break
                logits, hidden = draft.step(tokens[:, n + j], hidden, torch.full((B,), n + j), cache)
                torch.testing.assert_close(hidden, unrolled[:, j, n - 1], rtol=1e-10, atol=1e-12,
                                           msg=f"entry {n}, step {j}")
                torch.testing.assert_close(logits, draft.logits(unrolled[:, j, n - 1]), rtol=1e-10, atol=1e-12)
                checked += 1
    assert checked == sum(min(k, T - n) for n in range(1, T))


def test_unrolled_steps_see_their_own_earlier_keys_and_not_later_entries():
    """The training forward's attention at step j reads step 0's keys of entries <= n and its own
    earlier steps' keys at entry n: changing a token after entry n + j changes nothing there, and
    changing step 1's input at entry n (token n + 1) changes step 2 at entry n."""
    target, draft = target_and_draft()
    tokens = torch.randint(0, CFG.vocab_size, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        stream = target.residual_stream(tokens, layers=draft.target_layers)
        base = draft.unrolled_hidden(tokens, stream, 3)
        later = tokens.clone()
        later[0, 8] = (later[0, 8] + 1) % CFG.vocab_size
        moved = draft.unrolled_hidden(later, stream, 3)
        n = 4  # entry 4: steps read tokens 4, 5, 6; nothing of token 8
        assert torch.equal(base[:, :, n - 1], moved[:, :, n - 1])
        changed = tokens.clone()
        changed[0, n + 1] = (changed[0, n + 1] + 1) % CFG.vocab_size
        moved = draft.unrolled_hidden(changed, stream, 3)
        assert torch.equal(base[:, 0, n - 1], moved[:, 0, n - 1])
        assert not torch.allclose(base[:, 2, n - 1], moved[:, 2, n - 1])


def test_the_reduced_vocabulary_maps_back_with_zero_probability_elsewhere():
    target, draft = target_and_draft(draft_vocab=13)
    out = torch.randn(3, CFG.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = draft.logits(out)  # (3, V)
        assert full.shape == (3, CFG.vocab_size)
        outside = torch.ones(CFG.vocab_size, dtype=torch.bool)
        outside[draft.d2t] = False
        assert torch.isinf(full[:, outside]).all() and (full[:, outside] < 0).all()
        torch.testing.assert_close(full[:, draft.d2t], draft.head(draft.norm(out)))
        assert (torch.softmax(full, -1)[:, outside] == 0).all()


def test_draft_vocabulary_is_the_most_frequent_tokens_sorted():
    tokens = [5, 5, 5, 2, 2, 9, 9, 7, 1]  # counts: 5:3, 2:2, 9:2, 1:1, 7:1
    assert draft_vocabulary(tokens, 3, 12).tolist() == [2, 5, 9]
    assert draft_vocabulary(tokens, 4, 12).tolist() == [1, 2, 5, 9]  # a tie goes to the smaller id
    assert draft_vocabulary(tokens, 7, 12).tolist() == [0, 1, 2, 3, 5, 7, 9]  # filled with the smallest unseen
    with pytest.raises(ValueError):
        draft_vocabulary(tokens, 13, 12)


def test_the_initialization_copies_the_targets_embedding_and_head_rows():
    target, _ = target_and_draft()
    draft = Eagle3DraftModel.from_target(target, Eagle3Config(draft_vocab=13), torch.arange(13) * 3)
    assert torch.equal(draft.embed.weight, target.embed.weight) and not draft.embed.weight.requires_grad
    assert torch.equal(draft.head.weight, target.unembed.weight[torch.arange(13) * 3])
    d = CFG.d_model
    assert draft.fc.weight.shape == (d, 3 * d) and draft.attn.wqkv.weight.shape[1] == 2 * d
    assert draft.trainable_parameters() == sum(p.numel() for n, p in draft.named_parameters() if n != "embed.weight")
    with pytest.raises(ValueError, match="distinct"):
        Eagle3DraftModel(CFG, Eagle3Config(draft_vocab=3), torch.tensor([1, 1, 2]))


@pytest.mark.parametrize("groups,own", [(1, 0), (1, 3), (2, 2)], ids=["step-0", "step-3", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_flash_tree_attention_equals_the_dense_one_with_its_gradients(groups, own, dtype):
    """Training's attention on the CPU (`_tree_attention`: the flash kernel's causal attention, its
    log-sum-exp joined by the own entries' scores; backward through the kernel's with the whole
    output) gives the dense (N, N) form's output and every input's gradient: to fp64 rounding in fp64,
    to 1e-5 in fp32."""
    B, n_kv, N, dh = 2, 2, 37, 8
    gen = torch.Generator().manual_seed(6)

    def rand(heads):
        return torch.randn(B, heads, N, dh, generator=gen, dtype=dtype).requires_grad_()
    q, k0, v0 = rand(groups * n_kv), rand(n_kv), rand(n_kv)
    own_k, own_v = [rand(n_kv) for _ in range(own)], [rand(n_kv) for _ in range(own)]
    grad = torch.randn(B, N, groups * n_kv * dh, generator=gen, dtype=dtype)
    inputs = [q, k0, v0, *own_k, *own_v]
    got, expected = _tree_attention(q, k0, v0, own_k, own_v), _dense_tree_attention(q, k0, v0, own_k, own_v)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got, expected, **tol)
    for g, e in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(g, e, **tol)
