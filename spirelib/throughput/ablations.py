"""Which SPIRe component matters most (method §3.8): importance from ablation taus.

Each component is judged by what the modeled throughput multiplier (method §2) loses when it
is removed, comparing two variants that differ in that component alone. Five variants are
separately trained drafts with their own measured tau; "no_sparse_kv" is cost-model only
(SPIRe's tau, the draft reading its whole cache). With the paper's taus at (B, L) =
(64, 512) this reproduces the paper's order (tests/throughput/test_ablations.py). Where on two
variants' learning curves a part starts to pay is `pays_from`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from spirelib.throughput import perfmodel
from spirelib.throughput.recorded import Recorded

#: component -> (variant with it, the same variant without it)
COMPONENTS: dict[str, tuple[str, str]] = {
    "sparse KV": ("spire", "no_sparse_kv"),
    "target activations": ("no_feedback", "no_feedback_no_target_acts"),
    "distillation": ("spire", "hard_target"),
    "pruned init": ("spire", "random_init"),
    "feedback": ("spire", "no_feedback"),
    "MixedLoss": ("spire", "distill_only"),
}

#: The order the paper reports (method §3.8), most important first.
PAPER_IMPORTANCE_ORDER = ["sparse KV", "target activations", "distillation", "pruned init", "feedback", "MixedLoss"]


def variant_multipliers(taus: Mapping[str, float], B, L, target, draft, **model_kwargs) -> dict:
    """Modeled SPIRe throughput multiplier of every variant with a tau, plus "no_sparse_kv"
    (SPIRe's tau, sparse cache off) when "spire" is present; floats, or arrays over array B/L.
    `model_kwargs` go to `perfmodel.throughput_multiplier` (k, hoi, sink_size, window_factor
    or window, ...)."""
    out = {name: perfmodel.throughput_multiplier("spire", tau, B, L, target, draft, **model_kwargs)
           for name, tau in taus.items() if name != "no_sparse_kv"}
    if "spire" in taus:
        dense = {**model_kwargs, "window_factor": None, "window": None}
        out["no_sparse_kv"] = perfmodel.throughput_multiplier("spire", taus["spire"], B, L, target, draft, **dense)
    return out


def importance(multipliers: Mapping[str, float]) -> list[tuple[str, float]]:
    """(component, multiplier lost without it), most important first; components whose two
    variants are not both in `multipliers` are left out."""
    drops = [(name, multipliers[with_it] - multipliers[without])
             for name, (with_it, without) in COMPONENTS.items() if with_it in multipliers and without in multipliers]
    return sorted(drops, key=lambda item: -item[1])


def matches_paper_order(ranking: list[tuple[str, float]]) -> bool:
    """Whether an `importance` ranking orders its components as the paper does (method §3.8),
    comparing only the components it has."""
    ours = [name for name, _ in ranking]
    return ours == [name for name in PAPER_IMPORTANCE_ORDER if name in ours]


#: Components whose two variants are both trained drafts: their tau difference is measured
#: (paired, `tau.delta_tau`). "sparse KV" is cost-model only, exact at any scale.
MEASURED_COMPONENTS = {name: pair for name, pair in COMPONENTS.items() if "no_sparse_kv" not in pair}


#: What a ranking's measured differences speak about (the values of `tau.SeedsInterval.scope`):
#: "training" (two seeds or more: over training randomness, the target held fixed) or "draft"
#: (one seed: the one trained draft per variant that seed gave, over its contexts only).
TRAINING, DRAFT = "training", "draft"


#: A ranked part's effects, in the order a ranking lists them.
EFFECTS = ("helps", "harmful", "not resolved")


@dataclass(frozen=True)
class RankedPart(Recorded):
    """One part of SPIRe as a ranking (`resolved_ranking`) holds it and notebook 05 records it under
    "importance": the modeled multiplier lost without it, whether its difference is resolved over
    training randomness, its effect (one of `EFFECTS`), what the verdict is about ("scope") and its
    rank among the parts that help (None for the others)."""

    part: str
    multiplier_lost: float
    resolved: bool = True
    effect: str = ""
    scope: str = TRAINING
    rank: int | None = None

    @classmethod
    def from_dict(cls, recorded: dict) -> RankedPart:
        """A recorded row; one recorded before "effect" existed helps when resolved (then the
        default) with a positive multiplier."""
        row = super().from_dict(recorded)
        if row.effect:
            return row
        effect = "not resolved" if not row.resolved else "helps" if row.multiplier_lost > 0 else "harmful"
        return replace(row, effect=effect)


def resolved_ranking(ranking: list[tuple[str, float]], resolved: Mapping[str, bool],
                     scope: str = TRAINING) -> list[RankedPart]:
    """An `importance` ranking with what this run can tell apart. Each part gets an "effect":
    "helps" (its measured tau difference is resolved, `resolved[name]`, e.g.
    `tau.DeltaTau.resolved`, and removing it costs multiplier; cost-model-only parts always are
    resolved), "harmful" (resolved, and removing it gains multiplier) or "not resolved". Only
    the parts that help get ranks 1, 2, ... in order of the multiplier they are worth; harmful
    parts follow, then unresolved ones, both without a rank: a part that hurts is reported as
    harmful, not placed at the end of an importance chain.

    `scope` DRAFT (one seed): `resolved[name]` says the interval excludes 0 for that seed's
    trained drafts (`tau.DeltaTau.excludes_zero`); the effects are about those drafts, and a
    measured part's "resolved" stays False (nothing is resolved over training randomness with
    one seed). Every row records its "scope"."""
    if scope not in (TRAINING, DRAFT):
        raise ValueError(f"scope must be {TRAINING!r} or {DRAFT!r}, got {scope!r}")
    rows = []
    for name, drop in ranking:
        measured = name in MEASURED_COMPONENTS
        shown = not measured or resolved[name]
        rows.append((name, drop, shown and (not measured or scope == TRAINING),
                     "not resolved" if not shown else "helps" if drop > 0 else "harmful"))
    ordered = [row for effect in EFFECTS for row in rows if row[3] == effect]
    helping = [row[0] for row in ordered if row[3] == "helps"]
    return [RankedPart(name, drop, shown, effect, scope, helping.index(name) + 1 if effect == "helps" else None)
            for name, drop, shown, effect in ordered]


def pays_from(with_it: list[tuple[int, float]], without: list[tuple[int, float]], margin: float = 1e-3) -> int | None:
    """The training tokens from which a part pays on the learning curves (`learning_curve` of the
    variant with the part and of the one without, at the same evaluations): the first evaluation
    from which on `with_it` stays above `without` by more than `margin` (a difference below the
    three decimals the curves are reported with is a tie); None when it is not above at the last."""
    common = sorted(set(dict(with_it)) & set(dict(without)))
    a, b = dict(with_it), dict(without)
    start = None
    for tokens in common:
        if a[tokens] > b[tokens] + margin:
            start = tokens if start is None else start
        else:
            start = None
    return start
