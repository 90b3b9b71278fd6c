"""A round's roofline as the method cards list its forwards (`bench.roofline`): what each forward
kind reads (a dense cache's whole capacity; the useful, live part apart), a round as its card's passes."""

from __future__ import annotations

import pytest
import torch

from spirelib.bench import roofline
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput import profiled
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import card

CFG = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)


def test_a_dense_cache_forward_reads_the_whole_capacity_and_the_roofline_counts_it():
    """The AD step's attention reads every slot of its cache (masked), so its roofline's bytes are
    those of the capacity the generation decodes in; the useful roofline counts the live L + 1 keys."""
    context, k, window, rounds = 40, 3, 4, 6
    capacity = roofline.capacities(context, k, rounds)
    model = Transformer(CFG).eval()
    cache = model.new_cache(2, capacity["ad"])
    with torch.no_grad():
        model.hidden(torch.zeros(2, context, dtype=torch.long), cache=cache)
        positions = torch.full((2, 1), context)  # (B, 1): a decode step
        cache.prepare(positions)
    keys, _ = cache.layer_kv(0, positions)  # (B, n_kv, slots read, d_head)
    kinds = roofline.forward_shapes(roofline.model_cfgs(CFG), context, k, roofline.kv_budgets(window), capacity)
    assert kinds["AD step"].reads == keys.shape[2] == capacity["ad"] > kinds["AD step"].keys == context + 1
    assert kinds[f"verify ({k + 1} tokens)"].reads == capacity["sd"] == kinds[roofline.step_kind("vanilla")].reads
    machine = Machine(1e12, 1e11, 4)
    read = profiled.forward_work(CFG.shape(), CFG.vocab_size, 2, 1, capacity["ad"], bytes_per_value=4).bytes
    live = profiled.forward_work(CFG.shape(), CFG.vocab_size, 2, 1, context + 1, bytes_per_value=4).bytes
    assert roofline.roofline(kinds, [("AD step", 1)], 2, machine)[1] == pytest.approx(read / 1e6)
    assert roofline.roofline(kinds, [("AD step", 1)], 2, machine, live=True)[1] == pytest.approx(live / 1e6)


def test_a_round_is_its_cards_passes_and_the_verification():
    k = 3
    assert roofline.round_forwards("ad", k) == [("AD step", 1)]
    assert roofline.round_forwards("vanilla", k) == [("vanilla SD step", 2), ("vanilla SD step", 1),
                                                     ("vanilla SD step", 1), ("verify (4 tokens)", 4)]
    assert roofline.round_forwards("guided", k)[-1] == ("verify (4) + scores", 4)
    assert roofline.round_forwards("lookup", k) == [("verify (4 tokens)", 4)]
    assert len(roofline.round_forwards("eagle3", k)) == len(card("eagle3").round(k)) == k + 1
