"""What notebooks 02 and 03 record: the target ("target": its parameters, loss, speed, MFU and
origin), SPIRe's measured training cost (`training_cost`, read by 08) and each draft's budget
against the paper's 20 tokens per parameter (`draft_budgets`, read by 04, 06 and the run index).
They read what `series`, `pipeline` and the trainer computed and compute nothing of their own
beyond ratios; the words are `narrative.training`'s."""

from __future__ import annotations

import math

from spirelib.throughput.costs import budget_fraction, chinchilla_tokens, measured_training_units
from spirelib.throughput.hardware import GPU_DTYPE, GPU_MFU, HARDWARE
from spirelib.throughput.recorded import RecordedBudget, RecordedTarget, RecordedTrainingCost
from spirelib.workbook.work import TrainRun


def target_result(run, cfg, speed: dict, imported) -> RecordedTarget:
    """What notebook 02 records of the target ("target" in results.json, `RecordedTarget`): parameters,
    validation loss, training speed and MFU, tokens and steps, device, identity and where it came from."""
    s, n_total, n_body = run.summary, cfg.num_params(), cfg.body_params()
    return RecordedTarget(params=n_total, body_params=n_body, val_loss=s["val_loss"], tokens_per_s=s["tokens_per_s"],
                          mfu=speed["mfu"], run_mfu=speed["run_mfu"], run_tokens_per_s=s.get("run_tokens_per_s"),
                          peak_flops=speed["peak_flops"], tokens=s["tokens"], steps=s["steps"], device=s["device"],
                          config_hash=run.config_hash, reused=run.result.reused,
                          imported_from=str(imported) if imported else None, embedding_params=n_total - n_body)


def training_cost(target_summary: dict, draft_summary: dict, body_ratio: float) -> RecordedTrainingCost | None:
    """What notebook 03 records of SPIRe's training cost ("training_cost" in results.json, read by
    notebook 08): the target's and the SPIRe draft's measured training tokens/s, the draft's cost
    per token in target-training units (`costs.measured_training_units`, method §2) and its body
    parameters over the target's (the cost that counts parameters alone). None where either speed
    was not measured (an imported target was never trained here)."""
    target, draft = float(target_summary["tokens_per_s"]), float(draft_summary["tokens_per_s"])
    if not (math.isfinite(target) and math.isfinite(draft)):
        return None
    return RecordedTrainingCost(target, draft, measured_training_units(target, draft), float(body_ratio))


def draft_budgets(vanilla, spire_draft, target_cfg) -> dict[str, RecordedBudget]:
    """Per trained draft (`pipeline.TrainedModel`s of the target `target_cfg`): its training tokens,
    its body parameters N, the paper's budget 20 x N (method §6, `costs.chinchilla_tokens`), the
    share of it the draft got, and what training on the paper's budget would take
    (`paper_budget_seconds`), as notebook 03 records it ("draft_budgets") and 04 states it."""
    drafts = {"SPIRe draft": (spire_draft, spire_draft.config), "vanilla draft": (vanilla, None)}
    out = {}
    for name, (m, spire) in drafts.items():
        tokens, n = m.summary["tokens"], m.layers_config.body_params()
        out[name] = RecordedBudget(int(tokens), int(n), int(chinchilla_tokens(n)), budget_fraction(tokens, n),
                                   paper_budget_seconds(m, spire, target_cfg, int(chinchilla_tokens(n))))
    return out


def paper_budget_seconds(trained, spire, target_cfg, paper_tokens: int) -> dict[str, float]:
    """What training `trained` (a draft, `spire` its SpireConfig or None) on `paper_tokens` would
    take: on this machine at the training tokens/s it measured ("this machine"; absent when not
    measured), and on each GPU of the hardware table as the plan models it (`work.TrainRun.work`'s
    FLOPs per token of this training, over the bf16 peak at `hardware.GPU_MFU`)."""
    _, tokens, flops, _ = TrainRun(target_cfg, trained.train_config, trained.layers_config, spire,
                                   trained.layers_config.body_params()).work()
    work = flops / tokens * paper_tokens
    out = {name: work / (hw.peak_flops.get(GPU_DTYPE, max(hw.peak_flops.values())) * GPU_MFU)
           for name, hw in HARDWARE.items()}
    speed = float(trained.summary.get("tokens_per_s", math.nan))
    return {**({"this machine": paper_tokens / speed} if math.isfinite(speed) and speed > 0 else {}), **out}
