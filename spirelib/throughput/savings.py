"""What the methods of a comparison save (method §2, "Cost analysis"), in `costs`' target-training
units, as notebook 08 prices them: each draft's training units per target, the net savings per
method, SPIRe's margin over MagicDec, the serving volumes from which a trained draft pays, and
the training cost below which SPIRe stays ahead of MagicDec."""

from __future__ import annotations

from spirelib.throughput import costs
from spirelib.throughput.scenarios import Scenario


def training_units_by_target(scenarios: dict[str, Scenario], mfu_ratio: float = 1.0) -> dict[str, dict[str, float]]:
    """target name -> method -> the draft's training cost in target-training units (trained on
    its target's tokens; `mfu_ratio` = the draft's training MFU / the target's)."""
    return {target: {m: costs.draft_training_units(d, target, mfu_ratio=mfu_ratio, method=m, k=s.k)
                     for m, d in s.drafts.items()} for target, s in scenarios.items()}


def relative_margin(nets: dict[str, float]) -> float | None:
    """SPIRe's net savings over MagicDec's, as a fraction; None when MagicDec saves nothing."""
    return nets["spire"] / nets["magicdec"] - 1 if nets["magicdec"] > 0 else None


def net_savings(multipliers: dict, serving_units, training: dict) -> dict:
    """method -> net savings, serving x (1 - 1/TM) - training units (method §2, "Cost analysis"),
    at `multipliers` (method -> TM; floats or arrays, as `serving_units` may be); a method
    without training units (MagicDec) pays none."""
    return {m: costs.serving_savings(tm, serving_units=serving_units, training_units=training.get(m, 0.0))
            for m, tm in multipliers.items()}


def break_even_volumes(tm: dict, training: dict, tm_70b: dict, training_70b: dict) -> dict[str, float]:
    """Serving volumes (target-training units) from which a trained draft pays
    (`costs.break_even_serving`): SPIRe and vanilla SD against AD, SPIRe against MagicDec for
    the small target and for the 70B (tm: method -> TM, training: method -> units); inf: never."""
    return {"spire_vs_ad": costs.break_even_serving(tm["spire"], training["spire"]),
            "vanilla_vs_ad": costs.break_even_serving(tm["vanilla"], training["vanilla"]),
            "spire_vs_magicdec": costs.break_even_serving(tm["spire"], training["spire"], baseline_tm=tm["magicdec"]),
            "spire_vs_magicdec_70b": costs.break_even_serving(tm_70b["spire"], training_70b["spire"],
                                                              baseline_tm=tm_70b["magicdec"])}


def max_training_units(tm: dict[str, float], serving_units: float) -> float:
    """The training cost below which SPIRe's net savings beat MagicDec's (taken as free to train):
    serving * (1 / TM_magicdec - 1 / TM_spire), in target-training units."""
    return serving_units * (1 / tm["magicdec"] - 1 / tm["spire"])
