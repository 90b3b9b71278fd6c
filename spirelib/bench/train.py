"""`spire bench train`: training throughput and model FLOP utilization (MFU).

Measures, in one process: this machine's fp32 matmul peak (large square matmuls,
`spirelib.measure.calibrate`), then training tokens/s of the default CPU target (or `--preset`'s
model) through the real trainer (`spirelib.training.train.train`, random tokens, AdamW, clipping,
the works; the first step is excluded as warm-up/compilation), and reports

    MFU = 6 x (body params + unembedding) x tokens/s / peak

Attention score FLOPs are not counted (as in method §2), so longer sequences lower MFU.
The peak is measured again after the runs; MFU uses the higher of the two. The draft presets
train the series' SPIRe draft (2 layers, k = 4, its objective compiled as the trainer compiles
it) and EAGLE-3 draft (k = 4, draft vocabulary 2,048) of a freshly initialized default target,
against their own objectives; their MFU counts the draft's layers and unembedding only (the
frozen target's forward, a third or more of their step, is not in it).

Measured results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from spirelib.bench import positive
from spirelib.measure.calibrate import matmul_peak
from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.costs import flop_params, training_flops
from spirelib.throughput.perfmodel import PRESETS
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.eagle3 import Eagle3Objective, new_eagle3_draft
from spirelib.training.objectives import SpireObjective, lm_objective
from spirelib.training.train import Session, TrainingRun, train

# The default CPU target (params/default.yaml: series.target + vocab_size).
DEFAULT_TARGET = ModelConfig(vocab_size=4096, num_layers=8, d_model=64, n_q_per_kv=1, n_kv=4, d_head=32, d_ff=512)
#: The models `--preset` names: the workbook's CPU target and its vanilla draft (4 x 32, method §4), and the
#: paper's target (its seqax 67M, GPT-2 ids padded).
TARGETS = {"workbook": DEFAULT_TARGET, "workbook-vanilla": vanilla_draft_config(DEFAULT_TARGET),
           "paper": ModelConfig(vocab_size=50_304, **dataclasses.asdict(PRESETS["seqax-67m"]))}
#: The drafts `--preset` names, trained against a freshly initialized default target (params/default.yaml's
#: `spire` and `eagle3`), and the model config their MFU counts.
DRAFTS = {"workbook-spire": dataclasses.replace(DEFAULT_TARGET, num_layers=2),
          "workbook-eagle3": dataclasses.replace(DEFAULT_TARGET, num_layers=1, vocab_size=2048)}


def build(preset: str, tokens: np.ndarray):
    """(model, objective) of `preset` (`TARGETS` or `DRAFTS`), from the global generator."""
    if preset in TARGETS:
        return Transformer(TARGETS[preset]), lm_objective
    target = Transformer(DEFAULT_TARGET).eval()
    if preset == "workbook-spire":
        return SpireDraftModel.from_target(target, SpireConfig(num_layers=2, sink=1, window=64, k=4)), SpireObjective(target)
    return new_eagle3_draft(target, Eagle3Config(k=4, draft_vocab=2048), tokens), Eagle3Objective(target)


def measure(preset: str, batch_size: int, seq_len: int, steps: int, compile: bool, device: str = "cpu") -> dict:
    """Tokens/s of `steps` training steps (first excluded) of a fresh `preset` model on random tokens."""
    vocab = TARGETS.get(preset, DEFAULT_TARGET).vocab_size
    tokens = np.random.default_rng(0).integers(0, vocab, 200_000)
    docs = FlatDocs(tokens, np.array([0]), np.array([len(tokens)]))
    cfg = TrainConfig(batch_size=batch_size, seq_len=seq_len, steps=steps, compile=compile, eval_windows=1,
                      checkpoint_every=10**9, log_every=10**9)
    torch.manual_seed(0)
    model, objective = build(preset, tokens)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        result = train(model, objective, docs, cfg, run=TrainingRun(Path(tmp), {"bench": True}),
                       session=Session(device, progress=False))
        wall = time.perf_counter() - t
    return {"tokens_per_s": result.summary["tokens_per_s"], "first_step_s": result.summary["first_step_s"],
            "wall_s": wall}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12, help="training steps per repeat (first one untimed)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", choices=["on", "off", "both"], default="both")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--preset", choices=[*TARGETS, *DRAFTS], default="workbook",
                        help="the model trained: the workbook's target, 8 x 64 (default), its vanilla draft, 4 x 32, "
                        "its SPIRe or EAGLE-3 draft (against a fresh target), or the paper's target, 8 x 512, V 50,304")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (on a GPU: bf16 autocast, bf16 peak)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def problems(args: argparse.Namespace) -> list[str]:
    return positive(args, "batch_size", "seq_len", "steps", "repeats")


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = TARGETS.get(args.preset) or DRAFTS[args.preset]
    n_flops = flop_params(cfg)
    gpu = torch.device(args.device).type == "cuda"

    def peak_now():  # what training computes in: fp32 on the CPU, bf16 (autocast) on a GPU
        return matmul_peak(sizes=(8192,), device=args.device, dtype=torch.bfloat16) if gpu else matmul_peak()
    peak_before = peak_now()
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.compile]
    runs = {m: [measure(args.preset, args.batch_size, args.seq_len, args.steps, m, args.device) for _ in range(args.repeats)]
            for m in modes}
    peak_after = peak_now()
    peak = max(peak_before["flops"], peak_after["flops"])

    report = {"model": cfg.to_dict(), "flop_params": n_flops, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "threads": torch.get_num_threads(), "device": args.device, "peak_flops": peak,
              "peak_before": peak_before["flops"], "peak_after": peak_after["flops"], "modes": {}}
    for m, rs in runs.items():
        tps = [r["tokens_per_s"] for r in rs]
        report["modes"]["compiled" if m else "eager"] = {
            "tokens_per_s_best": max(tps), "tokens_per_s_all": tps, "mfu_best": training_flops(n_flops, max(tps)) / peak,
            "mfu_median": training_flops(n_flops, statistics.median(tps)) / peak, "first_step_s": [r["first_step_s"] for r in rs]}
        # The first repeat's first step includes compilation (unless inductor's disk cache has it).
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"model: {cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.n_kv}x{cfg.n_q_per_kv} heads of {cfg.d_head}, "
          f"d_ff {cfg.d_ff}, vocab {cfg.vocab_size}; {n_flops:,} FLOP-params; batch {args.batch_size} x {args.seq_len}; "
          f"{report['threads']} threads")
    print(f"{'bf16' if gpu else 'fp32'} matmul peak on {args.device}: {peak_before['flops'] / 1e9:.0f} GFLOP/s before, "
          f"{peak_after['flops'] / 1e9:.0f} after")
    for name, r in report["modes"].items():
        spread = ", ".join(f"{t:,.0f}" for t in r["tokens_per_s_all"])
        print(f"{name:9s} best {r['tokens_per_s_best']:,.0f} tokens/s  MFU best {r['mfu_best']:.1%} "
              f"(median {r['mfu_median']:.1%}; runs: {spread}; first step {r['first_step_s'][0]:.1f} s)")
    return 0
