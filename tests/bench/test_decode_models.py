"""The models the decoding benchmarks build (`bench.decode_models`): one draft per decoded card, the
very models their factories decode (what is compiled is what decodes), the budgeted self-drafts at
the window's budgets, the same random weights every call, and compiled decoding switched for all."""

from __future__ import annotations

import torch

from spirelib.bench.decode_models import TIMED, build_methods, compile_all, draft_models
from spirelib.bench.roofline import kv_budgets
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import BUDGETED, DECODED, card

CFG = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)


def test_every_decoded_card_gets_a_factory_that_decodes_the_very_model_built_for_it():
    torch.manual_seed(0)
    target = Transformer(CFG).eval()
    factories, models = build_methods(target, list(TIMED), 0.0, 4)
    assert TIMED == ("ad", *DECODED) and set(factories) == set(models) == set(DECODED)
    assert {m for m, model in models.items() if model is not None} == {m for m in DECODED if card(m).needs_model}
    drafts = {m: make() for m, make in factories.items()}
    assert all(drafts[m].model is (models[m] if card(m).needs_model else target) for m in DECODED if m != "lookup")
    assert {m: drafts[m].budget for m in BUDGETED} == {m: kv_budgets(4)[m] for m in BUDGETED}
    again = draft_models(target, list(TIMED), 4)  # seed 1 every call: the same random weights
    assert all(torch.equal(a, b) for m in again if again[m] is not None for a, b in zip(again[m].state_dict().values(),
                                                                models[m].state_dict().values()))
    compile_all(target, models, True)
    assert target.compiled_decoding and all(m.compiled_decoding for m in models.values() if m is not None)
    compile_all(target, models, False)
    assert not target.compiled_decoding and not any(m.compiled_decoding for m in models.values() if m is not None)
