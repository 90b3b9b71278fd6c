"""Tokenizers (bytes, byte-level BPE, GPT-2 pass-through) and cached token memmaps."""

from pathlib import Path

import numpy as np
import pytest

from spirelib.training import tokenizer as tk
from spirelib.training.corpus import _text_corpus, split_documents

TEXTS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7} times. " * (3 + i % 4)
         + "Ünïcödé — “quotes” and\ttabs\n" for i in range(30)]


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def corpus():
    return _text_corpus("toy", [(f"doc{i}", t) for i, t in enumerate(TEXTS)])


def test_bytes_tokenizer_round_trips_utf8():
    tok = tk.BytesTokenizer()
    ids = tok.encode_batch(["héllo"])[0]
    assert tok.vocab_size == 256 and ids.tolist() == list("héllo".encode())
    assert tok.decode(ids) == "héllo"


def test_bpe_is_deterministic_round_trips_and_has_the_requested_vocab():
    a, b = tk.train_bpe(TEXTS, 300), tk.train_bpe(TEXTS, 300)
    assert a.to_str() == b.to_str()
    tok = tk.BPETokenizer(a)
    assert tok.vocab_size == 300 and tok.eos_id == 0
    text = "The lazy dog — “unseen” wörds\n"
    ids = tok.encode_batch([text])[0]
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges compress
    with pytest.raises(ValueError, match="257"):
        tk.train_bpe(TEXTS, 200)


def test_bpe_trains_on_the_training_split_only_and_is_cached(corpus, monkeypatch):
    train_docs, val_docs = split_documents(len(corpus), 0.2, 0)
    seen = []
    real = tk.train_bpe
    monkeypatch.setattr(tk, "train_bpe", lambda texts, v: seen.extend(texts) or real(texts, v))
    tok = tk.build_tokenizer("bpe", 320, corpus, train_docs, "s0")
    assert sorted(seen) == sorted(corpus.texts[i] for i in train_docs)
    monkeypatch.setattr(tk, "train_bpe", lambda texts, v: pytest.fail("retrained instead of loading the cache"))
    again = tk.build_tokenizer("bpe", 320, corpus, train_docs, "s0")
    assert again.checksum == tok.checksum


def test_token_memmaps_hold_each_split_with_document_separators(corpus):
    train_docs, val_docs = split_documents(len(corpus), 0.2, 0)
    tok = tk.build_tokenizer("bytes", 256)
    ds = tk.tokenize(corpus, tok, train_docs, val_docs, "s0")
    assert isinstance(ds.train.tokens, np.memmap) and ds.train.tokens.dtype == np.uint16
    assert len(ds.val.lengths) == len(val_docs)
    for k, i in enumerate(val_docs):
        doc = ds.val.read_windows(np.array([k]), np.array([0]), int(ds.val.lengths[k]))[0]
        assert tok.decode(doc) == corpus.texts[i]
        assert ds.val.tokens[ds.val.starts[k] + ds.val.lengths[k]] == tok.eos_id
    assert ds.train.num_tokens == sum(len(corpus.texts[i].encode()) + 1 for i in train_docs)
    bpe = tk.build_tokenizer("bpe", 300, corpus, train_docs, "s0")
    assert tk.tokenize(corpus, bpe, train_docs, val_docs, "s0").checksum != ds.checksum
    assert tk.tokenize(corpus, tok, train_docs, val_docs, "s0").checksum == ds.checksum  # cached


def test_gpt2_ids_pass_through():
    tok = tk.build_tokenizer("gpt2", 50304)
    assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
    assert tok.decode([464, 50256]) == "[464 50256]"
    with pytest.raises(NotImplementedError):
        tok.encode_batch(["text"])
    with pytest.raises(ValueError, match="unknown tokenizer"):
        tk.build_tokenizer("sentencepiece", 1000)


def checkpoint_folder(folder, specials: list[str], eos_token_id, template: str | None):
    """A Hugging Face folder with config.json's `eos_token_id` and a byte-level BPE tokenizer.json
    (`specials` at ids 0, 1, ...) whose post-processor is `template` (TemplateProcessing, as Llama 2's
    and 3's) or, without one, ByteLevel's (as SmolLM2's and Qwen2's, which add no token)."""
    import json

    from hf_checkpoints import bpe_tokenizer

    tok = bpe_tokenizer(TEXTS, 300, specials, template)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": eos_token_id}))
    return folder


@pytest.mark.parametrize("specials, eos_token_id, template, bos, eos", [
    (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], [1, 2], "<|begin_of_text|> $A",
     "<|begin_of_text|>", "<|end_of_text|>"),  # Llama 3 (3.1 Instruct's eos list)
    (["<|endoftext|>", "<|im_start|>"], 0, None, None, "<|endoftext|>"),  # SmolLM2
    (["<unk>", "<s>", "</s>"], 2, "<s> $A </s>", "<s>", "</s>"),  # Llama 2 with add_eos_token
], ids=["llama3", "smollm2", "bos-and-eos-template"])
def test_a_checkpoint_tokenizer_starts_documents_with_its_bos_and_separates_them_with_its_eos(
        corpus, tmp_path, specials, eos_token_id, template, bos, eos):
    from spirelib.training import hf_tokenizer

    tok = hf_tokenizer.load_tokenizer(checkpoint_folder(tmp_path, specials, eos_token_id, template))
    assert (tok.bos_token, tok.eos_token) == (bos, eos)
    assert tok.bos_id == (None if bos is None else specials.index(bos)) and tok.eos_id == specials.index(eos)
    train_docs, val_docs = split_documents(len(corpus), 0.2, 0)
    ds = tk.tokenize(corpus, tok, train_docs, val_docs, "s0")
    for k, i in enumerate(val_docs):
        start, n = int(ds.val.starts[k]), int(ds.val.lengths[k])
        text = tok.tokenizer.encode(corpus.texts[i], add_special_tokens=False).ids
        assert ds.val.tokens[start : start + n].tolist() == ([] if bos is None else [tok.bos_id]) + text
        assert ds.val.tokens[start + n] == tok.eos_id  # one EOS, even where the template appends its own
        assert tok.decode(ds.val.tokens[start : start + n]) == corpus.texts[i]
    if template == "<|begin_of_text|> $A":  # the tokenizer's own encoding of a text is the document's
        assert tok.encode(corpus.texts[val_docs[0]]).tolist() == ds.val.tokens[: ds.val.lengths[0]].tolist()


@pytest.mark.parametrize("bos", [None, "<|begin_of_text|>"])
def test_a_random_checkpoint_of_a_published_config_loads_with_its_conventions(tmp_path, bos):
    """tests/support/hf_checkpoints.py (what times the example on a real model's shapes): a published config,
    shrunk, saved by transformers with random weights and a tokenizer, loads as the series loads it."""
    import json

    from hf_checkpoints import random_checkpoint

    from spirelib.training import hf_tokenizer, hf_weights

    config = json.loads((Path(__file__).parents[1] / "fixtures" / "hf_configs" / "smollm2-135m.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, vocab_size=320)
    folder = random_checkpoint(config, tmp_path, TEXTS, bos=bos)
    model = hf_weights.load_model(folder)
    tok = hf_tokenizer.load_tokenizer(folder)
    assert model.cfg.num_layers == 2 and model.cfg.tie_embeddings and model.cfg.vocab_size == 320
    assert tok.eos_id == 0 and tok.bos_token == bos and tok.vocab_size <= 320
    text = tok.encode("the state", add_special_tokens=False).tolist()
    assert tok.encode_batch(["the state"])[0].tolist() == ([] if bos is None else [tok.bos_id]) + text
