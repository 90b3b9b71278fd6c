"""The models' shapes (spirelib.model.config): each config refuses what it cannot build by name, the
shape rules (the vanilla draft's halving, EAGLE-3's target layers, the ablations), and config hashes
that fields added later leave unchanged."""

import json
from dataclasses import replace

import pytest
import torch

from spirelib.model.config import (
    ABLATIONS,
    Eagle3Config,
    ModelConfig,
    SinkWindow,
    SpireConfig,
    ablation,
    eagle3_layers,
    vanilla_draft_config,
)
from spirelib.model.transformer import Transformer
from spirelib.training.checkpoint import config_hash


def test_config_fields_added_later_leave_existing_config_hashes_unchanged():
    """Cached checkpoints are keyed by config_hash(ModelConfig.to_dict()): rope_scaling,
    tie_embeddings and qkv_bias (imported checkpoints' fields) enter the dict only when set, and it round-trips."""
    cfg = ModelConfig(vocab_size=4096, num_layers=4, d_model=128, n_q_per_kv=1, n_kv=4, d_head=32, d_ff=512)
    assert config_hash(cfg.to_dict()) == "80caf671a82bb05b5f8f8590eab6ca298172682921408652e204a873be7243bf"
    assert ModelConfig(**cfg.to_dict()) == cfg
    for change in ({"rope_scaling": (8.0, 1.0, 4.0, 8192.0)}, {"tie_embeddings": True}, {"qkv_bias": True}):
        other = replace(cfg, **change)
        d = json.loads(json.dumps(other.to_dict()))  # a JSON list comes back for the tuple
        assert set(d) - set(cfg.to_dict()) == set(change) and ModelConfig(**d) == other and hash(ModelConfig(**d))
        assert config_hash(d) != config_hash(cfg.to_dict())


def test_vanilla_draft_has_an_eighth_of_the_paper_targets_body():
    paper = ModelConfig(vocab_size=50304, num_layers=8, d_model=512, n_q_per_kv=1, n_kv=8, d_head=128, d_ff=4096)
    draft = vanilla_draft_config(paper)
    assert (draft.num_layers, draft.d_model, draft.d_head, draft.d_ff) == (4, 256, 64, 2048)
    with torch.device("meta"):
        assert sum(p.numel() for p in Transformer(draft).blocks.parameters()) == 8_390_656 == draft.body_params()
    with pytest.raises(ValueError, match="cannot halve"):
        vanilla_draft_config(ModelConfig(vocab_size=10, num_layers=1, d_model=8, n_q_per_kv=1, n_kv=1, d_head=4, d_ff=8))


def test_spire_config_validation_names_the_problem():
    with pytest.raises(ValueError, match="feedback"):
        SpireConfig(feedback=True, target_activations=False)
    with pytest.raises(ValueError, match="windw"):
        SpireConfig.from_dict({"windw": 3})
    with pytest.raises(ValueError, match="ablation"):
        ablation("no_sparse_kv")
    with pytest.raises(ValueError, match="k must be"):
        SpireConfig(window=3, k=4)
    with pytest.raises(ValueError, match="SinkWindow"):
        SpireConfig(sink=-1)


def test_every_ablation_is_one_change_to_the_spire_config():
    base = SpireConfig(window=16)
    for name, change in ABLATIONS.items():
        variant = ablation(name, base)
        assert {f: getattr(variant, f) for f in change} == change and replace(variant, **{
            f: getattr(base, f) for f in change}) == base


def test_eagle3_reads_the_papers_target_layers_and_refuses_what_it_cannot_build():
    assert eagle3_layers(32) == (2, 16, 29)  # EAGLE-3's (2, L // 2, L - 3), as vLLM and speculators pick them
    assert eagle3_layers(4) == (1, 2, 4) and eagle3_layers(2) == (0, 1, 2)
    with pytest.raises(ValueError, match="needs >= 2 layers"):
        eagle3_layers(1)
    assert Eagle3Config(target_layers=[1, 2, 4]).target_layers == (1, 2, 4)  # a params list becomes a tuple
    for bad, match in (({"target_layers": [1, 1, 2]}, "distinct"), ({"draft_vocab": 0}, "draft_vocab"),
                       ({"k": 0}, "k must")):
        with pytest.raises(ValueError, match=match):
            Eagle3Config(**bad)


def test_model_config_refuses_shapes_it_cannot_build():
    base = {"vocab_size": 10, "num_layers": 1, "d_model": 8, "n_q_per_kv": 1, "n_kv": 1, "d_head": 4, "d_ff": 8}
    for bad, match in (({"d_head": 3}, "d_head must be even"), ({"vocab_size": 0}, "vocab_size"),
                       ({"sliding_window": 1}, "sliding_window"), ({"rope_scaling": (8.0, 1.0)}, "rope_scaling"),
                       ({"rope_scaling": (8.0, 4.0, 1.0, 8192.0)}, "low_freq_factor")):
        with pytest.raises(ValueError, match=match):
            ModelConfig(**{**base, **bad})
    assert ModelConfig(**base, sliding_window=4).attention_window == SinkWindow(0, 3)
    with pytest.raises(ValueError, match="SinkWindow needs"):
        SinkWindow(1, 0)
