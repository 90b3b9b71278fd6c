"""A half-precision target (an imported bf16 checkpoint): its drafts train in fp32 and decode in
the target's dtype, losslessly (method §3.6, §1)."""

from __future__ import annotations

import pytest
import torch

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget
from spirelib.training.config import TrainConfig
from spirelib.training.objectives import SpireObjective, lm_objective
from spirelib.training.train import make_optimizer

CFG = ModelConfig(vocab_size=64, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)


def bf16_target(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    target = Transformer(CFG)
    target.reset_parameters(0.3)  # peaked next-token distributions: greedy choices are far from ties
    return target.to(torch.bfloat16).eval()


def train_steps(model, objective, batch, steps: int = 25) -> tuple[list[float], torch.optim.Optimizer]:
    opt = make_optimizer(model, TrainConfig(lr=3e-3, steps=steps))
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss, _ = objective(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, opt


def test_a_bf16_targets_spire_draft_trains_in_fp32_and_its_loss_falls():
    target = bf16_target()
    draft = SpireDraftModel.from_target(target, SpireConfig(num_layers=2, window=8, k=4))
    assert {p.dtype for p in draft.parameters()} == {torch.float32}
    batch = torch.randint(0, CFG.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    losses, opt = train_steps(draft, SpireObjective(target), batch)
    assert {p.dtype for p in draft.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in draft.parameters() if p.grad is not None} == {torch.float32}
    moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert losses[-1] < 0.9 * losses[0], losses
    assert {p.dtype for p in target.parameters()} == {torch.bfloat16}, "the frozen target stays as it came"


@pytest.mark.parametrize("method", ["vanilla", "magicdec", "spire"])
def test_greedy_decoding_with_a_bf16_target_and_fp32_drafts_is_the_targets_own(method):
    """The fp32-trained draft decodes through a bf16 copy (`draft_factory`): every emitted token
    is the bf16 target's greedy choice, whatever the draft proposes."""
    target = bf16_target()
    torch.manual_seed(2)
    models = {"vanilla": Transformer(vanilla_draft_config(CFG)),
              "spire": SpireDraftModel.from_target(target, SpireConfig(num_layers=2, window=8, k=4)),
              "magicdec": None}
    model = models[method]
    if model is not None:  # a little training, so that the draft agrees with the target sometimes
        batch = torch.randint(0, CFG.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
        train_steps(model, SpireObjective(target) if method == "spire" else lm_objective, batch, steps=5)
        assert next(model.parameters()).dtype == torch.float32
    options = {"budget": KVBudget(1, 8)} if method == "magicdec" else {}
    contexts = torch.randint(0, CFG.vocab_size, (3, 12), generator=torch.Generator().manual_seed(3))
    ad = autoregressive_generate(target, contexts, 16, temperature=0.0)
    for dtype in (None, torch.float32):  # the target's dtype (the default), or an explicit decode dtype
        draft = draft_factory(method, target, model, temperature=0.0, dtype=dtype, **options)()
        decodes_in = next((draft.model.body if method == "spire" else draft.model).parameters()).dtype
        assert decodes_in == (dtype or torch.bfloat16) or method == "magicdec"
        sd = speculative_generate(target, draft, contexts, 16, k=3, temperature=0.0)
        assert torch.equal(sd.tokens, ad.tokens)
        assert (sd.accepted >= 0).sum() < 3 * 16, "every round emitted one token: the test would not see a draft"
    if model is not None:
        assert next(model.parameters()).dtype == torch.float32, "decoding copies the draft; the trained one stays fp32"


def test_a_compiled_draft_copied_into_another_dtype_compiles_its_own_and_keeps_no_cache():
    """`drafts.in_dtype` of a model decoding through compiled graphs: the copy is compiled too,
    through a compiled forward of its own (bound to the copy), and starts with no pinned cache
    (the original's, of its dtype, stays the original's)."""
    from spirelib.decoding.drafts import in_dtype
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer

    model = Transformer(ModelConfig(vocab_size=32, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8,
                                    d_ff=32)).compile_decoding()
    cache = model.new_cache(2, 8)
    twin = in_dtype(model, torch.float64)
    assert twin.compiled_decoding and twin._compiled is not model._compiled
    assert twin.new_cache(2, 8) is not cache and twin.new_cache(2, 8).k[0].dtype == torch.float64
    assert model.new_cache(2, 8) is cache  # the original keeps its own
