"""The recipes notebooks call: data, tokenizer, token arrays, trained models, each cached.

Shared notebook parameters (every notebook that needs the target declares the same keys,
so that all of them rebuild, i.e. load, the same cached target):

    device: str            "auto" | "cpu" | "cuda" | "cuda:N"
    seed: int              model init and training-window seed
    corpus: str            "sotu" | "stdlib" | "text" | "longcrawl64"   (spirelib.data)
    corpus_path: str       files for "text", the Zarr folder for "longcrawl64" (relative to the project root)
    tokenizer: str         "bpe" | "bytes" | "gpt2" (gpt2: LongCrawl64's ids)
    vocab_size: int        the model's vocabulary; BPE is trained to this size; it may pad
                           a fixed tokenizer's vocabulary (GPT-2's 50257 -> 50304)
    target: dict           ModelConfig fields except vocab_size (num_layers, d_model,
                           n_q_per_kv, n_kv, d_head, d_ff; optional rope_base, norm_eps)
    target_training: dict  TrainConfig fields except seed (spirelib.train)

`trained_target(**shared)` turns them into the trained target (a `TrainedModel`), training
it only when no finished checkpoint of the same identity exists. The drafts follow from a
trained target: `trained_vanilla_draft(target, vanilla_training, ...)` (a smaller
Transformer, same objective, same data) and `trained_spire_draft(target, spire,
spire_training, ...)` (k-pass training against the frozen target); both put the target's
`config_hash` in their identity so they retrain when the target changes.
Everything is validated (`validate_shared`) before any data is read or model built.

Multi-GPU (or multi-process CPU) training uses the same recipe from the command line, and
notebooks then load the cached result:

    torchrun --nproc_per_node 8 -m spirelib.pipeline target --params params/paper.yaml

reads the shared keys from the file's `shared` section (a `02_train_target` section wins),
prepares the data on rank 0 first, and trains with DDP.

The train/validation split is fixed: 10% of documents (at least one) for validation,
permutation seed 0, independent of `seed`, so changing the training seed never moves
documents between splits.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from spirelib.data import CORPORA, TokenDataset, load_corpus, longcrawl64_dataset, split_documents
from spirelib.kvcache import DenseKVCache
from spirelib.model import ModelConfig, Transformer
from spirelib.tokenizer import TOKENIZERS, build_tokenizer, tokenize
from spirelib.drafts import vanilla_draft_config
from spirelib.spire import SpireConfig, SpireDraftModel, SpireObjective
from spirelib.train import (TrainConfig, TrainResult, from_dict_checked, full_identity, lm_objective, resolve_device,
                            run_dir_for, train)

VAL_FRACTION = 0.1
SPLIT_SEED = 0


@dataclass
class Data:
    """A token dataset with the tokenizer that made it."""

    dataset: TokenDataset
    tokenizer: object  # spirelib.tokenizer.BytesTokenizer | BPETokenizer | GPT2Ids
    corpus_name: str
    num_documents: tuple[int, int]  # (train, validation)


@dataclass
class TrainedModel:
    """A trained (or loaded) model with everything that identifies it: a language model
    (`Transformer`, `ModelConfig`) or a SPIRe draft (`SpireDraftModel`, `SpireConfig`)."""

    model: torch.nn.Module  # on the training device, in eval mode
    config: ModelConfig | SpireConfig
    train_config: TrainConfig
    result: TrainResult
    data: Data
    identity: dict

    @property
    def config_hash(self) -> str:
        return self.result.meta["config_hash"]

    @property
    def summary(self) -> dict:
        return self.result.summary

    @property
    def metrics(self) -> list[dict]:
        return self.result.metrics


def model_config(shape: dict, vocab_size: int, what: str = "target") -> ModelConfig:
    """A ModelConfig from a params dict of shape fields (vocab_size comes separately)."""
    if isinstance(shape, dict) and "vocab_size" in shape:
        raise ValueError(f"{what}: set vocab_size as the shared vocab_size parameter, not inside {what}")
    return from_dict_checked(ModelConfig, {**shape, "vocab_size": vocab_size}, what)


def train_config(training: dict, seed: int, what: str = "target_training") -> TrainConfig:
    if isinstance(training, dict) and "seed" in training:
        raise ValueError(f"{what}: the seed is the shared seed parameter, not a {what} field")
    return from_dict_checked(TrainConfig, {**training, "seed": seed}, what)


def validate_shared(*, device: str, seed: int, corpus: str, corpus_path: str, tokenizer: str, vocab_size: int,
                    target: dict, target_training: dict) -> tuple[ModelConfig, TrainConfig]:
    """Check every shared parameter (no compute); returns the model and training configs."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; choose one of {list(CORPORA)}")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {list(TOKENIZERS)}")
    if (corpus == "longcrawl64") != (tokenizer == "gpt2"):
        raise ValueError("corpus longcrawl64 is pre-tokenized GPT-2 ids: use it with tokenizer: gpt2 (and only it)")
    minimum = {"bytes": 256, "gpt2": 50257, "bpe": 257}[tokenizer]
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is below the {tokenizer} tokenizer's minimum {minimum}")
    if device != "auto" and not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return model_config(target, vocab_size), train_config(target_training, seed)


def token_data(corpus: str, corpus_path: str, tokenizer: str, vocab_size: int) -> Data:
    """Corpus -> split -> tokenizer (trained on the training split) -> cached token memmaps."""
    source = load_corpus(corpus, corpus_path)
    if corpus == "longcrawl64":
        ds = longcrawl64_dataset(source)
        return Data(ds, build_tokenizer("gpt2", vocab_size), corpus, (source.train.rows, source.val.rows))
    train_docs, val_docs = split_documents(len(source), VAL_FRACTION, SPLIT_SEED)
    split_key = f"val{VAL_FRACTION}-seed{SPLIT_SEED}"
    tok = build_tokenizer(tokenizer, vocab_size, source, train_docs, split_key)
    return Data(tokenize(source, tok, train_docs, val_docs, split_key), tok, corpus, (len(train_docs), len(val_docs)))


def train_language_model(model_cfg: ModelConfig, train_cfg: TrainConfig, data: Data, *, name: str,
                         device: str = "auto", progress: bool = True, extra_identity: dict | None = None,
                         stop_at: int | None = None) -> TrainedModel:
    """Train (or load the cached) Transformer `model_cfg` with next-token cross-entropy.

    Cached under cache_dir()/models/<name>-<hash>; the identity covers the model config,
    training config, dataset checksum (corpus + split + tokenizer) and `extra_identity`.
    """
    if model_cfg.vocab_size < data.dataset.vocab_size:
        raise ValueError(f"model vocab_size {model_cfg.vocab_size} < the tokenizer's {data.dataset.vocab_size}")
    identity = {"kind": "language-model", "objective": "next-token-ce", "model": model_cfg.to_dict(),
                "data": data.dataset.checksum, **(extra_identity or {})}
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg)
    run_dir = run_dir_for(name, full_identity(train_cfg, identity))
    result = train(model, lm_objective, data.dataset.train, train_cfg, run_dir=run_dir, identity=identity,
                   val_docs=data.dataset.val, device=device, progress=progress, stop_at=stop_at)
    return TrainedModel(result.model, model_cfg, train_cfg, result, data, identity)


SHARED_KEYS = ("device", "seed", "corpus", "corpus_path", "tokenizer", "vocab_size", "target", "target_training")


def trained_target(*, device: str, seed: int, corpus: str, corpus_path: str, tokenizer: str, vocab_size: int,
                   target: dict, target_training: dict, progress: bool = True) -> TrainedModel:
    """The workbook's target model from the shared parameters (see the module docstring)."""
    model_cfg, train_cfg = validate_shared(device=device, seed=seed, corpus=corpus, corpus_path=corpus_path,
                                           tokenizer=tokenizer, vocab_size=vocab_size, target=target,
                                           target_training=target_training)
    data = token_data(corpus, corpus_path, tokenizer, vocab_size)
    return train_language_model(model_cfg, train_cfg, data, name="target", device=device, progress=progress)


def trained_vanilla_draft(target: TrainedModel, vanilla_training: dict, *, seed: int, device: str = "auto",
                          progress: bool = True) -> TrainedModel:
    """The vanilla SD draft for `target` (spec 4): `drafts.vanilla_draft_config` of its shape,
    random init, next-token cross-entropy on the target's data; retrained when the target changes."""
    cfg = vanilla_draft_config(target.config)
    return train_language_model(cfg, train_config(vanilla_training, seed, "vanilla_training"), target.data,
                                name="vanilla_draft", device=device, progress=progress,
                                extra_identity={"target": target.config_hash})


def trained_spire_draft(target: TrainedModel, spire: dict, spire_training: dict, *, seed: int, device: str = "auto",
                        progress: bool = True, name: str = "spire_draft", stop_at: int | None = None) -> TrainedModel:
    """A SPIRe draft for `target` (spec 3): `spire` holds `SpireConfig` fields (an ablation is a
    change to them, `spire.ABLATIONS`), `spire_training` `TrainConfig` fields. k-pass training
    against the frozen target with the configured loss; cached, retrained when the target changes.
    The metrics log has alpha_1..alpha_k per step and validation (the acceptance estimate)."""
    spire_cfg = spire if isinstance(spire, SpireConfig) else SpireConfig.from_dict(spire)
    train_cfg = train_config(spire_training, seed, "spire_training")
    identity = {"kind": "spire-draft", "spire": spire_cfg.to_dict(), "target": target.config_hash,
                "data": target.data.dataset.checksum}
    torch.manual_seed(train_cfg.seed)  # the random_init ablation's weights
    frozen = target.model.to(resolve_device(device))
    model = SpireDraftModel.from_target(frozen, spire_cfg)
    run_dir = run_dir_for(name, full_identity(train_cfg, identity))
    result = train(model, SpireObjective(frozen), target.data.dataset.train, train_cfg, run_dir=run_dir,
                   identity=identity, val_docs=target.data.dataset.val, device=device, progress=progress,
                   stop_at=stop_at)
    return TrainedModel(result.model, spire_cfg, train_cfg, result, target.data, identity)


@torch.no_grad()
def generate(model: Transformer, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             seed: int = 0) -> torch.Tensor:
    """Plain autoregressive sampling with a dense KV cache: (B, P) prompt -> (B, P + max_new_tokens).
    temperature 0 is greedy. (The batched speculative engine lives in spirelib.speculative.)"""
    cfg = model.cfg
    dev = next(model.parameters()).device
    B, P = prompt.shape
    cache = DenseKVCache(cfg.num_layers, B, cfg.n_kv, cfg.d_head, P + max_new_tokens, device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    tokens = prompt.to(dev)
    logits = model(tokens, cache=cache)[:, -1]  # (B, V)
    for i in range(max_new_tokens):
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
        else:
            nxt = torch.multinomial(torch.softmax(logits.float() / temperature, dim=-1), 1, generator=gen)  # (B, 1)
        tokens = torch.cat([tokens, nxt], dim=1)
        if i + 1 < max_new_tokens:
            logits = model(nxt, cache.next_positions(1), cache)[:, -1]
    return tokens


def mfu(model_cfg: ModelConfig, tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOP utilization: 6 x (body params + unembedding) x tokens/s / peak (issue 4)."""
    return 6 * flops_per_token_params(model_cfg) * tokens_per_s / peak_flops


def training_mfu(trained: TrainedModel) -> dict:
    """MFU of a training run against the peak measured now on the device it trained on:
    fp32 on CPU, bf16 (autocast) on GPU. {"peak_flops", "mfu", "device"}; mfu is None when
    that device is not present here (e.g. a GPU-trained checkpoint loaded on a laptop)."""
    from spirelib.calibrate import matmul_peak

    device = torch.device(trained.summary["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        return {"peak_flops": None, "mfu": None, "device": str(device)}
    if device.type == "cuda":
        peak = matmul_peak(sizes=(8192,), device=str(device), dtype=torch.bfloat16)["flops"]
    else:
        peak = matmul_peak(seconds=0.2, repeats=2)["flops"]
    return {"peak_flops": peak, "mfu": mfu(trained.config, trained.summary["tokens_per_s"], peak), "device": str(device)}


def flops_per_token_params(model_cfg: ModelConfig) -> int:
    """Parameters that cost matmul FLOPs per token: body + unembedding (the embedding is a lookup)."""
    with torch.device("meta"):
        body = Transformer(model_cfg).body_params()
    return body + model_cfg.d_model * model_cfg.vocab_size


def main(argv: list[str]) -> int:
    """`python -m spirelib.pipeline target --params FILE` (also under torchrun): train and cache the target."""
    import yaml

    parser = argparse.ArgumentParser(prog="python -m spirelib.pipeline", description=main.__doc__)
    parser.add_argument("what", choices=["target"])
    parser.add_argument("--params", required=True, type=Path, help="a params/*.yaml file")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    params = yaml.safe_load(args.params.read_text()) or {}
    merged = {**(params.get("shared") or {}), **((params.get("notebooks") or {}).get("02_train_target") or {})}
    missing = [k for k in SHARED_KEYS if k not in merged]
    if missing:
        print(f"{args.params} lacks {missing} (in `shared` or the 02_train_target section)", file=sys.stderr)
        return 2
    shared = {k: merged[k] for k in SHARED_KEYS}
    validate_shared(**shared)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:  # rank 0 tokenizes and caches the data; the others then read the cache
        import torch.distributed as dist

        from spirelib.train import resolve_device

        dist.init_process_group(backend="nccl" if resolve_device(shared["device"]).type == "cuda" else "gloo")
        if dist.get_rank() == 0:
            token_data(shared["corpus"], shared["corpus_path"], shared["tokenizer"], shared["vocab_size"])
        dist.barrier()
    run = trained_target(**shared, progress=not args.no_progress)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"target {run.result.path.parent}: {run.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
