"""What a comparison of drafting methods is, and what the notebooks derive from it (method §2).

A `Scenario` says what is compared: target and draft shapes, each method's tau, the hardware
intensity, the sparse window and (optionally) a per-request length distribution. The paper's
is `Scenario.paper()`; notebooks that measure their own taus on their own shapes build theirs
(`Scenario.trained`). From a scenario: its variants (without the sparse cache, with mixed
lengths), the multipliers over G generated tokens and per ablation, the best draft depth per
cell, the winner per scenario and the deployment schedules at one context. Multipliers are
TM = tau / dt. Numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from spirelib.throughput import perfmodel as pm
from spirelib.throughput.ablations import variant_multipliers
from spirelib.throughput.acceptance import alpha_from_tau, best_k
from spirelib.throughput.hardware import BYTES_PER_VALUE, Hardware
from spirelib.throughput.schedule import Acceptance, Schedule, modeled_table, schedule


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Shapes, taus and cost-model settings to compare methods under (method §2)."""

    target: pm.ModelShape | str
    drafts: Mapping[str, pm.ModelShape | str]  # method -> draft shape (MagicDec needs none)
    taus: Mapping[str, float]  # method -> tau at depth k; the methods shown
    k: int = 4
    hoi: float = pm.PAPER_HOI
    overlap: bool = True
    window_factor: int | None = 8
    window: int | None = None  # fixed sparse window in tokens (overrides window_factor)
    length_spread: float = 0.0  # > 0: each batch's lengths ~ LengthDistribution(L, spread)
    length_kind: str = "lognormal"
    seed: int = 0
    bytes_per_value: float = 1.0  # per weight and per KV value (paper: 1, FP8)
    label: str = "paper shapes, paper taus"

    @classmethod
    def paper(cls, target: str = "seqax-67m", tau_context: int = pm.PAPER_TAU_CONTEXT, **overrides) -> Scenario:
        """The paper's comparison: its target, drafts and Table 1 taus (HOI 600, k 4)."""
        drafts = {m: pm.PRESETS[name] for m, name in pm.PAPER_DRAFTS[target].items()}
        return cls(pm.PRESETS[target], drafts, dict(pm.PAPER_TAU[tau_context]), label=f"{target}, paper taus",
                   **overrides)

    @classmethod
    def trained(cls, target, vanilla, spire_layers: int, window: int, taus: Mapping[str, float],
                **overrides) -> Scenario:
        """The trained series' comparison: its target and vanilla draft (`ModelConfig`s), the SPIRe
        draft as the target's first `spire_layers` layers (method §3.1's pruned init) reading a fixed
        sparse `window` of tokens, and EAGLE-3's one layer of the target's shape."""
        drafts = {"vanilla": vanilla.shape(), "spire": dataclasses.replace(target, num_layers=spire_layers).shape(),
                  "eagle3": dataclasses.replace(target, num_layers=1).shape()}
        return cls(target.shape(), drafts, taus, window_factor=None, window=window, **overrides)

    def with_taus(self, taus: Mapping[str, float], label: str) -> Scenario:
        """The same shapes and settings with other taus (`taus`: method -> tau, e.g. every method a run
        measured: the verification-guided draft and prompt lookup draft with no shape of their own),
        under `label`. A method that drafts with a model this comparison has no shape for is refused."""
        missing = [m for m in taus if m not in pm.SELF_DRAFTS and m not in self.drafts]
        if missing:
            raise ValueError(f"{self.label} has no draft shape for {', '.join(missing)}: give its shape in `drafts`")
        return dataclasses.replace(self, taus=dict(taus), label=label)

    def with_one_pass(self, tau: float) -> Scenario:
        """This comparison with a one-pass drafter added (method §2, "Beyond the paper's three": all k
        drafts in one forward, as DFlash and P-EAGLE draft) of SPIRe's draft shape at a stated `tau`:
        a parameter of the question "where would such a drafter beat SPIRe?", not a measurement."""
        if not 1 <= tau <= self.k + 1:
            raise ValueError(f"a one-pass drafter's tau at k = {self.k} lies in [1, {self.k + 1}], got {tau}")
        return dataclasses.replace(self, taus={**self.taus, "one_pass": float(tau)},
                                   drafts={**self.drafts, "one_pass": self.drafts["spire"]},
                                   label=f"{self.label}; one-pass drafter at a stated tau of {tau:g}")

    def tau_to_match(self, method: str, B, L, rival: str | None = None) -> np.ndarray:
        """The tau `method` needs at the broadcast (B, L) points for its TM to equal `rival`'s at the
        rival's tau here (None: to equal AD, TM 1). TM = tau / dt with dt independent of tau (method
        §2), so the answer is TM_rival * dt_method: a question the model answers for a method no one has
        measured (the guided draft, prompt lookup at the paper's shapes). Above k + 1 no draft reaches it."""
        dt = 1.0 / dataclasses.replace(self, taus={method: 1.0}).multipliers(B, L)[method]  # TM at tau 1 is 1 / dt
        if rival is None:
            return dt
        return dataclasses.replace(self, taus={rival: self.taus[rival]}).multipliers(B, L)[rival] * dt

    def with_hardware(self, hardware: Hardware, dtype: str) -> Scenario:
        """The same comparison on `hardware` computing in `dtype`, weights and KV stored in it too."""
        return dataclasses.replace(self, hoi=hardware.hoi(dtype), bytes_per_value=float(BYTES_PER_VALUE[dtype]))

    def model_kwargs(self) -> dict:
        """The cost-model settings of `perfmodel.throughput_multiplier` (method §2) this scenario fixes."""
        return dict(k=self.k, hoi=self.hoi, overlap=self.overlap, window_factor=self.window_factor, window=self.window,
                    bytes_per_weight=self.bytes_per_value, bytes_per_kv=self.bytes_per_value)

    def multipliers(self, B, L) -> dict[str, np.ndarray]:
        """Throughput multiplier per method at the broadcast (B, L) points (L = mean when spread > 0)."""
        out = {}
        kwargs = self.model_kwargs()
        for method, tau in self.taus.items():
            draft = self.drafts.get(method)
            if self.length_spread == 0:
                out[method] = np.asarray(pm.throughput_multiplier(method, tau, B, L, self.target, draft, **kwargs))
                continue
            batch, context = np.broadcast_arrays(np.asarray(B), np.asarray(L))
            values = [pm.throughput_multiplier(method, tau, int(b), self._lengths(float(l)), self.target, draft,
                                               **kwargs) for b, l in zip(batch.ravel(), context.ravel())]
            out[method] = np.reshape(values, batch.shape)
        return out

    def mixed_and_uniform(self, B: int, lengths: pm.RequestLengths) -> dict[str, tuple[float, float]]:
        """Per method, TM of a batch of B requests with `lengths` and TM of a uniform batch of
        their mean length (`perfmodel.mixed_and_uniform`)."""
        return {m: pm.mixed_and_uniform(m, tau, B, lengths, self.target, self.drafts.get(m), **self.model_kwargs())
                for m, tau in self.taus.items()}

    def _lengths(self, mean: float) -> pm.LengthDistribution:
        return pm.LengthDistribution(mean, spread=self.length_spread, kind=self.length_kind, seed=self.seed)


def taus_used(measured) -> tuple[dict, dict, int | None, str]:
    """The taus a comparison uses: those measured in the run (`measured`: `recorded.recorded_taus`'s
    (taus, per-position acceptance, L)) or, without them (None), the paper's Table 1 at its L;
    with the phrase that names their source. Returns (taus, per_position, L or None, source)."""
    if measured is None:
        return (dict(pm.PAPER_TAU[pm.PAPER_TAU_CONTEXT]), {}, None,
                f"the paper's Table 1 taus at L = {pm.PAPER_TAU_CONTEXT} (no taus were measured in this run)")
    taus, per_position, L = measured
    return taus, per_position, L, f"taus measured in this run by notebook 04 at L = {L}"


def paper_ablation_multipliers(scenario: Scenario, B: int, L) -> dict:
    """SPIRe's modeled TM (method §2) with each of the paper's ablation taus (method §3.8,
    `perfmodel.PAPER_ABLATION_TAU`) under the scenario's shapes and settings, "no_sparse_kv"
    with a dense draft cache (`ablations.variant_multipliers`); floats, or (len(L),) arrays."""
    return variant_multipliers(pm.PAPER_ABLATION_TAU, B, L, scenario.target, scenario.drafts["spire"],
                               **scenario.model_kwargs())


def multipliers_over_generation(scenario: Scenario, B: int, L_values, G: int) -> dict[str, np.ndarray]:
    """The G-aware TM (method §2's model priced over the G generated tokens, the cache growing)
    per method of `scenario`, (len(L_values),) at batch B."""
    return {m: np.array([pm.throughput_multiplier_over_generation(m, tau, B, L, G, scenario.target,
                                                                  scenario.drafts.get(m), **scenario.model_kwargs())
                         for L in L_values]) for m, tau in scenario.taus.items()}


def best_k_maps(scenario: Scenario, taus: dict, per_position: dict, B, L, default_cap: int = 8):
    """Per method, the best draft depth at every broadcast (B, L) cell, and the deepest k searched.

    A method with measured per-position acceptance (`per_position[method]`, (k,)) is searched
    up to its measured depth; otherwise i.i.d. alpha from its tau at the scenario's k, up to
    `default_cap`. Returns ({method: k grid}, {method: cap}).
    """
    best, caps = {}, {}
    for method, tau in taus.items():
        acceptance = per_position.get(method)
        acceptance = np.asarray(acceptance) if acceptance else float(alpha_from_tau(tau, scenario.k))
        caps[method] = len(acceptance) if np.ndim(acceptance) == 1 else default_cap  # best_k's k_max
        best[method], _ = best_k(method, acceptance, B, L, scenario.target, scenario.drafts.get(method),
                                 k_max=caps[method], **depth_free(scenario))
    return best, caps


def depth_free(scenario: Scenario) -> dict:
    """The scenario's cost-model settings without its k (`acceptance.best_k` varies k)."""
    return {key: value for key, value in scenario.model_kwargs().items() if key != "k"}


def stated_on_cell(scenario: Scenario, B: int, L: int, tau_context: int, target: str = "seqax-67m") -> dict | None:
    """The paper's stated multipliers (`perfmodel.PAPER_MULTIPLIERS`) where (B, L) and the settings
    are the paper's own cell (its B, L, HOI 600, f = max and Table 1 at L = 512), else None."""
    stated = pm.PAPER_MULTIPLIERS[target]
    on_cell = (B, L, scenario.hoi, scenario.overlap, tau_context) == (stated["B"], stated["L"], 600.0, True, 512)
    return stated if on_cell else None


def dense_scenario(scenario: Scenario) -> Scenario:
    """The scenario without the sparse draft KV cache (Klen = L, method §2): the drafts whose cache
    the window bounds, MagicDec and SPIRe."""
    return dataclasses.replace(scenario, window_factor=None, taus={m: scenario.taus[m] for m in ("magicdec", "spire")})


def ablation_curves(scenario: Scenario, B: int, L) -> dict:
    """`paper_ablation_multipliers` keyed by the names a figure shows ("random init"; "spire" stays)."""
    return {(name if name == "spire" else name.replace("_", " ")): tm
            for name, tm in paper_ablation_multipliers(scenario, B, L).items()}


def mixed_scenarios(scenarios: dict[str, Scenario], spread: float, seed: int) -> dict[str, Scenario]:
    """Each scenario with mixed-length batches (log-length sigma `spread`, sampled with `seed`), labelled so."""
    return {name: dataclasses.replace(s, length_spread=spread, seed=seed,
                                      label=s.label + f", mixed lengths (sigma {spread:g})")
            for name, s in scenarios.items()}


def multipliers_at(scenarios: dict[str, Scenario], B: int, L: int) -> dict[str, dict[str, float]]:
    """Per scenario, each method's TM at (B, L) as floats."""
    return {name: {m: float(tm) for m, tm in s.multipliers(B, L).items()} for name, s in scenarios.items()}


def scenario_winners(at: dict[str, dict[str, float]]) -> dict[str, str]:
    """Per scenario of `multipliers_at`, the method with the highest TM."""
    return {name: max(values, key=values.get) for name, values in at.items()}


def schedules_at(scenario: Scenario, acceptance: dict[str, Acceptance], L: int, max_batch: int) -> dict[str, Schedule]:
    """Per method the deployment schedule (`throughput.schedule`, docs/deploy.md) over B =
    1..max_batch at context L under the scenario's shapes and cost settings (its k ignored: the
    schedule picks k per B)."""
    B = np.arange(1, max_batch + 1)
    return {m: schedule(modeled_table(m, a, B, L, scenario.target, scenario.drafts.get(m), **depth_free(scenario)),
                        max_batch=max_batch) for m, a in acceptance.items()}


def implied_alphas(scenario: Scenario) -> dict[str, float]:
    """Per method the i.i.d. acceptance rate alpha its tau implies at the scenario's k (method §2:
    tau(k) = (1 - alpha^(k+1)) / (1 - alpha), inverted)."""
    return {m: alpha_from_tau(tau, scenario.k) for m, tau in scenario.taus.items()}


def spire_best_k(scenario: Scenario, B, L, cap: int) -> np.ndarray:
    """SPIRe's best draft depth on the grid B x L ((len(B), len(L))), i.i.d. alpha from its tau,
    searched up to `cap` (`best_k_maps`)."""
    B, L = np.asarray(B), np.asarray(L)
    best, _ = best_k_maps(scenario, {"spire": scenario.taus["spire"]}, {}, B[:, None], L[None, :], default_cap=cap)
    return best["spire"]
