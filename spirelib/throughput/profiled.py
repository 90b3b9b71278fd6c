"""A profiled cost model of decoding on this machine, next to the paper's (method §2).

The paper's model (`perfmodel`) charges a forward max(2 N FLOPs, weight + KV bytes x HOI) and
nothing else; at CPU scale that misses most of the clock (kernel launches, elementwise kernels,
attention FLOPs, the unembedding, sampling, 4-byte values). This model, in the spirit of
operator-profiled simulators such as Vidur (MLSys 2024), keeps the roofline's physical form and
adds those costs as a few coefficients (`ProfiledCost`): the roofline's peak and bandwidth are
this machine's calibration, pinned; only the overheads are fitted (`profile_fit.fit`), to the engine's own
sections timed inside real decoding rounds, so that they cannot trade against the rates. An AD
step is one target forward and one draw (`ad_step_seconds`); a speculative round is the draft's
passes, verification, bookkeeping and the method's own overhead (`round_seconds`), each priced
against the target's shape, vocabulary and bytes per value (`PricedTarget`), and a batch
decodes in lockstep until its slowest row is done (`acceptance.expected_rounds`).

Numpy only, like the paper's model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from spirelib.throughput.acceptance import expected_rounds
from spirelib.throughput.methods import BUDGET, KVBudget, Pass, card
from spirelib.throughput.perfmodel import ModelShape, body_params, fused_params


@dataclass(frozen=True)
class ForwardWork:
    """What one forward pass does: matmul FLOPs, bytes it moves, and its layer count."""

    flops: float
    bytes: float
    layers: int
    tokens: int = 0  # B x T: what the per-token costs scale with
    attention_flops: float = 0.0  # the part of `flops` that is attention (q.k and p.v)
    key_reads: float = 0.0  # B x keys x layers: the keys its attention reads, per row and layer


def forward_work(shape: ModelShape, vocab_size: int, batch: int, new: int, keys: int, *, logits: bool = True,
                 bytes_per_value: float = 4.0) -> ForwardWork:
    """One forward of `new` tokens per row (B rows) attending to `keys` keys each.

    FLOPs: 2 per body parameter per token, attention 4 x layers x n_q x d_head per (token, key)
    (q.k and p.v), and, with `logits`, the unembedding 2 x d_model x V per token. Bytes: the
    body weights once (and the unembedding with logits), the keys/values read, and the new
    tokens' keys/values written, at `bytes_per_value`.
    """
    tokens = batch * new
    n_q = shape.n_q_per_kv * shape.n_kv
    kv_per_token = 2 * shape.num_layers * shape.n_kv * shape.d_head  # values cached per token
    unembed = shape.d_model * vocab_size if logits else 0
    attention = 4.0 * shape.num_layers * n_q * shape.d_head * tokens * keys
    flops = 2.0 * (body_params(shape) + unembed) * tokens + attention
    moved = (body_params(shape) + unembed + kv_per_token * batch * (keys + new)) * bytes_per_value
    return ForwardWork(float(flops), float(moved), shape.num_layers, tokens, float(attention),
                       float(batch * keys * shape.num_layers))


@dataclass(frozen=True)
class DraftOverhead:
    """What a drafting method's round costs beyond its passes' forwards and draws, the target's
    verification and the bookkeeping as the shared coefficients price them: round_s +
    round_per_row_s x B, fitted to its rounds timed in the loop (`fit`). Signed: where the
    shared coefficients overprice the method's forwards (a draft of other layer counts than
    the target), it comes out negative."""

    round_s: float = 0.0
    round_per_row_s: float = 0.0

    def seconds(self, batch: int) -> float:
        return self.round_s + self.round_per_row_s * batch


@dataclass(frozen=True)
class ProfiledCost:
    """Coefficients: a forward costs per_layer_s x layers + per_token_layer_s x tokens x layers +
    multi_token_layer_s x layers if it runs more than one token + per_key_s x key reads +
    attention FLOPs / attention_flops_per_s + max(matmul FLOPs / flops_per_s, bytes /
    bytes_per_s) (`seconds`); a draw from (B, V) probabilities sampling_s +
    sampling_per_logit_s x B V; a round's bookkeeping bookkeeping_s + bookkeeping_per_logit_s x
    B (k + 1) V; each method's round its `DraftOverhead` on top. flops_per_s and bytes_per_s are
    the calibrated machine's.

    FLOPs and bytes come from `forward_work` (body matmuls, attention over the keys read, the
    unembedding; weights and KV at their dtype). A forward of one token in all (B x T = 1: an AD
    step or a draft pass at B = 1) multiplies matrices by a vector, which a BLAS does faster per
    linear than the matrix-matrix kernels of two tokens or more (docs/benchmarks.md); what those
    cost per layer beyond it is multi_token_layer_s, so that the B = 1 cells' AD steps are not
    priced at the setup cost of verification's kernels. Attention costs per key each row reads
    (a CPU's attention kernel pays per (row, head) block and key, whatever the queries) and per
    FLOP (its queries' scores). A forward's fixed cost is charged per layer (its kernels'
    launches): one target is timed, so a constant per forward and one per layer cannot be told
    apart, and what a draft's forwards cost beyond that goes to its method's overhead."""

    flops_per_s: float
    bytes_per_s: float
    per_layer_s: float = 0.0
    per_token_layer_s: float = 0.0
    multi_token_layer_s: float = 0.0  # per layer, a forward of more than one token (matrix-matrix kernels)
    per_key_s: float = 0.0
    attention_flops_per_s: float = float("inf")
    sampling_s: float = 0.0
    sampling_per_logit_s: float = 0.0
    bookkeeping_s: float = 0.0
    bookkeeping_per_logit_s: float = 0.0
    drafts: dict = dataclasses.field(default_factory=dict)  # method -> DraftOverhead
    paces: dict = dataclasses.field(default_factory=dict)  # (B, L) -> a fitted cell's time factor (`fit`)

    def seconds(self, work: ForwardWork) -> float:
        return self.overhead(work) + self.attention(work) + self.roofline(work)

    def overhead(self, work: ForwardWork) -> float:
        """A forward's launches and elementwise kernels: per layer, per token and layer, and per
        layer once it runs more than one token (matrix-matrix rather than matrix-vector kernels)."""
        multi = self.multi_token_layer_s if work.tokens > 1 else 0.0
        return (self.per_layer_s + multi + self.per_token_layer_s * work.tokens) * work.layers

    def attention(self, work: ForwardWork) -> float:
        """Attention beyond the roofline: per key read by a row in a layer, and per FLOP."""
        return self.per_key_s * work.key_reads + work.attention_flops / self.attention_flops_per_s

    def roofline(self, work: ForwardWork) -> float:
        """max(matmul FLOPs / peak, bytes / bandwidth): attention's FLOPs have their own rate."""
        return max((work.flops - work.attention_flops) / self.flops_per_s, work.bytes / self.bytes_per_s)

    def bookkeeping(self, batch: int, k: int, vocab_size: int) -> float:
        return self.bookkeeping_s + self.bookkeeping_per_logit_s * batch * (k + 1) * vocab_size

    def sampling(self, batch: int, vocab_size: int) -> float:
        return self.sampling_s + self.sampling_per_logit_s * batch * vocab_size

    def draft(self, method: str) -> DraftOverhead:
        """The method's fitted overhead (none if it was not fitted)."""
        return self.drafts.get(method, DraftOverhead())

    def pace(self, batch: int, context: int) -> float:
        """The factor on the seconds of every section of every method at the fitted cell (B, L)
        (`fit`); 1 for a cell the fit did not see. It cancels in a speedup."""
        return self.paces.get((batch, context), 1.0)

    def to_dict(self) -> dict:
        return {**asdict(self), "paces": [{"B": b, "L": c, "pace": v} for (b, c), v in self.paces.items()]}

    @classmethod
    def from_dict(cls, recorded: dict) -> ProfiledCost:
        """A cost as `to_dict` wrote it (keys of no field, such as a record's verdict beside it, ignored)."""
        rates = {f.name for f in dataclasses.fields(cls)} - {"drafts", "paces"}
        return cls(**{k: float(v) for k, v in recorded.items() if k in rates},
                   drafts={m: DraftOverhead(**d) for m, d in recorded.get("drafts", {}).items()},
                   paces={(p["B"], p["L"]): p["pace"] for p in recorded.get("paces", ())})


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class PricedTarget:
    """The target a decoding round is priced against: its layer stack, its vocabulary (the logits
    each of its forwards writes and each draw reads) and the bytes one value takes in the dtype it
    decodes in (its weights and caches, and its drafts')."""

    shape: ModelShape
    vocab_size: int
    bytes_per_value: float = 4.0


@dataclass(frozen=True)
class DraftShape:
    """What the profiled model needs of a draft method beyond its card (`methods.card`: its passes,
    whether its verification scores every key): its draft model's layer stack (None: the target
    itself, the self-drafts'), the `KVBudget` a sparse draft's passes read (None: a dense cache,
    the whole context), and how many layers write memory from the target's verified positions
    (SPIRe's target-activation memory, method §3.3)."""

    method: str
    shape: ModelShape | None = None
    budget: KVBudget | None = None
    memory_layers: int = 0

    def __post_init__(self):
        c = card(self.method)
        if c.drafter is not None and (c.reads == BUDGET) != (self.budget is not None):
            raise ValueError(f"{self.method!r} reads {'a KV budget' if c.reads == BUDGET else 'a dense cache'}: "
                             f"{'give' if c.reads == BUDGET else 'it takes no'} KV budget (got {self.budget})")
        if c.needs_model and self.shape is None:
            raise ValueError(f"{self.method!r} drafts with a model of its own: give its ModelShape")

    @property
    def keys(self) -> int | None:
        """The keys one of its passes reads: its budget's entries plus those it writes itself
        (None: a dense cache's capacity)."""
        return None if self.budget is None else self.budget.entries + card(self.method).own

    @property
    def scores(self) -> bool:
        """The verification records its attention scores for the draft (the guided draft)."""
        return card(self.method).scores

    def passes(self, k: int) -> tuple[Pass, ...]:
        """The draft's passes in a round (the card's, without the verification)."""
        return tuple(p for p in card(self.method).round(k) if not p.verify)


def ad_step_seconds(cost: ProfiledCost, target: PricedTarget, batch: int, context: int) -> float:
    """One autoregressive step: one token per row over `context` keys, with logits, and a draw
    from its (B, V) probabilities."""
    return (cost.seconds(forward_work(target.shape, target.vocab_size, batch, 1, context,
                                      bytes_per_value=target.bytes_per_value))
            + cost.sampling(batch, target.vocab_size))


def ad_keys(context: int, new_tokens: int) -> int:
    """The keys an AD step reads after `context`, generating G = `new_tokens`: its cache's whole
    capacity L + G (`kvcache.DenseKVCache` reads it all at decode time)."""
    return context + new_tokens


def sd_keys(context: int, new_tokens: int, k: int) -> int:
    """The keys a speculative forward over a dense cache reads: its whole capacity L + G + 2k
    (`prefill.speculative_capacity`)."""
    return context + new_tokens + 2 * k


def propose_seconds(cost: ProfiledCost, draft: DraftShape, target: PricedTarget, batch: int, k: int,
                    dense_keys: int) -> float:
    """The draft's k passes as the engine runs them, each followed by a draw from (B, V)
    probabilities, priced by their forwards alone (no `DraftOverhead`), as its card lists them
    (the vanilla draft's first pass runs two tokens, the one before the pending one again);
    a SPIRe pass also projects its feedback memory (one K/V projection per layer). A pass over
    a dense cache reads `dense_keys` (its capacity); a sparse draft its sink + window."""
    works = draft_work(draft, target, batch, k, dense_keys)
    memory = _memory_weights(draft, draft.shape if draft.shape is not None else target.shape)
    # prompt lookup runs no pass and draws nothing: its matching is its fitted overhead
    return sum(cost.seconds(dataclasses.replace(w, flops=w.flops + 2.0 * memory * batch))
               + cost.sampling(batch, target.vocab_size) for w in works)


def draft_work(draft: DraftShape, target: PricedTarget, batch: int, k: int, dense_keys: int) -> list[ForwardWork]:
    """The work of the draft's passes in a round, as its card lists them (`DraftShape.passes`):
    its model's (a self-draft's: the target's) forwards over `dense_keys` (a dense cache's
    capacity) or, for a sparse draft, its budget's keys, with the weights it runs beyond its layer
    stack (`perfmodel.fused_params`)."""
    shape, value_bytes = draft.shape if draft.shape is not None else target.shape, target.bytes_per_value
    keys = dense_keys if draft.keys is None else min(dense_keys, draft.keys)
    fused = fused_params(draft.method, shape)  # EAGLE-3's fusion and its 2 d wide W_q, W_k, W_v
    return [dataclasses.replace(w, flops=w.flops + 2.0 * fused * batch * p.new, bytes=w.bytes + fused * value_bytes)
            for p in draft.passes(k)
            for w in [forward_work(shape, target.vocab_size, batch, p.new, keys, bytes_per_value=value_bytes)]]


def accept_seconds(cost: ProfiledCost, draft: DraftShape, target: PricedTarget, batch: int, k: int) -> float:
    """The draft's `accept` of k + 1 verified positions priced by its work alone: SPIRe
    projects their target activations into its memory keys/values (other drafts: nothing)."""
    memory = _memory_weights(draft, draft.shape if draft.shape is not None else target.shape)
    if not memory:
        return 0.0
    return (cost.per_layer_s * draft.memory_layers
            + max(2.0 * memory * batch * (k + 1) / cost.flops_per_s,
                  memory * target.bytes_per_value / cost.bytes_per_s))


def _memory_weights(draft: DraftShape, shape: ModelShape) -> int:
    """The K/V projection weights of the layers that write memory (SPIRe's, method §3.3)."""
    return draft.memory_layers * 2 * shape.n_kv * shape.d_head * shape.d_model


def scored(work: ForwardWork, target: ModelShape, bytes_per_value: float = 4.0) -> ForwardWork:
    """A forward's `work` when its queries also score every key for the guided draft (method §2): the
    scoring adds half the attention's FLOPs (q.k of q.k and p.v) and one more read of the keys."""
    key_bytes = work.key_reads * target.n_kv * target.d_head * bytes_per_value
    return dataclasses.replace(work, flops=work.flops + work.attention_flops / 2, bytes=work.bytes + key_bytes,
                               attention_flops=1.5 * work.attention_flops)


def verify_seconds(cost: ProfiledCost, target: PricedTarget, batch: int, k: int, dense_keys: int,
                   scores: bool = False) -> float:
    """The target's forward over the pending token and the k drafted ones, reading `dense_keys`;
    with `scores` (the guided draft) its queries score every key once more (`scored`)."""
    w = forward_work(target.shape, target.vocab_size, batch, k + 1, dense_keys, bytes_per_value=target.bytes_per_value)
    return cost.seconds(scored(w, target.shape, target.bytes_per_value) if scores else w)


def round_seconds(cost: ProfiledCost, draft: DraftShape, target: PricedTarget, batch: int, k: int, dense_keys: int,
                  overhead: bool = True) -> float:
    """One speculative round: the draft's k passes (`propose_seconds`, each followed by a draw from
    (B, V) probabilities), the target verifying k + 1 tokens (`verify_seconds`), the bookkeeping
    (`speculative.Rows.settle`: rejection sampling over (B, k + 1, V), the emitted tokens, the
    rollback), the draft's `accept` (`accept_seconds`) and, with `overhead`, the method's own code
    beyond all of these (its Python, MagicDec's ring, SPIRe's memory and the target-stream
    capture): its fitted `DraftOverhead`, round_s + round_per_row_s x B. Forwards over a dense cache read
    `dense_keys` (`sd_keys`)."""
    return (propose_seconds(cost, draft, target, batch, k, dense_keys)
            + verify_seconds(cost, target, batch, k, dense_keys, draft.scores)
            + cost.bookkeeping(batch, k, target.vocab_size) + accept_seconds(cost, draft, target, batch, k)
            + (cost.draft(draft.method).seconds(batch) if overhead else 0.0))


def speedup(cost: ProfiledCost, draft: DraftShape, tau: float, target: PricedTarget, batch: int, context: int,
            new_tokens: int, k: int) -> float:
    """SD tokens/s over AD tokens/s while G = `new_tokens` tokens are generated per row after a
    context of `context`: G AD steps against the `expected_rounds` a batch of B rows needs at
    this tau, every forward over a dense cache reading its whole capacity (L + G for AD,
    L + G + 2k for speculative decoding); the sparse drafts read their sink + window."""
    ad = new_tokens * ad_step_seconds(cost, target, batch, ad_keys(context, new_tokens))
    rounds = expected_rounds(min(tau, k + 1.0), k, new_tokens, batch)
    return ad / (rounds * round_seconds(cost, draft, target, batch, k, sd_keys(context, new_tokens, k)))
