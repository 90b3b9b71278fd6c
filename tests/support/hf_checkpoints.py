"""Random checkpoints of real models' shapes, laid out as the Hub publishes them (nothing downloads).

`random_checkpoint(config, folder)` builds `transformers`' model for a published config.json (a
fixture under tests/fixtures/hf_configs, or any), with random weights, and writes it with
`save_pretrained` (safetensors, in the config's dtype) plus a byte-level BPE tokenizer.json trained
on the given texts: its special tokens at the config's own BOS / EOS ids, a BOS prepended by the
post-processor only where `prepend_bos` says so. Its speed is the real model's (the shapes are);
its acceptance rates are a random model's.

As a script, to time a series on a real model's shapes (`params/hf-example.yaml`):

    .venv/bin/python tests/support/hf_checkpoints.py tests/fixtures/hf_configs/smollm2-135m.json models/target
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

SPECIAL = "<|endoftext|>"


def bpe_tokenizer(texts, vocab_size: int, specials: list[str], template: str | None = None):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts`, `specials` at ids 0, 1, ..., whose
    post-processor is `template` (TemplateProcessing, as Llama 2's and 3's: "<|begin_of_text|> $A")
    or, without one, ByteLevel's (as SmolLM2's and Qwen2's, which add no token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = (processors.ByteLevel(trim_offsets=False) if template is None else processors.TemplateProcessing(
        single=template, special_tokens=[(t, tok.token_to_id(t)) for t in specials if t in template.split()]))
    return tok


def random_checkpoint(config: dict, folder: Path, texts=None, *, seed: int = 0, tokenizer_vocab: int | None = None,
                      bos: str | None = None) -> Path:
    """`folder` with config.json (as `transformers` writes it back), model.safetensors of random
    weights in the config's dtype, and a tokenizer.json (trained on `texts`, default a few
    sentences) of at most the model's vocabulary."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(seed)
    dtype = getattr(torch, config.get("torch_dtype") or config.get("dtype") or "float32")
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder, safe_serialization=True)
    texts = list(texts or ["The state of the union is strong.", "We hold these truths to be self-evident."])
    eos = config.get("eos_token_id", 0)
    if (eos[0] if isinstance(eos, list) else eos) != 0:
        raise ValueError("this builder puts the end-of-text token at id 0")
    tok = bpe_tokenizer(texts, min(tokenizer_vocab or config["vocab_size"], config["vocab_size"]),
                        [SPECIAL] + ([bos] if bos else []), None if bos is None else f"{bos} $A")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    from spirelib.training.corpus import load_corpus

    config = json.loads(Path(argv[0]).read_text())
    corpus = load_corpus("sotu")
    texts = [corpus.texts[i] for i in range(len(corpus))]
    out = random_checkpoint(config, Path(argv[1]), texts)
    print(f"{out}: random {config.get('model_type')} of {argv[0]}'s shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
