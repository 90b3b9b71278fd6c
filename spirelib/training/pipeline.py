"""The recipes behind the series: data, tokenizer, token arrays and trained models, each cached.

`spirelib.training.series.Series` holds the configuration and calls these: `token_data` (corpus ->
split -> tokenizer -> token memmaps), `train_language_model` (the target, or any
Transformer trained on next-token cross-entropy), `trained_vanilla_draft` (method §4) and
`trained_spire_draft` (method §3, k-pass training against the frozen target), and
`imported_target` (a Hugging Face checkpoint as the target, evaluated instead of trained).
A model is trained only when no finished checkpoint of the same identity exists;
the drafts put the target's `config_hash` in their identity so they retrain when the target
changes (an imported target's hash covers its weight files' bytes).

The train/validation split is fixed: 10% of documents (at least one) for validation,
permutation seed 0, independent of the series' seed, so changing the training seed never
moves documents between splits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.costs import flop_params, training_flops
from spirelib.training.checkpoint import config_hash
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import TokenDataset, load_corpus, longcrawl64_dataset, split_documents
from spirelib.training.devices import init_distributed, resolve_device
from spirelib.training.objectives import SpireObjective, lm_objective
from spirelib.training.step import evaluate
from spirelib.training.tokenizer import build_tokenizer, tokenize
from spirelib.training.train import (
    Session,
    TrainingRun,
    TrainResult,
    Validation,
    full_identity,
    run_dir_for,
    train,
)
from spirelib.training.windows import validation_windows

VAL_FRACTION = 0.1
SPLIT_SEED = 0


@dataclass
class Data:
    """A token dataset with the tokenizer that made it."""

    dataset: TokenDataset
    tokenizer: object  # spirelib.training.tokenizer.BytesTokenizer | BPETokenizer | GPT2Ids
    corpus_name: str
    num_documents: tuple[int, int]  # (train, validation)


@dataclass
class TrainedModel:
    """A trained (or loaded) model with everything that identifies it: a language model
    (`Transformer`, `ModelConfig`), a SPIRe draft (`SpireDraftModel`, `SpireConfig`) or an EAGLE-3
    draft (`Eagle3DraftModel`, `Eagle3Config`)."""

    model: torch.nn.Module  # on the training device, in eval mode
    config: ModelConfig | SpireConfig
    train_config: TrainConfig
    result: TrainResult
    data: Data
    identity: dict

    @property
    def layers_config(self) -> ModelConfig:
        """The shape of the model's layer stack: a language model's own config, a SPIRe draft's body,
        an EAGLE-3 draft's one layer (`Eagle3DraftModel.layer_cfg`)."""
        if isinstance(self.config, SpireConfig):
            return self.model.body.cfg
        return self.config if isinstance(self.config, ModelConfig) else self.model.layer_cfg

    @property
    def config_hash(self) -> str:
        return self.result.meta["config_hash"]

    @property
    def summary(self) -> dict:
        return self.result.summary

    @property
    def metrics(self) -> list[dict]:
        return self.result.metrics


TARGET, VANILLA, SPIRE = "target", "vanilla_draft", "spire_draft"  # the recipes' cache folder names


def language_model_identity(model_cfg: ModelConfig, data: Data, extra: dict | None = None) -> dict:
    """What a language model's checkpoint is keyed by (`train_language_model`), besides its TrainConfig."""
    return {"kind": "language-model", "objective": "next-token-ce", "model": model_cfg.to_dict(),
            "data": data.dataset.checksum, **(extra or {})}


def spire_identity(spire_cfg: SpireConfig, data: Data, target_hash: str) -> dict:
    """What a SPIRe draft's checkpoint is keyed by (`trained_spire_draft`), besides its TrainConfig."""
    return {"kind": "spire-draft", "spire": spire_cfg.to_dict(), "target": target_hash, "data": data.dataset.checksum}


def planned_run_dirs(target_cfg: ModelConfig, target_training: TrainConfig | None, data: Data,
                     imported: Path | None = None) -> tuple[str, Path | None, Callable, Callable]:
    """Where the recipes will keep their checkpoints, before any is trained (`spirelib.workbook.work`):
    (the target's config hash, its run folder (None for an imported target), the vanilla draft's
    folder as a function of its TrainConfig, a SPIRe draft's as a function of its SpireConfig and
    TrainConfig)."""
    from spirelib.training import hf_export

    if imported is not None:
        target_hash, target_dir = hf_export.checkpoint_digest(imported), None
    else:
        ident = full_identity(target_training, language_model_identity(target_cfg, data))
        target_hash, target_dir = config_hash(ident), run_dir_for(TARGET, ident)
    vanilla = vanilla_draft_config(target_cfg)

    def vanilla_dir(train_cfg: TrainConfig) -> Path:
        return run_dir_for(VANILLA, full_identity(train_cfg, language_model_identity(vanilla, data,
                                                                                     {"target": target_hash})))

    def spire_dir(spire_cfg: SpireConfig, train_cfg: TrainConfig) -> Path:
        return run_dir_for(SPIRE, full_identity(train_cfg, spire_identity(spire_cfg, data, target_hash)))

    return target_hash, target_dir, vanilla_dir, spire_dir


def token_data(corpus: str, corpus_path: str, tokenizer, vocab_size: int) -> Data:
    """Corpus -> split -> tokenizer -> cached token memmaps. `tokenizer` names a kind
    (`tokenizer.build_tokenizer`: "bpe" is trained on the training split) or is a ready
    tokenizer (an imported target's, `hf_tokenizer.load_tokenizer`); token caches are keyed by its checksum."""
    source = load_corpus(corpus, corpus_path)
    if corpus == "longcrawl64":
        ds = longcrawl64_dataset(source)
        return Data(ds, build_tokenizer("gpt2", vocab_size), corpus, (source.train.rows, source.val.rows))
    train_docs, val_docs = split_documents(len(source), VAL_FRACTION, SPLIT_SEED)
    split_key = f"val{VAL_FRACTION}-seed{SPLIT_SEED}"
    tok = (build_tokenizer(tokenizer, vocab_size, source, train_docs, split_key) if isinstance(tokenizer, str)
           else tokenizer)
    return Data(tokenize(source, tok, train_docs, val_docs, split_key), tok, corpus, (len(train_docs), len(val_docs)))


def train_language_model(model_cfg: ModelConfig, train_cfg: TrainConfig, data: Data, *, name: str,
                         session: Session, extra_identity: dict | None = None) -> TrainedModel:
    """Train (or load the cached) Transformer `model_cfg` with next-token cross-entropy, in `session`.

    Cached under cache_dir()/models/<name>-<hash>; the identity covers the model config,
    training config, dataset checksum (corpus + split + tokenizer) and `extra_identity`.
    """
    if model_cfg.vocab_size < data.dataset.vocab_size:
        raise ValueError(f"model vocab_size {model_cfg.vocab_size} < the tokenizer's {data.dataset.vocab_size}")
    identity = language_model_identity(model_cfg, data, extra_identity)
    torch.manual_seed(train_cfg.seed)
    model = Transformer(model_cfg)
    run = TrainingRun(run_dir_for(name, full_identity(train_cfg, identity)), identity)
    result = train(model, lm_objective, data.dataset.train, train_cfg, run=run,
                   validation=Validation(data.dataset.val), session=session)
    return TrainedModel(result.model, model_cfg, train_cfg, result, data, identity)


def for_decoding(target: TrainedModel) -> TrainedModel:
    """A target trained in the run, in the dtype it decodes in: bf16 on a GPU (as an imported
    checkpoint decodes in its stored dtype, and its drafts are cast to it, `drafts.draft_factory`),
    as it is elsewhere (fp32 on the CPU). Its checkpoint keeps the fp32 training weights."""
    param = next(target.model.parameters())
    if param.device.type == "cuda" and param.dtype == torch.float32:
        target.model.to(torch.bfloat16)
    return target


def imported_target(path: Path, data: Data, eval_cfg: TrainConfig, *, device: str = "auto",
                    parallel: str = "ddp") -> TrainedModel:
    """The Hugging Face checkpoint at `path` as the series' target: loaded by
    `hf_weights.load_model` (fp32 on CPU, where bf16 is slow; the stored dtype on GPU), evaluated on
    `eval_cfg.eval_windows` validation windows of `eval_cfg.seq_len` tokens instead of trained.
    Its identity is the sha256 of its config and weight files (`hf_export.checkpoint_digest`).
    Under torchrun with `parallel` "fsdp" it is loaded sharded (`hf_weights.load_model_sharded`: no rank
    holds it whole), and every rank evaluates every window (the sharded forwards run in lockstep)."""
    from spirelib.training import fsdp, hf_export, hf_weights

    dev = resolve_device(device)
    dtype = torch.float32 if dev.type == "cpu" else None
    _, world = init_distributed(dev)
    sharded = parallel == "fsdp" and world > 1
    if sharded:
        model = hf_weights.load_model_sharded(path, fsdp.device_mesh(dev, world), device=dev, dtype=dtype)
    else:
        model = hf_weights.load_model(path, device=dev, dtype=dtype).eval()
    if model.cfg.vocab_size < data.dataset.vocab_size:
        raise ValueError(f"{path}: the model's vocabulary {model.cfg.vocab_size} is smaller than its tokenizer's "
                         f"{data.dataset.vocab_size}")
    windows = validation_windows(data.dataset.val, eval_cfg.eval_windows, eval_cfg.seq_len + 1, eval_cfg.seed)
    summary = {"steps": 0, "tokens": 0, "tokens_per_s": float("nan"), "device": str(dev), "imported_from": str(path),
               "world_size": world if sharded else 1,
               **evaluate(model, lm_objective, windows, eval_cfg.batch_size, dev)}
    identity = {"kind": "imported-language-model", "checkpoint": hf_export.checkpoint_digest(path)}
    result = TrainResult(model, Path(path), {"config_hash": identity["checkpoint"], "summary": summary}, [], reused=True)
    return TrainedModel(model, model.cfg, eval_cfg, result, data, identity)


def trained_vanilla_draft(target: TrainedModel, train_cfg: TrainConfig, *, session: Session) -> TrainedModel:
    """The vanilla SD draft for `target` (method §4): `config.vanilla_draft_config` of its shape,
    random init, next-token cross-entropy on the target's data, in `session`; retrained when the
    target changes."""
    return train_language_model(vanilla_draft_config(target.config), train_cfg, target.data, name=VANILLA,
                                session=session, extra_identity={"target": target.config_hash})


def trained_spire_draft(target: TrainedModel, spire_cfg: SpireConfig, train_cfg: TrainConfig, *,
                        session: Session, name: str = SPIRE) -> TrainedModel:
    """A SPIRe draft for `target` (method §3; an ablation is a change to `spire_cfg`,
    `config.ABLATIONS`): k-pass training against the frozen target with the configured loss, in
    `session`; cached, retrained when the target changes. The metrics log has alpha_1..alpha_k per
    step and validation (the acceptance estimate).

    Under torchrun with `session.parallel` "fsdp" the frozen target is sharded block by block (in place,
    once: `fsdp.shard_frozen_target`; an imported one already is), the loss reads a replicated copy
    of its head (`fsdp.teacher_head`), and the draft, built on the meta device, trains sharded
    (`train`), each rank's shards filled from the target's (`fsdp.init_spire_draft`)."""
    identity = spire_identity(spire_cfg, target.data, target.config_hash)
    torch.manual_seed(train_cfg.seed)  # the random_init ablation's weights (drawn by from_target or by train)
    dev = resolve_device(session.device)
    _, world = init_distributed(dev)
    frozen = target.model.to(dev)
    sharded = session.parallel == "fsdp" and world > 1
    initialize = None
    if sharded:
        from torch.distributed.fsdp import FSDPModule

        from spirelib.training import fsdp

        head = fsdp.teacher_head(frozen)
        if not isinstance(frozen, FSDPModule):
            fsdp.shard_frozen_target(frozen, fsdp.device_mesh(dev, world), dev)
        objective = SpireObjective(frozen, head)
        # no rank builds the draft whole: its shards are filled from the target's local ones once sharded
        model = SpireDraftModel.from_target(frozen, spire_cfg, device="meta")
        initialize = partial(fsdp.init_spire_draft, target=frozen)
    else:
        model = SpireDraftModel.from_target(frozen, spire_cfg)
        objective = SpireObjective(frozen)
    run = TrainingRun(run_dir_for(name, full_identity(train_cfg, identity)), identity)
    result = train(model, objective, target.data.dataset.train, train_cfg, run=run,
                   validation=Validation(target.data.dataset.val), session=session, initialize=initialize)
    return TrainedModel(result.model, spire_cfg, train_cfg, result, target.data, identity)


def initial_spire_metrics(target: TrainedModel, spire_cfg: SpireConfig, train_cfg: TrainConfig, *,
                          device: str = "auto") -> dict[str, float]:
    """The validation metrics of a SPIRe draft at step 0, before any training: the draft
    `trained_spire_draft` starts from (the pruned init, or the random_init ablation's weights from
    the same seed), scored by the same objective on the same validation windows as the trainer's
    evaluations ("val_loss", "alpha", "alpha_1".., "distill_ce", "hard_ce"): the learning curve's
    first point."""
    dev = resolve_device(device)
    torch.manual_seed(train_cfg.seed)  # as trained_spire_draft: the random_init ablation's weights
    frozen = target.model.to(dev)
    model = SpireDraftModel.from_target(frozen, spire_cfg)
    windows = validation_windows(target.data.dataset.val, train_cfg.eval_windows, train_cfg.seq_len + 1,
                                 train_cfg.seed)
    with torch.no_grad():
        return evaluate(model, SpireObjective(frozen), windows, train_cfg.batch_size, dev)


def training_mfu(trained: TrainedModel) -> dict:
    """MFU of a training run against the peak measured now on the device it trained on:
    fp32 on CPU, bf16 (autocast) on GPU. {"peak_flops", "mfu", "run_mfu", "device"}: `mfu` of
    the steady state (timed steps: the first, compiling step, evaluations and checkpoints
    excluded), `run_mfu` of the run's wall clock (all of them included; None for a checkpoint
    that predates the figure). Both are None when that device is not present here (e.g. a
    GPU-trained checkpoint loaded on a laptop). Under torchrun the run's tokens/s are every
    rank's together: MFU divides them by the world size, each rank against one device's peak."""
    from spirelib.measure.calibrate import matmul_peak

    device = torch.device(trained.summary["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        return {"peak_flops": None, "mfu": None, "run_mfu": None, "device": str(device)}
    if device.type == "cuda":
        peak = matmul_peak(sizes=(8192,), device=str(device), dtype=torch.bfloat16)["flops"]
    else:
        peak = matmul_peak(seconds=0.2, repeats=2)["flops"]
    n = flop_params(trained.config)
    world = trained.summary.get("world_size", 1)
    run = trained.summary.get("run_tokens_per_s")
    return {"peak_flops": peak, "mfu": training_flops(n, trained.summary["tokens_per_s"] / world) / peak,
            "run_mfu": None if run is None else training_flops(n, run / world) / peak, "device": str(device)}
