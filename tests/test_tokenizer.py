"""Tokenizers (bytes, byte-level BPE, GPT-2 pass-through) and cached token memmaps."""

import numpy as np
import pytest

from spirelib.training import tokenizer as tk
from spirelib.training.data import _text_corpus, split_documents

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
