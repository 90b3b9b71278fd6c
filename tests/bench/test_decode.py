"""`spire bench decode`'s roofline counts what the kernels read (a dense cache's whole capacity, the
useful part apart), its timed rounds are retaken while a graph records, and `--dtype bf16` reaches
the models and the memory check."""

from __future__ import annotations

import pytest
import torch

from spirelib import bench, cli
from spirelib.bench import decode, decode_memory, decode_models, roofline
from spirelib.bench.roofline import RooflineTiming
from spirelib.decoding.graphs import GRAPHS
from spirelib.measure.tau import DecodingProtocol
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.hardware import Machine

CFG = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
TOY = ["--vocab-size", "64", "--target-layers", "2", "--d-model", "32", "--n-kv", "2", "--d-head", "16",
       "--d-ff", "64"]


def test_the_capacities_are_those_the_timed_generations_allocate(monkeypatch):
    """`capacities` prices the caches `round_generation` decodes in: AD's and SD's (the prefill's)."""
    target = Transformer(CFG).eval()
    factories, _ = decode_models.build_methods(target, ["spire"], 0.0, 4)
    made = []
    new_cache = target.new_cache
    monkeypatch.setattr(target, "new_cache", lambda batch, capacity, **o: made.append(capacity) or
                        new_cache(batch, capacity, **o))
    for method in ("ad", "spire"):
        next(decode.round_generation(target, factories, method, decode.RoundCell(2, 12, 3), 5, run=0))
    assert made == [roofline.capacities(12, 3, 5)["ad"], roofline.capacities(12, 3, 5)["sd"]]


@pytest.mark.parametrize("method", ["ad", "spire"])
def test_a_round_generation_runs_at_least_its_rounds(method):
    """`round_generation` decodes enough tokens for `rounds` rounds whatever the draft accepts (AD: one
    token a step after the prefill's; SD: at most k + 1 a round): the warm-up and the timed rounds fit."""
    target = Transformer(CFG).eval()
    factories, _ = decode_models.build_methods(target, ["spire"], 0.0, 4)
    generation = decode.round_generation(target, factories, method, decode.RoundCell(2, 12, 3), 4, run=0)
    assert sum(1 for _ in generation) >= 4


def test_round_rows_report_the_bytes_read_beside_the_useful_ones_and_no_recording_on_the_cpu():
    torch.manual_seed(0)
    target = Transformer(CFG).eval()
    factories, models = decode_models.build_methods(target, ["spire"], 0.0, 4)
    rows = decode.round_rows(target, factories, models, ["ad", "spire"], decode.RoundCell(2, 12, 3), 4,
                             RooflineTiming(Machine(1e10, 1e10, 4), repeats=2))
    for r in rows:
        assert r["mbytes"] > r["useful_mbytes"] and r["fraction"] > r["useful_fraction"] > 0
        assert r["recorded"] == 0
    with pytest.raises(ValueError, match="prices 2 bytes a value; the target's weights take 4"):
        decode.round_rows(target, factories, models, ["ad"], decode.RoundCell(2, 12, 3), 4,  # a bf16 machine's
                          RooflineTiming(Machine(1e10, 1e10, 2), repeats=2))  # roofline, an fp32 target


def test_a_timing_that_recorded_a_graph_is_taken_again_then_flagged(monkeypatch):
    """`bench.replayed`: a take during which a round's graph was recorded is retaken (at most
    `RETAKES` times); one that still records comes back with its count, to be flagged."""
    takes = []

    def measure(records):
        def take():
            takes.append(1)
            GRAPHS.recordings += records(len(takes))
            return len(takes)
        return take

    monkeypatch.setattr(GRAPHS, "recordings", 0)
    assert bench.replayed(measure(lambda n: 0)) == (1, 0)  # replays only: one take
    takes.clear()
    assert bench.replayed(measure(lambda n: n == 1)) == (2, 0)  # the first take recorded: retaken once
    takes.clear()
    assert bench.replayed(measure(lambda n: 1)) == (bench.RETAKES + 1, 1)  # always recording: flagged


def test_dtype_bf16_is_accepted_and_reaches_the_models_and_the_memory_check(monkeypatch, capsys):
    seen = {}

    def run_case(target, factories, methods, B, L, *rest):
        seen["dtype"] = next(target.parameters()).dtype
        return []

    monkeypatch.setattr(decode, "run_case", run_case)
    assert cli.main(["bench", "decode", "--dtype", "bf16", "--batch", "1", "--context", "8", "--methods", "ad",
                     *TOY]) == 0
    assert seen["dtype"] == torch.bfloat16 and "bf16" in capsys.readouterr().out
    assert cli.main(["bench", "decode", "--batch", "1", "--context", "8", "--methods", "ad", *TOY]) == 0
    assert seen["dtype"] == torch.float32  # fp32, the default
    argv = ["bench", "decode", "--batch", "4", "--context", "64", *TOY]
    fp32 = sum(decode_memory.held_bytes(CFG, list(decode_models.TIMED), 4, 64, DecodingProtocol(k=4, new_tokens=64), 64,
                                        "rounds", 4).values())
    monkeypatch.setattr(decode_memory, "available_bytes", lambda device: fp32 * 3 // 4)  # bf16's half fits, fp32 does not
    assert decode.problems(cli.parser().parse_args(argv + ["--dtype", "bf16"])) == []
    assert "the timed runs hold" in decode.problems(cli.parser().parse_args(argv))[0]
    with pytest.raises(SystemExit):
        cli.main(["bench", "decode", "--dtype", "fp16", *TOY])
