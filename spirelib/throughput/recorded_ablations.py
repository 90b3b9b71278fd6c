"""What notebook 05, the ablations (method §3.8, §10), records, read back typed: each variant's tau
over the seeds (`VariantTau`), SPIRe's parts ranked (`ablations.RankedPart`), every paired
difference with its family-wise verdict (`RecordedDelta`), what the intervals are about and the
family they are controlled over (`RecordedInterval`, `Family`) and how the variants were trained
and measured (`AblationProtocol`), all in one `RecordedAblations` (`ablation_record`). 05 builds
these (`tables.ablations`) and records `to_dict()`; its words, its figure, the run index's claim
and its details table read the same shapes, whether in memory or read back."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from spirelib.throughput.ablations import DRAFT, TRAINING, RankedPart
from spirelib.throughput.recorded import Recorded


@dataclass(frozen=True)
class VariantTau(Recorded):
    """One variant's tau as 05 records it under "tau": the mean over the seeds, its 95% half-width
    over seeds and contexts (method §10) and the contexts each seed decoded."""

    mean: float
    ci95: float
    n_contexts: int


@dataclass(frozen=True)
class RecordedDelta(Recorded):
    """A paired difference of taus as 05 records it (`tables.ablations.delta_record`): the mean over
    the seeds, its own 95% half-width (uncorrected), each seed's value, what it is about, its
    degrees of freedom and variance terms (method §10; `tau.DeltaTau`'s fields), whether its own
    interval excludes 0 ("excludes_zero"; "resolved_alone": and spans two seeds or more), and the
    family-wise verdicts: "resolved" over training randomness, "family_excludes_zero" also with one
    seed. A field a run recorded before it existed reads as its default."""

    mean: float
    ci95: float
    per_seed: list[float] = field(default_factory=list)
    scope: str = TRAINING
    about: str = ""
    seeds: int = 0
    n_contexts: int = 0
    df_seeds: int | None = None
    df_contexts: int | None = None
    seeds_var: float | None = None
    contexts_var: float | None = None
    excludes_zero: bool = False
    resolved: bool = False
    family_excludes_zero: bool = False
    resolved_alone: bool = False

    def text(self) -> str:
        """The difference with its own interval, as every table and sentence of 05 says it."""
        return f"{self.mean:+.3f} ± {self.ci95:.3f}"


@dataclass(frozen=True)
class Family(Recorded):
    """The family one ablation table's verdicts are controlled over (method §10): the procedure
    (Holm's step-down), the family-wise level and the number of comparisons; under 05's two-look
    rule (`measure.ablations.DeltaRule`) the looks and Holm's level at the look the table stopped
    (its share of `level`; `level` itself with one look, and in a run recorded before looks)."""

    procedure: str
    level: float
    comparisons: int
    looks: int = 1
    look_level: float | None = None
    width: float | None = None  # with two looks: a comparison within +- this tau is settled at the first

    @property
    def tested_at(self) -> float:
        """Holm's family-wise level at the look the verdicts were made."""
        return self.level if self.look_level is None else self.look_level


@dataclass(frozen=True)
class RecordedInterval(Recorded):
    """What 05's paired intervals are about (`tables.ablations.interval_note`): "scope" (TRAINING,
    or DRAFT with one seed) in words ("about"), the seeds and contexts, the degrees of freedom of
    the seeds' term (None with one seed) and of the contexts', the target held fixed, and the
    `Family` (None in a run recorded before 05 recorded it)."""

    scope: str
    about: str = ""
    seeds: int = 1
    n_contexts: int = 0
    df_seeds: int | None = None
    df_contexts: int = 0
    target: str = "fixed"
    family: Family | None = None

    @classmethod
    def from_dict(cls, recorded: dict) -> RecordedInterval:
        fam = recorded.get("family")
        return replace(super().from_dict(recorded), family=Family.from_dict(fam) if fam else None)

    @property
    def one_seed(self) -> bool:
        """Whether every difference is about one trained draft per variant (one seed)."""
        return self.scope == DRAFT


@dataclass(frozen=True)
class AblationProtocol(Recorded):
    """How 05 trained and measured its variants (method §5's tau protocol), as it records it under
    "ablation_protocol": L, the contexts (the cap, and the first look of a two-look rule), k, G, T
    and the contexts' seed; the training budget
    (`TrainConfig` fields) and SPIRe's shape (`SpireConfig` fields) every variant shared, the
    training seeds, the training's seconds and the scale note. Empty in a run that recorded none."""

    context_length: int | None = None
    n_contexts: int | None = None  # the cap: the contexts every draft decodes unless the table stops earlier
    first_look: int | None = None  # the contexts at the first of two looks (`DeltaRule`); None: one look
    look_width: float | None = None  # with two looks: a comparison within +- this tau is settled at the first
    k: int | None = None
    new_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    training: dict = field(default_factory=dict)
    spire: dict = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    training_seconds: float | None = None
    scale: str = ""

    @property
    def training_tokens(self) -> int | None:
        """The tokens each variant trained on per seed (None where the budget was not recorded)."""
        t = self.training
        return t["batch_size"] * t["seq_len"] * t["steps"] if t else None


@dataclass(frozen=True)
class RecordedAblations(Recorded):
    """All 05 records of its ablations but the learning curves: each variant's tau (`VariantTau`),
    the parts of SPIRe ranked ("importance": `RankedPart`), the paired differences to SPIRe per
    variant ("delta_tau") and per measured part ("component_delta_tau"; `RecordedDelta`), what
    their intervals are about (`RecordedInterval`; None without differences), the seeds, whether
    the ranking keeps the paper's order and the `AblationProtocol`."""

    tau: dict[str, VariantTau] = field(default_factory=dict)
    importance: list[RankedPart] = field(default_factory=list)
    delta_tau: dict[str, RecordedDelta] = field(default_factory=dict)
    component_delta_tau: dict[str, RecordedDelta] = field(default_factory=dict)
    interval: RecordedInterval | None = None
    seeds: list[int] = field(default_factory=list)
    importance_matches_paper: bool = False
    ablation_protocol: AblationProtocol = field(default_factory=AblationProtocol)

    @classmethod
    def from_dict(cls, recorded: dict) -> RecordedAblations:
        interval = recorded.get("interval")
        return cls(tau={name: VariantTau.from_dict(t) for name, t in (recorded.get("tau") or {}).items()},
                   importance=[RankedPart.from_dict(r) for r in recorded.get("importance") or []],
                   delta_tau=_deltas(recorded.get("delta_tau")),
                   component_delta_tau=_deltas(recorded.get("component_delta_tau")),
                   interval=RecordedInterval.from_dict(interval) if interval else None,
                   seeds=list(recorded.get("seeds") or []),
                   importance_matches_paper=bool(recorded.get("importance_matches_paper")),
                   ablation_protocol=AblationProtocol.from_dict(recorded.get("ablation_protocol") or {}))

    @property
    def one_seed(self) -> bool:
        """Whether the differences are about one trained draft per variant (one seed)."""
        return self.interval is not None and self.interval.one_seed


def _deltas(recorded: dict | None) -> dict[str, RecordedDelta]:
    return {name: RecordedDelta.from_dict(d) for name, d in (recorded or {}).items()}


def ablation_record(results: dict) -> RecordedAblations:
    """Notebook 05's record in a run's results, typed; empty (no parts ranked) where the run has none."""
    return RecordedAblations.from_dict(results.get("05_ablations") or {})
