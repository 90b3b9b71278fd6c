"""What notebook 02 says about the target (tables.training) holds what series, pipeline and the trainer computed."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spirelib.model.config import ModelConfig
from spirelib.throughput.costs import flop_params
from spirelib.throughput.recorded import trained_target
from spirelib.training.tokenizer import BytesTokenizer
from spirelib.workbook.narrative import training as words
from spirelib.workbook.tables import training as tables

CFG = ModelConfig(vocab_size=256, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
TRAINED = SimpleNamespace(imported=None, corpus="tiny", tokenizer="bytes")
IMPORTED = SimpleNamespace(imported=Path("/models/llama"), corpus="tiny", tokenizer="hf")
TRAIN_CFG = SimpleNamespace(batch_size=4, seq_len=64, beta1=0.9, beta2=0.95, lr=3e-3, warmup_fraction=0.1,
                            min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0)
SUMMARY = {"val_loss": 2.0, "device": "cpu", "tokens_per_s": 12345.6, "run_tokens_per_s": 10000.0, "tokens": 2560,
           "steps": 10}


def run(reused=False, summary=SUMMARY):
    return SimpleNamespace(summary=summary, config_hash="abc", result=SimpleNamespace(
        reused=reused, path=Path("/cache/target-abc/final.safetensors")))


def test_data_note_counts_each_split():
    train = SimpleNamespace(num_tokens=1000, lengths=np.array([3, 70]))
    val = SimpleNamespace(num_tokens=200, lengths=np.array([50]))
    data = SimpleNamespace(num_documents=(12, 3), tokenizer=BytesTokenizer(), dataset=SimpleNamespace(
        train=train, val=val, vocab_size=256, checksum="0123456789abcdef"))
    note = words.data_note(data, TRAINED, 260)
    assert "| train | 12 | 1,000 | 70 |\n| validation | 3 | 200 | 50 |" in note
    assert note.endswith("tokenizer **bytes** with 256 ids (model vocabulary 260). Each document is followed by "
                         "`\\x00` (id 0); no BOS token precedes it. Dataset checksum `0123456789ab`.")


def test_special_tokens_sentence_names_the_bos_and_eos_around_each_document():
    llama3 = SimpleNamespace(bos_id=128000, bos_token="<|begin_of_text|>", eos_id=128001, eos_token="<|end_of_text|>")
    assert words.special_tokens_sentence(llama3) == (
        "Each document is preceded by `<|begin_of_text|>` (id 128000) and followed by `<|end_of_text|>` (id 128001).")
    smollm2 = SimpleNamespace(bos_id=None, bos_token=None, eos_id=0, eos_token="<|endoftext|>")
    assert words.special_tokens_sentence(smollm2) == (
        "Each document is followed by `<|endoftext|>` (id 0); no BOS token precedes it.")


def test_scale_line_and_model_note_trained_and_imported():
    assert words.scale_line(CFG, TRAINED, 2_500_000) == \
        f"2 layers, d_model 32, {CFG.num_params() / 1e6:.2f}M params, 2.50M tokens of tiny"
    assert words.scale_line(CFG, IMPORTED, 0).endswith("params, imported from /models/llama")
    trained = words.model_note(CFG, TRAIN_CFG, TRAINED, 10, 2560)
    assert f"| 2 | 32 | 2 x 2 | 8 | 64 | 256 | {CFG.body_params():,} | {CFG.num_params():,} |" in trained
    assert f"**2,560 tokens**, {2560 / CFG.num_params():.2f} tokens per parameter (paper: 20)" in trained
    assert "warm-up 10% of steps, cosine to 0.1x" in trained
    imported = words.model_note(CFG, TRAIN_CFG, IMPORTED, 0, 0)
    assert "**Imported** from `/models/llama`" in imported and "**Budget:**" not in imported
    assert f"hold {1 - CFG.body_params() / CFG.num_params():.0%} of its parameters" in imported


def test_trained_sentence_says_where_the_target_came_from():
    assert words.trained_sentence(run(), None) == (
        "Trained the target (target-abc): validation loss 2.000 nats/token (perplexity 7.4) on cpu, "
        "12,346 training tokens/s")
    assert words.trained_sentence(run(reused=True), None).startswith("Loaded the cached target (target-abc)")
    assert words.trained_sentence(run(reused=True), IMPORTED.imported).startswith(
        "Imported the target (final.safetensors)") and "training tokens/s" not in words.trained_sentence(
        run(), IMPORTED.imported)


def test_mfu_sentence_for_each_case():
    speed = {"mfu": 0.25, "run_mfu": 0.2, "peak_flops": 2e11, "device": "cpu"}
    assert words.mfu_sentence(SUMMARY, speed, CFG, None) == (
        f"steady state: 12,346 tokens/s x 6 x {flop_params(CFG):,} FLOP-params / 200 GFLOP/s peak = MFU 25.0%; "
        "the run's wall clock: 10,000 tokens/s, MFU 20.0%")
    assert words.mfu_sentence(SUMMARY, {**speed, "run_mfu": None}, CFG, None).endswith(
        "not recorded by this cached checkpoint")
    assert words.mfu_sentence(SUMMARY, {**speed, "mfu": None, "device": "cuda:0"}, CFG, None) == \
        "trained on cuda:0, which is not present here: no MFU"
    assert words.mfu_sentence(SUMMARY, speed, CFG, IMPORTED.imported) == "imported, not trained here: no training MFU"


def test_sample_text_decodes_prompt_target_and_actual():
    assert words.sample_text(0, lambda t: "".join(t), ["a", "b"], ["c"], ["d"]) == \
        "--- sample 1\nPROMPT: 'ab'\nTARGET: 'c'\nACTUAL: 'd'"


def test_target_result_keeps_the_results_keys():
    speed = {"mfu": 0.25, "run_mfu": None, "peak_flops": 2e11}
    result = tables.target_result(run(), CFG, speed, None).to_dict()
    assert list(result) == ["params", "body_params", "val_loss", "tokens_per_s", "mfu", "run_mfu", "run_tokens_per_s",
                            "peak_flops", "tokens", "steps", "device", "config_hash", "reused", "imported_from",
                            "embedding_params"]
    assert result["embedding_params"] == CFG.num_params() - CFG.body_params() and result["imported_from"] is None
    assert result["run_tokens_per_s"] == 10000.0 and result["mfu"] == 0.25 and result["reused"] is False
    old = {k: v for k, v in SUMMARY.items() if k != "run_tokens_per_s"}  # a checkpoint that predates the figure
    assert tables.target_result(run(summary=old), CFG, speed, IMPORTED.imported).run_tokens_per_s is None
    assert tables.target_result(run(), CFG, speed, IMPORTED.imported).imported_from == "/models/llama"
    recorded = {"02_train_target": {"target": result}}
    assert trained_target(recorded) == tables.target_result(run(), CFG, speed, None)  # read back typed as written


def test_every_trained_draft_states_its_budget_against_the_papers_20_n_and_a_small_one_is_about_the_budget():
    """A SPIRe draft of 25M body parameters trained on 123k tokens got 0.025% of the paper's 20 x N
    = 500M: its taus are worded as about that budget; the vanilla draft at 62% of its own is not.
    The index says the same beside every claim built on a tau (`paper_claims.budget_clause`)."""
    from spirelib.throughput.recorded import RecordedBudget, trained_budgets
    from spirelib.workbook import paper_claims

    budgets = {"SPIRe draft": RecordedBudget(123_000, 25_000_000, 500_000_000, 123_000 / 500_000_000),
               "vanilla draft": RecordedBudget(1_638_400, 131_072, 2_621_440, 0.625)}
    text = words.budget_sentence(budgets)
    assert text.startswith("Training budgets: the SPIRe draft trained on 123,000 tokens, 0.025% of the paper's 20 x N "
                           "= 500,000,000 (N = 25,000,000 body parameters); the vanilla draft trained on 1,638,400 "
                           "tokens, 62% of the paper's")
    assert text.endswith("those of the SPIRe draft, and every claim built on them, are about this budget, not about "
                         "the method: a draft given the paper's budget could accept far more.")
    assert "vanilla draft, and every claim" not in text
    recorded = {"03_train_drafts": {"draft_budgets": {name: b.to_dict() for name, b in budgets.items()}}}
    assert trained_budgets(recorded) == budgets  # as 03 records them, read back typed
    clause = paper_claims.budget_clause(recorded)
    assert clause == ("; drafts trained on 0.025% (SPIRe draft) and 62% (vanilla draft) of the paper's 20 x N tokens: "
                      "about that budget for the SPIRe draft, not about the method")
    budgets["SPIRe draft"] = dataclasses.replace(budgets["SPIRe draft"], fraction=0.5)
    assert words.budget_sentence(budgets).endswith("that share of the paper's budget.")
    assert paper_claims.budget_clause({}) == ""


def test_a_drafts_budget_says_what_the_papers_would_take_here_and_on_the_hardware_tables_gpus():
    """03's draft budgets: the paper's 20 x N tokens at the draft's measured training speed on this
    machine, and on each GPU of the hardware table at the plan's FLOPs per token (a SPIRe draft's
    training includes the frozen target's forward, so it costs more per token than the same body
    trained alone) and MFU; the sentence says both."""
    from spirelib.throughput.hardware import GPU_MFU, HARDWARE
    from spirelib.training.train import TrainConfig
    from spirelib.units import duration
    from spirelib.workbook import work

    train_cfg = TrainConfig(batch_size=4, seq_len=64, steps=10)
    draft_cfg = ModelConfig(vocab_size=256, num_layers=1, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)

    def trained(tokens_per_s, spire=None):
        return SimpleNamespace(summary={"tokens": 2560, "tokens_per_s": tokens_per_s}, layers_config=draft_cfg,
                               train_config=train_cfg, config=spire)

    budgets = tables.draft_budgets(trained(1000.0), trained(500.0, spire="spire config"), CFG)
    spire, vanilla = budgets["SPIRe draft"], budgets["vanilla draft"]
    paper = 20 * draft_cfg.body_params()
    assert spire.paper_tokens == paper and spire.fraction == 2560 / paper
    assert spire.paper_seconds["this machine"] == paper / 500.0 and vanilla.paper_seconds["this machine"] == (
        paper / 1000.0)
    assert set(spire.paper_seconds) == {"this machine", *HARDWARE}
    _, tokens, flops, _ = work.TrainRun(CFG, train_cfg, draft_cfg, None, draft_cfg.body_params()).work()
    h100 = HARDWARE["h100-sxm"].peak_flops["bf16"] * GPU_MFU
    assert vanilla.paper_seconds["h100-sxm"] == pytest.approx(flops / tokens * paper / h100)
    assert spire.paper_seconds["h100-sxm"] > vanilla.paper_seconds["h100-sxm"]  # the frozen target's forward
    text = words.budget_sentence(budgets)
    assert f"that budget would take {duration(paper / 500.0)} on this machine at its measured speed, " in text
    assert f"{duration(spire.paper_seconds['h100-sxm'])} on h100-sxm" in text and "(modeled at 40% MFU)" in text
    imported = tables.draft_budgets(trained(float("nan")), trained(500.0, spire="s"), CFG)["vanilla draft"]
    assert "this machine" not in imported.paper_seconds
