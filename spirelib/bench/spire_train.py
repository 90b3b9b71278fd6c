"""`spire bench spire-train`: SPIRe draft training throughput (method §3.6).

On one training batch of the chosen shapes, the forward + backward time of k-pass training against
an ordinary transformer of the draft's shape (goal: ratio >= 0.9) and against training block by
block, and a real training step of the trainer's own objective, whole and in its parts (`run`).
Tokens/s count the training positions (B x T). `--hf-config config.json` takes the target's shapes
from a Hugging Face config (no weights are read), e.g. a 135M Llama with its 49,152-token vocabulary.

Measured results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from spirelib.bench import positive
from spirelib.measure.wallclock import repeat_seconds as _time
from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.model.spire import SpireDraftModel, block_positions
from spirelib.model.transformer import Transformer
from spirelib.training.losses import head_draft_losses
from spirelib.training.objectives import SpireObjective

#: The rows, in the order printed: the k-pass comparison (goal: k-pass >= 0.9 of ordinary), then a real
#: step and its parts.
ROWS = ("target_forward", "k_pass", "ordinary", "naive", "objective", "teacher", "draft_passes", "heads_and_loss")


def run(target_cfg: ModelConfig, spire_cfg: SpireConfig, batch: int, seq_len: int, k: int, repeats: int,
        naive_blocks: int, device: str = "cpu") -> dict:
    """Forward + backward time (`ROWS`) on one training batch of
    - k-pass: `SpireDraftModel.k_pass_logits` (all blocks of a sequence in k passes),
    - ordinary: a plain `Transformer` of the same shape (n_d layers, the target's width) over the
      same T tokens, the cost k-pass training should stay close to,
    - naive: the same draft trained block by block, k one-query passes per block (T sequential
      passes per sequence; the first `naive_blocks` blocks, scaled), what training would cost
      without the k-pass formulation,
    and, separately, the frozen target's forward that supplies activations and distributions. The
    loss of those three is a stand-in (mean logsumexp), the same for every variant, so only the
    model's forward/backward is compared. Then the trainer's own objective (`SpireObjective`),
    whole ("objective": the teacher's forward, the draft's k passes, MixedLoss fused with both
    unembeddings, backward) and in its parts: "teacher" (the target's residual stream, no grad),
    "draft passes" (the k passes forward and backward, no unembedding) and "heads and loss"
    (`losses.head_draft_losses`: both unembeddings, the loss and its gradient, chunked). Each
    position's logits come from one pass only (the pass that predicts it), so a step runs each
    unembedding once per position, not k times."""
    torch.manual_seed(0)
    target = Transformer(target_cfg).to(device).eval()
    draft = SpireDraftModel.from_target(target, spire_cfg)
    plain = Transformer(draft.body.cfg).to(device)
    tokens = torch.randint(0, target_cfg.vocab_size, (batch, seq_len), device=device)
    with torch.no_grad():
        memory = target.residual_stream(tokens, layers=draft.memory_layers)  # (n_d, B, T, d_model)
    positions = block_positions(seq_len, k, device)

    def target_forward():
        with torch.no_grad():
            target.head(target.residual_stream(tokens, layers=(*draft.memory_layers, target_cfg.num_layers))[-1])

    def k_pass():
        draft.zero_grad(set_to_none=True)
        logits, _ = draft.k_pass_logits(tokens, memory, k)
        logits.logsumexp(-1).mean().backward()

    def ordinary():
        plain.zero_grad(set_to_none=True)
        plain(tokens).logsumexp(-1).mean().backward()

    def naive():  # the first `naive_blocks` blocks one at a time; scaled to the whole sequence below
        draft.zero_grad(set_to_none=True)
        for b in range(naive_blocks):
            logits, _ = draft.k_pass_logits(tokens, memory, k, positions[b : b + 1])
            logits.logsumexp(-1).mean().backward()

    objective = SpireObjective(target)
    batch_tokens = torch.cat([tokens, tokens[:, :1]], dim=1)  # (B, T + 1): inputs and shifted labels
    hidden, hidden_positions = draft.k_pass_hidden(tokens[:, :-1], memory[:, :, :-1], k)
    hidden = hidden.detach().requires_grad_(True)  # (B, n_blocks, k, d_model)
    with torch.no_grad():
        teacher_x = target.norm(target.hidden(tokens[:, :-1])[:, hidden_positions])  # (B, n_blocks, k, d_model)

    def real_step():
        draft.zero_grad(set_to_none=True)
        objective(draft, batch_tokens)[0].backward()

    def teacher():
        with torch.no_grad():
            target.residual_stream(tokens, layers=(*draft.memory_layers, target_cfg.num_layers))

    def draft_passes():
        draft.zero_grad(set_to_none=True)
        draft.k_pass_hidden(tokens[:, :-1], memory[:, :, :-1], k)[0].square().mean().backward()

    def heads_and_loss():
        draft.zero_grad(set_to_none=True)
        hidden.grad = None
        loss, _ = head_draft_losses(draft.body.norm(hidden), draft.body.unembed.weight, teacher_x,
                                    target.unembed.weight, tokens[:, 1:][:, hidden_positions], draft.cfg.mix_weight)
        loss.backward()

    tokens_per_step = batch * seq_len
    results = {}
    for name, fn, scale in [("target_forward", target_forward, 1.0), ("k_pass", k_pass, 1.0),
                            ("ordinary", ordinary, 1.0), ("naive", naive, positions.shape[0] / naive_blocks),
                            ("objective", real_step, 1.0), ("teacher", teacher, 1.0),
                            ("draft_passes", draft_passes, 1.0), ("heads_and_loss", heads_and_loss, 1.0)]:
        times = [t * scale for t in _time(fn, repeats, device=device)]
        results[name] = {"best_s": min(times), "median_s": statistics.median(times),
                         "tokens_per_s": tokens_per_step / min(times)}
    results["k_pass_vs_ordinary"] = results["k_pass"]["tokens_per_s"] / results["ordinary"]["tokens_per_s"]
    results["k_pass_vs_naive"] = results["k_pass"]["tokens_per_s"] / results["naive"]["tokens_per_s"]
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf-config", help="a Hugging Face config.json: the target's shapes (replaces the options "
                        "--vocab-size .. --d-ff)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--target-layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-kv", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=32)
    parser.add_argument("--d-ff", type=int, default=512)
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-blocks", type=int, default=4, help="blocks timed for the naive variant (extrapolated)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def problems(args: argparse.Namespace) -> list[str]:
    return positive(args, "vocab_size", "target_layers", "d_model", "n_kv", "d_head", "d_ff", "draft_layers",
                    "window", "batch", "seq_len", "k", "repeats", "naive_blocks")


def target_config(args: argparse.Namespace) -> ModelConfig:
    """The target's shapes: a Hugging Face config.json's (`--hf-config`), or the options'."""
    if args.hf_config:
        import json
        from pathlib import Path

        from spirelib.training.hf_config import config_from_hf

        return config_from_hf(json.loads(Path(args.hf_config).read_text()))
    return ModelConfig(vocab_size=args.vocab_size, num_layers=args.target_layers, d_model=args.d_model, n_q_per_kv=1,
                       n_kv=args.n_kv, d_head=args.d_head, d_ff=args.d_ff)


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    target_cfg = target_config(args)
    results = run(target_cfg, SpireConfig(num_layers=args.draft_layers, window=args.window), args.batch,
                  args.seq_len, args.k, args.repeats, args.naive_blocks, args.device)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"SPIRe draft training, B={args.batch} T={args.seq_len} k={args.k} window={args.window}, "
          f"target {target_cfg.num_layers}x{target_cfg.d_model} (vocabulary {target_cfg.vocab_size}), "
          f"draft {args.draft_layers} layers, {torch.get_num_threads()} threads")
    for name in ROWS:
        r = results[name]
        print(f"  {name:15s} {r['best_s'] * 1e3:9.1f} ms (median {r['median_s'] * 1e3:.1f})  {r['tokens_per_s']:10.0f} tokens/s")
    print(f"  k-pass / ordinary throughput: {results['k_pass_vs_ordinary']:.2f} (goal >= 0.9)")
    print(f"  k-pass / naive throughput:    {results['k_pass_vs_naive']:.1f}x")
    parts = {name: results[name]["median_s"] for name in ("teacher", "draft_passes", "heads_and_loss")}
    print("  a real step (objective) by part: " + ", ".join(
        f"{name} {s / results['objective']['median_s']:.0%}" for name, s in parts.items()))
    return 0
