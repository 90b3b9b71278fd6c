"""A profiled cost model of decoding on this machine, next to the paper's (method §2).

The paper's model (`perfmodel`) charges a forward max(2 N FLOPs, weight + KV bytes x HOI) and
nothing else; at CPU scale that misses most of the clock (kernel launches, elementwise kernels,
attention FLOPs, the unembedding, sampling, 4-byte values). This model, in the spirit of
operator-profiled simulators such as Vidur (MLSys 2024), keeps the roofline's physical form and
adds those costs as a few coefficients (`ProfiledCost`): the roofline's peak and bandwidth are
this machine's calibration, pinned; only the overheads are fitted (`fit`), to the engine's own
sections timed inside real decoding rounds, so that they cannot trade against the rates. An AD
step is one target forward and one draw (`ad_step_seconds`); a speculative round is the draft's
passes, verification, bookkeeping and the method's own overhead (`round_seconds`), and a batch
decodes in lockstep until its slowest row is done (`acceptance.expected_rounds`).

Numpy only, like the paper's model.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import asdict, dataclass

import numpy as np

from spirelib.modeling.acceptance import expected_rounds
from spirelib.modeling.perfmodel import ModelShape, body_params


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


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class DraftShape:
    """What the profiled model needs of a draft method: its layer stack's shape (None: the
    target itself, MagicDec's and the guided draft's), the keys one of its passes reads (None:
    the whole context, a dense cache; 0: no pass at all, prompt lookup's), how many layers write
    memory from the target's verified positions (SPIRe's target-activation memory, method §3.3),
    and whether the verification also scores every key for it (`scores`, the guided draft)."""

    method: str
    shape: ModelShape | None
    keys: int | None = None
    memory_layers: int = 0
    scores: bool = False  # the verification records its attention scores for the draft (the guided draft)


def ad_step_seconds(cost: ProfiledCost, target: ModelShape, vocab_size: int, batch: int, context: int,
                    bytes_per_value: float = 4.0) -> float:
    """One autoregressive step: one token per row over `context` keys, with logits, and a draw
    from its (B, V) probabilities."""
    return (cost.seconds(forward_work(target, vocab_size, batch, 1, context, bytes_per_value=bytes_per_value))
            + cost.sampling(batch, vocab_size))


def ad_keys(context: int, new_tokens: int) -> int:
    """The keys an AD step reads after `context`, generating G = `new_tokens`: its cache's whole
    capacity L + G (`kvcache.DenseKVCache` reads it all at decode time)."""
    return context + new_tokens


def sd_keys(context: int, new_tokens: int, k: int) -> int:
    """The keys a speculative forward over a dense cache reads: its whole capacity L + G + 2k
    (`speculative.speculative_capacity`)."""
    return context + new_tokens + 2 * k


def propose_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, batch: int,
                    k: int, dense_keys: int, bytes_per_value: float = 4.0) -> float:
    """The draft's k passes as the engine runs them, each followed by a draw from (B, V)
    probabilities, priced by their forwards alone (no `DraftOverhead`). The vanilla draft's
    first pass runs two tokens (the one before the pending one again, `drafts.VanillaDraft`);
    a SPIRe pass also projects its feedback memory (one K/V projection per layer). A pass over
    a dense cache reads `dense_keys` (its capacity); a sparse draft its sink + window."""
    if draft.keys == 0:  # prompt lookup: no forward, no draw; its matching is its fitted overhead
        return 0.0
    shape = draft.shape if draft.shape is not None else target
    keys = dense_keys if draft.keys is None else min(dense_keys, draft.keys)
    memory = _memory_weights(draft, shape)
    seconds = k * cost.sampling(batch, vocab_size)
    for j in range(k):
        w = forward_work(shape, vocab_size, batch, 2 if (draft.method == "vanilla" and j == 0) else 1, keys,
                         bytes_per_value=bytes_per_value)
        seconds += cost.seconds(dataclasses.replace(w, flops=w.flops + 2.0 * memory * batch))
    return seconds


def accept_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, batch: int, k: int,
                   bytes_per_value: float = 4.0) -> float:
    """The draft's `accept` of k + 1 verified positions priced by its work alone: SPIRe
    projects their target activations into its memory keys/values (other drafts: nothing)."""
    memory = _memory_weights(draft, draft.shape if draft.shape is not None else target)
    if not memory:
        return 0.0
    return (cost.per_layer_s * draft.memory_layers
            + max(2.0 * memory * batch * (k + 1) / cost.flops_per_s, memory * bytes_per_value / cost.bytes_per_s))


def _memory_weights(draft: DraftShape, shape: ModelShape) -> int:
    """The K/V projection weights of the layers that write memory (SPIRe's, method §3.3)."""
    return draft.memory_layers * 2 * shape.n_kv * shape.d_head * shape.d_model


def scored(work: ForwardWork, target: ModelShape, bytes_per_value: float = 4.0) -> ForwardWork:
    """A forward's `work` when its queries also score every key for the guided draft (method §2): the
    scoring adds half the attention's FLOPs (q.k of q.k and p.v) and one more read of the keys."""
    key_bytes = work.key_reads * target.n_kv * target.d_head * bytes_per_value
    return dataclasses.replace(work, flops=work.flops + work.attention_flops / 2, bytes=work.bytes + key_bytes,
                               attention_flops=1.5 * work.attention_flops)


def verify_seconds(cost: ProfiledCost, target: ModelShape, vocab_size: int, batch: int, k: int, dense_keys: int,
                   bytes_per_value: float = 4.0, scores: bool = False) -> float:
    """The target's forward over the pending token and the k drafted ones, reading `dense_keys`;
    with `scores` (the guided draft) its queries score every key once more (`scored`)."""
    w = forward_work(target, vocab_size, batch, k + 1, dense_keys, bytes_per_value=bytes_per_value)
    return cost.seconds(scored(w, target, bytes_per_value) if scores else w)


def round_seconds(cost: ProfiledCost, draft: DraftShape, target: ModelShape, vocab_size: int, batch: int, k: int,
                  dense_keys: int, bytes_per_value: float = 4.0, overhead: bool = True) -> float:
    """One speculative round: the draft's k passes (`propose_seconds`, each followed by a draw from
    (B, V) probabilities), the target verifying k + 1 tokens (`verify_seconds`), the bookkeeping
    (`speculative.Rows.settle`: rejection sampling over (B, k + 1, V), the emitted tokens, the
    rollback), the draft's `accept` (`accept_seconds`) and, with `overhead`, the method's own code
    beyond all of these (its Python, MagicDec's ring, SPIRe's memory and the target-stream
    capture): its fitted `DraftOverhead`, round_s + round_per_row_s x B. Forwards over a dense cache read
    `dense_keys` (`sd_keys`)."""
    return (propose_seconds(cost, draft, target, vocab_size, batch, k, dense_keys, bytes_per_value)
            + verify_seconds(cost, target, vocab_size, batch, k, dense_keys, bytes_per_value, draft.scores)
            + cost.bookkeeping(batch, k, vocab_size) + accept_seconds(cost, draft, target, batch, k, bytes_per_value)
            + (cost.draft(draft.method).seconds(batch) if overhead else 0.0))


def speedup(cost: ProfiledCost, draft: DraftShape, tau: float, target: ModelShape, vocab_size: int, batch: int,
            context: int, new_tokens: int, k: int, bytes_per_value: float = 4.0) -> float:
    """SD tokens/s over AD tokens/s while G = `new_tokens` tokens are generated per row after a
    context of `context`: G AD steps against the `expected_rounds` a batch of B rows needs at
    this tau, every forward over a dense cache reading its whole capacity (L + G for AD,
    L + G + 2k for speculative decoding); the sparse drafts read their sink + window."""
    ad = new_tokens * ad_step_seconds(cost, target, vocab_size, batch, ad_keys(context, new_tokens), bytes_per_value)
    rounds = expected_rounds(min(tau, k + 1.0), k, new_tokens, batch)
    return ad / (rounds * round_seconds(cost, draft, target, vocab_size, batch, k, sd_keys(context, new_tokens, k),
                                        bytes_per_value))


# ---------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class LoopTiming:
    """One method ("ad" or a draft's) generating G = `new_tokens` per row after contexts of L at
    batch B, timed inside the decoding loop (`speculative.SectionTimer`): seconds per round (AD:
    per step) of each section, averaged over runs (`wallclock.loop_timings`). For AD, "verify" is
    the target's forward and "bookkeeping" the draw."""

    method: str
    batch: int
    context: int
    new_tokens: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float

    @property
    def round_s(self) -> float:
        return self.draft_s + self.verify_s + self.bookkeeping_s


def cell_problems(cells) -> list[str]:
    """Why timings at these (B, L) `cells` cannot identify the model's coefficients (empty: they
    can): at least three cells, two batch sizes (the per-token and per-row costs) and two
    context lengths (attention's)."""
    cells = set(cells)
    Bs, Ls = sorted({b for b, _ in cells}), sorted({c for _, c in cells})
    out = []
    if len(cells) < 3:
        out.append(f"{len(cells)} (B, L) cell(s) timed; the fit needs at least 3")
    if len(Bs) == 1:
        out.append(f"every cell is at B = {Bs[0]}; the per-token and per-row costs need at least "
                   "two batch sizes")
    if len(Ls) == 1:
        out.append(f"every cell is at L = {Ls[0]}; attention's cost needs at least two context lengths")
    return out


def fit_problems(timings: list[LoopTiming], drafts: dict[str, DraftShape]) -> list[str]:
    """Why `timings` cannot identify the model's coefficients (empty: they can): their cells
    (`cell_problems`), AD timings (the target's forward and the draw), and every drafting method
    at two batch sizes (its overhead per round and per row) with a known shape."""
    out = cell_problems((t.batch, t.context) for t in timings)
    if not any(t.method == "ad" for t in timings):
        out.append("no AD timings: the target's forward and the draw are fitted to AD steps")
    for method in sorted({t.method for t in timings} - {"ad"}):
        if method not in drafts:
            out.append(f"{method!r} was timed but has no DraftShape")
        elif len({t.batch for t in timings if t.method == method}) < 2:
            out.append(f"{method!r} was timed at one batch size; its overhead per row needs two")
    return out


def fit(timings: list[LoopTiming], *, target: ModelShape, vocab_size: int, drafts: dict[str, DraftShape], k: int,
        peak_flops: float, bandwidth: float, bytes_per_value: float = 4.0) -> ProfiledCost:
    """The coefficients that explain decoding sections timed in the loop, with the roofline's
    peak FLOP/s and bandwidth pinned to this machine's calibration. The sections are the engine's
    own, timed inside real decoding rounds (`LoopTiming`, from `wallclock.time_cells`'
    `SectionTimer`: draft, verify, bookkeeping), where the cost is paid: caches as a round leaves
    them, not warm as in an isolated call. Every stage is a
    least-squares fit in relative error (each timing counts alike), non-negative but for the
    methods' overheads:

    1. the forward's per-layer, per-token-layer, multi-token per-layer, per-key and attention-FLOP
       costs, to the target's forwards: AD steps (1 token over L + G keys) and the verifications
       of the drafts that read no target activations (k + 1 tokens over L + G + 2k keys); without
       a single-token forward (no B = 1 cell) the multi-token kernels' cost is part of per_layer_s;
    2. the draw, to AD's draws (B V logits);
    3. the bookkeeping, to the speculative rounds' (B (k + 1) V logits);
    4. each method's `DraftOverhead`, to what its whole rounds leave unexplained.

    Each cell also gets its own pace (`ProfiledCost.paces`): one factor on the seconds of every
    section of every method timed there (above 1: slower than the coefficients price it), their
    geometric mean 1, fitted alternately with the coefficients until no pace moves. The methods
    of a cell decode in lockstep (`wallclock.time_cells`), so what sets a cell's level slows them
    all alike: the machine's state while the cell ran and how its working set sits in the caches
    (docs/benchmarks.md: both move a cell's level, every method alike). Unabsorbed, such a level
    bends the coefficients; absorbed, the coefficients explain how the methods
    compare within each cell, which is all a speedup depends on (the pace cancels in it). A cell
    the fit did not see is priced at pace 1. What the paces take away is identified only through
    those comparisons, so the coefficients move more from run to run than the speedups do.

    Refuses timings that cannot identify them (`fit_problems`)."""
    problems = fit_problems(timings, drafts)
    if problems:
        raise ValueError("cannot fit the profiled model: " + "; ".join(problems))
    by_cell: dict[tuple[int, int], list[LoopTiming]] = {}
    for t in timings:
        by_cell.setdefault((t.batch, t.context), []).append(t)
    paces = dict.fromkeys(by_cell, 1.0)
    for _ in range(PACE_ITERATIONS):
        cost = _coefficients([_at_pace(t, paces[cell]) for cell, own in by_cell.items() for t in own], target=target,
                             vocab_size=vocab_size, drafts=drafts, k=k, peak_flops=peak_flops, bandwidth=bandwidth,
                             bytes_per_value=bytes_per_value)
        logs = {cell: np.mean([np.log(t.round_s / modeled_sections(cost, t, target=target, vocab_size=vocab_size,
                                                                    drafts=drafts, k=k, bytes_per_value=bytes_per_value))
                               for t in own]) for cell, own in by_cell.items()}
        center = np.mean(list(logs.values()))
        moved, paces = paces, {cell: float(np.exp(v - center)) for cell, v in logs.items()}
        if max(abs(paces[c] / moved[c] - 1.0) for c in paces) < PACE_TOLERANCE:
            break
    return dataclasses.replace(cost, paces=paces)


# The alternating fit of coefficients and cell paces stops once no pace moves by more than
# PACE_TOLERANCE in an iteration: on 09's timings after a few hundred iterations (docs/benchmarks.md).
PACE_ITERATIONS, PACE_TOLERANCE = 3000, 1e-9


def _at_pace(timing: LoopTiming, pace: float) -> LoopTiming:
    """`timing`'s sections divided by its cell's pace."""
    return dataclasses.replace(timing, draft_s=timing.draft_s / pace, verify_s=timing.verify_s / pace,
                               bookkeeping_s=timing.bookkeeping_s / pace)


def _coefficients(timings: list[LoopTiming], *, target: ModelShape, vocab_size: int, drafts: dict[str, DraftShape],
                  k: int, peak_flops: float, bandwidth: float, bytes_per_value: float) -> ProfiledCost:
    """`fit`'s four stages on timings at pace 1."""
    cost = ProfiledCost(float(peak_flops), float(bandwidth))
    forwards = [(forward_work(target, vocab_size, t.batch, 1, ad_keys(t.context, t.new_tokens),
                              bytes_per_value=bytes_per_value), t.verify_s) for t in timings if t.method == "ad"]
    forwards += [(forward_work(target, vocab_size, t.batch, k + 1, sd_keys(t.context, t.new_tokens, k),
                               bytes_per_value=bytes_per_value), t.verify_s)
                 for t in timings if t.method != "ad" and not drafts[t.method].memory_layers
                 and not drafts[t.method].scores]  # a verification that also writes memory or scores is not plain
    seconds = np.array([s for _, s in forwards])
    a = np.array([[w.layers, w.tokens * w.layers, w.key_reads, w.attention_flops, w.layers * (w.tokens > 1)]
                  for w, _ in forwards], dtype=float)
    if all(w.tokens > 1 for w, _ in forwards):  # no single-token forward: per_layer_s prices the multi-token kernels
        a = a[:, :4]
    rest = seconds - np.array([cost.roofline(w) for w, _ in forwards])
    per_layer, per_token_layer, per_key, per_flop, *multi = _nonnegative_lstsq(a / seconds[:, None], rest / seconds)
    cost = dataclasses.replace(cost, per_layer_s=float(per_layer), per_token_layer_s=float(per_token_layer),
                               per_key_s=float(per_key), multi_token_layer_s=float(sum(multi)),
                               attention_flops_per_s=1.0 / per_flop if per_flop > 0 else float("inf"))
    sampling = _affine([(t.batch * vocab_size, t.bookkeeping_s) for t in timings if t.method == "ad"])
    bookkeeping = _affine([(t.batch * (k + 1) * vocab_size, t.bookkeeping_s) for t in timings if t.method != "ad"])
    cost = dataclasses.replace(cost, sampling_s=sampling[0], sampling_per_logit_s=sampling[1],
                               bookkeeping_s=bookkeeping[0], bookkeeping_per_logit_s=bookkeeping[1])
    overheads = {}
    for method in sorted({t.method for t in timings} - {"ad"}):
        own = [t for t in timings if t.method == method]
        measured = np.array([t.round_s for t in own])
        modeled = np.array([round_seconds(cost, drafts[method], target, vocab_size, t.batch, k,
                                          sd_keys(t.context, t.new_tokens, k), bytes_per_value, overhead=False)
                            for t in own])
        a = np.array([[1.0, t.batch] for t in own]) / measured[:, None]
        round_s, per_row = np.linalg.lstsq(a, 1.0 - modeled / measured, rcond=None)[0]
        overheads[method] = DraftOverhead(float(round_s), float(per_row))
    return dataclasses.replace(cost, drafts=overheads)


def _affine(pairs: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) >= 0 of seconds ~ a + b x n, fitted in relative error."""
    n = np.array([float(c) for c, _ in pairs])
    s = np.array([float(v) for _, v in pairs])
    a = np.stack([np.ones_like(s), n], axis=1) / s[:, None]
    return tuple(float(c) for c in _nonnegative_lstsq(a, np.ones_like(s)))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (a few unknowns): the best least-squares solution over
    every subset of coefficients left free, the others at 0, that comes out non-negative."""
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for free in itertools.combinations(range(n), size):
            x = np.zeros(n)
            x[list(free)] = np.linalg.lstsq(a[:, list(free)], b, rcond=None)[0]
            err = float(np.sum((a @ x - b) ** 2))
            if np.all(x >= 0) and err < best_err:
                best, best_err = x, err
    return best


def modeled_sections(cost: ProfiledCost, timing: LoopTiming, *, target: ModelShape, vocab_size: int,
                     drafts: dict[str, DraftShape], k: int, bytes_per_value: float = 4.0) -> float:
    """What the model says one round (AD: one step) of `timing` takes, at its cell's pace: the
    seconds its fit is judged on, against `timing.round_s`."""
    pace = cost.pace(timing.batch, timing.context)
    if timing.method == "ad":
        return pace * ad_step_seconds(cost, target, vocab_size, timing.batch,
                                       ad_keys(timing.context, timing.new_tokens), bytes_per_value)
    return pace * round_seconds(cost, drafts[timing.method], target, vocab_size, timing.batch, k,
                                 sd_keys(timing.context, timing.new_tokens, k), bytes_per_value)
