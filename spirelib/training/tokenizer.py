"""Tokenizers and cached token arrays (method §9: byte-level BPE trained on the corpus at small scale).

- ``"bpe"``: byte-level BPE (Hugging Face `tokenizers`) trained on the *training* split only,
  GPT-2 pre-tokenization, one special token ``<|endoftext|>`` (id 0) between documents.
  Cached under ``data_dir()/tokenizers`` keyed by corpus checksum, split and vocab size;
  training is deterministic (same corpus and settings give the same vocabulary file).
- ``"bytes"``: UTF-8 bytes, vocab 256, NUL (id 0) between documents (corpora drop NUL).
- ``"gpt2"``: LongCrawl64's GPT-2 ids pass through (vocab 50257, ``<|endoftext|>`` = 50256).
  No GPT-2 vocabulary is available offline, so `decode` shows ids.

Every tokenizer has `kind`, `vocab_size`, `bos_id` and `bos_token` (the token that starts every
document, None for these three; an imported checkpoint's `hf_tokenizer.HFTokenizer` has its own),
`eos_id` and `eos_token` (the one after every document), `checksum` (identifies its vocabulary),
`encode_batch(texts) -> list[np.ndarray]` (a document's ids, its BOS first) and `decode(ids) -> str`.

`tokenize(corpus, tokenizer, train_docs, val_docs, split_key)` turns a text corpus into a
`data.TokenDataset` whose splits are numpy memmaps cached under ``data_dir()/tokens``
(uint16 ids when the vocabulary fits, else uint32).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from spirelib.paths import data_dir, write_atomically
from spirelib.training.corpus import GPT2_VOCAB, FlatDocs, TextCorpus, TokenDataset

TOKENIZERS = ("bpe", "bytes", "gpt2")
EOT = "<|endoftext|>"
_FORMAT = 1  # bump when tokenization or the cache layout changes


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class BytesTokenizer:
    kind = "bytes"
    vocab_size = 256
    bos_id = bos_token = None
    eos_id, eos_token = 0, "\x00"
    checksum = "bytes-utf8-v1"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    kind = "bpe"
    bos_id = bos_token = None
    eos_token = EOT

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = tokenizer.token_to_id(EOT)
        self.checksum = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch_fast(list(texts))]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


class GPT2Ids:
    """Pre-tokenized GPT-2 ids (LongCrawl64): nothing to encode; decode lists the ids."""

    kind = "gpt2"
    vocab_size = GPT2_VOCAB
    bos_id = bos_token = None
    eos_id, eos_token = GPT2_VOCAB - 1, EOT
    checksum = "gpt2-ids"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        raise NotImplementedError("GPT-2 ids pass through: no GPT-2 vocabulary is available offline to encode text")

    def decode(self, ids) -> str:
        return "[" + " ".join(str(int(i)) for i in ids) + "]"


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` with `vocab_size` entries (256 bytes, EOT, merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"a byte-level BPE vocabulary needs at least 257 entries (256 bytes + {EOT}), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def build_tokenizer(kind: str, vocab_size: int, corpus: TextCorpus | None = None,
                    train_docs: np.ndarray | None = None, split_key: str = ""):
    """The tokenizer `kind`; "bpe" is trained on corpus.texts[train_docs] (cached)."""
    if kind == "bytes":
        return BytesTokenizer()
    if kind == "gpt2":
        return GPT2Ids()
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of {list(TOKENIZERS)}")
    from tokenizers import Tokenizer

    key = _digest({"format": _FORMAT, "corpus": corpus.checksum, "split": split_key, "vocab_size": vocab_size})
    path = data_dir() / "tokenizers" / f"bpe-{vocab_size}-{key[:16]}.json"
    if path.is_file():
        return BPETokenizer(Tokenizer.from_file(str(path)))
    tok = train_bpe([corpus.texts[i] for i in train_docs], vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: tok.save(str(tmp)))
    return BPETokenizer(tok)


def _write_split(folder: Path, name: str, arrays: list[np.ndarray], eos_id: int, dtype) -> None:
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
    tokens = np.lib.format.open_memmap(folder / f"{name}_tokens.npy", mode="w+", dtype=dtype,
                                       shape=(int(lengths.sum() + len(arrays)),))
    for start, a in zip(starts, arrays):
        tokens[start : start + len(a)] = a
        tokens[start + len(a)] = eos_id
    tokens.flush()
    del tokens
    np.save(folder / f"{name}_starts.npy", starts)
    np.save(folder / f"{name}_lengths.npy", lengths)


def _read_split(folder: Path, name: str) -> FlatDocs:
    return FlatDocs(np.load(folder / f"{name}_tokens.npy", mmap_mode="r"),
                    np.load(folder / f"{name}_starts.npy"), np.load(folder / f"{name}_lengths.npy"))


def tokenize(corpus: TextCorpus, tokenizer, train_docs: np.ndarray, val_docs: np.ndarray, split_key: str) -> TokenDataset:
    """Both splits of `corpus` as cached token memmaps, each document as `tokenizer.encode_batch`
    gives it (its BOS first, where the tokenizer has one) followed by `tokenizer.eos_id`;
    `split_key` identifies the split."""
    checksum = _digest({"format": _FORMAT, "corpus": corpus.checksum, "split": split_key, "tokenizer": tokenizer.checksum})
    folder = data_dir() / "tokens" / f"{corpus.name}-{tokenizer.kind}-{checksum[:16]}"
    if not (folder / "meta.json").is_file():
        dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
        try:
            for name, docs in (("train", train_docs), ("val", val_docs)):
                _write_split(tmp, name, tokenizer.encode_batch([corpus.texts[i] for i in docs]), tokenizer.eos_id, dtype)
            (tmp / "meta.json").write_text(json.dumps({"checksum": checksum, "corpus": corpus.name,
                                                       "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size}))
            if folder.exists():  # a concurrent run finished first
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return TokenDataset(_read_split(folder, "train"), _read_split(folder, "val"),
                        tokenizer.vocab_size, tokenizer.eos_id, checksum)
