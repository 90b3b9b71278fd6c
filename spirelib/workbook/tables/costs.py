"""Tables of the paper's cost analysis (method §2, "Cost analysis") as notebook 08 shows them:
what a draft costs to train, the paper's five numbers recomputed, break-even serving volumes,
net savings in mixed-length batches and at the schedule's k, and what 08 records of them.
Costs are in target-training units (`costs`, `savings`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from spirelib.throughput import costs
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.methods import label as method_label
from spirelib.throughput.savings import net_savings, relative_margin
from spirelib.throughput.scenarios import Scenario, depth_free
from spirelib.throughput.schedule import Acceptance, modeled_table, schedule
from spirelib.workbook.tables.perf import window_name

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


def draft_cost_rows(scenarios: dict[str, Scenario], training: dict[str, dict[str, float]]) -> list[dict]:
    """Per target and draft: body parameters, training units on the target's tokens
    (`training`, from `savings.training_units_by_target`), units on its own Chinchilla budget (20 tokens per
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


# Notebook 08's cells: the cost tables at its operating points and what it records.

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
    schedule serves at (B, L) (`throughput.schedule` over B = 1..B, i.i.d. acceptance from the
    scenario's tau at its k, searched to `k_max`; k = 0: speculation off, TM 1) beside the fixed k:
    per method the scheduled k, both TMs and both net savings."""
    fixed = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
    scheduled, ks = {}, {}
    for m, tau in scenario.taus.items():
        table = modeled_table(m, Acceptance(float(tau), 0.0, scenario.k), np.arange(1, B + 1), L, scenario.target,
                              scenario.drafts.get(m), k_max=k_max, **depth_free(scenario))
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


def break_even_rows(break_even: dict[str, float]) -> list[dict]:
    """The rows of `break_even_volumes` (BREAK_EVEN_COLUMNS)."""
    return [{"comparison": k.replace("_", " "), "volume": v} for k, v in break_even.items()]


def break_even_result(break_even: dict[str, float]) -> dict:
    """`break_even_volumes` as results.json holds it: None where a draft never breaks even."""
    return {k: (v if np.isfinite(v) else None) for k, v in break_even.items()}


def mixed_columns(methods) -> dict[str, str]:
    """The headers of `mixed_length_savings`'s rows."""
    return {"window": "draft window", **{m: method_label(m) for m in methods}}


def mixed_margin_result(margins: dict) -> dict:
    """`mixed_length_savings`'s margins as results.json holds them."""
    return {w: {"mixed": a, "uniform": b} for w, (a, b) in margins.items()}
