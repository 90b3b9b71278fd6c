"""What a GPU needs of the hot loops: no host sync inside a forward or a training step,
at most one per decoding round; only the target layers a draft reads are kept; caches a compiled
model writes in place keep their addresses. Counted on the CPU (`host_syncs.count_host_syncs`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from host_syncs import count_host_syncs

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity
from spirelib.decoding.sections import SectionTimer
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.training.corpus import FlatDocs
from spirelib.training.objectives import SpireObjective
from spirelib.training.train import Session, TrainConfig, TrainingRun, train

CFG = ModelConfig(vocab_size=96, num_layers=4, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
SPIRE = SpireConfig(num_layers=2, window=16, k=4)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = Transformer(CFG).eval()
    return {"target": target, "vanilla": Transformer(vanilla_draft_config(CFG)).eval(),
            "spire": SpireDraftModel.from_target(target, SPIRE).eval(), "magicdec": None, "guided": None,
            "lookup": None}


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("method", ["vanilla", "magicdec", "spire", "guided", "lookup"])
def test_speculative_decoding_makes_at_most_one_host_sync_per_round(models, method, temperature):
    """Formerly 7.1 syncs per round for vanilla (one per dense-cache forward and the loop's
    test), 2.9 for MagicDec and SPIRe, and greedy drafts 2 more per draft token (`F.one_hot`
    checks its indices on the host). Now: none in a forward, none in the rounds a row cannot
    have finished in, then one per round."""
    target = models["target"]
    draft = draft_factory(method, target, models[method], temperature=temperature)()
    contexts = torch.randint(0, CFG.vocab_size, (4, 40), generator=torch.Generator().manual_seed(1))
    pre = prefill(target, contexts, capacity=speculative_capacity(40, 32, 4), **prefill_needs([draft], 4))
    with count_host_syncs() as syncs:
        out = speculative_generate(target, draft, contexts, 32, k=4, temperature=temperature,
                                   generator=torch.Generator().manual_seed(2), prefilled=pre)
    rounds = out.accepted.shape[1]
    assert sum(syncs.values()) <= rounds, (dict(syncs), rounds)  # a few per generation, then one per round


def test_forwards_and_draft_passes_make_no_host_sync(models):
    target, spire = models["target"], models["spire"]
    contexts = torch.randint(0, CFG.vocab_size, (3, 30), generator=torch.Generator().manual_seed(1))
    pre = prefill(target, contexts, capacity=40, layers=spire.memory_layers)
    n = pre.cache.lengths
    tokens = torch.randint(0, CFG.vocab_size, (3, 5))
    cache = spire.new_cache(3, slack=5)
    spire.write_target_memory(cache, pre.verified.stream(spire.memory_layers), pre.verified.positions,
                              pre.verified.valid)
    with count_host_syncs() as syncs:
        target(tokens, n[:, None] + torch.arange(5), pre.cache)  # a verification
        target(tokens[:, :1], n[:, None] + 5, pre.cache)  # an AD step
        target.residual_stream(tokens, n[:, None] + torch.arange(5), pre.cache, layers=(2, 3, 4))
        spire.step(tokens[:, 0], n, cache)  # a SPIRe pass
    assert not syncs, dict(syncs)


def test_autoregressive_decoding_makes_no_host_sync_per_step(models):
    contexts = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    pre = prefill(models["target"], contexts, capacity=36)
    with count_host_syncs() as syncs:
        autoregressive_generate(models["target"], contexts, 16, prefilled=pre)
    assert sum(syncs.values()) <= 1, dict(syncs)  # the capacity check at the end


def test_timed_generations_on_a_gpu_record_events_and_wait_once_when_read(models, monkeypatch):
    """`SectionTimer` on a GPU (CUDA's events, streams and synchronize faked here): a timed generation
    records a start and an end event per section and never waits; reading its seconds afterwards waits
    once for all of them. Formerly a synchronize before and after every section: 8 a SD round, 4 an AD
    token, so AD and SD paid different counts of waits."""
    device, syncs, events = {"busy": True}, [], []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            events.append(self)

        def query(self):  # finished? not before the device caught up
            return not device["busy"]

        def elapsed_time(self, end):
            return 2.0  # ms

    def synchronize(dev=None):
        syncs.append(dev)
        device["busy"] = False

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: None)
    target = models["target"]
    contexts = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    for method in ("ad", "spire"):
        syncs.clear(), events.clear()
        device["busy"] = True
        timer = SectionTimer("cuda")
        if method == "ad":
            autoregressive_generate(target, contexts, 12, timer=timer)
            sections = 1 + 2 * 11  # the prefill (its logits give the first token), then verify + bookkeeping a token
        else:
            draft = draft_factory(method, target, models[method], temperature=1.0)()
            out = speculative_generate(target, draft, contexts, 12, k=4, generator=torch.Generator().manual_seed(2),
                                       timer=timer)
            # the prefill, then draft, verify, bookkeeping, draft a round, the rounds counted and the one
            # more that the stop check, reading whether rows are active a round late, lets run
            sections = 1 + 4 * (out.accepted.shape[1] + 1)
        assert not syncs and len(events) == 2 * sections, (method, len(syncs), len(events))
        assert timer.finished_seconds() == {}  # a look while the device is busy: nothing finished, no wait
        seconds = timer.seconds
        assert len(syncs) == 1 and sum(seconds.values()) == pytest.approx(sections * 0.002), method
        assert timer.seconds is seconds and len(syncs) == 1  # nothing left to wait for


def _train_syncs(target, steps: int, log_every: int, tmp_path) -> int:
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, 4000).astype(np.uint16)
    docs = FlatDocs(tokens, np.array([0]), np.array([len(tokens)]))
    cfg = TrainConfig(batch_size=2, seq_len=32, steps=steps, log_every=log_every, eval_every=0, eval_windows=1,
                      checkpoint_every=1000, compile=False)
    draft = SpireDraftModel.from_target(target, SPIRE)
    with count_host_syncs() as syncs:
        train(draft, SpireObjective(target), docs, cfg, run=TrainingRun(tmp_path / f"{steps}-{log_every}", {"t": 1}),
              session=Session("cpu", progress=False))
    return sum(syncs.values())


def test_a_training_step_makes_no_host_sync_between_log_lines(models, tmp_path):
    """Formerly 22 syncs per SPIRe training step (the loss, the gradient norm, every
    metric, k-pass attention's band, AdamW's step counters). Now the host waits at a log line
    (and at the end), never in a step between them."""
    once = _train_syncs(models["target"], 4, 4, tmp_path / "a")
    assert _train_syncs(models["target"], 12, 12, tmp_path / "b") == once  # 8 more steps, not one more sync
    per_line = _train_syncs(models["target"], 8, 4, tmp_path / "c") - _train_syncs(models["target"], 8, 8, tmp_path / "d")
    assert 0 < per_line <= 2  # a log line: the interval's means (one transfer) and the finiteness check


def test_prefill_verification_and_training_keep_only_the_layers_the_draft_reads(models, monkeypatch):
    """SPIRe reads the inputs of its n_d pruned layers (and the loss the last entry): of an 8B
    target's 33 residual-stream entries, 9 instead of 33 (`bench memory`)."""
    target, spire = models["target"], models["spire"]
    n_d = SPIRE.num_layers
    kept = []
    original = Transformer.residual_stream

    def recording(self, *args, **kwargs):
        stream = original(self, *args, **kwargs)
        kept.append(stream.shape[0])
        return stream
    monkeypatch.setattr(Transformer, "residual_stream", recording)
    draft = draft_factory("spire", target, spire, temperature=1.0)()
    contexts = torch.randint(0, CFG.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    speculative_generate(target, draft, contexts, 8, k=4, generator=torch.Generator().manual_seed(2))
    assert kept[0] == n_d and set(kept[1:]) == {n_d + 1}, kept  # prefill: the draft's; rounds: + the logits'
    kept.clear()
    SpireObjective(target)(SpireDraftModel.from_target(target, SPIRE), contexts)
    assert kept == [n_d + 1]
    assert spire.memory_layers == (CFG.num_layers - n_d, CFG.num_layers - 1)


def test_residual_stream_returns_the_entries_asked_for_in_order(models):
    target = models["target"]
    tokens = torch.randint(0, CFG.vocab_size, (2, 9))
    full = target.residual_stream(tokens)  # (n_layers + 1, B, T, d)
    assert full.shape[0] == CFG.num_layers + 1
    torch.testing.assert_close(target.residual_stream(tokens, layers=(4, 0, 2)), full[[4, 0, 2]], rtol=0, atol=0)
    with pytest.raises(ValueError, match="entries 0..4"):
        target.residual_stream(tokens, layers=(5,))


def test_compiled_models_reuse_their_caches_with_static_addresses(models):
    """CUDA graphs replay over the buffers they recorded: a compiled model's next cache of the same
    shape is its last one, emptied; its key/value tensors are marked static for dynamo."""
    target = Transformer(CFG).eval()
    first = target.new_cache(2, 30)
    assert target.new_cache(2, 30) is not first, "eager models allocate a cache per call"
    target._compiled = lambda *a: None  # compiled, as far as `new_cache` is concerned (no compilation here)
    pooled = target.new_cache(2, 30)
    pooled.prepare(torch.arange(6).expand(2, 6))
    again = target.new_cache(2, 30)
    assert again is pooled and again.key_positions.max() == -1 and int(again.lengths.max()) == 0
    assert all(k.data_ptr() == p.data_ptr() for k, p in zip(again.k, pooled.k))
    assert target.new_cache(3, 30) is not pooled
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in (*again.k, *again.v))
