"""`spirelib.training.simulate`: the trainer's sharded step traced with fake tensors on 2 fake ranks.

Small shapes, seconds: the same code `spire bench memory --simulate` runs at 70B. Checked:
- a step of several micro-batches keeps every gradient sharded (FSDP2 reduce-scatters each
  micro-batch; with gradient sync off it would hold the whole model's gradient on every rank), and
  clipping computes the norm from the shards (no whole gradient either);
- the checkpoint gather holds the whole weights and both AdamW moments (rank 0), the gather of
  the trained model at the end of a run one copy of the weights, never two;
- the SPIRe draft's run (frozen sharded target, k-pass) traces, and its collectives are counted;
- the k-pass gathers each draft block once per pass: k times a micro-batch's forward, k in its backward;
- the run is built and stepped by the trainer's own public pieces, not a copy of them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.training.config import TrainConfig
from spirelib.training.simulate import Case, peak, simulate

SHAPE = ModelConfig(vocab_size=256, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
TRAIN = TrainConfig(batch_size=4, seq_len=16, steps=1, micro_batch_size=1)  # 2 micro-batches a rank


@pytest.fixture(scope="module")
def target_run():
    return simulate(Case("toy target", "target", SHAPE, TRAIN, 2))


@pytest.fixture(scope="module")
def spire_run():
    return simulate(Case("toy spire", "spire", SHAPE, TRAIN, 2, SpireConfig(num_layers=1, sink=1, window=8, k=2)))


def test_micro_batches_keep_gradients_sharded(target_run):
    """At the step's peak (the second micro-batch, the first one's gradients held) a rank holds its
    half of the fp32 gradient, no whole (unsharded) gradient: 4 bytes x params / 2."""
    r = target_run
    assert r["micro_batches"] == r["micro_batches_traced"] == 2
    fb = r["phases"]["forward+backward"]
    assert fb["Sharded Grad"] == pytest.approx(4 * r["params"] / 2, rel=0.02)
    assert fb["Unsharded Grad"] <= 0.05 * 4 * r["params"]
    assert peak(r) == max(fb["peak_bytes"], r["phases"]["optimizer"]["peak_bytes"]) > 0


def test_clipping_and_the_optimizer_step_hold_no_whole_gradient(target_run):
    """The optimizer phase (clipping, AdamW) holds the shards and little else: torch's
    clip_grad_norm_ on DTensor gradients materialized the whole fp32 gradient (+77 GB a rank at 70B)."""
    r = target_run
    opt = r["phases"]["optimizer"]
    held = opt["Sharded Param"] + opt["Sharded Grad"] + opt["OptState"] + opt["Inputs"]
    assert opt["peak_bytes"] - held < 0.25 * 4 * r["params"]


def test_saves_gather_weights_and_moments_and_the_end_of_run_one_copy(target_run):
    r = target_run
    weights = 4 * r["params"]
    assert r["host"]["build"] == weights  # a language model is built whole
    assert r["host"]["save"] == pytest.approx(3 * weights, rel=0.01)  # weights, exp_avg, exp_avg_sq
    before = r["phases"]["optimizer"]["Sharded Param"] + r["phases"]["optimizer"]["OptState"]
    end = r["phases"]["end of run"]["peak_bytes"]
    assert end <= before + r["phases"]["optimizer"]["Sharded Grad"] + 1.1 * weights  # one whole copy, not two


def test_spire_draft_run_traces_with_its_frozen_target_and_counts_collectives(spire_run):
    r = spire_run
    counts, volume = r["comms"]["counts"], r["comms"]["bytes"]
    assert counts["all_gather"] > 0 and counts["reduce_scatter"] > 0 and counts["all_reduce"] >= 1
    assert volume["all_gather"] > 0 and volume["reduce_scatter"] > 0
    fb = r["phases"]["forward+backward"]
    assert fb["Inputs"] > 2 * SHAPE.vocab_size * SHAPE.d_model  # the bf16 teacher head, the target's shards, the batch
    assert peak(r) > fb["Sharded Param"] > 0


def test_a_resume_reads_this_ranks_rows_and_the_draft_is_built_from_the_targets_shards(target_run, spire_run):
    """A resume reads each rank's rows of the weights and both AdamW moments (`fsdp.load_local_state`,
    its reads counted), half of the 3 x weights rank 0 saved, where every rank read them whole. A SPIRe
    draft is built on the meta device and its shards filled from the sharded target's, no collective:
    the build holds this rank's half of the draft, where every rank built it whole (gathering the
    target's parameters one at a time)."""
    weights = 4 * target_run["params"]
    assert target_run["host"]["resume"] == pytest.approx(3 * weights / 2, rel=0.01)
    spire = spire_run
    draft = 4 * spire["params"]
    assert spire["host"]["resume"] == pytest.approx(3 * draft / 2, rel=0.01)
    assert draft / 2 <= spire["host"]["build"] <= 1.01 * draft / 2
    assert spire["comms"]["build"]["counts"] == {}  # nothing gathered, nothing sent


def test_the_k_pass_gathers_each_draft_block_once_per_pass():
    """A layer's share of a pass is one call of its block (`Block.run`, FSDP2's forward method): a
    draft block is all-gathered k times in a micro-batch's forward and k in its backward. Formerly
    once per call of `queries`, `memory_kv` and `finish_heads`: 3k + 1 in the forward, 3k in the
    backward (4,652 all-gathers a step at 70B over 8 ranks). A draft of two blocks against one of one
    block (the same target): the difference is one block's."""
    spire = SpireConfig(num_layers=1, sink=1, window=8, k=3)
    shape = replace(SHAPE, num_layers=3)
    runs = [simulate(Case(f"toy spire, {n} blocks", "spire", shape, TRAIN, 2, replace(spire, num_layers=n)))
            for n in (1, 2)]
    micro = runs[0]["micro_batches"]
    forward = [r["comms"]["forward"]["counts"]["all_gather"] for r in runs]
    total = [r["comms"]["counts"]["all_gather"] for r in runs]
    assert (forward[1] - forward[0]) / micro == spire.k  # at most k + 1, the goal
    assert (total[1] - total[0] - (forward[1] - forward[0])) / micro == spire.k
    assert forward[0] > micro * (shape.num_layers + spire.k)  # the target's blocks too: the count is the forward's


def test_the_simulation_builds_and_steps_through_the_trainers_own_pieces(monkeypatch):
    """The run is built and stepped by the trainer's public pieces (`train.build_train_state`,
    `step.train_step`), not by a copy of them: a change to the trainer's step changes the simulation."""
    from spirelib.training import step, train

    calls = []

    def counting(module, name):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return counted

    for module, name in ((train, "build_train_state"), (step, "train_step")):
        monkeypatch.setattr(module, name, counting(module, name))
    r = simulate(Case("toy target", "target", SHAPE, TRAIN, 2))
    assert calls == ["build_train_state", "train_step"]
    assert r["phases"]["forward+backward"]["peak_bytes"] > 0 and r["phases"]["optimizer"]["peak_bytes"] > 0


def test_a_batch_that_does_not_split_is_refused_before_any_compute():
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        Case("bad", "target", SHAPE, TRAIN, 3)
    with pytest.raises(ValueError, match="needs its SpireConfig"):
        Case("bad", "spire", SHAPE, TRAIN, 2)
    assert not torch.distributed.is_initialized()
