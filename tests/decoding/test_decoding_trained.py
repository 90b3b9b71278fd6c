"""Exactness on trained models: greedy speculative decoding equals greedy
autoregressive decoding token for token, in fp32, with batch > 1, ragged contexts and
ragged acceptance, for both baseline drafts. Random models have flat, tie-free logits;
trained ones have the confident, close-call logits where a cache or batching bug (or a
rounding difference between a 1-token and a (k+1)-token forward) would flip an argmax."""

import inspect
import json
import string
import textwrap

import pytest
import torch
import torch.nn.functional as F

from spirelib.decoding.drafts import MagicDecDraft, VanillaDraft
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig, vanilla_draft_config
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget

TARGET = ModelConfig(vocab_size=256, num_layers=2, d_model=64, n_q_per_kv=2, n_kv=2, d_head=16, d_ff=192)


def corpus() -> torch.Tensor:
    """Bytes of a few standard-library modules: real text, deterministic for a Python version."""
    text = "".join(inspect.getsource(m) for m in (textwrap, string, json.decoder, json.encoder))
    return torch.tensor(list(text.encode()), dtype=torch.long)


def train_bytes_model(cfg: ModelConfig, data: torch.Tensor, steps: int, seed: int) -> Transformer:
    """A minimal next-token cross-entropy loop (seconds on a CPU)."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        batch = data[starts[:, None] + torch.arange(65)]  # (16, 65)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These matmuls are too small to share; on a busy machine a second thread costs 10x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(one_thread):
    data = corpus()
    split = int(0.9 * len(data))
    target = train_bytes_model(TARGET, data[:split], steps=150, seed=0)
    draft = train_bytes_model(vanilla_draft_config(TARGET), data[:split], steps=150, seed=1)
    return target, draft, data[split:]


def held_out_contexts(val: torch.Tensor, B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.linspace(0, len(val) - L - 1, B).long()
    contexts = val[starts[:, None] + torch.arange(L)]  # (B, L)
    lengths = torch.tensor([L, L - 9, L - 3, 5, L - 17, L][:B])  # ragged, right-padded
    return contexts, lengths


def test_training_made_language_models(trained):
    target, draft, val = trained
    windows = val[torch.arange(0, len(val) - 65, 997)[:, None] + torch.arange(65)]
    for model in (target, draft):
        with torch.no_grad():
            loss = F.cross_entropy(model(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
        assert loss < 3.0, "well below a uniform byte model's 5.55 nats"


@pytest.mark.parametrize("method", ["vanilla", "magicdec"])
def test_greedy_speculative_equals_greedy_autoregressive_on_trained_models(trained, method):
    target, small, val = trained
    contexts, lengths = held_out_contexts(val, B=6, L=48)
    G, k = 40, 4
    draft = VanillaDraft(small, temperature=0.0) if method == "vanilla" else MagicDecDraft(target, KVBudget(1, 8), temperature=0.0)
    ad = autoregressive_generate(target, contexts, G, temperature=0.0, lengths=lengths)
    sd = speculative_generate(target, draft, contexts, G, k=k, temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)
    rounds = sd.accepted[sd.accepted >= 0]
    assert (rounds < k).any() and (rounds > 0).any() and (rounds == k).any(), "the test needs ragged acceptance"
    assert rounds.float().mean() > 1.0, "a trained draft agrees with the target often"
