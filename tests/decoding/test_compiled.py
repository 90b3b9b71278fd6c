"""Compiled decoding (`Transformer.compile_decoding`) against eager decoding, the reference.

Every decoding path (AD and each kind of draft) traces whole (fullgraph, one static graph per
shape), and its graphs emit eager's greedy tokens: traced by dynamo and AOTAutograd, functionalized
with the caches written in place, which is what torch.compile hands inductor, run by AOTAutograd's
eager backend (`traced_only`: a seventh of inductor's cold compile, which costs 10-15 s a graph on
this CPU). Inductor itself, the product's CPU path (C++ kernels, the C++ wrapper), compiles the
target's and the SPIRe draft's graphs: greedy tokens equal eager's, and sampled speculative decoding
still follows the target's exact distribution. The slow test compiles every path with inductor."""

import pytest
import torch
from test_speculative import CFG, chi_square_pvalue, exact_two_token_distribution, peaky_model
from torch._dynamo.utils import counters

from spirelib.decoding.drafts import MagicDecDraft, SpireDraft, VanillaDraft
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.model.spire import SpireDraftModel
from spirelib.throughput.methods import KVBudget


def greedy(target, draft, contexts, lengths, G=20, k=4):
    """Greedy tokens (B, G): AD with `draft` None, else speculative decoding with it."""
    if draft is None:
        return autoregressive_generate(target, contexts, G, temperature=0.0, lengths=lengths).tokens
    return speculative_generate(target, draft, contexts, G, k=k, temperature=0.0, lengths=lengths).tokens


@pytest.fixture
def traced_only(monkeypatch):
    """torch.compile with its arguments as `compile_for_decoding` passes them (fullgraph, static
    shapes), the graphs run by AOTAutograd's eager backend instead of inductor's kernels."""
    compile_ = torch.compile
    calls = []

    def traced(fn, *, options=None, **kwargs):
        calls.append(kwargs)
        return compile_(fn, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", traced)
    return calls


def assert_every_path_compiles_to_eager_greedy_tokens():
    target = peaky_model()
    small = peaky_model(ModelConfig(vocab_size=CFG.vocab_size, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2,
                                    d_head=8, d_ff=32), seed=5)
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=6, k=4)).eval()
    contexts = torch.randint(0, CFG.vocab_size, (4, 20), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([20, 18, 20, 17])  # ragged contexts; the prefill is compiled too
    drafts = {"ad": (None, lambda: None),
              "magicdec": (None, lambda: MagicDecDraft(target, KVBudget(1, 6), temperature=0.0)),
              "vanilla": (small, lambda: VanillaDraft(small, temperature=0.0)),
              "spire": (spire, lambda: SpireDraft(spire, temperature=0.0))}
    eager = {name: greedy(target, make(), contexts, lengths) for name, (_, make) in drafts.items()}
    target.compile_decoding()
    for name, (model, make) in drafts.items():  # each model's compiled graphs run, and emit eager's tokens
        graphs = counters["stats"]["unique_graphs"]
        assert torch.equal(greedy(target, make(), contexts, lengths), eager[name]), name  # the target compiled
        if model is not None:  # then the draft model too: the graphs it adds are its own
            graphs = counters["stats"]["unique_graphs"]
            model.compile_decoding()
            assert torch.equal(greedy(target, make(), contexts, lengths), eager[name]), name
        assert counters["stats"]["unique_graphs"] > graphs, f"{name} decoded through newly compiled graphs"
    for model in (target, small, spire):
        model.compile_decoding(False)
    assert torch.equal(greedy(target, drafts["spire"][1](), contexts, lengths), eager["spire"])


def test_every_decoding_path_traces_whole_and_its_graphs_emit_the_eager_greedy_tokens(traced_only):
    assert_every_path_compiles_to_eager_greedy_tokens()
    assert traced_only and all(c == {"fullgraph": True, "dynamic": False} for c in traced_only)


@pytest.mark.slow
def test_every_decoding_path_compiled_by_inductor_emits_the_eager_greedy_tokens():
    assert_every_path_compiles_to_eager_greedy_tokens()


def test_inductor_compiled_speculative_decoding_is_greedy_exact_and_samples_the_target_distribution():
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=3, k=3)).eval()
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1])
    n = 20_000
    contexts = torch.randint(0, cfg.vocab_size, (n, 8), generator=torch.Generator().manual_seed(2))
    joint = exact_two_token_distribution(target, context).flatten()  # eager, before compiling
    eager = greedy(target, SpireDraft(spire, temperature=0.0), contexts, None, G=2, k=3)
    target.compile_decoding()
    spire.compile_decoding()
    gen = torch.Generator().manual_seed(11)
    sd = speculative_generate(target, SpireDraft(spire, temperature=1.0), context.expand(n, -1), 2, k=3,
                              temperature=1.0, generator=gen)
    counts = torch.bincount(sd.tokens[:, 0] * cfg.vocab_size + sd.tokens[:, 1], minlength=cfg.vocab_size ** 2)
    assert chi_square_pvalue(counts, joint) > 1e-3
    assert torch.equal(greedy(target, SpireDraft(spire, temperature=0.0), contexts, None, G=2, k=3), eager)
