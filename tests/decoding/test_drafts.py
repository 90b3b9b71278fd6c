"""What the drafts do inside the decoding engine: every round's proposals equal a
fresh draft's over the accepted prefix, SPIRe's k-pass training equals its inference through
the engine for every ablation, ragged (right-padded) rows decode as if alone, pruned
initialization copies what it should, the feedback mixture is its definition, and the
temperature scales logits as softmax(logits / T).

Models are small, float64 and far from uniform (weights of std 0.5, norm gains 1 + noise),
and every draft disagrees with the target often, so acceptance is ragged: some rounds
accept nothing, some everything.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from spirelib.decoding.drafts import MagicDecDraft, VanillaDraft, spire_draft
from spirelib.decoding.prefill import prefill, speculative_capacity
from spirelib.decoding.sampling import probabilities
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ABLATIONS, ModelConfig, SpireConfig, ablation
from spirelib.model.kvcache import DenseKVCache
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget

CFG = ModelConfig(vocab_size=23, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
SMALL = ModelConfig(vocab_size=23, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)


def randomize(model: torch.nn.Module, seed: int, std: float = 0.5) -> torch.nn.Module:
    """Every tensor random: matrices N(0, std), norm gains 1 + N(0, 0.3), mixing logits N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * noise)
            elif name == "mix":
                p.copy_(noise)
            else:
                p.copy_(std * noise)
    return model


def random_target(seed: int = 0, cfg: ModelConfig = CFG, std: float = 0.3) -> Transformer:
    return randomize(Transformer(cfg).double().eval(), seed, std)


def perturbed(model: Transformer, scale: float, seed: int) -> Transformer:
    """A copy of `model` with every tensor moved by `scale` times its own spread."""
    gen = torch.Generator().manual_seed(seed)
    copy = Transformer(model.cfg).double().eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return copy


def spire_model(target: Transformer, variant: str = "spire", seed: int = 1, scale: float = 0.1,
                **cfg) -> SpireDraftModel:
    """A pruned SPIRe draft of `target` (config `cfg` over a base, then the ablation `variant`),
    every tensor moved away from the target's by `scale`, and non-uniform feedback mixtures."""
    base = SpireConfig(**{"num_layers": 2, "sink": 1, "window": 5, "k": 4, **cfg})
    draft = SpireDraftModel.from_target(target, ablation(variant, base)).to(next(target.parameters()).dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.add_((1.0 if name == "mix" else scale * float(p.std().clamp(min=0.1)))
                   * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return draft.double().eval()


def residual_stream(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """The target's residual stream (n_layers + 1, B, T, d_model) over tokens (B, T) at
    positions 0..T-1: the embedding, then each block's output (causal attention)."""
    B, T = tokens.shape
    rope = model.rope(torch.arange(T).expand(B, T))
    x = model.embed(tokens)
    layers = [x]
    for block in model.blocks:
        x = block(x, rope, None)
        layers.append(x)
    return torch.stack(layers)


def test_the_hand_built_residual_stream_is_the_models():
    target = random_target()
    tokens = torch.randint(0, CFG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        stream = residual_stream(target, tokens)
        assert stream.shape == (CFG.num_layers + 1, 2, 9, CFG.d_model)
        torch.testing.assert_close(stream, target.residual_stream(tokens), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(target.head(stream[-1]), target(tokens), rtol=1e-12, atol=1e-12)


def assert_rows_as_if_alone(run, contexts: torch.Tensor, lengths: torch.Tensor) -> None:
    """Each row of `run(contexts, lengths)` (a generation) emits and accepts what it does decoded
    alone, unpadded: ragged rows share a batch without seeing each other."""
    batch = run(contexts, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = run(contexts[b : b + 1, :n], None)
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"row {b}"
        assert torch.equal(batch.accepted[b][batch.accepted[b] >= 0], alone.accepted[0]), f"row {b}"


def contexts_and_lengths(B: int, L: int, seed: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded contexts (B, L); the padding is random tokens, so it cannot pass for real."""
    contexts = torch.randint(0, CFG.vocab_size, (B, L), generator=torch.Generator().manual_seed(seed))
    return contexts, torch.tensor(lengths)


# ------------------------------------------------------------------ what a draft proposes in the engine


class Recorder:
    """A Draft that records every round's propose() inputs (its uniforms too) and outputs."""

    def __init__(self, draft):
        self.draft = draft
        self.target_layers, self.key = draft.target_layers, draft.key
        self.rounds: list[dict] = []

    def begin(self, verified, k):
        self.draft.begin(verified, k)

    def static_tensors(self):
        return self.draft.static_tensors()

    def propose(self, pending, positions, k, u):
        tokens, q = self.draft.propose(pending, positions, k, u)
        self.rounds.append({"u": None if u is None else u.clone(), "pending": pending.clone(),
                            "positions": positions.clone(), "tokens": tokens.clone(), "q": q.clone()})
        return tokens, q

    def accept(self, verified):
        self.draft.accept(verified)


def accepted_prefixes(contexts, lengths, rounds, accepted) -> list[list[list[int]]]:
    """Per round, per row, the text the engine had accepted when the round began (context,
    emitted tokens, the pending token last), rebuilt from the recorded proposals, the accept
    counts and the next round's pending tokens."""
    seqs = [contexts[b, : lengths[b]].tolist() for b in range(contexts.shape[0])]
    out = [[list(s) for s in seqs]]
    for r in range(1, len(rounds)):
        prev = rounds[r - 1]
        for b, seq in enumerate(seqs):
            a = int(accepted[b, r - 1])
            if a >= 0:  # active in round r - 1: its accepted drafts, then the token the target emitted
                seq += prev["tokens"][b, :a].tolist() + [int(rounds[r]["pending"][b])]
        out.append([list(s) for s in seqs])
    return out


def check_rounds_against_fresh_drafts(target, make_draft, contexts, lengths, G, k, temperature, seed=0):
    """Decode with a recorded draft, then replay every round on a fresh draft built from scratch
    over the accepted prefix (fresh target prefill, begin, propose) with the round's uniforms:
    proposals must be identical and q equal. Returns the engine's accept counts."""
    gen = torch.Generator().manual_seed(seed)
    rec = Recorder(make_draft())
    out = speculative_generate(target, rec, contexts, G, k=k, temperature=temperature, lengths=lengths, generator=gen)
    # the rounds counted, and at most one more: the stop check reads whether rows are active a round late
    assert out.accepted.shape[1] <= len(rec.rounds) <= out.accepted.shape[1] + 1
    prefixes = accepted_prefixes(contexts, lengths, rec.rounds, out.accepted)
    for b in range(contexts.shape[0]):  # the rebuilt text is what the engine emitted
        emitted = prefixes[-1][b][int(lengths[b]):][:G]
        assert emitted == out.tokens[b, : len(emitted)].tolist()
    filler = torch.Generator().manual_seed(99)
    for r, (rnd, rows) in enumerate(zip(rec.rounds, prefixes)):
        n = torch.tensor([len(s) for s in rows])
        assert torch.equal(rnd["positions"], n - 1), f"round {r}: the pending token sits after the accepted text"
        padded = torch.randint(0, CFG.vocab_size, (len(rows), int(n.max())), generator=filler)
        for b, s in enumerate(rows):
            padded[b, : len(s)] = torch.tensor(s)
        with torch.no_grad():
            fresh = make_draft()
            pf = prefill(target, padded, n, capacity=speculative_capacity(int(n.max()), G, k),
                         layers=fresh.target_layers)
            assert torch.equal(pf.pending, rnd["pending"])
            fresh.begin(pf.verified, k)
            tokens, q = fresh.propose(pf.pending, n - 1, k, rnd["u"])
        assert torch.equal(tokens, rnd["tokens"]), f"round {r}: proposals differ from a fresh draft's"
        torch.testing.assert_close(q, rnd["q"], rtol=1e-9, atol=1e-12, msg=f"round {r}: q differs from a fresh draft's")
    return out.accepted


def draft_makers(target):
    spire = spire_model(target, num_layers=3, window=6, scale=0.05)
    no_feedback = spire_model(target, "no_feedback", num_layers=3, window=6, scale=0.02)
    plain = spire_model(target, "no_feedback_no_target_acts", num_layers=3, window=6, scale=0.05)
    near = perturbed(target, 0.1, seed=4)
    return {
        # the vanilla draft re-runs the token before the pending one (after an all-accepted round it never ran)
        "vanilla": lambda T: VanillaDraft(near, temperature=T),
        # MagicDec: its ring of window + slack slots wraps several times over these contexts
        "magicdec": lambda T: MagicDecDraft(target, KVBudget(1, 4), rope_mode="cache", temperature=T),
        "magicdec-original": lambda T: MagicDecDraft(target, KVBudget(2, 3), rope_mode="original", temperature=T),
        # SPIRe: target memory is written after every verification, feedback memory in between
        "spire": lambda T: spire_draft(spire, temperature=T),
        "spire-no-feedback": lambda T: spire_draft(no_feedback, temperature=T),
        # an ordinary pruned transformer over its own sparse cache (the vanilla draft's code path)
        "spire-no-target-acts": lambda T: spire_draft(plain, temperature=T),
    }


@pytest.mark.parametrize("name", ["vanilla", "magicdec", "magicdec-original", "spire", "spire-no-feedback",
                                  "spire-no-target-acts"])
@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_every_round_proposes_what_a_fresh_draft_over_the_accepted_prefix_proposes(name, temperature):
    """A draft's incremental state (caches rolled back per row, the vanilla draft's previous
    token, MagicDec's ring, SPIRe's target and feedback memory) holds exactly what a draft
    built from scratch over the accepted text holds: its proposals and q are the same, round
    by round, with ragged acceptance and ragged, right-padded contexts."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 11, 1, [11, 6, 9, 3])
    make = draft_makers(target)[name]
    k = 4
    accepted = check_rounds_against_fresh_drafts(target, lambda: make(temperature), contexts, lengths, 24, k,
                                                 temperature, seed=7)  # a stream with ragged acceptance for all
    counts = accepted[accepted >= 0]
    assert (counts == 0).any() and (counts == k).any() and ((counts > 0) & (counts < k)).any(), \
        f"the test needs ragged acceptance, got {sorted(set(counts.tolist()))}"


# ------------------------------------------------------------------ SPIRe: training == inference, every variant


@pytest.mark.parametrize("variant", sorted(ABLATIONS))
def test_k_pass_training_equals_inference_through_the_engine(variant):
    """For every ablation (method §3.8), each round's draft distributions q inside
    `speculative_generate` equal the training forward on the same text: `k_pass_logits` over
    the accepted prefix (target memory, from the target's residual stream) followed by the
    block the draft ran (the pending token and its first k - 1 proposals, teacher-forced),
    softmax at T = 1 (q is float32). For "no_feedback_no_target_acts" training is one sparse parallel pass
    of an ordinary transformer and inference is the vanilla draft over a sink + window cache."""
    target = random_target()
    model = spire_model(target, variant, num_layers=3, window=6, scale=0.05)
    if not model.cfg.pruned_init:
        randomize(model, seed=5)
    contexts, lengths = contexts_and_lengths(4, 11, 2, [11, 6, 9, 3])
    k, G = 4, 20
    gen = torch.Generator().manual_seed(3)
    rec = Recorder(spire_draft(model, temperature=1.0))
    out = speculative_generate(target, rec, contexts, G, k=k, temperature=1.0, lengths=lengths, generator=gen)
    prefixes = accepted_prefixes(contexts, lengths, rec.rounds, out.accepted)
    checked = set()
    with torch.no_grad():
        for r, (rnd, rows) in enumerate(zip(rec.rounds, prefixes)):
            for b, prefix in enumerate(rows):
                n = len(prefix) - 1  # the pending token's position: the block is n .. n + k - 1
                seq = torch.tensor(prefix + rnd["tokens"][b, : k - 1].tolist())[None]  # (1, n + k)
                block = torch.arange(n, n + k)[None]  # (1 block, k)
                logits, _ = model.k_pass_logits(seq, residual_stream(target, seq)[list(model.memory_layers)], k,
                                                positions=block)
                torch.testing.assert_close(torch.softmax(logits[0, 0], -1).float(), rnd["q"][b], rtol=1e-5, atol=1e-7,
                                           msg=f"round {r}, row {b}: inference differs from training")
                checked.add(n)
    assert max(checked) > model.cfg.window + k, "blocks far enough that the window slides"
    counts = out.accepted[out.accepted >= 0]
    assert (counts == 0).any() and (counts > 1).any()


# ------------------------------------------------------------------ ragged contexts


def test_right_padded_prefill_gives_every_row_its_own_logits():
    """A right-padded batch through the target with `valid` (what `prefill` runs) gives each
    row the logits it has alone, and after `prefill` the next step continues each row alone."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 12, 5, [12, 5, 9, 2])
    B, L = contexts.shape
    positions = torch.arange(L).expand(B, L)
    with torch.no_grad():
        cache = DenseKVCache(CFG.num_layers, B, CFG.n_kv, CFG.d_head, L + 4, dtype=torch.float64)
        logits = target(contexts, positions, cache, valid=positions < lengths[:, None])
        assert torch.equal(cache.lengths, lengths)
        pf = prefill(target, contexts, lengths, capacity=L + 4)
        assert torch.equal(pf.cache.lengths, lengths - 1) and torch.equal(pf.verified.lengths, lengths - 1)
        assert torch.equal(pf.pending, contexts[torch.arange(B), lengths - 1])
        nxt = target(pf.pending[:, None], pf.cache.lengths[:, None], pf.cache)[:, 0]
        for b, n in enumerate(lengths.tolist()):
            alone = target(contexts[b : b + 1, :n])[0]
            torch.testing.assert_close(logits[b, :n], alone, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(nxt[b], alone[-1], rtol=1e-10, atol=1e-12)


RAGGED_DRAFTS = ["vanilla", "magicdec", "magicdec-original", "spire", "spire-no-feedback", "spire-no-target-acts"]


@pytest.mark.parametrize("name", ["ad"] + RAGGED_DRAFTS)
def test_ragged_rows_decode_greedily_as_if_alone(name):
    """Every row of a right-padded batch gets, greedily, the tokens it gets decoded alone (AD
    and SD), and with SD the same accept count in every round: the draft's proposals for a
    row depend on that row alone (padding, other rows' lengths and their progress do not
    leak into its caches)."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 16, 6, [16, 5, 11, 2])  # padding longer than the sparse caches' rings
    G, k = 18, 4
    if name == "ad":
        run = lambda c, n: autoregressive_generate(target, c, G, temperature=0.0, lengths=n)
    else:
        make = draft_makers(target)[name]
        run = lambda c, n: speculative_generate(target, make(0.0), c, G, k=k, temperature=0.0, lengths=n)
    batch = run(contexts, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = run(contexts[b : b + 1, :n], None)
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"row {b}"
        if name != "ad":
            rounds = batch.accepted[b][batch.accepted[b] >= 0]
            assert torch.equal(rounds, alone.accepted[0]), f"row {b}: accept counts {rounds} alone {alone.accepted[0]}"
    if name != "ad":
        assert (batch.accepted >= 0).sum(1).unique().numel() > 1, "rows finish in different rounds"


# ------------------------------------------------------------------ pruned initialization, feedback mixture


def test_pruned_init_copies_every_tensor_it_should_and_random_init_none():
    """Method §3.1 with every target tensor random (norm gains too, 1 + noise, so a gain left at
    its initial ones is caught): draft layer i is target layer n_t - n_d + i, and embedding,
    final norm and unembedding are the target's, as copies; random init copies none of them."""
    target = random_target()
    n_d = 2
    first = CFG.num_layers - n_d
    expected = {"embed.weight": "embed.weight", "norm.weight": "norm.weight", "unembed.weight": "unembed.weight"}
    for i in range(n_d):
        for name, _ in target.blocks[first + i].named_parameters():
            expected[f"blocks.{i}.{name}"] = f"blocks.{first + i}.{name}"
    cfg = SpireConfig(num_layers=n_d, window=5, k=4)
    draft = SpireDraftModel.from_target(target, cfg)
    assert {name for name, _ in draft.named_parameters()} == {f"body.{name}" for name in expected} | {"mix"}
    for name, source in expected.items():
        p, t = draft.body.get_parameter(name), target.get_parameter(source)
        assert torch.equal(p, t.to(p.dtype)), f"{name} is not a copy of the target's {source}"
        assert p.data_ptr() != t.data_ptr(), f"{name} shares the target's storage"
        assert p.dtype == torch.promote_types(t.dtype, torch.float32), "drafts train in fp32 at least"
    sums = {float(target.get_parameter(source).detach().sum()) for source in expected.values()}
    assert len(sums) == len(expected), "the target's tensors are all distinct"
    random_init = SpireDraftModel.from_target(target, replace(cfg, pruned_init=False))
    targets = list(target.parameters())
    for name, p in random_init.body.named_parameters():
        assert not any(p.shape == t.shape and torch.equal(p, t) for t in targets), f"random init copied {name}"


def test_feedback_memory_is_the_softmax_mixture_of_the_embedding_and_every_layer_output():
    """m^i = sum_l softmax(w_i)_l x^l over x^0 (the embedding) .. x^{n_d} (method §3.2), by hand,
    with non-uniform mixing logits; every term, the embedding's too, moves each m^i by its
    weight."""
    target = random_target()
    model = SpireDraftModel.from_target(target, SpireConfig(num_layers=3, window=5, k=4)).double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        model.mix.copy_(torch.randn(3, 4, generator=gen, dtype=torch.float64))
    acts = [torch.randn(2, 5, CFG.d_model, generator=gen, dtype=torch.float64) for _ in range(4)]
    with torch.no_grad():
        got = model.feedback_memory(acts)
        weights = [[math.exp(w) for w in row] for row in model.mix.tolist()]
        weights = [[w / sum(row) for w in row] for row in weights]
        assert got.shape == (3, 2, 5, CFG.d_model)
        for i in range(3):
            by_hand = sum(weights[i][l] * acts[l] for l in range(4))
            torch.testing.assert_close(got[i], by_hand, rtol=1e-12, atol=1e-12)
        for l in range(4):
            delta = torch.randn(2, 5, CFG.d_model, generator=gen, dtype=torch.float64)
            moved = model.feedback_memory([a + delta if j == l else a for j, a in enumerate(acts)])
            for i in range(3):
                torch.testing.assert_close(moved[i] - got[i], weights[i][l] * delta, rtol=1e-9, atol=1e-12)
    assert len({round(w, 6) for row in weights for w in row}) == 12, "non-uniform mixtures"


# ------------------------------------------------------------------ temperature


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 1.5, 3.0])
def test_probabilities_is_softmax_of_logits_over_temperature(temperature):
    gen = torch.Generator().manual_seed(8)
    logits = 3 * torch.randn(4, 6, 17, generator=gen, dtype=torch.float64)
    p = probabilities(logits, temperature)
    e = torch.exp(logits / temperature - (logits / temperature).amax(-1, keepdim=True))
    assert p.dtype == torch.float32 and p.shape == logits.shape
    torch.testing.assert_close(p.double(), e / e.sum(-1, keepdim=True), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(probabilities(logits.float(), temperature).double(), e / e.sum(-1, keepdim=True),
                               rtol=1e-5, atol=1e-7)


def test_probabilities_at_temperature_zero_is_the_argmax_one_hot():
    logits = torch.tensor([[0.5, 2.0, -1.0], [3.0, 2.9, 2.8]])
    assert probabilities(logits, 0.0).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="temperature"):
        probabilities(logits, -0.5)
