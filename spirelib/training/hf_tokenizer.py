"""A Hugging Face folder's tokenizer.json with the interface of `spirelib.training.tokenizer`'s tokenizers.

`load_tokenizer` reads it with `tokenizers` (fast tokenizers' tokenizer.json only, not sentencepiece's
tokenizer.model), end-of-text from config.json (`hf_config.read_config`), BOS from its post-processor
(`HFTokenizer`). Apart from the weights, so that a series reads an imported target's tokenizer (and
tokenizes its corpus) without loading the model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from spirelib.training.hf_config import read_config

TOKENIZER = "tokenizer.json"


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` with the interface of `spirelib.training.tokenizer`'s
    tokenizers (`kind`, `vocab_size`, `bos_id`, `eos_id`, their tokens, `checksum`, `encode_batch`,
    `decode`), plus `encode` of one text, following the checkpoint's own conventions: end-of-text
    is config.json's `eos_token_id`, not a looked-up string; BOS is what the tokenizer's
    post-processor puts before a text (`_prepended`: Llama 2 / 3 and Mistral prepend theirs,
    SmolLM2 and Qwen2 nothing). `encode_batch` encodes documents for the token stream: BOS, then
    the text's tokens, nothing the post-processor would append (the stream puts `eos_id` between
    documents, `tokenizer.tokenize`)."""

    kind = "hf"

    def __init__(self, tokenizer, eos_id: int):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = int(eos_id)
        self.eos_token = tokenizer.id_to_token(self.eos_id)
        prepended = _prepended(tokenizer)
        if len(prepended) > 1:
            raise ValueError(f"the tokenizer's post-processor puts {[tokenizer.id_to_token(i) for i in prepended]} "
                             "before every text; only a single BOS token is implemented")
        self.bos_id = prepended[0] if prepended else None
        self.bos_token = None if self.bos_id is None else tokenizer.id_to_token(self.bos_id)
        # The ids that frame each document are part of what `tokenizer.tokenize` caches.
        self.checksum = hashlib.sha256(
            (tokenizer.to_str() + f"\nbos_id={self.bos_id}\neos_id={self.eos_id}").encode()).hexdigest()

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        head = [] if self.bos_id is None else [self.bos_id]
        return [np.asarray(head + e.ids, dtype=np.int64)
                for e in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def _prepended(tokenizer) -> list[int]:
    """The ids the post-processor puts before a text (TemplateProcessing "<|begin_of_text|> $A":
    [128000]; ByteLevel or none: []): a probe encoded with special tokens, less its own tokens."""
    probe = "a"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    raise ValueError("the tokenizer's post-processor changes a text's own tokens; only added special tokens "
                     "are implemented")


def load_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """The tokenizer of the Hugging Face folder `path`: its tokenizer.json, with end-of-text
    from config.json's `eos_token_id` (int, or a list whose first id is taken; else
    generation_config.json's) and BOS from its post-processor (`HFTokenizer`)."""
    from tokenizers import Tokenizer

    folder = Path(path)
    file = folder / TOKENIZER
    if not file.is_file():
        raise ValueError(f"{folder}: no {TOKENIZER} (only fast tokenizers' tokenizer.json files load, "
                         "not sentencepiece tokenizer.model)")
    eos = read_config(folder).get("eos_token_id")
    generation = folder / "generation_config.json"
    if eos is None and generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        raise ValueError(f"{folder}: config.json has no eos_token_id (nor generation_config.json)")
    tok = Tokenizer.from_file(str(file))
    if tok.id_to_token(int(eos)) is None:
        raise ValueError(f"{folder}: eos_token_id={eos} is not in the tokenizer's vocabulary of {tok.get_vocab_size()}")
    return HFTokenizer(tok, int(eos))
