"""`spire bench peer`: our decoding engine against Hugging Face transformers on the same weights.

The target (random weights; on the CPU the default series' shape in fp32, on a GPU the paper's
target in bf16: `device_defaults`) is exported as a Hugging Face Llama checkpoint and loaded by
`transformers`, so both sides decode the very same weights (`Peer`). Greedy decoding, G new tokens
per row, at every (B, L) cell, in three modes (`Peer.sides`): eager, compiled, and assisted (B = 1
only). Per side, cell and mode: the whole generation, the prefill and the decode step (`Times`),
the sides taking turns over fresh contexts after warm-ups that record every graph (`time_cell`),
ours / transformers as a speed ratio (`ratio_row`: above 1, ours is faster). Greedy tokens of both
sides are compared at every cell and mode; a row that differs beyond a near-tie (`differing_rows`)
is reported and the exit status is 1.

transformers is optional: `pip install 'transformers>=4.56'` (in the `test` extra) to run this.
Measured results, dated, with the machine and the command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from spirelib.bench import (
    DTYPES,
    MODEL_OPTIONS,
    TIE_LOGITS,
    add_model_arguments,
    device_problems,
    fill_model_options,
    greedy_mismatch,
    model_config,
    positive,
    replayed,
    synchronize,
    torch_dtype,
)
from spirelib.decoding.drafts import VanillaDraft
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import vanilla_draft_config
from spirelib.model.transformer import Transformer

MODES = ("eager", "compiled", "assisted")
BATCHES, CONTEXTS = (1, 16, 64), (256, 960, 2048)  # the CPU's default cells: every B at every L
#: The default cells on a GPU (the paper's target in bf16): one row at a short context, a full batch at a long one.
GPU_CELLS = [(1, 512), (64, 2048)]
INSTALL = "spire bench peer needs transformers: pip install 'transformers>=4.56' (it comes with the project's test extra)"


def import_transformers():
    """The `transformers` module, or a RuntimeError that says how to install it."""
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError(INSTALL) from e
    return transformers


@dataclass
class Side:
    """One way of decoding: `generate(contexts (B, L), G) -> tokens (B, G)` (greedy)."""

    name: str
    generate: object


@dataclass
class Times:
    """Seconds per repeat of one side at one cell and mode: the whole generation (G tokens) and the
    prefill (a generation of 1 token: both sides then take the first token from the prefill's
    logits or one forward more, as their code does), and how many round graphs of ours were still
    recorded inside kept timings after their retakes (`bench.replayed`; not 0 flags the row)."""

    whole: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    tokens: torch.Tensor | None = None  # the last repeat's greedy tokens (B, G)
    contexts: torch.Tensor | None = None  # the last repeat's contexts (B, L)
    recorded: int = 0

    def step(self, new_tokens: int) -> list[float]:
        """Per-decode-step seconds of each repeat: (whole - prefill) / (G - 1)."""
        return [(w - p) / (new_tokens - 1) for w, p in zip(self.whole, self.prefill)]


class Peer:
    """Both sides' models on the same weights: ours (eager and a compiled copy) and transformers'
    (eager and one whose forward is compiled), the vanilla draft beside each for `assisted`.
    `target` and `draft` (on the CPU, in the dtype both sides decode in) are exported first, then
    every model moves to `device`. `tie`: how close the top two logits of a near-tie are (0 in
    fp32: every different token counts).

    In bf16 the weights are cast before the export, so both sides still hold the very same values.
    On a GPU, transformers' `generate` with the static cache also compiles its decoding call itself
    (`CompileConfig`: CUDA graphs); ours replays its own graphs. Below fp32, two engines' kernels
    round differently, so a greedy row may take the runner-up where the top two logits are within
    `bench.TIE_LOGITS`: such rows are counted as ties, not differences."""

    def __init__(self, target: Transformer, draft: Transformer, folder: Path, k: int, device: str = "cpu"):
        transformers = import_transformers()
        from spirelib.training.hf_export import save_model

        transformers.utils.logging.set_verbosity_error()  # its deprecation notes would drown the table
        transformers.utils.logging.disable_progress_bar()

        self.k, self.device = k, torch.device(device)
        dtype = next(target.parameters()).dtype
        self.tie = 0.0 if dtype == torch.float32 else TIE_LOGITS
        save_model(target, folder / "target")
        save_model(draft, folder / "draft")
        target, draft = target.to(self.device), draft.to(self.device)
        self.ours = {"eager": target, "draft": draft}
        compiled = Transformer(target.cfg).to(device=self.device, dtype=dtype).eval()
        compiled.load_state_dict(target.state_dict())
        self.ours["compiled"] = compiled.compile_decoding()

        def load(name):
            return transformers.AutoModelForCausalLM.from_pretrained(folder / name, dtype=dtype).to(self.device).eval()

        self.theirs = {"eager": load("target"), "draft": load("draft")}
        fast = load("target")
        fast.forward = torch.compile(fast.forward, dynamic=False)
        self.theirs["compiled"] = fast
        config = self.theirs["draft"].generation_config  # assisted generation reads k from the assistant's config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
        config.assistant_confidence_threshold = 0.0

    def sides(self, mode: str) -> tuple[Side, Side]:
        """(ours, transformers') greedy generators for `mode`:
        - "eager": our `autoregressive_generate` against transformers' `generate` (its dynamic cache);
        - "compiled": our `Transformer.compile_decoding()` against `generate` with
          `cache_implementation="static"` and the model's forward under `torch.compile(dynamic=False)`
          (prefill and decode steps compiled, static shapes: what transformers documents for speed);
        - "assisted" (B = 1 only): our speculative decoding with the vanilla draft (method §4 shape,
          k drafts a round) against assisted generation with the same draft exported too, k
          assistant tokens a round (constant schedule, no confidence cut: the same rounds as ours)."""
        k, ours, theirs = self.k, self.ours, self.theirs

        def hf(model, **options):
            def run(contexts, new_tokens):
                out = model.generate(contexts, attention_mask=torch.ones_like(contexts), do_sample=False,
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens, **options)
                return out[:, contexts.shape[1]:]
            return run

        if mode == "assisted":
            return (Side("ours", lambda c, g: speculative_generate(
                        ours["eager"], VanillaDraft(ours["draft"], temperature=0.0), c, g, k=k, temperature=0.0).tokens),
                    Side("transformers", hf(theirs["eager"], assistant_model=theirs["draft"])))
        options = {"cache_implementation": "static"} if mode == "compiled" else {}
        return (Side("ours", lambda c, g: autoregressive_generate(ours[mode], c, g, temperature=0.0).tokens),
                Side("transformers", hf(theirs[mode], **options)))


def timed(side: Side, contexts: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    """Seconds of one greedy generation (on a GPU, to the end of its kernels, none of earlier work's
    counted) and its tokens (B, G)."""
    with torch.no_grad():
        synchronize(contexts.device)
        start = time.perf_counter()
        tokens = side.generate(contexts, new_tokens)
        synchronize(contexts.device)
        return time.perf_counter() - start, tokens


def cell_modes(modes: list[str], batch: int) -> list[str]:
    """The modes timed at batch size `batch`: assisted generation only at B = 1."""
    return [m for m in modes if m != "assisted" or batch == 1]


def warm_ups(modes: list[str]) -> int:
    """Untimed runs before `time_cell` times: two with the compiled mode (the first compiles and runs
    each round eagerly, the second records the graphs: ours on a round key's second call, and
    transformers' CUDA graphs on their second call too), else one."""
    return 2 if "compiled" in modes else 1


def time_cell(peer: Peer, batch: int, context: int, modes: list[str], new_tokens: int, repeats: int,
              vocab_size: int) -> dict[str, dict[str, Times]]:
    """mode -> side -> `Times` at (B, L): untimed warm-ups (`warm_ups`), then `repeats` rounds in
    which every mode's sides take turns (the order rotated each repeat) over fresh contexts."""
    pairs = {m: peer.sides(m) for m in cell_modes(modes, batch)}
    times = {m: {s.name: Times() for s in sides} for m, sides in pairs.items()}
    turns = [(m, s) for m, sides in pairs.items() for s in sides]
    warm = warm_ups(modes)
    for run in range(warm + repeats):
        contexts = torch.randint(0, vocab_size, (batch, context),
                                 generator=torch.Generator().manual_seed(run)).to(peer.device)  # (B, L)
        shift = run % len(turns)
        for mode, side in turns[shift:] + turns[:shift]:
            (whole, tokens), recorded = replayed(partial(timed, side, contexts, new_tokens))
            (prefill, _), recorded_too = replayed(partial(timed, side, contexts, 1))
            if run >= warm:
                t = times[mode][side.name]
                t.whole.append(whole)
                t.prefill.append(prefill)
                t.tokens, t.contexts = tokens, contexts
                t.recorded += recorded + recorded_too
    return times


def ratio_row(ours: list[float], theirs: list[float]) -> dict:
    """transformers' seconds over ours per repeat (above 1: ours faster): median, lowest, highest."""
    ratios = sorted(t / o for o, t in zip(ours, theirs))
    return {"ratio": statistics.median(ratios), "low": ratios[0], "high": ratios[-1],
            "ours_s": statistics.median(ours), "theirs_s": statistics.median(theirs)}


def differing_rows(peer: Peer, ours: Times, theirs: Times) -> tuple[int, int]:
    """(rows whose greedy tokens differ beyond a near-tie, rows that differ only after a near-tie of
    `peer.tie`) in the last repeat; a near-tie is judged on our eager target (`gpu_check.greedy_mismatch`)."""
    differ = (ours.tokens != theirs.tokens).any(dim=1).nonzero().flatten().tolist()
    tied = sum(peer.tie > 0 and greedy_mismatch(peer.ours["eager"], ours.contexts[r:r + 1], theirs.tokens[r:r + 1],
                                                ours.tokens[r:r + 1], peer.tie) is None for r in differ)
    return len(differ) - tied, tied


def rows_of(peer: Peer, batch: int, context: int, times: dict[str, dict[str, Times]], new_tokens: int) -> list[dict]:
    """One row per mode: whole, prefill and decode-step ratios, how many rows' tokens differ (beyond
    a near-tie, and only after one) and the round graphs recorded inside kept timings (`Times`)."""
    rows = []
    for mode, sides in times.items():
        ours, theirs = sides["ours"], sides["transformers"]
        differ, tied = differing_rows(peer, ours, theirs)
        rows.append({"batch": batch, "context": context, "mode": mode,
                     "whole": ratio_row(ours.whole, theirs.whole),
                     "prefill": ratio_row(ours.prefill, theirs.prefill),
                     "step": ratio_row(ours.step(new_tokens), theirs.step(new_tokens)),
                     "rows_differ": differ, "rows_tied": tied, "recorded": ours.recorded + theirs.recorded,
                     "tokens_per_s": {"ours": batch * new_tokens / statistics.median(ours.whole),
                                      "transformers": batch * new_tokens / statistics.median(theirs.whole)}})
    return rows


def parse_cell(text: str) -> tuple[int, int]:
    try:
        batch, context = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a cell is BxL, e.g. 16x960; got {text!r}") from None
    return batch, context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", type=parse_cell, nargs="+", metavar="BxL",
                        help="cells to time (default on cpu every B in 1, 16, 64 at every L in 256, 960, 2048; "
                             "on cuda 1x512 and 64x2048)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--new-tokens", type=int, default=64, help="G, at least 2")
    parser.add_argument("-k", type=int, default=4, help="drafts a round, assisted mode")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per cell (after one warm-up)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="both sides' weights and caches (default fp32 on cpu, bf16 on cuda)")
    add_model_arguments(parser)
    parser.set_defaults(**dict.fromkeys(MODEL_OPTIONS))  # the device's target (`device_defaults`)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def device_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the options left unset filled for its device, in place: on a GPU the paper's
    target (`train.TARGETS["paper"]`) in bf16 at `GPU_CELLS`; on the CPU the default series' target
    (`train.TARGETS["workbook"]`) in fp32 at every B of `BATCHES` and L of `CONTEXTS`."""
    from spirelib.bench.train import TARGETS

    gpu = args.device.startswith("cuda")
    if args.cells is None:
        args.cells = list(GPU_CELLS) if gpu else [(b, c) for c in CONTEXTS for b in BATCHES]
    if args.dtype is None:
        args.dtype = "bf16" if gpu else "fp32"
    fill_model_options(args, TARGETS["paper" if gpu else "workbook"])
    return args


def problems(args: argparse.Namespace) -> list[str]:
    device_defaults(args)
    out = positive(args, "new_tokens", "k", "repeats", *MODEL_OPTIONS) + device_problems(args.device)
    out += [f"--cells: {b}x{c}: B and L must be > 0 and L >= 2" for b, c in args.cells if b < 1 or c < 2]
    if args.new_tokens < 2:
        out.append(f"--new-tokens: the decode step needs G >= 2, got {args.new_tokens}")
    if args.modes == ["assisted"] and all(b != 1 for b, _ in args.cells):
        out.append("--modes assisted runs at B = 1 only: add a cell 1xL")
    try:
        import_transformers()
    except RuntimeError as e:
        out.append(str(e))
    return out


def run(args: argparse.Namespace) -> list[dict]:
    """Every cell of `args.cells`: the rows of `rows_of`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = model_config(device_defaults(args))
    torch.manual_seed(0)
    dtype = torch_dtype(args.dtype)
    target = Transformer(cfg).to(dtype).eval()
    draft = Transformer(vanilla_draft_config(cfg)).to(dtype).eval()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        peer = Peer(target, draft, Path(folder), args.k, args.device)
        for batch, context in args.cells:
            times = time_cell(peer, batch, context, args.modes, args.new_tokens, args.repeats, cfg.vocab_size)
            rows += rows_of(peer, batch, context, times, args.new_tokens)
    return rows


def print_rows(rows: list[dict], args: argparse.Namespace) -> None:
    cfg = model_config(args)
    print(f"peer: target {cfg.num_layers}x{cfg.d_model} (n_kv {cfg.n_kv}, d_head {cfg.d_head}, d_ff {cfg.d_ff}, "
          f"vocab {cfg.vocab_size}), {args.dtype}, G={args.new_tokens}, greedy, {args.device}"
          f"{f', {torch.get_num_threads()} threads' if args.device == 'cpu' else ''}, "
          f"medians of {args.repeats}; ours / transformers as speed (their time / ours), [lowest, highest]")
    print(f"{'B':>3} {'L':>5} {'mode':9} {'whole':>19} {'prefill':>19} {'decode step':>19} {'tokens':>10}")

    def cell(r):
        return f"{r['ratio']:5.2f} [{r['low']:4.2f}, {r['high']:4.2f}]"

    for r in rows:
        same = (f"{r['rows_differ']}/{r['batch']} differ" if r["rows_differ"] else
                f"{r['rows_tied']} near-ties" if r["rows_tied"] else "equal")
        same += f", {r['recorded']} graphs recorded while timed" if r["recorded"] else ""
        print(f"{r['batch']:3d} {r['context']:5d} {r['mode']:9} {cell(r['whole']):>19} {cell(r['prefill']):>19}"
              f" {cell(r['step']):>19} {same:>10}")


def main(args: argparse.Namespace) -> int:
    rows = run(args)
    print(json.dumps(rows, indent=2)) if args.json else print_rows(rows, args)
    differ = [r for r in rows if r["rows_differ"]]
    for r in differ:
        print(f"greedy tokens differ: B={r['batch']} L={r['context']} {r['mode']}: {r['rows_differ']} rows")
    return 1 if differ else 0
