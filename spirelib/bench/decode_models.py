"""The models the decoding benchmarks build (`bench decode`, `bench rounds`, `make gpu-check`): every
decoded draft of the method cards (`TIMED`) over one target, random weights from a fixed seed, in
the target's dtype and on its device (`draft_models`), each with a factory that decodes that very
model (`build_methods`), the budgeted self-drafts at a window's budgets (`draft_options`), and
compiled decoding switched on or off for all of them (`compile_all`).
"""

from __future__ import annotations

import torch

from spirelib.bench.roofline import kv_budgets
from spirelib.decoding.builders import draft_factory
from spirelib.model.config import Eagle3Config, SpireConfig, vanilla_draft_config
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import BUDGETED, DECODED

TIMED = ("ad", *DECODED)  # AD and every decoded draft (`methods.DECODED`): what this benchmark builds


def draft_options(window: int) -> dict[str, dict]:
    """Each budgeted self-draft's builder options at a `window` (`kv_budgets`); the other drafts take none."""
    budgets = kv_budgets(window)
    return {m: {"budget": budgets[m]} for m in BUDGETED}


def draft_models(target: Transformer, methods, window: int) -> dict:
    """The draft model of each SD method in `methods` (None where its card needs none: the
    self-drafts and prompt lookup), in the target's dtype and on its device: the vanilla draft in the method §4
    shape (`vanilla_draft_config`), the SPIRe draft pruned from the target (2 layers, sink 1 +
    window), EAGLE-3's one layer. Random weights from seed 1: the same models every call."""
    torch.manual_seed(1)
    param = next(target.parameters())
    build = {"vanilla": lambda: Transformer(vanilla_draft_config(target.cfg)).to(param).eval(),
             "spire": lambda: SpireDraftModel.from_target(target, SpireConfig(window=window)).to(param).eval(),
             "eagle3": lambda: Eagle3DraftModel.from_target(target, Eagle3Config()).to(param).eval()}
    return {m: build[m]() if m in build else None for m in methods if m != "ad"}


def build_methods(target: Transformer, methods: list[str], temperature: float, window: int) -> tuple[dict, dict]:
    """A draft factory per SD method (AD needs none) and the draft model built for each
    (`draft_models`), so that the factories decode these very models (`drafts.in_dtype` copies
    none) and compiling them compiles what decodes; the sparse drafts take `draft_options`."""
    built = draft_models(target, methods, window)
    options = draft_options(window)
    factories = {m: draft_factory(m, target, model, temperature=temperature, **options.get(m, {}))
                 for m, model in built.items()}
    return factories, built


def compile_all(target: Transformer, models: dict, enabled: bool) -> None:
    """Decode the target and `build_methods`' draft models through compiled graphs, or eagerly again."""
    for model in (target, *models.values()):
        if model is not None:
            model.compile_decoding(enabled)
