"""Tables of the paper's cost analysis (method §2, "Cost analysis") as notebook 08 shows them:
what a draft costs to train, the paper's five numbers recomputed, break-even serving volumes
and net savings in mixed-length batches. Costs are in target-training units (`costs`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from spirelib.modeling import costs
from spirelib.modeling import perfmodel as pm
from spirelib.modeling.methods import label as method_label
from spirelib.modeling.schedule import Acceptance, modeled_table, schedule
from spirelib.workbook.plots.explorer import Scenario
from spirelib.workbook.tables.perf import _depth_free, window_name

DRAFT_COST_COLUMNS = {"target": "target", "draft": "draft", "params": "body params",
                      "same_tokens": "units (target's tokens, MFU ratio applied)",
                      "own": "units (own Chinchilla budget)", "flops": "FLOPs on the target's tokens"}
COST_COLUMNS = {"method": "method", "tm": "modeled TM", "training_units": "training units",
                "gross_savings": "gross savings", "net_savings": "net savings",
                "net_from_rounded": "net, from TM rounded to 2 decimals"}
CHECK_COLUMNS = {"quantity": "quantity", "paper": "paper", "tm": "modeled TM", "rounded": "from TM to 2 decimals",
                 "full": "from full TM", "which": "matches the paper to 2 decimals"}
# The paper's five cost numbers (method §2): quantity, target, L, method, training units, stated savings.
PAPER_COST_CHECKS = (("SPIRe gross, (64, 512)", "seqax-67m", 512, "spire", 0.0, 6.40),
                     ("SPIRe net, (64, 512)", "seqax-67m", 512, "spire", 0.25, 6.15),
                     ("MagicDec, (64, 512)", "seqax-67m", 512, "magicdec", 0.0, 5.12),
                     ("SPIRe net, 70B (64, 65536)", "llama3-70b", 65536, "spire", 0.25, 6.20),
                     ("MagicDec, 70B (64, 65536)", "llama3-70b", 65536, "magicdec", 0.0, 5.33))


def draft_training_units(scenarios: dict[str, Scenario], mfu_ratio: float = 1.0) -> dict[str, dict[str, float]]:
    """target name -> method -> the draft's training cost in target-training units (trained on
    its target's tokens; `mfu_ratio` = the draft's training MFU / the target's)."""
    return {target: {m: costs.draft_training_units(d, target, mfu_ratio=mfu_ratio) for m, d in s.drafts.items()}
            for target, s in scenarios.items()}


def with_measured_training(modeled: dict[str, dict[str, float]], measured: dict | None
                           ) -> tuple[dict[str, dict[str, float]], str]:
    """The drafts' training units 08 prices with, and where SPIRe's come from, in words: the cost
    per token notebook 03 measured (`measured`: its "training_cost", `tables.training.training_cost`)
    for SPIRe at every target, where this run recorded one (it holds the frozen target's forward on
    every batch, which the body-parameter count leaves out), else the body-parameter model
    `modeled` (`draft_training_units`), said so (method §2, "Cost analysis")."""
    if not measured:
        return modeled, ("SPIRe's training is priced from its body parameters, "
                         + ", ".join(f"{units['spire']:.2f} units ({name})" for name, units in modeled.items())
                         + ": this run recorded no measured training cost (notebook 03).")
    units = measured["spire_units_per_token"]
    return ({name: {**m, "spire": units} for name, m in modeled.items()},
            f"SPIRe's training is priced at {units:.2f} target-training units, the cost per token notebook 03 measured "
            f"(the draft trained at {measured['spire_tokens_per_s']:,.0f} tokens/s, the target at "
            f"{measured['target_tokens_per_s']:,.0f}: every SPIRe step runs the frozen target forward), trained on as "
            f"many tokens as its target; its body parameters alone would say {measured['body_ratio']:.2f}, the "
            "paper's \"about 1/4\".")


def draft_cost_rows(scenarios: dict[str, Scenario], training: dict[str, dict[str, float]]) -> list[dict]:
    """Per target and draft: body parameters, training units on the target's tokens
    (`training`, from `draft_training_units`), units on its own Chinchilla budget (20 tokens per
    parameter, against the target's), and its training FLOPs on the target's tokens."""
    rows = []
    for target, scenario in scenarios.items():
        n_target = pm.body_params(target)
        target_flops = costs.training_flops(n_target, costs.chinchilla_tokens(n_target))
        for method, draft in scenario.drafts.items():
            n = pm.body_params(draft)
            rows.append({"target": target, "draft": f"{method_label(method)}: {pm.PAPER_DRAFTS[target][method]}",
                         "params": n, "same_tokens": training[target][method],
                         "own": costs.training_flops(n, costs.chinchilla_tokens(n)) / target_flops,
                         "flops": costs.training_flops(n, costs.chinchilla_tokens(n_target))})
    return rows


def by_method(rows: list[dict], key: str) -> dict:
    """method -> row[key] of a `costs.cost_table`."""
    return {r["method"]: r[key] for r in rows}


def relative_margin(nets: dict[str, float]) -> float | None:
    """SPIRe's net savings over MagicDec's, as a fraction; None when MagicDec saves nothing."""
    return nets["spire"] / nets["magicdec"] - 1 if nets["magicdec"] > 0 else None


def net_savings(multipliers: dict, serving_units, training: dict) -> dict:
    """method -> net savings, serving x (1 - 1/TM) - training units (method §2, "Cost analysis"),
    at `multipliers` (method -> TM; floats or arrays, as `serving_units` may be); a method
    without training units (MagicDec) pays none."""
    return {m: costs.serving_savings(tm, serving_units=serving_units, training_units=training.get(m, 0.0))
            for m, tm in multipliers.items()}


def paper_cost_checks(scenarios: dict[str, Scenario], B: int = 64) -> list[dict]:
    """The paper's five cost numbers (`PAPER_COST_CHECKS`) recomputed at its own cells: per
    quantity the stated value, the modeled TM, the savings from TM rounded to two decimals (the
    paper's arithmetic) and from the full TM, and which of the two matches to two decimals."""
    rows = []
    for quantity, target, L, method, training, stated in PAPER_COST_CHECKS:
        tm = float(scenarios[target].multipliers(B, L)[method])
        full = costs.serving_savings(tm, training_units=training)
        rounded = costs.serving_savings(round(tm, 2), training_units=training)
        rows.append({"quantity": quantity, "paper": stated, "tm": tm, "rounded": rounded, "full": full,
                     "which": ", ".join(n for n, v in (("rounded", rounded), ("full", full)) if round(v, 2) == stated)
                     or "neither"})
    return rows


def break_even_volumes(tm: dict, training: dict, tm_70b: dict, training_70b: dict) -> dict[str, float]:
    """Serving volumes (target-training units) from which a trained draft pays
    (`costs.break_even_serving`): SPIRe and vanilla SD against AD, SPIRe against MagicDec for
    the small target and for the 70B (tm: method -> TM, training: method -> units); inf: never."""
    return {"spire_vs_ad": costs.break_even_serving(tm["spire"], training["spire"]),
            "vanilla_vs_ad": costs.break_even_serving(tm["vanilla"], training["vanilla"]),
            "spire_vs_magicdec": costs.break_even_serving(tm["spire"], training["spire"], baseline_tm=tm["magicdec"]),
            "spire_vs_magicdec_70b": costs.break_even_serving(tm_70b["spire"], training_70b["spire"],
                                                              baseline_tm=tm_70b["magicdec"])}


def mixed_length_savings(scenario: Scenario, B: int, lengths, serving_units: float, training: dict,
                         windows=(None, 64)):
    """Net savings of a batch whose requests have `lengths` and of a uniform batch of their
    mean length, per draft window (None: the scenario's) and method (training: method -> units).

    Returns (rows, margins): rows show "mixed (uniform u)" per method; margins[window] is
    SPIRe's net savings minus MagicDec's, (mixed, uniform).
    """
    rows, margins = [], {}
    for window in windows:
        on = dataclasses.replace(scenario, window=window) if window is not None else scenario
        both = on.mixed_and_uniform(B, lengths)
        mixed, uniform = (net_savings({m: tms[i] for m, tms in both.items()}, serving_units, training) for i in (0, 1))
        rows.append({"window": window_name(on), **{m: f"{mixed[m]:.3f} (uniform {uniform[m]:.3f})" for m in on.taus}})
        margins[window_name(on)] = (mixed["spire"] - mixed["magicdec"], uniform["spire"] - uniform["magicdec"])
    return rows, margins


# Notebook 08's cells: the cost tables at its operating points, what it records and the sentences.

BREAK_EVEN_COLUMNS = {"comparison": "comparison", "volume": "break-even serving volume (units)"}


def cost_at(scenario: Scenario, B: int, L: int, training: dict[str, float], serving_units: float) -> list[dict]:
    """`costs.cost_table` (method §2, "Cost analysis") of the scenario's methods at (B, L): their
    modeled TM, the drafts' training units and `serving_units` of autoregressive serving."""
    tm = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
    return costs.cost_table(tm, training, serving_units=serving_units)


SCHEDULED_COLUMNS = {"method": "method", "k": "scheduled k", "tm_fixed": "TM at the fixed k", "tm": "TM at the schedule's k",
                     "net_fixed": "net savings, fixed k", "net": "net savings, schedule's k"}


def scheduled_savings(scenario: Scenario, B: int, L: int, training: dict[str, float], serving_units: float,
                      k_max: int = 8) -> list[dict]:
    """The cost table (method §2, "Cost analysis") with each method at the k its deployment
    schedule serves at (B, L) (`modeling.schedule` over B = 1..B, i.i.d. acceptance from the
    scenario's tau at its k, searched to `k_max`; k = 0: speculation off, TM 1) beside the fixed k:
    per method the scheduled k, both TMs and both net savings."""
    fixed = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
    scheduled, ks = {}, {}
    for m, tau in scenario.taus.items():
        table = modeled_table(m, Acceptance(float(tau), 0.0, scenario.k), np.arange(1, B + 1), L, scenario.target,
                              scenario.drafts.get(m), k_max=k_max, **_depth_free(scenario))
        ks[m] = schedule(table).k_at(B)
        scheduled[m] = float(table.at(ks[m])[0][B - 1])
    nets = {name: by_method(costs.cost_table(tm, training, serving_units=serving_units), "net_savings")
            for name, tm in (("fixed", fixed), ("scheduled", scheduled))}
    return [{"method": m, "k": ks[m], "tm_fixed": fixed[m], "tm": scheduled[m], "net_fixed": nets["fixed"][m],
             "net": nets["scheduled"][m]} for m in scenario.taus]


def scheduled_result(tables_at: dict[str, list[dict]]) -> dict:
    """`scheduled_savings` per target as results.json holds it: method -> {k, tm, net_savings}."""
    return {name: {r["method"]: {"k": r["k"], "tm": r["tm"], "net_savings": r["net"]} for r in rows}
            for name, rows in tables_at.items()}


def cost_heading(name: str, B: int, L: int, serving_units: float) -> str:
    """The heading of one `cost_at` table."""
    return f"**{name} at B = {B}, L = {L}**, serving = {serving_units:g} units"


def margin_sentence(label: str, nets: dict[str, float]) -> str:
    """SPIRe's net savings minus MagicDec's (units, and `relative_margin` when MagicDec saves anything)."""
    m = relative_margin(nets)
    return (f"{label}: SPIRe's net savings minus MagicDec's = {nets['spire'] - nets['magicdec']:.3f} units"
            + (f" ({100 * m:+.1f}%)" if m is not None else " (MagicDec saves nothing here)"))


def savings_results(gross: dict, net: dict, net_70b: dict) -> dict:
    """What notebook 08 records of its two cost tables ("savings": the small target's; "savings_70b")."""
    return {"savings": {"spire_gross": gross["spire"], "spire_net": net["spire"], "magicdec": net["magicdec"],
                        "vanilla_net": net["vanilla"], "spire_margin_over_magicdec": relative_margin(net)},
            "savings_70b": {"spire_net": net_70b["spire"], "magicdec": net_70b["magicdec"],
                            "vanilla_net": net_70b["vanilla"]}}


def check_results(checks: list[dict]) -> dict:
    """`paper_cost_checks` by quantity: the paper's number and ours from the rounded and the full TM."""
    return {c["quantity"]: {"paper": c["paper"], "from_rounded_tm": c["rounded"], "from_full_tm": c["full"]}
            for c in checks}


def check_sentences(checks: list[dict]) -> str:
    """SPIRe's net savings over MagicDec's at (64, 512) (checks 1 and 2) from the paper's numbers,
    the rounded and the full TM, one line each."""
    return "\n".join(f"SPIRe net over MagicDec at (64, 512), {column:>7}: "
                     f"{100 * (checks[1][column] / checks[2][column] - 1):.2f}%"
                     for column in ("paper", "rounded", "full"))


def break_even_rows(break_even: dict[str, float]) -> list[dict]:
    """The rows of `break_even_volumes` (BREAK_EVEN_COLUMNS)."""
    return [{"comparison": k.replace("_", " "), "volume": v} for k, v in break_even.items()]


def break_even_result(break_even: dict[str, float]) -> dict:
    """`break_even_volumes` as results.json holds it: None where a draft never breaks even."""
    return {k: (v if np.isfinite(v) else None) for k, v in break_even.items()}


def max_training_units(tm: dict[str, float], serving_units: float) -> float:
    """The training cost below which SPIRe's net savings beat MagicDec's (taken as free to train):
    serving * (1 / TM_magicdec - 1 / TM_spire), in target-training units."""
    return serving_units * (1 / tm["magicdec"] - 1 / tm["spire"])


def max_training_sentence(limit: float) -> str:
    """`max_training_units` in words."""
    return f"SPIRe stays ahead while its training costs less than {limit:.2f} target-training units"


def mixed_heading(lengths, spread: float, seed: int, serving_units: float) -> str:
    """The heading of `mixed_length_savings`'s table: the batch's lengths (a `LengthDistribution` sample)."""
    values = lengths.lengths
    return (f"B = {len(values)} requests, lengths {values.min()}..{values.max()}, "
            f"mean {float(values.mean()):.0f} (sigma {spread:g}, seed {seed}); "
            f"net savings at serving = {serving_units:g}:")


def mixed_columns(methods) -> dict[str, str]:
    """The headers of `mixed_length_savings`'s rows."""
    return {"window": "draft window", **{m: method_label(m) for m in methods}}


def mixed_margin_sentences(margins: dict) -> str:
    """Per draft window, SPIRe's net savings minus MagicDec's in the mixed and the uniform batch."""
    return "\n".join(f"window {window}: SPIRe's net savings minus MagicDec's, mixed batch {mixed:.3f} units, "
                     f"uniform batch {uniform:.3f} units" for window, (mixed, uniform) in margins.items())


def mixed_margin_result(margins: dict) -> dict:
    """`mixed_length_savings`'s margins as results.json holds them."""
    return {w: {"mixed": a, "uniform": b} for w, (a, b) in margins.items()}


def lead(checks: list[dict], net: dict, net_70b: dict, break_even: dict, limit: float, serving_units: float,
         cells: tuple[tuple[int, int], tuple[int, int]], source: str) -> list[str]:
    """08's conclusion in words, before its evidence (Markdown paragraphs): whether training SPIRe
    pays at the cost tables' cells (`cells`: the small target's and the 70B's (B, L)) against
    MagicDec, from what serving volume, and up to what training cost (`max_training_units`), at
    the training cost `source` names (`with_measured_training`); and
    how the paper's five numbers (`paper_cost_checks`) come out: from the full multipliers, only
    from the multipliers rounded to two decimals first (the paper's arithmetic), or neither."""
    (b, l), (b70, l70) = cells
    spire_ahead = net["spire"] > net["magicdec"]
    verdict = (f"**Training SPIRe {'pays' if spire_ahead else 'does not pay'}** at serving = {serving_units:g} "
               f"target-training units: net savings {net['spire']:.2f} against MagicDec's {net['magicdec']:.2f} "
               f"(small target, B = {b}, L = {l}), {net_70b['spire']:.2f} against {net_70b['magicdec']:.2f} "
               f"(Llama 3 70B, B = {b70}, L = {l70}).")
    volume = break_even["spire_vs_magicdec"]
    verdict += (f" SPIRe's training is repaid against AD after {break_even['spire_vs_ad']:.2f} units of serving and "
                + (f"overtakes MagicDec from {volume:.2f} units" if np.isfinite(volume) else "never overtakes MagicDec")
                + f"; at {serving_units:g} units it stays ahead while its training costs less than {limit:.2f} units. "
                + source)
    full = [c for c in checks if "full" in c["which"]]
    rounded = [c for c in checks if c["which"] == "rounded"]
    neither = [c for c in checks if c["which"] == "neither"]
    paper = (f"**The paper's five numbers:** {len(full)} of {len(checks)} agree to two decimals from the model's "
             "full multipliers"
             + (f"; {len(rounded)} only from the multipliers rounded to two decimals first, as the paper quotes them: "
                + "; ".join(f"{c['quantity']}: {c['full']:.2f} from the full multipliers, {c['rounded']:.2f} from "
                            f"the rounded ones (the paper's {c['paper']:.2f})" for c in rounded) if rounded else "")
             + (f"; {len(neither)} from neither: "
                + "; ".join(f"{c['quantity']}: {c['full']:.2f} (the paper's {c['paper']:.2f})" for c in neither)
                if neither else "")
             + ".")
    return [verdict, paper]
