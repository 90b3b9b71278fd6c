"""The SPIRe draft: pruned init, k-pass training == step-by-step inference, losses, and
lossless decoding through the engine."""

import pytest
import torch

from spirelib.decoding.drafts import SpireDraft, spire_draft
from spirelib.decoding.prefill import prefill, speculative_capacity
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ABLATIONS, ModelConfig, SpireConfig, ablation
from spirelib.model.spire import SpireDraftModel, block_positions
from spirelib.model.transformer import Transformer
from spirelib.training.losses import draft_losses, head_draft_losses
from spirelib.training.objectives import SpireObjective

TARGET = ModelConfig(vocab_size=29, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)


def random_target(seed=0, dtype=torch.float32, std=0.02):
    torch.manual_seed(seed)
    model = Transformer(TARGET).to(dtype).eval()
    model.reset_parameters(std)
    return model


def randomized_draft(target, cfg, seed=1):
    """A pruned draft whose weights (and mixing logits) moved away from the target's."""
    torch.manual_seed(seed)
    draft = SpireDraftModel.from_target(target, cfg)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.5 * p.std().clamp(min=0.1) * torch.randn_like(p))
    return draft


def test_pruned_init_copies_the_last_layers_and_stays_independent():
    target = random_target()
    draft = SpireDraftModel.from_target(target, SpireConfig(num_layers=2, k=3))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    for i in range(2):
        for name, p in draft.body.blocks[i].named_parameters():
            assert torch.equal(p, target.blocks[2 + i].get_parameter(name))
    for name in ("embed.weight", "norm.weight", "unembed.weight"):
        assert torch.equal(draft.body.get_parameter(name), target.get_parameter(name))
    opt = torch.optim.SGD(draft.parameters(), lr=1.0)
    tokens = torch.randint(0, TARGET.vocab_size, (2, 13))
    loss, _ = SpireObjective(target)(draft, tokens)
    loss.backward()
    opt.step()
    assert not torch.equal(draft.body.blocks[0].mlp.w_down.weight, target.blocks[2].mlp.w_down.weight)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items()), "training the draft changed the target"
    random_init = SpireDraftModel.from_target(target, ablation("random_init"))
    assert not torch.equal(random_init.body.embed.weight, target.embed.weight)


def test_block_positions_cover_the_sequence_after_position_zero():
    assert block_positions(13, 4).tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    with pytest.raises(ValueError):
        block_positions(4, 4)


@pytest.mark.parametrize("variant", ["spire", "no_feedback"])
@pytest.mark.parametrize("sink,window,k", [(1, 5, 3), (2, 7, 4), (0, 4, 4), (1, 12, 3), (2, 10, 3)])
def test_k_pass_training_equals_step_by_step_inference(variant, sink, window, k):
    """The efficient training computes exactly what inference computes (method §3.6): for every
    block, running the draft step by step on the same tokens, with target memory for the
    context before the block, gives the same logits as the k-pass forward. Windows of at
    least 2k make several blocks share a gathered band (the last chunk partly padding)."""
    target = random_target()
    cfg = ablation(variant, SpireConfig(num_layers=2, sink=sink, window=window))
    draft = randomized_draft(target, cfg)
    B, T = 3, 26
    tokens = torch.randint(0, TARGET.vocab_size, (B, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        layers = target.residual_stream(tokens, layers=draft.memory_layers)  # (n_d, B, T, d_model)
        trained, positions = draft.k_pass_logits(tokens, layers, k)  # (B, n_blocks, k, V)
        for b, block in enumerate(positions.tolist()):
            start = block[0]
            cache = draft.new_cache(B, slack=k + 1)
            context = torch.arange(start).expand(B, start)
            draft.write_target_memory(cache, layers[:, :, :start], context)
            for j, pos in enumerate(block):
                logits = draft.step(tokens[:, pos], torch.full((B,), pos), cache)
                torch.testing.assert_close(logits, trained[:, b, j], atol=2e-5, rtol=1e-4)


def test_window_and_feedback_change_the_prediction():
    """The equivalence test would pass for a draft that ignored its memory; make sure the
    memory matters: mixing weights and distant context both change the logits."""
    target = random_target()
    cfg = SpireConfig(num_layers=2, sink=1, window=4)
    draft = randomized_draft(target, cfg)
    tokens = torch.randint(0, TARGET.vocab_size, (2, 17))
    with torch.no_grad():
        layers = target.residual_stream(tokens, layers=draft.memory_layers)
        base, _ = draft.k_pass_logits(tokens, layers, 4)
        draft.mix.add_(torch.randn_like(draft.mix))
        mixed, _ = draft.k_pass_logits(tokens, layers, 4)
    assert torch.allclose(base[:, :, 0], mixed[:, :, 0]), "the first pass has no feedback memory"
    assert not torch.allclose(base[:, :, 1:], mixed[:, :, 1:])


def test_alpha_gradient_matches_finite_differences():
    """The fused loss's gradient of alpha (MixedLoss(0) = -mean alpha), against central differences."""
    torch.manual_seed(0)
    target_logits = torch.randn(3, 7, dtype=torch.float64)
    labels = torch.zeros(3, dtype=torch.long)
    logits = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    alpha = lambda z: -draft_losses(z, target_logits, labels, 0.0)[0]  # noqa: E731
    alpha(logits).backward()
    eps = 1e-6
    numeric = torch.zeros_like(logits)
    for idx in range(logits.numel()):
        d = torch.zeros(logits.numel(), dtype=torch.float64)
        d[idx] = eps
        d = d.view_as(logits)
        numeric.view(-1)[idx] = (alpha(logits.detach() + d) - alpha(logits.detach() - d)) / (2 * eps)
    torch.testing.assert_close(logits.grad, numeric, atol=1e-6, rtol=1e-5)
    assert logits.grad.abs().sum() > 0


# The plain definitions of method §3.7's losses (p the target's distribution, q the draft's),
# the references of the fused, chunked implementations in spirelib.training.losses.


def hard_target_loss(logits, labels):
    """HardTargetLoss: mean cross-entropy of logits (..., V) with the data's tokens (...)."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def distillation_loss(logits, p):
    """Mean CE(p, q) = -sum_i p_i log q_i over positions."""
    return -(p * torch.log_softmax(logits, -1)).sum(-1).mean()


def expected_acceptance(logits, p):
    """alpha = sum_i min(p_i, q_i) per position: the chance the draft's sample is accepted."""
    return torch.minimum(p, torch.softmax(logits, -1)).sum(-1)


def mixed_loss(logits, p, weight):
    """MixedLoss(w) = w * CE(p, q) - (1 - w) * alpha, averaged over positions."""
    return weight * distillation_loss(logits, p) - (1 - weight) * expected_acceptance(logits, p).mean()


@pytest.mark.parametrize("mix_weight", [0.0, 0.5, 1.0, None])
def test_fused_draft_losses_equal_the_definitions_in_value_and_gradient(mix_weight):
    """`draft_losses` (one chunked pass, gradient computed in forward) against autograd
    through the plain definitions; shapes as in training (B, n_blocks, k, V), several chunks."""
    torch.manual_seed(0)
    logits = torch.randn(2, 60, 4, 300, dtype=torch.float64, requires_grad=True)
    target_logits = 2 * torch.randn(2, 60, 4, 300, dtype=torch.float64)
    labels = torch.randint(0, 300, (2, 60, 4))  # 480 rows: more than one chunk
    p = torch.softmax(target_logits, -1)
    reference = hard_target_loss(logits, labels) if mix_weight is None else mixed_loss(logits, p, mix_weight)
    expected_grad, = torch.autograd.grad(reference, logits)
    loss, parts = draft_losses(logits, target_logits, labels, mix_weight)
    loss.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(logits.grad, expected_grad)
    assert logits.grad.abs().sum() > 0
    torch.testing.assert_close(parts["alpha"], expected_acceptance(logits, p).detach())
    torch.testing.assert_close(parts["distill_ce"].mean(), distillation_loss(logits, p).detach())
    torch.testing.assert_close(parts["hard_ce"].mean(), hard_target_loss(logits, labels).detach())
    assert parts["alpha"].shape == labels.shape and not parts["alpha"].requires_grad
    with pytest.raises(ValueError, match="weight"):
        draft_losses(logits, target_logits, labels, 1.5)


@pytest.mark.parametrize("mix_weight", [0.0, 0.5, 1.0, None])
def test_head_fused_draft_losses_equal_the_definitions_in_value_and_gradients(mix_weight):
    """`head_draft_losses` (final norms outside, both unembeddings fused into the chunked pass)
    against autograd through norm, unembedding and the plain definitions: the loss, the parts
    and the gradients with respect to the draft's hidden states, norm gain and unembedding;
    120 rows in chunks of 7 (the last one partial)."""
    torch.manual_seed(0)
    d, V, eps = 16, 300, 1e-6
    f64 = dict(dtype=torch.float64)
    hidden = torch.randn(2, 15, 4, d, **f64, requires_grad=True)
    gain = (1 + 0.3 * torch.randn(d, **f64)).requires_grad_()
    weight = (0.5 * torch.randn(V, d, **f64)).requires_grad_()
    target_x = torch.nn.functional.rms_norm(torch.randn(2, 15, 4, d, **f64), (d,), 1 + 0.3 * torch.randn(d, **f64), eps)
    target_weight = 0.7 * torch.randn(V, d, **f64)
    labels = torch.randint(0, V, (2, 15, 4))
    draft_x = lambda: torch.nn.functional.rms_norm(hidden, (d,), gain, eps)  # noqa: E731
    logits = draft_x() @ weight.T
    p = torch.softmax(target_x @ target_weight.T, -1)
    reference = hard_target_loss(logits, labels) if mix_weight is None else mixed_loss(logits, p, mix_weight)
    expected = torch.autograd.grad(reference, (hidden, gain, weight))
    loss, parts = head_draft_losses(draft_x(), weight, target_x, target_weight, labels, mix_weight, chunk=7)
    got = torch.autograd.grad(loss, (hidden, gain, weight))
    torch.testing.assert_close(loss, reference)
    for name, g, e in zip(("hidden", "norm gain", "unembedding"), got, expected):
        assert e.abs().sum() > 0
        torch.testing.assert_close(g, e, msg=lambda m, name=name: f"gradient wrt the {name}: {m}")
    torch.testing.assert_close(parts["alpha"], expected_acceptance(logits, p).detach())
    torch.testing.assert_close(parts["distill_ce"].mean(), distillation_loss(logits, p).detach())
    torch.testing.assert_close(parts["hard_ce"].mean(), hard_target_loss(logits, labels).detach())
    assert parts["alpha"].shape == labels.shape and not parts["alpha"].requires_grad


@pytest.mark.parametrize(("vocab", "rows"), [(256, 2048), (4096, 128), (50_304, 128)])
def test_a_cpu_chunk_of_the_draft_losses_holds_2_19_logits_and_at_least_128_rows(vocab, rows, monkeypatch):
    """`losses.CPU_ROWS`: the paper's vocabulary got 64-row chunks before, 1.26x slower; the
    workbook's and the smoke vocabularies keep the chunks they had (bit-identical trainings)."""
    from spirelib.training import losses

    chunks = []
    monkeypatch.setattr(losses._HeadDraftLosses, "apply",
                        lambda *args: chunks.append(args[6]) or (torch.zeros(()), *[torch.zeros(4)] * 3))
    x = torch.randn(4, 8, requires_grad=True)
    head_draft_losses(x, torch.randn(vocab, 8), torch.randn(4, 8), torch.randn(vocab, 8), torch.zeros(4, dtype=torch.long),
                      0.5)
    assert chunks == [rows]


@pytest.mark.parametrize("variant", ["spire", "hard_target", "no_feedback_no_target_acts"])
def test_objective_trains_through_hidden_states_as_through_the_logits(variant):
    """`SpireObjective` (k_pass_hidden, head_draft_losses, no (B, n_blocks, k, V) tensor) gives
    the loss and every parameter's gradient of the logits path (k_pass_logits, draft_losses)."""
    target = random_target(dtype=torch.float64, std=0.3)
    cfg = ablation(variant, SpireConfig(num_layers=2, sink=1, window=6, k=3))
    draft = randomized_draft(target, cfg).double()
    batch = torch.randint(0, TARGET.vocab_size, (2, 17), generator=torch.Generator().manual_seed(3))
    params = [p for p in draft.parameters()]
    loss, metrics = SpireObjective(target)(draft, batch)
    got = torch.autograd.grad(loss, params, allow_unused=True)
    with torch.no_grad():
        layers = target.residual_stream(batch[:, :-1])
    logits, positions = draft.k_pass_logits(batch[:, :-1], layers[list(draft.memory_layers)], cfg.k)
    reference, parts = draft_losses(logits, target.head(layers[-1])[:, positions], batch[:, 1:][:, positions],
                                    None if cfg.loss == "hard" else cfg.mix_weight)
    expected = torch.autograd.grad(reference, params, allow_unused=True)
    torch.testing.assert_close(loss, reference)
    assert metrics["alpha"] == pytest.approx(float(parts["alpha"].mean()))
    for (name, _), g, e in zip(draft.named_parameters(), got, expected):
        assert (g is None) == (e is None), name
        if e is not None:
            torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


def test_the_compiled_objective_gives_the_eager_loss_metrics_and_gradients(monkeypatch):
    """`SpireObjective.compiled()` (the target's forward and the loss's chunk arithmetic compiled,
    what the trainer runs under `TrainConfig.compile`) computes what the eager objective does, up
    to fp32 rounding. The graphs torch.compile captures (dynamo, AOT autograd) run on its
    `aot_eager` backend: inductor's kernels are torch's to test, and would cost this test ~30 s
    of cold compilation on 2 cores (`make run` trains through them)."""
    from spirelib.training import losses

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compile_(fn, backend="aot_eager", **options))
    losses._compiled_chunk_parts.cache_clear()  # compiled anew, on that backend
    try:
        _compare_compiled_objective()
    finally:
        losses._compiled_chunk_parts.cache_clear()  # later callers in this process compile with inductor


def _compare_compiled_objective():
    torch.manual_seed(0)
    target = Transformer(ModelConfig(**{**TARGET.to_dict(), "num_layers": 2})).eval()
    target.reset_parameters(0.3)
    draft = randomized_draft(target, SpireConfig(num_layers=1, sink=1, window=6, k=3))
    batch = torch.randint(0, TARGET.vocab_size, (2, 17), generator=torch.Generator().manual_seed(3))
    params = list(draft.parameters())
    results = []
    for objective in (SpireObjective(target), SpireObjective(target).compiled()):
        loss, metrics = objective(draft, batch)
        results.append((loss, metrics, torch.autograd.grad(loss, params)))
    (loss, metrics, grads), (c_loss, c_metrics, c_grads) = results
    torch.testing.assert_close(c_loss, loss)
    torch.testing.assert_close(c_metrics, metrics)
    for (name, _), g, e in zip(draft.named_parameters(), c_grads, grads):
        torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("variant", sorted(ABLATIONS))
def test_every_ablation_trains_and_decodes_losslessly(variant):
    """Each variant's objective gives finite gradients, and greedy speculative decoding with
    it reproduces greedy autoregressive decoding token for token (ragged rows)."""
    target = random_target(dtype=torch.float64, std=0.3)
    cfg = ablation(variant, SpireConfig(num_layers=2, sink=1, window=6, k=3))
    draft = SpireDraftModel.from_target(target, cfg).double()
    batch = torch.randint(0, TARGET.vocab_size, (2, 14))
    loss, metrics = SpireObjective(target)(draft, batch)
    loss.backward()
    assert torch.isfinite(loss) and {"alpha_1", "alpha_3", "distill_ce", "hard_ce"} <= set(metrics)
    trainable = [p for p in draft.parameters() if p.grad is not None]
    assert trainable and all(torch.isfinite(p.grad).all() for p in trainable)
    if cfg.feedback:
        assert draft.mix.grad.abs().sum() > 0
    contexts = torch.randint(0, TARGET.vocab_size, (4, 12), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([12, 7, 3, 10])
    with torch.no_grad():
        ad = autoregressive_generate(target, contexts, 20, temperature=0.0, lengths=lengths)
        sd = speculative_generate(target, spire_draft(draft.eval(), temperature=0.0), contexts, 20, k=4,
                                  temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)


def test_a_draft_deeper_than_its_target_is_refused():
    with pytest.raises(ValueError, match="exceed"):
        SpireDraftModel(TARGET, SpireConfig(num_layers=5))


def test_spire_draft_trains_the_same_with_gradient_accumulation(tmp_path):
    """The trainer's micro-batches (1 window of 4 per step) give the SPIRe draft the weights and
    logged metrics (loss, alpha per position) of whole-batch steps, to float tolerance."""
    import numpy as np

    from spirelib.training.corpus import FlatDocs
    from spirelib.training.train import Session, TrainConfig, TrainingRun, Validation, train

    target = random_target(std=0.3)
    tokens = np.random.default_rng(0).integers(0, TARGET.vocab_size, 2000)
    docs = FlatDocs(tokens, np.array([0]), np.array([2000]))
    cfg = SpireConfig(num_layers=2, sink=1, window=6, k=3)
    results = {}
    for micro in (0, 1):
        train_cfg = TrainConfig(batch_size=4, seq_len=16, steps=4, lr=1e-2, eval_windows=4, log_every=1,
                                micro_batch_size=micro)
        draft = SpireDraftModel.from_target(target, cfg)
        results[micro] = train(draft, SpireObjective(target), docs, train_cfg,
                               run=TrainingRun(tmp_path / f"micro{micro}", {"spire": cfg.to_dict()}),
                               validation=Validation(docs), session=Session("cpu", progress=False))
    whole, accumulated = results[0], results[1]
    for k, v in whole.model.state_dict().items():
        torch.testing.assert_close(accumulated.model.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert any(not torch.equal(v, target.state_dict()[k.removeprefix("body.")])
               for k, v in whole.model.state_dict().items() if k != "mix")
    for a, w in zip(accumulated.metrics, whole.metrics, strict=True):
        for key in ("loss", "grad_norm", "alpha_1", "alpha_3", "hard_ce", "val_loss"):
            if key in w:
                assert a[key] == pytest.approx(w[key], rel=1e-4), (key, w["step"])


@pytest.mark.parametrize("variant", ["spire", "no_feedback"])
def test_target_memory_is_what_the_pruned_layer_itself_computes_at_the_same_positions(variant):
    """The target-activation path lines up in layer and position, in the engine, round after
    round: with the pruned init (draft layer i = target layer n_t - n_d + i), the keys and
    values the draft stores for every verified position equal those the target's own layer
    n_t - n_d + i stored at that position in its cache. The k-pass == step test above shares
    `target_memory` between both sides, so it would not see a layer or position off by one."""
    target = random_target(dtype=torch.float64, std=0.3)
    cfg = ablation(variant, SpireConfig(num_layers=2, sink=1, window=40, k=3))
    draft = SpireDraft(SpireDraftModel.from_target(target, cfg).double().eval(), temperature=1.0)
    contexts = torch.randint(0, TARGET.vocab_size, (3, 9), generator=torch.Generator().manual_seed(6))
    capacity = speculative_capacity(contexts.shape[1], 12, 3)
    prefilled = prefill(target, contexts, capacity=capacity, layers=draft.target_layers)
    out = speculative_generate(target, draft, contexts, 12, k=3, temperature=1.0, prefilled=prefilled,
                               generator=torch.Generator().manual_seed(7))
    assert out.accepted.shape[1] > 1  # several verification passes wrote memory
    mine, theirs = draft.cache, prefilled.cache
    assert torch.equal(mine.lengths, theirs.lengths)
    first = TARGET.num_layers - cfg.num_layers
    for row in range(contexts.shape[0]):
        slots = ((mine.key_positions[row] >= 0) & (mine.key_positions[row] < mine.lengths[row])).nonzero()[:, 0]
        positions = mine.key_positions[row, slots]
        assert sorted(positions.tolist()) == list(range(int(mine.lengths[row])))  # the window holds them all
        for i in range(cfg.num_layers):
            torch.testing.assert_close(mine.k[i][row][:, slots], theirs.k[first + i][row][:, positions])
            torch.testing.assert_close(mine.v[i][row][:, slots], theirs.v[first + i][row][:, positions])


@pytest.mark.parametrize("seq_len,k,sink,window", [(1023, 4, 1, 64), (37, 3, 2, 8), (20, 4, 1, 64), (100, 1, 0, 5)])
def test_the_regular_blocks_bands_are_the_indexed_ones_where_visible(seq_len, k, sink, window):
    """For blocks k apart (the span given, as `k_pass_hidden` gives it), `BandedMemory.gather` takes
    windows of the zero-padded keys (`unfold`, whose backward adds the windows back) instead of
    indexing (whose backward scatters position by position): every position a query may see holds
    the same key, and the rest (outside the sequence: zeros, not clamped copies) is never seen."""
    from spirelib.model.config import SinkWindow
    from spirelib.model.kpass_attention import BandedMemory

    starts = block_positions(seq_len, k)[:, 0]
    span = (min(max(1, window // k), len(starts)) - 1) * k + window
    regular = BandedMemory(starts, seq_len, k, SinkWindow(sink, window), span)
    measured = BandedMemory(starts, seq_len, k, SinkWindow(sink, window))  # the indexed path
    x = torch.randn(2, 3, seq_len, 5)
    got, expected = regular.gather(x), measured.gather(x)
    assert got.shape == expected.shape and torch.equal(regular.context, measured.context)
    seen = regular.context.any(dim=1)  # (n_chunks, S): visible to some block of the chunk
    assert torch.equal(got[:, :, seen], expected[:, :, seen])


def test_distillation_alone_skips_alphas_gradient_bit_for_bit():
    """MixedLoss(1) (EAGLE-3's loss, the distill-only ablation) returns dz = q - p without computing
    alpha's term, which the general formula multiplies by 0: the same bits."""
    from spirelib.training.losses import _chunk_parts

    gen = torch.Generator().manual_seed(0)
    log_q = torch.log_softmax(3 * torch.randn(16, 50, generator=gen), -1)
    p = torch.softmax(3 * torch.randn(16, 50, generator=gen), -1)
    label = torch.randint(0, 50, (16, 1), generator=gen)
    *parts, dz = _chunk_parts(log_q, p, label, 1.0, True)
    q = log_q.exp()
    below = torch.where(q < p, q, 0.0)
    general = 1.0 * (q - p) - (1.0 - 1.0) * (below - q * below.sum(-1, keepdim=True))
    assert torch.equal(dz, general)
    for part, expected in zip(parts, _chunk_parts(log_q, p, label, 0.5, False)[:3]):
        assert torch.equal(part, expected)
