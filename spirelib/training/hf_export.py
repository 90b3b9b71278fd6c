"""Our models out as Hugging Face folders (`save_model`), and an imported folder's identity (`checkpoint_digest`).

`save_model` writes config.json (`hf_config.config_to_hf`), model.safetensors
(`hf_weights.hf_state_dict`) and, given a tokenizer, tokenizer.json: a folder that
``transformers.LlamaForCausalLM.from_pretrained`` (``Qwen2ForCausalLM`` for a model with q/k/v
biases, ``MistralForCausalLM`` for one with a sliding window) loads and that computes our logits.
`checkpoint_digest` names a folder by its bytes, so drafts trained for an imported target retrain
when its weights change. Both write their files whole or not at all (`_atomic_write`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from spirelib.model.transformer import Transformer
from spirelib.paths import write_atomically
from spirelib.training.hf_config import CONFIG, config_to_hf
from spirelib.training.hf_tokenizer import TOKENIZER
from spirelib.training.hf_weights import INDEX, PICKLE_PATTERNS, SINGLE, hf_state_dict


def save_model(model: Transformer, path: str | os.PathLike, tokenizer=None, *,
               max_position_embeddings: int = 4096) -> Path:
    """Write `model` as a Hugging Face Llama folder: config.json and model.safetensors (issue
    13), which `transformers.LlamaForCausalLM.from_pretrained(path)` loads and `hf_weights.load_model`
    reads back bitwise. With a `tokenizer` from `spirelib.training.tokenizer` or `hf_tokenizer.load_tokenizer`,
    its eos id goes into config.json and, where it has a `tokenizers.Tokenizer` (BPE, hf),
    tokenizer.json and tokenizer_config.json are written too. Returns the folder."""
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.d_model % cfg.n_q:
        raise ValueError(f"transformers' LlamaConfig needs hidden_size ({cfg.d_model}) to be a multiple of "
                         f"num_attention_heads ({cfg.n_q}), even with head_dim set; this model cannot be exported")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    clashing = sorted({p.name for pattern in (INDEX, "model-*.safetensors", *PICKLE_PATTERNS)
                       for p in folder.glob(pattern)})
    if clashing:
        raise ValueError(f"{folder} already holds other weights ({', '.join(clashing)}); save into an empty folder")
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"the model mixes dtypes {sorted(map(str, dtypes))}; cast it to one first")
    eos = None if tokenizer is None else getattr(tokenizer, "eos_id", None)
    config = config_to_hf(cfg, dtypes.pop(), eos_token_id=None if eos is None else int(eos),
                          max_position_embeddings=max_position_embeddings)
    write_atomically(folder / SINGLE, lambda tmp: save_file(hf_state_dict(model), str(tmp), metadata={"format": "pt"}))
    if tokenizer is not None and hasattr(tokenizer, "tokenizer"):
        tok = tokenizer.tokenizer
        write_atomically(folder / TOKENIZER, lambda tmp: tok.save(str(tmp)))
        special = {"tokenizer_class": "PreTrainedTokenizerFast"}
        if eos is not None and tok.id_to_token(int(eos)) is not None:
            special["eos_token"] = tok.id_to_token(int(eos))
        write_atomically(folder / "tokenizer_config.json", lambda tmp: tmp.write_text(json.dumps(special, indent=2)))
    write_atomically(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return folder




def checkpoint_digest(path: str | os.PathLike) -> str:
    """sha256 over the folder's config.json and weight files (names and bytes): the identity
    of an imported target, so drafts trained for it retrain when its weights change. Each
    file's digest is cached under the cache folder by (path, size, mtime), so a series reads a
    large checkpoint's bytes once, not in every notebook."""
    from spirelib.paths import cache_dir

    folder = Path(path).resolve()
    files = [folder / CONFIG] + sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.safetensors.index.json"))
    store = cache_dir() / "hf" / "digests.json"
    known = json.loads(store.read_text()) if store.is_file() else {}
    total, before = hashlib.sha256(), len(known)
    for f in files:
        stat = f.stat()
        key = f"{f}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in known:
            digest = hashlib.sha256()
            with open(f, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 24), b""):
                    digest.update(block)
            known[key] = digest.hexdigest()
        total.update(f"{f.name}:{known[key]}\n".encode())
    if len(known) > before:  # new digests only: a series reads the checkpoint once, writes the store once
        store.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(store, lambda tmp: tmp.write_text(json.dumps(known, indent=1)))
    return total.hexdigest()
