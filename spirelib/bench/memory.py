"""`spire bench memory`: peak memory of one training step at the paper's shapes.

One training step (forward, backward, AdamW step, its state allocated) at the paper's target shape
(8 layers x 512, 8 kv heads of 128, d_ff 4096, V 50,304) of: `target` (`Transformer.loss`, fused
unembedding + cross-entropy), `vanilla` (`config.vanilla_draft_config` of it), `spire` (the SPIRe
draft, 2 layers, with `SpireObjective`: `losses.head_draft_losses`) and, for comparison,
`spire-logits` (the same through materialized logits: `k_pass_logits`, `losses.draft_losses`); on
the CPU in fp32, each in a fresh subprocess (`measure`), then per token and fixed (`table`).

`--stream-only` computes the target activations a SPIRe draft holds (`residual_stream_rows`),
`--ranks` the per-rank memory under ddp and fsdp (`_print_ranks`), `--simulate` traces the sharded
trainer with fake tensors (`spirelib.training.simulate`): computed or simulated, not measured.
Measured results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys

from spirelib.bench import positive
from spirelib.throughput.perfmodel import PRESETS

PAPER_TARGET = dict(num_layers=8, d_model=512, n_q_per_kv=1, n_kv=8, d_head=128, d_ff=4096)
#: Where a SPIRe draft's target activations weigh most: big targets (bf16), the draft at the paper's
#: ratio (a quarter of the target's layers), a training batch and a tau prefill (B, tokens per row).
STREAM_CASES = (("llama3-8b", "training", 64, 1024), ("llama3-8b", "tau prefill", 256, 960),
                ("llama3-70b", "training", 64, 1024), ("llama3-70b", "tau prefill", 256, 960))
PAPER_VOCAB = 50_304
MODELS = ("target", "vanilla", "spire", "spire-logits")


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def _trim() -> None:
    """Return freed heap memory to the system (glibc), so the resident set is what is live."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(model: str, batch: int, seq_len: int, vocab: int, k: int = 4, window: int = 64,
            shape: dict | None = None) -> dict:
    """Peak bytes of one training step of `model` (in this process; call it in a fresh one, `_child`);
    `shape`: the target's ModelConfig fields other than the vocabulary (default: the paper's).

    The peak resident set during the step (VmHWM, reset through /proc/self/clear_refs just before
    it, freed heap returned first) minus the resident set after `import torch` (the interpreter
    and libraries): it includes the weights (and the frozen target's), the gradients and AdamW's
    two moments. The step's peak is the larger of two phases, measured apart: forward + backward
    (weights, AdamW's moments, allocated beforehand as in every step after the first, gradients
    and activations) and the optimizer step (weights, moments, gradients, AdamW's temporaries; it
    does not grow with the batch)."""
    import torch

    base = _status("VmRSS")
    from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config
    from spirelib.model.spire import SpireDraftModel
    from spirelib.model.transformer import Transformer
    from spirelib.training.config import TrainConfig
    from spirelib.training.losses import draft_losses
    from spirelib.training.objectives import SpireObjective, lm_objective
    from spirelib.training.train import make_optimizer

    torch.manual_seed(0)
    target_cfg = ModelConfig(vocab_size=vocab, **(shape or PAPER_TARGET))
    if model in ("target", "vanilla"):
        trained = Transformer(target_cfg if model == "target" else vanilla_draft_config(target_cfg))
        objective = lm_objective
    else:
        target = Transformer(target_cfg)
        trained = SpireDraftModel.from_target(target, SpireConfig(num_layers=2, window=window, k=k))
        objective = SpireObjective(target)
        if model == "spire-logits":
            def objective(draft, batch, frozen=objective.target):  # the unfused objective, through logits
                inputs, labels = batch[:, :-1], batch[:, 1:]
                with torch.no_grad():
                    stream = frozen.residual_stream(inputs, layers=(*draft.memory_layers, frozen.cfg.num_layers))
                    target_logits = frozen.head(stream[-1])  # (B, T, V)
                logits, positions = draft.k_pass_logits(inputs, stream[:-1], k)  # (B, n_blocks, k, V)
                return draft_losses(logits, target_logits[:, positions], labels[:, positions], 0.5)
    opt = make_optimizer(trained, TrainConfig(steps=1))
    for p in trained.parameters():  # AdamW's moments exist from the second step on: allocate them
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1))
    setup = _status("VmRSS")

    def peak_of(fn) -> int:
        _trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        fn()
        return _status("VmHWM") - base

    def forward_backward():
        objective(trained, tokens)[0].backward()

    fb, step = peak_of(forward_backward), peak_of(opt.step)
    return {"model": model, "batch": batch, "seq_len": seq_len, "vocab": vocab, "setup_bytes": setup - base,
            "forward_backward_bytes": fb, "optimizer_bytes": step, "peak_bytes": max(fb, step),
            "params": sum(p.numel() for p in trained.parameters())}


def _child(model: str, batch: int, seq_len: int, vocab: int, threads: int) -> dict:
    # Every allocation of 64 KiB or more its own mapping, unmapped when freed: the resident set
    # follows the live tensors (glibc otherwise keeps freed heap resident).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-m", "spirelib", "bench", "memory", "--child", model, str(batch),
                          str(seq_len), str(vocab)], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{model} B={batch} V={vocab} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def residual_stream_rows(bytes_per_value: int = 2) -> list[dict]:
    """The target's residual stream a SPIRe draft's training step or tau prefill holds, in bytes:
    keeping every entry (n_layers + 1), and keeping only those it reads
    (`Transformer.residual_stream(layers=...)`: the n_d inputs of the pruned layers, and in training
    the last entry for the loss)."""
    rows = []
    for name, what, batch, tokens in STREAM_CASES:
        shape = PRESETS[name]
        n_d = shape.num_layers // 4
        entry = batch * tokens * shape.d_model * bytes_per_value  # one (B, T, d_model) entry
        kept = n_d + 1 if what == "training" else n_d
        rows.append({"target": name, "case": what, "batch": batch, "tokens": tokens, "draft_layers": n_d,
                     "entries_before": shape.num_layers + 1, "entries_now": kept,
                     "before_bytes": (shape.num_layers + 1) * entry, "now_bytes": kept * entry})
    return rows


def table(results: list[dict], seq_len: int, vocab: int, small_vocab: int, budget: float = 80e9) -> list[dict]:
    """Per model: bytes per training token and fixed bytes, at both vocabularies, their
    difference (the part that scales with V) and the batch that fits `budget` at `vocab`.

    Per training token = (forward + backward peak at batch 2 - at batch 1) / seq_len: what grows
    with B x T; fixed = the batch-1 peak - seq_len x per token. Their difference between the two
    vocabularies is the part that scales with V (per token: the (tokens, V) tensors; fixed: the
    embedding and unembedding with gradient and moments, the loss chunks). The budget fits batch
    (budget - fixed) / (per token x seq_len), by extrapolation, if the optimizer phase fits too."""
    at = {(r["model"], r["batch"], r["vocab"]): r for r in results}
    rows = []
    for model in dict.fromkeys(r["model"] for r in results):
        row = {"model": model}
        for v, name in ((vocab, "V"), (small_vocab, "small")):
            fb1, fb2 = at[model, 1, v]["forward_backward_bytes"], at[model, 2, v]["forward_backward_bytes"]
            per_token = (fb2 - fb1) / seq_len
            row[f"per_token_{name}"] = per_token
            row[f"fixed_{name}"] = fb1 - per_token * seq_len
            row[f"optimizer_{name}"] = max(at[model, b, v]["optimizer_bytes"] for b in (1, 2))
            row[f"peak_b1_{name}"], row[f"peak_b2_{name}"] = at[model, 1, v]["peak_bytes"], at[model, 2, v]["peak_bytes"]
        row["per_token_from_V"] = row["per_token_V"] - row["per_token_small"]
        row["fixed_from_V"] = row["fixed_V"] - row["fixed_small"]
        fits = budget >= row["optimizer_V"]
        row["batch_in_budget"] = int((budget - row["fixed_V"]) // (row["per_token_V"] * seq_len)) if fits else 0
        rows.append(row)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=PAPER_VOCAB)
    parser.add_argument("--small-vocab", type=int, default=512, help="the second vocabulary, for the V-scaling part")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-gb", type=float, default=80.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--stream-only", action="store_true",
                        help="only the residual-stream table at Llama 3 8B and 70B shapes (computed, not measured)")
    parser.add_argument("--ranks", action="store_true",
                        help="per-rank memory of SPIRe training on Llama 3 8B/70B under ddp and fsdp (computed)")
    parser.add_argument("--simulate", action="store_true",
                        help="trace the sharded trainer's real step with fake tensors on a fake process group at the "
                             "params files' shapes and world sizes (spirelib.training.simulate; simulated, not measured)")
    parser.add_argument("--cases", nargs="+", default=[], metavar="TEXT",
                        help="with --simulate: only the cases whose name contains one of these")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "BATCH", "SEQ_LEN", "VOCAB"), help=argparse.SUPPRESS)


def problems(args: argparse.Namespace) -> list[str]:
    return positive(args, "seq_len", "vocab_size", "small_vocab", "threads", "budget_gb")


def main(args: argparse.Namespace) -> int:
    if args.child:  # one measurement, in the fresh process `_child` started
        model, batch, seq_len, vocab = args.child[0], *map(int, args.child[1:])
        print(json.dumps(measure(model, batch, seq_len, vocab)))
        return 0
    if args.ranks:
        return _print_ranks(args.budget_gb * 1e9, args.json)
    if args.simulate:
        return _print_simulated(args.cases, args.budget_gb * 1e9, args.json)
    stream = residual_stream_rows()
    results, rows = [], []
    if not args.stream_only:
        results = [_child(m, b, args.seq_len, v, args.threads)
                   for m in args.models for v in (args.vocab_size, args.small_vocab) for b in (1, 2)]
        rows = table(results, args.seq_len, args.vocab_size, args.small_vocab, args.budget_gb * 1e9)
    if args.json:
        print(json.dumps({"measurements": results, "table": rows, "residual_stream": stream}, indent=2))
        return 0
    print("target activations a SPIRe draft holds (bf16; draft = a quarter of the target's layers); GB = 1e9 bytes")
    print(f"  {'target':11s} {'case':12s} {'B x T':>11s} {'entries':>11s} {'before GB':>10s} {'now GB':>8s}")
    for r in stream:
        print(f"  {r['target']:11s} {r['case']:12s} {r['batch']:>4} x {r['tokens']:<5} {r['entries_before']:>4} -> "
              f"{r['entries_now']:<4} {r['before_bytes'] / 1e9:10.1f} {r['now_bytes'] / 1e9:8.1f}")
    if args.stream_only:
        return 0
    print(f"peak memory of one training step (fp32, CPU), seq_len {args.seq_len}, V {args.vocab_size:,} "
          f"(V-scaling part: minus V {args.small_vocab:,}); MB = 1e6 bytes")
    print(f"  {'model':13s} {'peak B=1':>9s} {'peak B=2':>9s} {'B/token':>9s} {'of it ~V':>9s} "
          f"{'fixed MB':>9s} {'of it ~V':>9s} {'optim MB':>9s}  batch in {args.budget_gb:g} GB")
    for r in rows:
        print(f"  {r['model']:13s} {r['peak_b1_V'] / 1e6:9.0f} {r['peak_b2_V'] / 1e6:9.0f} {r['per_token_V']:9,.0f} "
              f"{r['per_token_from_V']:9,.0f} {r['fixed_V'] / 1e6:9.0f} {r['fixed_from_V'] / 1e6:9.0f} "
              f"{r['optimizer_V'] / 1e6:9.0f}  {r['batch_in_budget']:,}")
    return 0


RANKS = (1, 2, 4, 8, 16)


def _print_ranks(budget: float, as_json: bool) -> int:
    """The per-rank memory table (`sharding.memory_table`) and the fewest ranks within `budget` bytes:
    SPIRe training on Llama 3 8B and 70B targets (the draft a quarter of the target's layers) under
    ddp and fsdp at 1 to 16 ranks. N=1 is one process (no DDP buckets, no sharding). Under ddp every
    rank holds the whole bf16 target and the whole fp32 draft state; under fsdp the shares fall as
    1/N, down to what a step gathers whole."""
    from spirelib.throughput.sharding import PARALLEL, memory_table, smallest_world

    rows = memory_table(worlds=RANKS)
    fewest = {(t, p): smallest_world(t, p, budget) for t in ("llama3-8b", "llama3-70b") for p in PARALLEL}
    if as_json:
        print(json.dumps({"rows": rows, "fewest": [{"target": t, "parallel": p, "budget_bytes": budget, "world": n}
                                                    for (t, p), n in fewest.items()]}, indent=2))
        return 0
    print("per-rank memory of SPIRe training (draft = a quarter of the target's layers; bf16 frozen target, fp32 "
          "draft + AdamW; batch 64 x 1,024; the draft's activations not included), GB = 1e9 bytes")
    print(f"  {'target':11s} {'parallel':8s} " + " ".join(f"{'N=' + str(n):>7s}" for n in RANKS)
          + f"   fewest N in {budget / 1e9:g} GB")
    for (target, parallel), n in fewest.items():
        totals = {r["world"]: r["total_gb"] for r in rows if r["target"] == target and r["parallel"] == parallel}
        print(f"  {target:11s} {parallel:8s} " + " ".join(f"{totals[w]:7.1f}" for w in RANKS)
              + f"   {n if n is not None else 'none (ddp holds the whole target and draft state on each rank)'}")
    return 0


def _print_simulated(only: list[str], budget: float, as_json: bool) -> int:
    """`simulate.params_cases()` traced one by one (each its own fake process group), one row each."""
    from spirelib.training.simulate import params_cases, peak, simulate

    cases = [c for c in params_cases() if not only or any(text in c.name for text in only)]
    if not cases:
        names = ", ".join(c.name for c in params_cases())
        print(f"no simulated case matches {only}; the cases: {names}", file=sys.stderr)
        return 2
    if not as_json:
        print("SIMULATED (fake tensors, fake process group; not measured on a GPU): one rank's peak device memory "
              "by phase, its host memory, and a step's collectives; GB = 1e9 bytes")
        print(f"  {'case':28s} {'params':>7s} {'fwd+bwd':>8s} {'optim':>7s} {'peak':>7s} {'fits':>5s} "
              f"{'save host':>9s} {'end gather':>10s} {'build':>7s} {'resume':>7s} {'AG/step':>7s} "
              f"{'AG GB/step':>10s} {'RS GB/step':>10s}")
    results = []
    for case in cases:
        r = simulate(case)
        results.append(r)
        if as_json:
            continue
        gb = {k: v["peak_bytes"] / 1e9 for k, v in r["phases"].items()}
        comms = r["comms"]["bytes"]
        print(f"  {r['case']:28s} {r['params'] / 1e9:6.2f}B {gb['forward+backward']:8.1f} {gb['optimizer']:7.1f} "
              f"{peak(r) / 1e9:7.1f} {'yes' if peak(r) <= budget else 'NO':>5s} {r['host']['save'] / 1e9:9.1f} "
              f"{gb['end of run']:10.1f} {r['host']['build'] / 1e9:7.1f} {r['host']['resume'] / 1e9:7.1f} "
              f"{r['comms']['counts'].get('all_gather', 0):7d} {comms.get('all_gather', 0) / 1e9:10.1f} "
              f"{comms.get('reduce_scatter', 0) / 1e9:10.1f}", flush=True)
    if as_json:
        print(json.dumps({"simulated": True, "budget_bytes": budget, "results": results}, indent=2))
    return 0
