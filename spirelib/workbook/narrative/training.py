"""The words of notebooks 02 and 03: the token data, the target's shape and training budget
(method §2's 20 tokens per parameter), the trained target, its MFU and sampled continuations;
SPIRe's measured training cost; and what each draft's tau is about given its share of the
paper's budget (`budget_sentence`, said by 04, 06 and the run index too)."""

from __future__ import annotations

import math

from spirelib.throughput.costs import flop_params
from spirelib.throughput.hardware import GPU_MFU
from spirelib.throughput.recorded import RecordedBudget, RecordedTrainingCost
from spirelib.units import duration


def data_note(data, series, vocab_size: int) -> str:
    """The token data (`pipeline` data: documents and tokens per split, the longest document),
    the corpus, tokenizer and vocabulary (the model's `vocab_size` beside the tokenizer's), the
    special tokens around each document (`special_tokens_sentence`) and the dataset checksum,
    as Markdown."""
    ds = data.dataset
    return (f"| | documents | tokens | longest document (tokens) |\n|---|---|---|---|\n"
            f"| train | {data.num_documents[0]:,} | {ds.train.num_tokens:,} | {int(ds.train.lengths.max()):,} |\n"
            f"| validation | {data.num_documents[1]:,} | {ds.val.num_tokens:,} | {int(ds.val.lengths.max()):,} |\n\n"
            f"Corpus **{series.corpus}**, tokenizer **{series.tokenizer}** with {ds.vocab_size:,} ids "
            f"(model vocabulary {vocab_size:,}). {special_tokens_sentence(data.tokenizer)} "
            f"Dataset checksum `{ds.checksum[:12]}`.")


def special_tokens_sentence(tokenizer) -> str:
    """Which special tokens the token stream carries (`tokenizer.tokenize`): the BOS before each
    document where the tokenizer has one (an imported checkpoint's post-processor: Llama 3's
    `<|begin_of_text|>`; SmolLM2, Qwen2 and ours none) and the EOS after each."""
    eos = f"`{ascii(tokenizer.eos_token)[1:-1]}` (id {tokenizer.eos_id})"
    if tokenizer.bos_id is None:
        return f"Each document is followed by {eos}; no BOS token precedes it."
    return (f"Each document is preceded by `{ascii(tokenizer.bos_token)[1:-1]}` (id {tokenizer.bos_id}) "
            f"and followed by {eos}.")


def scale_line(cfg, series, tokens: int) -> str:
    """The target's scale in one line (a figure's note): shape, parameters and training tokens
    (or where it was imported from)."""
    source = f"imported from {series.imported}" if series.imported else f"{tokens / 1e6:.2f}M tokens of {series.corpus}"
    return f"{cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.num_params() / 1e6:.2f}M params, " + source


def model_note(cfg, train_cfg, series, steps: int, tokens: int) -> str:
    """The target's shape as a one-row Markdown table, then its training budget and optimizer
    (tokens per parameter against the paper's 20), or, for an imported target, what share of its
    parameters the embeddings hold (a draft shares that vocabulary)."""
    n_total, n_body = cfg.num_params(), cfg.body_params()
    table = (f"| layers | d_model | heads (q per kv x kv) | d_head | d_ff | vocab | body params | all params |\n"
             f"|---|---|---|---|---|---|---|---|\n"
             f"| {cfg.num_layers} | {cfg.d_model} | {cfg.n_q_per_kv} x {cfg.n_kv} | {cfg.d_head} "
             f"| {cfg.d_ff} | {cfg.vocab_size:,} | {n_body:,} | {n_total:,} |\n\n")
    if series.imported:
        return table + (f"**Imported** from `{series.imported}` (`target_source`): evaluated on this corpus, not "
                        f"trained. Its embedding and unembedding hold {1 - n_body / n_total:.0%} of its parameters; "
                        "a draft for it shares that vocabulary, so its unembedding can dominate the draft's cost "
                        "(notebook 03).")
    return table + (f"**Budget:** {steps:,} steps x {train_cfg.batch_size} windows x {train_cfg.seq_len} tokens = "
                    f"**{tokens:,} tokens**, {tokens / n_total:.2f} tokens per parameter (paper: 20). "
                    f"AdamW ({train_cfg.beta1}, {train_cfg.beta2}), peak lr {train_cfg.lr:g}, warm-up "
                    f"{train_cfg.warmup_fraction:.0%} of steps, cosine to {train_cfg.min_lr_ratio}x, weight decay "
                    f"{train_cfg.weight_decay}, gradient clipping at {train_cfg.grad_clip}.")


def trained_sentence(run, imported) -> str:
    """Whether the target was imported, loaded from the cache or trained (`pipeline.TrainedModel`),
    its checkpoint, validation loss and perplexity, device and training speed."""
    s = run.summary
    done = "Imported the target" if imported else ("Loaded the cached target" if run.result.reused
                                                   else "Trained the target")
    return (f"{done} ({run.result.path.name if imported else run.result.path.parent.name}): validation loss "
            f"{s['val_loss']:.3f} nats/token (perplexity {math.exp(s['val_loss']):,.1f}) on {s['device']}"
            + ("" if imported else f", {s['tokens_per_s']:,.0f} training tokens/s"))


def mfu_sentence(summary: dict, speed: dict, cfg, imported) -> str:
    """Training MFU (`pipeline.training_mfu`'s `speed`): the steady state's (tokens/s x 6 x FLOP-params
    over the peak, `costs.flop_params`) and the run's wall clock's; why there is none for an
    imported target or one trained on a device not present here."""
    if imported:
        return "imported, not trained here: no training MFU"
    if speed["mfu"] is None:
        return f"trained on {speed['device']}, which is not present here: no MFU"
    return (f"steady state: {summary['tokens_per_s']:,.0f} tokens/s x 6 x {flop_params(cfg):,} FLOP-params "
            f"/ {speed['peak_flops'] / 1e9:,.0f} GFLOP/s peak = MFU {speed['mfu']:.1%}; the run's wall clock: "
            + (f"{summary['run_tokens_per_s']:,.0f} tokens/s, MFU {speed['run_mfu']:.1%}"
               if speed["run_mfu"] is not None else "not recorded by this cached checkpoint"))


def sample_text(i: int, decode, prompt, sampled, actual) -> str:
    """Sample `i` (from 0): its prompt, the target's continuation and the actual one, each decoded with `decode`."""
    return (f"--- sample {i + 1}\nPROMPT: {decode(prompt)!r}\n"
            f"TARGET: {decode(sampled)!r}\n"
            f"ACTUAL: {decode(actual)!r}")


def training_cost_sentence(cost: RecordedTrainingCost | None) -> str:
    """`training_cost` in words."""
    if cost is None:
        return ("Training cost: not measured here (the target was not trained on this machine), so notebook 08 "
                "prices SPIRe's training from its body parameters.")
    return (f"Training cost: the SPIRe draft trained at {cost.spire_tokens_per_s:,.0f} tokens/s and the target "
            f"at {cost.target_tokens_per_s:,.0f}, so a SPIRe token costs {cost.spire_units_per_token:.2f} of a "
            f"target training token, not the {cost.body_ratio:.2f} its share of the body parameters says: every "
            "SPIRe step also runs the frozen target forward. Notebook 08 prices SPIRe's training with this figure.")


#: Below this share of the paper's 20 x N training tokens, a trained draft's tau (and every claim
#: built on it) is worded as being about its budget, not about the method (method §6).
SMALL_BUDGET = 0.1


def percent(fraction: float) -> str:
    """A share as a percentage to two significant figures: 0.00057 as "0.057%"."""
    return f"{100 * fraction:.2g}%"


def budget_sentence(budgets: dict[str, RecordedBudget]) -> str:
    """What each trained draft's tau is about, in words (`draft_budgets`): its training tokens as a
    share of the paper's 20 x N and, for each draft below `SMALL_BUDGET`, that its taus speak of
    this budget, not of the method."""
    if not budgets:
        return ""
    each = "; ".join(f"the {name} trained on {b.tokens:,} tokens, {percent(b.fraction)} of the paper's 20 x N "
                     f"= {b.paper_tokens:,} (N = {b.body_params:,} body parameters"
                     + (f"; that budget would take {_costs(b.paper_seconds)}" if b.paper_seconds else "")
                     + ")" for name, b in budgets.items())
    small = [name for name, b in budgets.items() if b.fraction < SMALL_BUDGET]
    return (f"Training budgets: {each}. Each tau is about a draft trained on that share of the paper's budget"
            + (f"; those of the {' and the '.join(small)}, and every claim built on them, are about this budget, not "
               "about the method: a draft given the paper's budget could accept far more." if small else "."))


def _costs(seconds: dict[str, float]) -> str:
    """`paper_budget_seconds` in words: this machine's first, then the GPUs' as the plan models them."""
    here = (f"{duration(seconds['this machine'])} on this machine at its measured speed, "
            if "this machine" in seconds else "")
    gpus = ", ".join(f"{duration(t)} on {name}" for name, t in seconds.items() if name != "this machine")
    return f"{here}{gpus} (modeled at {GPU_MFU:.0%} MFU)"
