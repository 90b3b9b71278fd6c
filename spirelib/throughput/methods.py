"""One card per drafting method (method §1, §2, §4): everything the library knows about a way to
draft that is not its torch code, in one numpy-free table the performance model, the profiled
model, the plan, the benchmarks, `spire deploy` and the reports all read.

A card holds a method's name, display label, colour and winner-map letter; whether it needs a
trained draft model; whether the paper's model prices it (method §2) or only our extension does;
the engines that serve it; and its round as a list of forwards (`MethodCard.round`: which model
runs each, on how many new tokens a row, over which keys). A sparse draft reads a named
`KVBudget` (sink, recent window, entries chosen by the last verification's attention), one name
for what MagicDec's ring, SPIRe's cache and the guided draft's selection each keep.

A new draft adds one card here and one builder in `decoding.builders` (its torch code); the
table's test checks the two agree. `STYLES` also names the ablation variants of method §3.8 and
"target", which are drawn but do not draft. An unknown key is shown as itself, coloured from
plotly's qualitative palette by its position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

_PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
            "#FECB52")  # plotly.colors.qualitative.Plotly

TARGET, DRAFT = "target", "draft"  # who runs a forward: the target, or the method's own draft model
CONTEXT, BUDGET = "context", "budget"  # what it reads: every key of a dense cache, or the method's KV budget


@dataclass(frozen=True)
class KVBudget:
    """The keys a sparse draft keeps per layer and KV head (method §3.4, §4): the first `sink`
    positions, the `window` before the pending token, and `chosen` older positions picked by the
    last verification's attention (the guided draft; 0 for MagicDec's ring and SPIRe's cache)."""

    sink: int = 1
    window: int = 64
    chosen: int = 0

    def __post_init__(self):
        if self.sink < 0 or self.window < 1 or self.chosen < 0:
            raise ValueError(f"a KV budget needs sink >= 0, window >= 1 and chosen >= 0, got {self}")

    @property
    def entries(self) -> int:
        return self.sink + self.window + self.chosen

    @classmethod
    def ring(cls, entries: int, sink: int = 1) -> KVBudget:
        """A budget of `entries`: the sink and a recent window of the rest (MagicDec's ring, method §3.4)."""
        if entries - sink < 1:
            raise ValueError(f"a KV budget of {entries} leaves no window past the sink of {sink}; give a budget of "
                             "at least sink + 1")
        return cls(sink, entries - sink)

    @classmethod
    def split(cls, entries: int, sink: int = 1) -> KVBudget:
        """A budget of `entries` with the guided draft's split (method §4; MagicDec's sink + window for
        a like-for-like comparison): the sink, and the rest half a recent window (which takes an odd
        one) and half entries chosen by attention."""
        rest = entries - sink
        if rest < 2:
            raise ValueError(f"a KV budget of {entries} leaves {rest} entries past the sink of {sink}: the guided "
                             "draft needs at least a window of 1 and 1 chosen entry; give a budget of at least "
                             "sink + 2")
        return cls(sink, rest - rest // 2, rest // 2)


MAGICDEC_BUDGET = KVBudget(1, 64)  # MagicDec's sink + window (method §3.4), the self-drafts' default


@dataclass(frozen=True)
class Pass:
    """One forward of a round: who runs it (`TARGET` or the method's `DRAFT` model), on `new`
    tokens a row, reading `reads` (`CONTEXT`: every key of a dense cache; `BUDGET`: the KV budget)
    plus `own` keys it writes itself; `scores`: its queries also score every key (the guided
    draft's verification); `verify`: the target's verification of the round."""

    runs: str
    new: int
    reads: str
    own: int = 0
    scores: bool = False
    verify: bool = False


@dataclass(frozen=True)
class MethodCard:
    """A drafting method (module docstring). `drafter`: who runs its k draft passes (`TARGET` for
    the self-drafts, `DRAFT` for a draft model, None for no forward at all: prompt lookup);
    `reads`/`own`: what each pass reads; `first_new`: tokens its first pass runs (the vanilla
    draft re-runs the token before the pending one, `drafts.VanillaDraft`); `memory`: it writes
    memory from the target's verified activations (SPIRe, method §3.3); `fused`: the target
    layers whose hidden states it fuses into each verified entry (EAGLE-3's 3, through a
    `fused` x d -> d projection, and a [embedding ; feature] input to its layer); `unrolled`: its
    training runs each of its k steps over every position (EAGLE-3's training-time test), where
    SPIRe's k passes cost about one forward (method §3.6); `scores`: its verification
    records attention scores; `joint`: its k positions come from one pass of k tokens
    (a one-pass drafter, modeled only); `paper`: the paper's three (method §2), else priced by our
    extension (`perfmodel.EXTRA_METHODS`) or, with `priced` False, not at all; `engines`: each
    serving engine's name for it (vLLM's method, SGLang's algorithm), none if no engine serves it;
    `ngrams`: the n-gram lengths a prompt lookup tries (`decoding.lookup`), which its engine keys carry;
    `budget`: how a sparse self-draft spends a total of `entries` keys with a `sink` (`KVBudget.ring`,
    `KVBudget.split`): what `Series.kv_budgets` and the benchmarks give its builder as `budget=`
    (None: it reads no budget, or, SPIRe, its trained config's); `priced_like`: for a method the
    paper has no tau for, the paper's method whose tau (and spread) the plan prices it at before a
    run has measured its own (`workbook.work.prior_tau`): its nearest relative in the paper; None:
    at tau 1, every round one token (prompt lookup, whose proposals need the text to repeat itself)."""

    name: str
    label: str
    color: str
    letter: str
    needs_model: bool
    drafter: str | None
    reads: str = CONTEXT
    own: int = 0
    first_new: int = 1
    memory: bool = False
    fused: int = 0
    unrolled: bool = False
    scores: bool = False
    joint: bool = False
    paper: bool = False
    priced: bool = True
    engines: dict[str, str] = field(default_factory=dict)
    ngrams: tuple[int, int] | None = None  # the n-gram lengths (shortest, longest) a prompt lookup tries
    budget: Callable[[int, int], KVBudget] | None = None  # (entries, sink) -> a self-draft's KV budget
    priced_like: str | None = None  # a paper method whose tau prices this one before it is measured

    @property
    def self_draft(self) -> bool:
        """No draft model of its own (the target drafts, or nothing does)."""
        return self.drafter != DRAFT

    def round(self, k: int) -> tuple[Pass, ...]:
        """The forwards of one round: the k draft passes, then the target verifying k + 1 tokens."""
        if self.drafter is None:
            passes = ()
        elif self.joint:
            passes = (Pass(self.drafter, k, self.reads, self.own),)
        else:
            passes = tuple(Pass(self.drafter, self.first_new if j == 0 else 1, self.reads, self.own) for j in range(k))
        return (*passes, Pass(TARGET, k + 1, CONTEXT, scores=self.scores, verify=True))


CARDS: dict[str, MethodCard] = {c.name: c for c in (
    MethodCard("vanilla", "vanilla SD", "#2ca02c", "V", needs_model=True, drafter=DRAFT, first_new=2, paper=True,
               engines={"vllm": "draft_model", "sglang": "STANDALONE"}),
    MethodCard("magicdec", "MagicDec", "#1f77b4", "M", needs_model=False, drafter=TARGET, reads=BUDGET, own=1,
               paper=True, budget=KVBudget.ring),
    MethodCard("spire", "SPIRe", "#d62728", "S", needs_model=True, drafter=DRAFT, reads=BUDGET, memory=True,
               paper=True),
    MethodCard("guided", "guided sparse", "#17a0a0", "G", needs_model=False, drafter=TARGET, reads=BUDGET, own=1,
               scores=True, budget=KVBudget.split, priced_like="magicdec"),  # the verification-guided self-draft
    # MagicDec's ring with no attention sink, as many entries: the control for StreamingLLM's sink
    # (arXiv 2309.17453) in self-speculation, where the rotated-out first tokens may carry attention mass
    MethodCard("recent", "recent window", "#a0522d", "R", needs_model=False, drafter=TARGET, reads=BUDGET, own=1,
               budget=lambda entries, sink: KVBudget.ring(entries, 0), priced_like="magicdec"),
    # n-grams of 1 to 5, longest first: vLLM's default is 5 to 5; a floor should be generous, and a
    # proposal costs nothing but the verification the round runs anyway, so short n-grams are tried too
    MethodCard("lookup", "prompt lookup", "#8c8c3c", "P", needs_model=False, drafter=None,
               engines={"vllm": "ngram", "sglang": "NGRAM"}, ngrams=(1, 5)),
    # arXiv 2503.01840: its own dense KV; a trained draft model of its own, as the paper's vanilla draft
    MethodCard("eagle3", "EAGLE-3", "#7b4fd6", "E", needs_model=True, drafter=DRAFT, fused=3, unrolled=True,
               engines={"vllm": "eagle3", "sglang": "EAGLE3"}, priced_like="vanilla"),
    MethodCard("one_pass", "one-pass drafter", "#e8a33d", "1", needs_model=True, drafter=DRAFT, reads=BUDGET,
               joint=True),
)}
#: Methods the engine decodes with (a builder in `decoding.builders`); the one-pass drafter is a
#: hypothetical the performance model prices at a stated tau (method §2), with no torch code.
DECODED = tuple(m for m in CARDS if m != "one_pass")
#: The decoded self-drafts whose KV budget a series or a benchmark sets (`MethodCard.budget`).
BUDGETED = tuple(m for m in DECODED if CARDS[m].budget is not None)

AD = MethodCard("ad", "AD", "#7f7f7f", "AD", needs_model=False, drafter=None, priced=False)


def card(method: str) -> MethodCard:
    """The card of `method`; an unknown name is refused with the known ones."""
    if method not in CARDS:
        raise ValueError(f"unknown drafting method {method!r}; known: {', '.join(CARDS)}")
    return CARDS[method]


@dataclass(frozen=True)
class MethodStyle:
    label: str
    color: str


STYLES: dict[str, MethodStyle] = {
    AD.name: MethodStyle(AD.label, AD.color),
    "target": MethodStyle("target", "#7f7f7f"),
    **{c.name: MethodStyle(c.label, c.color) for c in CARDS.values()},
    "random_init": MethodStyle("random init", "#ff7f0e"),
    "distill_only": MethodStyle("distillation only", "#9467bd"),
    "hard_target": MethodStyle("hard target", "#8c564b"),
    "no_feedback": MethodStyle("no feedback", "#e377c2"),
    "no_feedback_no_target_acts": MethodStyle("no feedback, no target activations", "#bcbd22"),
    "no_sparse_kv": MethodStyle("no sparse KV", "#17becf"),
}


def label(key) -> str:
    """The display name of a method or variant (the key itself if it has none)."""
    style = STYLES.get(key)
    return style.label if style else str(key)


def color(key, i: int = 0) -> str:
    """The colour of a method or variant; an unknown key gets palette entry `i`."""
    style = STYLES.get(key)
    return style.color if style else _PALETTE[i % len(_PALETTE)]


def letter(key) -> str:
    """A method's letters in a winner map (AD's "AD"; an unknown key: its label's first two letters)."""
    found = CARDS.get(key) or (AD if key == AD.name else None)
    return found.letter if found else label(key)[:2]
