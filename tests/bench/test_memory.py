"""`spire bench memory`: one training step per model runs and is measured; the
table's per-token, fixed and V-scaling parts are the stated differences."""

import pytest

from spirelib.bench import memory


@pytest.mark.parametrize("model", memory.MODELS)
def test_one_training_step_of_each_model_is_measured(model):
    shape = dict(num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=64)
    r = memory.measure(model, batch=1, seq_len=16, vocab=64, shape=shape)
    assert r["peak_bytes"] == max(r["forward_backward_bytes"], r["optimizer_bytes"])  # tiny: bytes ~ noise
    assert r["params"] > 0 and r["model"] == model


def test_table_separates_per_token_fixed_and_vocabulary_parts():
    # peak = fixed + per_token * B * T with fixed 1000 + 10 V, per token 8 + 0.5 V, T = 4
    peak = lambda b, v: 1000 + 10 * v + (8 + 0.5 * v) * b * 4  # noqa: E731
    results = [{"model": "m", "batch": b, "vocab": v, "peak_bytes": peak(b, v), "forward_backward_bytes": peak(b, v),
                "optimizer_bytes": 1500} for b in (1, 2) for v in (100, 10)]
    (row,) = memory.table(results, seq_len=4, vocab=100, small_vocab=10, budget=peak(7, 100) + 1)
    assert row["per_token_V"] == 58 and row["fixed_V"] == 2000
    assert row["per_token_from_V"] == 45 and row["fixed_from_V"] == 900
    assert row["batch_in_budget"] == 7


def test_a_spire_draft_holds_its_own_target_layers_only():
    """Llama 3 8B (33 residual-stream entries of 4,096 values), a draft of 8 layers: a 64 x 1,024
    training batch held 17.7 GB of bf16 activations, now 9 entries, 4.8 GB; a B = 256, L = 960
    tau prefill 66.4 GB, now 8 entries, 16.1 GB."""
    rows = {(r["target"], r["case"]): r for r in memory.residual_stream_rows()}
    train, prefill = rows["llama3-8b", "training"], rows["llama3-8b", "tau prefill"]
    assert (train["entries_before"], train["entries_now"], prefill["entries_now"]) == (33, 9, 8)
    assert train["before_bytes"] == 33 * 64 * 1024 * 4096 * 2 and round(train["before_bytes"] / 1e9, 1) == 17.7
    assert round(train["now_bytes"] / 1e9, 1) == 4.8 and round(prefill["before_bytes"] / 1e9, 1) == 66.4
    assert round(prefill["now_bytes"] / 1e9, 1) == 16.1
    assert rows["llama3-70b", "training"]["entries_now"] == 21
