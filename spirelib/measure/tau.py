"""The tau measurement protocol (method §5) and the acceptance metrics of method §8.

Every method named in `methods` ("vanilla", "magicdec", "spire", ...: the drafts' registry,
`drafts.draft_factory`: a new draft plugs in without touching this module) decodes the SAME
contexts of each length L by speculative decoding (`measure_tau`); each round's accepted draft
count becomes tau with its 95% CI, contexts as the unit (`AcceptCounts.stats`). Two drafts are
compared paired, by context and random stream (`delta_tau`), and over training seeds with the
interval of method §10 (`seeds_interval`). Under a stopping rule (`stopping.StoppingRule`, notebook
04) each method at each L decodes only until its tau is resolved.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import torch
import torch.distributed as dist

from spirelib.decoding.builders import DraftFactory
from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity
from spirelib.decoding.sections import SectionTimer
from spirelib.decoding.speculative import speculative_generate
from spirelib.frontend import progress_bar
from spirelib.measure.context_loss import prefilled_losses
from spirelib.measure.intervals import t_quantile
from spirelib.measure.stopping import Rule, StoppingRule
from spirelib.model.transformer import Transformer
from spirelib.throughput.acceptance import acceptance_rate, per_position_from_counts


@dataclass(frozen=True)
class DecodingProtocol:
    """What every generation of a measurement decodes (method §5): G = `new_tokens` tokens a row, k
    drafts a round, sampled at `temperature` (0: greedy). `TauProtocol` adds its batching and seed;
    the wall clock's cells (`wallclock.time_cells`) set their own batches."""

    k: int = 4
    new_tokens: int = 64  # G
    temperature: float = 1.0

    def __post_init__(self):
        if self.k < 1 or self.new_tokens < 1 or self.temperature < 0:
            raise ValueError(f"a decoding protocol needs k, new_tokens >= 1 and temperature >= 0, got {self}")


@dataclass(frozen=True)
class TauProtocol:
    """Method §5: k = 4, G = 64; temperature and batching are the project's choices (method §9:
    T = 1 by default, exact rejection sampling). Contexts run in batches of B rows."""

    k: int = 4
    new_tokens: int = 64  # G
    temperature: float = 1.0
    batch_size: int = 64  # B rows decoded in lockstep
    seed: int = 0

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"a tau protocol needs batch_size >= 1, got {self}")
        self.decoding  # noqa: B018  (k, G and T are checked as a decoding protocol checks them)

    @property
    def decoding(self) -> DecodingProtocol:
        """Its k, G and temperature, without the batching."""
        return DecodingProtocol(self.k, self.new_tokens, self.temperature)


# ---------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class TauStats:
    """Method §8 metrics of one method at one context length (`AcceptCounts.stats`)."""

    mean: float  # tau: tokens / rounds pooled over all contexts (a ratio estimator, not a mean of ratios)
    ci95: float  # 95% half-width: the t-interval's, contexts as the unit (delta method); under a stopping rule
    # the wider of that and the rule's (`summarize`)
    n_contexts: int
    std: float  # per-context standard deviation of the linearized estimate: the t half-width is t * std / sqrt(n)
    rounds: int
    acceptance_rate: float
    per_position: tuple[float, ...]  # P[draft j accepted | 1..j-1 accepted], j = 1..k
    accepted_at: tuple[int, ...]  # rounds that accepted draft j
    reached: tuple[int, ...]  # rounds that accepted drafts 1..j-1 (reached draft j)

    def to_dict(self) -> dict:
        return asdict(self)


def linearize(tokens: torch.Tensor, rounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled tau over the last axis (contexts) of tokens Y and rounds X per context, and its
    delta-method linearization z_i = (Y_i - tau X_i) / mean(X), batched over leading axes: tau
    (...), z (..., n). To first order tau_hat - tau = mean(z), contexts i.i.d., so var(tau_hat)
    ~ var(z) / n.

    tau is the pooled ratio sum_i Y_i / sum_i X_i, tokens per round over all rounds of all
    contexts, not the mean of the per-context ratios Y_i / X_i: a context stops once it has G
    tokens, so a context that happened to accept much finishes in few rounds and its high ratio
    weighs as much as a slow context's many rounds; that mean of ratios is biased upwards
    (i.i.d. acceptance alpha = 0.5 / 0.7 / 0.85, k = 4, G = 64: about +0.02 / +0.035 / +0.035
    over (1 - alpha^(k+1)) / (1 - alpha), many CI widths at the paper's n). By Wald's identity
    E[Y_i] = tau E[X_i] under that stopping rule, so the pooled ratio is consistent (its bias is
    O(1/n)). Contexts, not rounds, are the independent units: rounds of one context share the
    text."""
    tau = tokens.sum(-1) / rounds.sum(-1)
    return tau, (tokens - tau[..., None] * rounds) / rounds.mean(-1, keepdim=True)


@dataclass
class AcceptCounts:
    """The accepted draft count of every round of every context (n, R), -1 after a context
    finished (the layout of `Generation.accepted`), at draft depth k."""

    accepted: torch.Tensor
    k: int

    def __post_init__(self):
        self.accepted = self.accepted.cpu()  # a few ints per context: the statistics are the host's

    def tokens_and_rounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens emitted (accepted + 1 per round, the bonus token included) and rounds, per
        context: two (n,) float64 tensors.

        The last round may emit more tokens than G still needed; it counts in full. Whether a
        round is the last depends only on earlier rounds (a stopping time): the draft proposed k
        tokens and the target verified them as in any other round, so its count is an ordinary
        draw of the round's acceptance. Truncating it to the tokens still needed would bias tau
        downwards by an amount that depends on G, not on the draft."""
        done = self.accepted >= 0
        return torch.where(done, self.accepted + 1, 0).sum(1).double(), done.sum(1).double()

    def tau_per_context(self) -> torch.Tensor:
        """Mean of accepted + 1 over each context's rounds, the last one in full: (n,) float64.
        (Their mean is NOT the tau estimate: see `linearize`.)"""
        tokens, rounds = self.tokens_and_rounds()
        return tokens / rounds

    def linearized(self) -> tuple[float, torch.Tensor]:
        """The pooled tau = sum_i Y_i / sum_i X_i (all tokens / all rounds) and its delta-method
        linearization per context, z_i = (Y_i - tau X_i) / mean(X): (n,) float64 (`linearize`).
        The one implementation behind `stats()`' interval and `delta_tau`'s."""
        tau, z = linearize(*self.tokens_and_rounds())
        return float(tau), z

    def stats(self) -> TauStats:
        """tau (pooled, `linearize`) and its 95% CI: the delta-method interval of a ratio estimator
        over contexts, mean +- t_{0.975, n-1} * s / sqrt(n) with s the sample standard deviation of
        z_i (`TauStats.std`), Student's t (at the paper's n = 65,536 the normal interval; t keeps it
        honest for small CPU-scale n); the acceptance rate, accepted / drafted tokens over all
        rounds (= (tau - 1) / k exactly); per-position acceptance, #(a_r >= j) / #(a_r >= j - 1)
        over all rounds r, with both counts."""
        tau, z = self.linearized()
        n = z.numel()
        a = self.accepted[self.accepted >= 0]  # every round
        histogram = torch.bincount(a, minlength=self.k + 1).numpy()  # rounds by accepted drafts 0..k
        std = float(z.std()) if n > 1 else float("nan")  # sample standard deviation, n - 1
        ci = t_quantile(0.975, n - 1) * std / math.sqrt(n) if n > 1 else float("nan")
        j = torch.arange(1, self.k + 1)
        accepted_at = (a[:, None] >= j).sum(0)  # (k,)
        reached = (a[:, None] >= j - 1).sum(0)
        return TauStats(
            mean=tau, ci95=ci, n_contexts=n, std=std, rounds=a.numel(),
            acceptance_rate=float(acceptance_rate(tau, self.k)),
            per_position=tuple(per_position_from_counts(histogram).tolist()),  # NaN where never reached
            accepted_at=tuple(accepted_at.tolist()), reached=tuple(reached.tolist()),
        )


#: What an interval over training seeds is about (`SeedsInterval.scope`): with two seeds or more
#: "training", the expectation over training randomness of drafts trained on one fixed target;
#: with one seed "draft", the one trained draft (per variant) that seed gave, contexts only.
TRAINING, DRAFT = "training", "draft"


@dataclass(frozen=True)
class SeedsInterval:
    """A tau, or a difference of taus, measured at S training seeds on the same n contexts
    (method §10): the mean over seeds, its 95% half-width (`seeds_interval`), each
    seed's value, and the two variance terms behind the width, each with its own degrees of
    freedom (`df`): the seeds' spread var_s / S and the contexts' noise var_i / n."""

    mean: float
    ci95: float
    per_seed: tuple[float, ...]
    n_contexts: int = 0
    seeds_var: float = float("nan")  # var over seeds of the per-seed values / S (0.0 with one seed)
    contexts_var: float = float("nan")  # var over contexts of the per-context terms averaged over seeds / n

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    @property
    def scope(self) -> str:
        """TRAINING (two seeds or more: over training randomness, the target held fixed) or DRAFT
        (one seed: about the one trained draft per variant it gave, contexts only)."""
        return TRAINING if self.seeds > 1 else DRAFT

    @property
    def about(self) -> str:
        """What the interval is about, in words."""
        if self.scope == TRAINING:
            return f"training randomness ({self.seeds} seeds, target fixed)"
        return "this trained draft (one seed, contexts only)"

    @property
    def df(self) -> tuple[int | None, int]:
        """Degrees of freedom of the seeds' term (None with one seed: no such term) and of the contexts' term."""
        return (self.seeds - 1 if self.seeds > 1 else None, self.n_contexts - 1)

    def to_dict(self) -> dict:
        df_seeds, df_contexts = self.df
        return {"mean": self.mean, "ci95": self.ci95, "per_seed": list(self.per_seed), "scope": self.scope,
                "about": self.about, "seeds": self.seeds, "n_contexts": self.n_contexts, "df_seeds": df_seeds,
                "df_contexts": df_contexts, "seeds_var": self.seeds_var, "contexts_var": self.contexts_var}


@dataclass(frozen=True)
class DeltaTau(SeedsInterval):
    """tau of one draft minus another's on the same contexts, over training seeds (`delta_tau`)."""

    @property
    def excludes_zero(self) -> bool:
        """The interval excludes 0. With one seed: a difference between these two trained drafts
        beyond the contexts' noise, not a statement about training randomness."""
        return abs(self.mean) > self.ci95

    @property
    def resolved(self) -> bool:
        """Resolved over training randomness: the interval excludes 0 and spans two seeds or more.
        Never with one seed (see `excludes_zero` for what one seed shows)."""
        return self.scope == TRAINING and self.excludes_zero

    def to_dict(self) -> dict:
        return {**super().to_dict(), "excludes_zero": self.excludes_zero, "resolved": self.resolved}


def seeds_interval(values: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The interval over training seeds of method §10, batched over leading axes:
    `values` (..., S) the per-seed estimates (a tau or a paired difference of taus), `z`
    (..., S, n) their delta-method linearizations on the same n contexts. Returns (mean,
    ci95, seeds_var, contexts_var), each (...): mean = mean_s values; seeds_var = var_s(values)
    / S (0 with one seed); contexts_var = var_i(mean_s z) / n; ci95 = sqrt(t_{S-1}^2 seeds_var
    + t_{n-1}^2 contexts_var), each term with its own t (NaN where n < 2): Banerjee's conservative
    combination, which covers whichever term dominates (tests/measure/test_tau_calibration.py; the
    alternatives it rejects: method §10)."""
    values, z = values.double(), z.double()
    S, n = z.shape[-2], z.shape[-1]
    if values.shape[-1] != S:
        raise ValueError(f"{values.shape[-1]} per-seed values for linearizations of {S} seeds")
    mean = values.mean(-1)
    seeds_var = values.var(-1) / S if S > 1 else torch.zeros_like(mean)
    if n < 2:
        nan = torch.full_like(mean, float("nan"))
        return mean, nan, seeds_var, nan
    contexts_var = z.mean(-2).var(-1) / n
    width = t_quantile(0.975, n - 1) ** 2 * contexts_var
    if S > 1:
        width = width + t_quantile(0.975, S - 1) ** 2 * seeds_var
    return mean, width.sqrt(), seeds_var, contexts_var


def _over_seeds(linearized: list[tuple[float, torch.Tensor]], cls):
    n = {z.numel() for _, z in linearized}
    if len(n) != 1:
        raise ValueError(f"every seed must decode the same contexts, got {sorted(n)} contexts")
    values = torch.tensor([v for v, _ in linearized], dtype=torch.float64)
    mean, ci, seeds_var, contexts_var = seeds_interval(values, torch.stack([z for _, z in linearized]))
    return cls(float(mean), float(ci), tuple(values.tolist()), n.pop(), float(seeds_var), float(contexts_var))


def delta_tau(a: list[AcceptCounts], b: list[AcceptCounts]) -> DeltaTau:
    """tau(a) - tau(b), paired by context, for one pair of accept counts per training seed
    (a[s] and b[s] decoded the same contexts with the same random streams, and every seed the
    same n contexts): the mean of the seeds' differences and its 95% half-width, the seeds'
    spread (t, S - 1 degrees of freedom) and the contexts' noise (t, n - 1) combined
    (`seeds_interval`, method §10). With one seed it is about those two trained drafts.

    Every method decodes batch b from a generator seeded by (seed, L, b) alone (`batch_seed`), the
    same stream for every method (common random numbers), so two similar drafts see the same draws
    and their difference is measured paired, per context: d_i = z_i(a) - z_i(b), each pooled
    ratio's delta-method linearization (`AcceptCounts.linearized`, the one `stats()` uses)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"delta_tau needs one pair of counts per seed, got {len(a)} and {len(b)}")
    pairs = []
    for x, y in zip(a, b):
        if x.accepted.shape[0] != y.accepted.shape[0]:
            raise ValueError("paired counts must come from the same contexts")
        (tau_x, dx), (tau_y, dy) = x.linearized(), y.linearized()
        pairs.append((tau_x - tau_y, dx - dy))
    return _over_seeds(pairs, DeltaTau)


def tau_over_seeds(counts: list[AcceptCounts]) -> SeedsInterval:
    """One draft's tau at S training seeds on the same n contexts: the mean of the seeds' pooled
    taus and its 95% half-width, as `delta_tau`'s (with one seed: `stats()`' interval)."""
    if not counts:
        raise ValueError("tau_over_seeds needs the counts of one seed at least")
    return _over_seeds([c.linearized() for c in counts], SeedsInterval)


def _pad_cat(blocks: list[torch.Tensor]) -> torch.Tensor:
    """Stack (n_i, R_i) accept-count blocks into (sum n_i, max R_i), padding with -1."""
    width = max(b.shape[1] for b in blocks)
    return torch.cat([torch.nn.functional.pad(b, (0, width - b.shape[1]), value=-1) for b in blocks])


# ---------------------------------------------------------------------------- measurement


def batch_seed(seed: int, context_length: int, batch: int) -> int:
    """The seed of one batch's generator: a function of what the batch is, not of who runs it
    or which method decodes it (common random numbers across methods)."""
    return zlib.crc32(f"{seed}/{context_length}/{batch}".encode())


class _Prefixed:
    """A SectionTimer view that charges sections to `prefix/section`."""

    def __init__(self, timer: SectionTimer, prefix: str):
        self.timer, self.prefix = timer, prefix

    def __call__(self, name: str):
        return self.timer(f"{self.prefix}/{name}")


class Measured(NamedTuple):
    """What `measure_tau` measured."""

    counts: dict[str, dict[int, AcceptCounts]]  # {method: {L: AcceptCounts}}
    losses: dict[int, torch.Tensor]  # {L: (n,) the target's loss on each context's continuation}; {} if not asked
    n_contexts: dict[str, dict[int, int]]  # {method: {L: contexts it decoded}}: all of them, or where its rule stopped


def _decode_batch(target, methods, rows, L, b, protocol, timer, continuation) -> dict[str, torch.Tensor]:
    """Batch b of contexts `rows` (B, L) decoded by each of `methods` (the factories of those still
    running at L), from one shared target prefill, with the target's loss on `continuation` read
    from it (key "target loss") if given."""
    device = rows.device
    drafts = {name: (make(), torch.Generator(device).manual_seed(batch_seed(protocol.seed, L, b)))
              for name, make in methods.items()}
    G = max(protocol.new_tokens, continuation.shape[1] if continuation is not None else 0)
    with timer("prefill") if timer else contextlib.nullcontext():
        shared = prefill(target, rows, capacity=speculative_capacity(L, G, protocol.k),
                         **prefill_needs((d for d, _ in drafts.values()), protocol.k))
    out = {}
    if continuation is not None:
        with timer("target loss") if timer else contextlib.nullcontext():
            out["target loss"] = prefilled_losses(target, shared, continuation)
    for name, (draft, gen) in drafts.items():
        out[name] = speculative_generate(target, draft, rows, protocol.new_tokens, k=protocol.k,
                                         temperature=protocol.temperature, generator=gen, prefilled=shared,
                                         timer=_Prefixed(timer, name) if timer else None).accepted.cpu()
    return out


def measure_tau(
    target: Transformer,
    methods: Mapping[str, DraftFactory],
    contexts: Mapping[int, torch.Tensor],
    protocol: TauProtocol = TauProtocol(),
    timer: SectionTimer | None = None,
    progress: bool = False,
    continuations: Mapping[int, torch.Tensor] | None = None,
    rule: Rule | None = None,
) -> Measured:
    """Accept counts of every method at every context length, and the target's loss on each
    context's continuation if `continuations` maps L to (n, G') tokens (`context_loss.prefilled_losses`).

    `contexts` maps L to the (n, L) token contexts every method decodes from (drawn once from the
    validation split, with a fixed seed, by the data layer). A `timer`
    accumulates "prefill" (the shared target prefill), "target loss" and "<method>/<section>" seconds.
    Contexts run in batches of `protocol.batch_size` rows, in order; the target's prefill of a batch is
    shared by every method that decodes it and by the loss. Each batch's generator depends on (seed,
    L, batch) alone (common random numbers across methods).

    With a `rule`, after each batch at an L the methods still running there that `rule.stopped(counts
    so far)` names stop drawing batches: 04's `stopping.StoppingRule` stops each once its tau is
    resolved (at least `rule.floor` contexts, 95% half-width <= `rule.half_width`), 05's
    `ablations.DeltaRule` all at once where its table is settled at its first look; the others go
    on, up to all n (the cap). A method's contexts are then the
    first `n_contexts[method][L]` of L's, so any two methods share their first min(n_a, n_b)
    contexts and random streams (`delta_tau` pairs only equal counts). The target's loss at L
    covers the contexts of its longest-running method: the batches some method decoded, the prefill
    it reads being run anyway.

    Under `torchrun` (any backend; gloo on CPU) batches are dealt to the processes in order,
    batch i of a round to rank i % world_size, and gathered on every process. Without a rule one
    round holds every batch. With one, a round holds world_size batches; after it, every process
    applies the rule to the gathered batches one at a time, in batch order. A method that stops at
    a batch drops the later batches of that round (decoded, not kept), and so does the loss where
    every method has stopped. So every process agrees, and the result equals a single process's.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    device = next(target.parameters()).device
    B = protocol.batch_size
    batches = {L: math.ceil(ctx.shape[0] / B) for L, ctx in contexts.items()}
    running = {L: list(methods) for L in contexts}  # the methods still drawing batches at L
    kept: dict[tuple[str, int], list[torch.Tensor]] = {(name, L): [] for name in methods for L in contexts}
    losses: dict[int, list[torch.Tensor]] = {L: [] for L in contexts}
    drawn = {L: 0 for L in contexts}  # batches decided at L
    with progress_bar(total=-(-len(methods) * sum(batches.values()) // world), enabled=progress, unit="batch",
                      desc=f"tau of {', '.join(methods) if len(methods) <= 6 else f'{len(methods)} drafts'}",
                      tokens_per_step=B * protocol.new_tokens) as bar:
        while True:  # one round of batches, every L's next ones (batch-major), then the rule
            pending = [(L, b) for b in range(max(batches.values(), default=0)) for L in contexts
                       if running[L] and drawn[L] <= b < batches[L]]
            wave = pending[:world] if rule else pending
            if not wave:
                break
            mine = {}
            for L, b in wave[rank::world]:
                rows = slice(b * B, (b + 1) * B)
                mine[L, b] = _decode_batch(target, {name: methods[name] for name in running[L]},
                                           contexts[L][rows].to(device), L, b, protocol, timer,
                                           continuations[L][rows] if continuations else None)
                bar.update(len(running[L]))
            if world > 1:
                shards = [None] * world
                dist.all_gather_object(shards, mine)
                mine = {key: value for shard in shards for key, value in shard.items()}
            for L, b in wave:
                drawn[L] = b + 1
                if running[L] and continuations:
                    losses[L].append(mine[L, b]["target loss"])
                for name in running[L]:
                    kept[name, L].append(mine[L, b][name])
                if rule:
                    stop = set(rule.stopped({n: AcceptCounts(_pad_cat(kept[n, L]), protocol.k) for n in running[L]}))
                    running[L] = [name for name in running[L] if name not in stop]
    counts = {name: {L: AcceptCounts(_pad_cat(kept[name, L]), protocol.k) for L in contexts} for name in methods}
    return Measured(counts, {L: torch.cat(losses[L]) for L in contexts} if continuations else {},
                    {name: {L: c.accepted.shape[0] for L, c in by_l.items()} for name, by_l in counts.items()})


def summarize(counts: Mapping[str, Mapping[int, AcceptCounts]],
              rule: StoppingRule | None = None) -> dict[str, dict[int, TauStats]]:
    """TauStats for every method and context length; measured under a stopping `rule`, each with
    the half-width that rule reports (`StoppingRule.reported`: the wider of the t half-width and
    the rule's, the fixed-width interval of a sequential rule)."""
    stats = {name: {L: c.stats() for L, c in by_length.items()} for name, by_length in counts.items()}
    if rule:
        stats = {name: {L: replace(s, ci95=float(rule.reported(s.ci95))) for L, s in by_l.items()}
                 for name, by_l in stats.items()}
    return stats
