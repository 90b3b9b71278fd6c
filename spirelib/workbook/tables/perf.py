"""Tables of the paper's throughput model (method §2) as notebooks 01, 06 and 07 show them: the
taus used, the shapes, the headline cell, verification's critical context, the ablations, the
G-aware model, the overlap rule, devices, the best draft depth, mixed-length batches and the
cells whose winner they change, the answer per scenario, the schedules beside the winner map,
and 07's roles and extrapolated headline; with the results each notebook records.

A `Scenario` (`throughput.scenarios`) says what is compared; multipliers are TM = tau / dt.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spirelib.throughput import intensity
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.acceptance import best_k
from spirelib.throughput.hardware import operating_points
from spirelib.throughput.methods import label as method_label
from spirelib.throughput.scenarios import Scenario, depth_free, scenario_winners, stated_on_cell
from spirelib.throughput.schedule import Schedule

SHAPE_COLUMNS = {"name": "model", "num_layers": "layers", "d_model": "d_model", "n_q_per_kv": "q per kv",
                 "n_kv": "kv heads", "d_head": "d_head", "d_ff": "d_ff", "body": "body params",
                 "kv": "KV bytes / token"}
HEADLINE_COLUMNS = {"method": "method", "tau": "tau", "dt": "iteration time dt", "tm": "modeled TM",
                    "paper": "paper"}
CRITICAL_COLUMNS = {"target": "target", "grid": "L_crit (power-of-two grid)",
                    "exact": "exact crossover 2Nk/(x HOI)"}
ABLATION_COLUMNS = {"ablation": "variant", "tau": "tau (paper)", "tm": "TM at B = 64, L = 512"}
MIXED_COLUMNS = {"window": "draft window", "spread": "sigma", "mean": "batch mean L"}  # + one per method


def shape_rows(presets=pm.PRESETS) -> list[dict]:
    """One row per model shape (method §2, "Models"): its `ModelShape` fields, body parameters
    and KV values per token (bytes at one byte per value)."""
    return [dict(name=name, **dataclasses.asdict(shape), body=pm.body_params(shape), kv=pm.kv_values_per_token(shape))
            for name, shape in presets.items()]


def headline_rows(taus: dict, multipliers: dict, stated: dict | None = None) -> list[dict]:
    """The headline cell (method §2): per method tau, the iteration time multiplier dt = tau / TM,
    the modeled TM and the paper's stated TM (`stated`: method -> TM; None off the paper's cell)."""
    return [{"method": method_label(m), "tau": taus[m], "dt": taus[m] / tm, "tm": tm,
             "paper": stated[m] if stated else "(other cell)"} for m, tm in multipliers.items()]


def critical_length_rows(targets, hoi: float, k: int) -> list[dict]:
    """Per target, L_crit (method §2, Figure 3): the longest context at which verifying k tokens
    can still become compute-bound, on the paper's power-of-two grid and as the exact crossover."""
    return [{"target": name, "grid": intensity.critical_context_length(name, hoi, k),
             "exact": intensity.critical_context_length(name, hoi, k, exact=True)} for name in targets]


def overlap_rows(scenario: Scenario, B: int, L: int) -> list[dict]:
    """Per method, TM at (B, L) with the scenario's overlap rule f and with the other one
    (method §2: max of compute and memory time, or their sum); `overlap_columns` names them."""
    ours = scenario.multipliers(B, L)
    other = dataclasses.replace(scenario, overlap=not scenario.overlap).multipliers(B, L)
    return [{"method": method_label(m), "ours": float(ours[m]), "other": float(other[m])} for m in scenario.taus]


TAU_NEEDED_COLUMNS = {"method": "method", "ad": "tau to beat AD (= its round time dt, in AD steps)",
                      "magicdec": "tau to equal MagicDec", "spire": "tau to equal SPIRe"}


def tau_needed_rows(scenario: Scenario, methods, B: int, L: int) -> list[dict]:
    """Per method (one the paper did not measure, e.g. the guided draft and prompt lookup) the tau it
    needs at (B, L) to beat AD and to equal MagicDec and SPIRe at the scenario's taus
    (`Scenario.tau_to_match`, method §2)."""
    return [{"method": method_label(m), "ad": float(scenario.tau_to_match(m, B, L)),
             **{rival: float(scenario.tau_to_match(m, B, L, rival)) for rival in ("magicdec", "spire")}}
            for m in methods]


def overlap_columns(scenario: Scenario, B: int, L: int) -> dict[str, str]:
    """The headers of `overlap_rows`: the first column says which f the scenario uses."""
    first, second = ("max", "sum") if scenario.overlap else ("sum", "max")
    return {"method": f"method (B = {B}, L = {L})", "ours": f"f = {first}", "other": f"f = {second}"}


def ablation_rows(multipliers: dict, taus: dict) -> list[dict]:
    """The ablations (method §3.8) ranked by modeled TM, best first: variant, its tau, its TM."""
    return [{"ablation": name.replace("_", " "), "tau": taus[name], "tm": tm}
            for name, tm in sorted(multipliers.items(), key=lambda kv: -kv[1])]


def relative_change_rows(L_values, relative: dict, *, first: str, header: str) -> list[dict]:
    """One row per L: `relative[method]` ((len(L_values),) fractions) as signed percentages;
    keys are the headers (`first` for L, "<method's name>: <header>" per method)."""
    return [{first: int(L), **{f"{method_label(m)}: {header}": f"{100 * relative[m][i]:+.1f}%" for m in relative}}
            for i, L in enumerate(L_values)]


def device_rows(scenario: Scenario, cells, dtypes=("fp8", "bf16", "fp32"), per_device: int = 2,
                table=None) -> list[dict]:
    """The scenario on every device of the hardware table (`hardware.operating_points`; `table`
    None: `hardware_table()`, with the measured machine): per device and dtype its HOI, bytes per
    value and, per (B, L) of `cells` and method, the TM (keys "method@(B, L)", `device_columns`)."""
    rows = []
    for name, device_hoi, value_bytes in operating_points(dtypes, per_device=per_device, table=table):
        on = dataclasses.replace(scenario, hoi=device_hoi, bytes_per_value=float(value_bytes))
        at = {cell: on.multipliers(*cell) for cell in cells}
        rows.append({"device": name, "hoi": device_hoi, "bytes": value_bytes,
                     **{f"{m}@{c}": float(at[c][m]) for c in at for m in at[c]}})
    return rows


def device_columns(methods, cells, *, with_bytes: bool = True) -> dict[str, str]:
    """The headers of `device_rows` (without the bytes per value when not `with_bytes`)."""
    return {"device": "device, dtype", "hoi": "HOI", **({"bytes": "bytes/value"} if with_bytes else {}),
            **{f"{m}@{c}": f"{method_label(m)} B={c[0]} L={c[1]}" for c in cells for m in methods}}


def best_k_rows(scenario: Scenario, alphas: dict, B: int, L_values, k_max: int) -> list[dict]:
    """Per L, each method's best draft depth under i.i.d. acceptance `alphas[method]` (method §2:
    tau(k) = (1 - alpha^(k+1)) / (1 - alpha)) with its TM, next to the TM at the scenario's k."""
    rows = []
    for L in L_values:
        at_k = scenario.multipliers(B, L)
        row = {"L": L}
        for m, alpha in alphas.items():
            k_best, tm_best = best_k(m, alpha, B, L, scenario.target, scenario.drafts.get(m), k_max=k_max,
                                     **depth_free(scenario))
            row[m] = f"k={k_best}: {tm_best:.2f}x (k={scenario.k}: {float(at_k[m]):.2f}x)"
        rows.append(row)
    return rows


def window_name(scenario: Scenario) -> str:
    """The scenario's draft window as a table shows it: "64 tokens", or "L/8"."""
    return f"{scenario.window} tokens" if scenario.window is not None else f"L/{scenario.window_factor}"


def mixed_length_rows(scenario: Scenario, B: int, L: int, spreads, seed: int, windows=(None, 64)):
    """Mixed-length batches against uniform ones of the same mean length (the paper's claim
    that SPIRe gains most when lengths vary, method §2): per draft window (None: the scenario's)
    and log-length spread sigma, the batch's mean length and per method "TM (vs uniform)".

    Returns (rows, change): change[window][method] is the largest |mixed / uniform - 1| over
    the spreads, the window as "L/8" or its tokens ("64").
    """
    rows, change = [], {}
    for window in windows:
        on = dataclasses.replace(scenario, window=window) if window is not None else scenario
        name = window_name(on)
        key = name if window is None else str(window)
        change[key] = {}
        for spread in spreads:
            lengths = pm.LengthDistribution(L, spread, seed=seed).sample(B)
            row = {"window": name, "spread": spread, "mean": float(lengths.lengths.mean())}
            for m, (mixed, uniform) in on.mixed_and_uniform(B, lengths).items():
                row[m] = f"{mixed:.3f} ({100 * (mixed / uniform - 1):+.2f}%)"
                change[key][m] = max(change[key].get(m, 0.0), abs(mixed / uniform - 1))
            rows.append(row)
    return rows, change


def winner_change_rows(scale: str, B, L, uniform: dict, mixed: dict) -> list[dict]:
    """The (B, L) cells whose best method (`perfmodel.best_method`) differs between the
    uniform and the mixed-length grids (method -> (len(B), len(L)))."""
    uniform_best, mixed_best = pm.best_method(uniform), pm.best_method(mixed)
    return [{"scale": scale, "B": int(B[i]), "L": int(L[j]), "uniform": method_label(uniform_best[i, j]),
             "mixed": method_label(mixed_best[i, j])} for i, j in zip(*np.nonzero(uniform_best != mixed_best))]


def cell_index(B, L, b: int, l: int) -> tuple[int, int] | None:
    """(i, j) of the cell (b, l) on the grid B x L, None when either is off it."""
    if b not in B or l not in L:
        return None
    return int(np.flatnonzero(B == b)[0]), int(np.flatnonzero(L == l)[0])


# Notebook 01's cells: what they show and record.

def headline(scenario: Scenario, B: int, L: int, tau_context: int, target: str = "seqax-67m"
             ) -> tuple[dict, list[dict], dict]:
    """The headline cell (method §2) of the paper's `target` at (B, L): per method the modeled TM
    (floats), the rows of `headline_rows` (the paper's stated TM only on the paper's own cell: its B, L, HOI 600,
    f = max and Table 1 at L = 512) and the results to record ("headline", "headline_cell")."""
    multipliers = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
    stated = stated_on_cell(scenario, B, L, tau_context, target)
    results = {"headline": {m: multipliers[m] for m in ("spire", "magicdec", "vanilla")},
               "headline_cell": {"B": B, "L": L, "hoi": scenario.hoi, "overlap": scenario.overlap,
                                 "tau_context": tau_context}}
    return multipliers, headline_rows(scenario.taus, multipliers, stated), results


def min_max(values) -> dict[str, float]:
    """{"min", "max"} of `values` as floats."""
    return {"min": float(np.min(values)), "max": float(np.max(values))}


def device_bars(rows: list[dict], methods, cell) -> dict[str, dict]:
    """Per device of `device_rows`, each method's TM at the (B, L) `cell` (a bar chart's groups)."""
    return {r["device"]: {m: r[f"{m}@{cell}"] for m in methods} for r in rows}


def best_k_columns(methods, B: int = 64) -> dict[str, str]:
    """The headers of `best_k_rows`."""
    return {"L": f"L (B = {B})", **{m: method_label(m) for m in methods}}


def mixed_columns(methods) -> dict[str, str]:
    """The headers of `mixed_length_rows`: MIXED_COLUMNS and one "TM (vs uniform)" per method."""
    return {**MIXED_COLUMNS, **{m: f"{method_label(m)} TM (vs uniform)" for m in methods}}


def flat_change(change: dict) -> dict[str, float]:
    """`mixed_length_rows`'s change flattened to "window:method" keys (as results.json holds it)."""
    return {f"{w}:{m}": v for w, by_method in change.items() for m, v in by_method.items()}


def spire_over_magicdec(multipliers: dict, margin) -> dict[str, float]:
    """SPIRe's TM over MagicDec's at the headline cell (`multipliers`) and its range over a grid (`margin`)."""
    return {"at_highlight": float(multipliers["spire"] / multipliers["magicdec"]),
            "grid_min": float(np.min(margin)), "grid_max": float(np.max(margin))}


# Notebook 06's cells: the answer at the highlighted cell, the schedules, what it records.

TAUS_COLUMNS = {"method": "method", "tau": "tau used here", "paper": "paper (L = 512)"}


def taus_rows(taus: dict) -> list[dict]:
    """Per method the tau a comparison uses next to the paper's Table 1 tau at L = 512 (NaN where it has none)."""
    paper = pm.PAPER_TAU[pm.PAPER_TAU_CONTEXT]
    return [{"method": m, "tau": t, "paper": paper.get(m, np.nan)} for m, t in taus.items()]


def winner_grid(B, L, grid: dict) -> dict:
    """The best method per (B, L) cell (`perfmodel.best_method`, "ad" where no draft gains) as results.json holds it."""
    return {"B": np.asarray(B).tolist(), "L": np.asarray(L).tolist(),
            "winners": pm.best_method(grid, baseline=1.0).tolist()}


def answer_rows(at: dict[str, dict[str, float]]) -> list[dict]:
    """One row per scenario of `multipliers_at`: each method's TM and the best method."""
    best = scenario_winners(at)
    return [{"scale": name, **values, "best": best[name]} for name, values in at.items()]


def explorer_results(taus: dict, measured_at: int | None, cell, at: dict, changes: list[dict], best: dict,
                     index: tuple[int, int] | None) -> dict:
    """What notebook 06 records: the taus used (measured at L = `measured_at`, or the paper's when
    None), the TM and winner per scenario at the highlighted (B, L) `cell`, the cells whose winner
    mixed lengths change and, when the cell is on the grid (`index`), each method's best k there."""
    results = {"taus_used": {"source": "paper" if measured_at is None else "measured", "context_length": measured_at,
                             "taus": taus},
               "multipliers_at_highlight": {"B": cell[0], "L": cell[1], **at},
               "winner_at_highlight": scenario_winners(at),
               "winner_changes_mixed_lengths": changes}
    if index is not None:
        results["best_k_at_highlight"] = {m: int(ks[index]) for m, ks in best.items()}
    return results


def schedule_rows(schedules: dict[str, Schedule], grid: dict, L: int) -> list[dict]:
    """Beside the winner map (`winner_grid`, at its fixed k) at context L: per B of its grid the
    winner ("-" when L is off the grid) and each method's scheduled k (0: speculation off)."""
    j = grid["L"].index(L) if L in grid["L"] else None
    return [{"B": b, "winner": "-" if j is None else method_label(grid["winners"][i][j]),
             **{method_label(m): s.k_at(b) for m, s in schedules.items()}} for i, b in enumerate(grid["B"])]


# Notebook 07's cells: Llama 3 70B with the paper's drafts (method §2, "Extrapolation").

ROLE_COLUMNS = {"role": "role", "name": "shape", "body": "body params", "body_share": "x target body",
                "kv": "KV bytes / token", "kv_share": "x target KV"}
EXTRAPOLATION_COLUMNS = {"method": "method", "tau": "tau (small-scale)", "tm": "modeled TM", "paper": "paper"}


def role_rows(target: str, drafts: dict[str, str]) -> list[dict]:
    """The target and each draft's shape (`perfmodel.PRESETS` names; MagicDec drafts with the
    target itself): body parameters and KV values per token, absolute and as a share of the target's."""
    shape = pm.PRESETS[target]
    rows = []
    for role, name in (("target", target), ("vanilla draft", drafts["vanilla"]), ("SPIRe draft", drafts["spire"]),
                       ("MagicDec draft", target)):
        other = pm.PRESETS[name]
        rows.append({"role": role, "name": name, "body": pm.body_params(other),
                     "body_share": pm.body_params(other) / pm.body_params(shape), "kv": pm.kv_values_per_token(other),
                     "kv_share": pm.kv_values_per_token(other) / pm.kv_values_per_token(shape)})
    return rows


def extrapolation_headline(scenario: Scenario, B: int, L: int, tau_context: int, target: str = "llama3-70b"
                           ) -> tuple[list[dict], dict]:
    """The extrapolated headline cell: per method its small-scale tau, the modeled TM and the
    paper's stated TM (only on the paper's cell: its B, L, HOI 600, f = max, Table 1 at L = 512;
    "not stated" for a method it does not quote), and the results to record ("headline_70b",
    "headline_70b_cell")."""
    multipliers = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
    stated = pm.PAPER_MULTIPLIERS[target]
    on_paper_cell = (B, L, scenario.hoi, scenario.overlap, tau_context) == (stated["B"], stated["L"], 600.0, True, 512)
    rows = [{"method": method_label(m), "tau": scenario.taus[m], "tm": v,
             "paper": stated.get(m, "not stated") if on_paper_cell else "(other cell)"} for m, v in multipliers.items()]
    return rows, {"headline_70b": multipliers,
                  "headline_70b_cell": {"B": B, "L": L, "hoi": scenario.hoi, "overlap": scenario.overlap}}
