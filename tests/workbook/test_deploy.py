"""`spire deploy`: the schedule (best k per batch size, off where AD wins, merges within the
noise or the switching cost), its refusals, each engine's file read back the way the engine reads
it (`throughput.engines`' lookup models, tests/throughput/test_engines.py) and `--explain`'s reading."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from spirelib import cli
from spirelib.throughput import engines, profiled
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.acceptance import alpha_from_tau, best_k
from spirelib.throughput.methods import KVBudget, card
from spirelib.throughput.scenarios import Scenario
from spirelib.throughput.schedule import (
    Acceptance,
    ProfiledPricing,
    Table,
    context_switches,
    expressed_cost,
    min_context_run,
    modeled_table,
    profiled_table,
    schedule,
)
from spirelib.training.series import Series
from spirelib.workbook import deploy, deploy_inputs, report, runner


def table(tm, spread=0.01):
    """A Table over B = 1..N from tm (K, N), its interval +-spread relative."""
    tm = np.asarray(tm, dtype=float)
    return Table(np.arange(1, tm.shape[0] + 1), np.arange(1, tm.shape[1] + 1), tm, tm * (1 - spread),
                 tm * (1 + spread))


# ---------------------------------------------------------------------------- the schedule

def test_schedule_takes_the_best_k_per_batch_and_turns_speculation_off_where_ad_wins():
    #          B = 1    2    3    4    5    6
    tm = [[2.0, 1.8, 1.5, 1.2, 0.9, 0.8],   # k = 1
          [2.5, 2.0, 1.4, 1.1, 0.8, 0.7],   # k = 2
          [2.2, 1.7, 1.3, 1.0, 0.7, 0.6]]   # k = 3
    s = schedule(table(tm, spread=0.0))
    assert [(r.lo, r.hi, r.k) for r in s.ranges] == [(1, 2, 2), (3, 4, 1), (5, 6, 0)]
    assert s.ranges[0].speedup_max == 2.5 and s.ranges[0].speedup_min == 2.0
    assert s.ranges[-1].speedup_min == 1.0 and s.merges == ()  # off: AD's own 1.0
    assert s.ranges[-1].drafting == 0.9 and s.ranges[0].drafting == 2.5  # the best any k >= 1 reaches there
    assert [s.k_at(b) for b in (1, 3, 6, 100)] == [2, 1, 0, 0]
    assert schedule(table(tm, spread=0.0), max_batch=64).ranges[-1].hi == 64


def test_neighbours_within_the_noise_merge_and_the_merge_is_recorded():
    tm = [[2.00, 2.00, 1.50, 1.50],
          [2.03, 2.03, 1.00, 1.00]]  # k = 2 wins B 1-2 by 1.5%, k = 1 wins B 3-4 by 50%
    noisy = schedule(table(tm, spread=0.01))
    assert [(r.lo, r.hi, r.k) for r in noisy.ranges] == [(1, 4, 1)]
    (merge,) = noisy.merges
    assert merge.merged == ((1, 2, 2), (3, 4, 1)) and merge.k == 1 and merge.reason == "noise"
    assert merge.loss == pytest.approx(1 - 2.00 / 2.03)
    assert noisy.ranges[0].loss == pytest.approx(1 - 2.00 / 2.03)
    resolved = schedule(table(tm, spread=0.001))  # intervals apart: both ranges stay
    assert [(r.lo, r.hi, r.k) for r in resolved.ranges] == [(1, 2, 2), (3, 4, 1)] and resolved.merges == ()
    assert [(r.lo, r.hi, r.k) for r in schedule(table(tm, spread=0.01), merge=False).ranges] == [(1, 2, 2), (3, 4, 1)]


def test_the_cheapest_merge_is_made_first():
    tm = [[2.0, 1.98, 1.0],
          [1.0, 2.00, 1.0],
          [1.0, 1.94, 2.0]]  # B = 2 may join B = 1 at k = 1 (loses 1%) or B = 3 at k = 3 (loses 3%), not both
    s = schedule(table(tm, spread=0.02))
    assert [(r.lo, r.hi, r.k) for r in s.ranges] == [(1, 2, 1), (3, 3, 3)]
    assert [m.loss for m in s.merges] == [pytest.approx(0.01)]


def test_a_switching_cost_merges_what_it_does_not_pay_to_switch_for():
    tm = [[2.0, 2.0, 1.6, 1.6],
          [2.2, 2.2, 1.0, 1.0]]  # k = 2 gains 10% at B 1-2
    assert len(schedule(table(tm, spread=0.001), switching_cost=0.05).ranges) == 2
    s = schedule(table(tm, spread=0.001), switching_cost=0.12)
    assert [(r.lo, r.hi, r.k) for r in s.ranges] == [(1, 4, 1)] and s.merges[0].reason == "switching cost"
    with pytest.raises(ValueError, match="switching_cost"):
        schedule(table(tm), switching_cost=1.5)


def test_a_minimum_batch_run_gives_a_narrow_range_the_neighbouring_k_that_loses_less():
    #          B = 1    2    3    4    5    6
    tm = [[1.0, 1.0, 2.0, 1.0, 1.0, 1.0],   # k = 1: best at B = 3 alone
          [2.0, 2.0, 1.9, 1.0, 1.0, 1.0],   # k = 2
          [1.0, 1.0, 1.5, 2.0, 2.0, 2.0]]   # k = 3
    assert schedule(table(tm, spread=0.001)).describe() == "B 1-2: k=2, B 3-3: k=1, B 4-6: k=3"
    s = schedule(table(tm, spread=0.001), min_batch_run=2, max_batch=10)
    assert s.describe() == "B 1-3: k=2, B 4-10: k=3" and s.ranges[0].loss == pytest.approx(1 - 1.9 / 2.0)
    assert schedule(table(tm, spread=0.001), min_batch_run=8, max_batch=10).describe() == "B 1-10: k=3"
    last = table([[2.0] * 5 + [1.0], [1.0] * 5 + [2.0]], spread=0.001)  # k = 2 at B = 6 only, which holds to 10
    assert schedule(last, min_batch_run=5, max_batch=10).describe() == "B 1-5: k=1, B 6-10: k=2"
    with pytest.raises(ValueError, match="min_batch_run"):
        schedule(table(tm), min_batch_run=0)


def test_the_tau_interval_moves_the_acceptance_curve_and_is_empty_without_spread():
    a = Acceptance(3.0, 0.2, 4, (0.8, 0.7, 0.6, 0.5))
    tau, low, high = a.taus(4)
    assert tau[-1] == pytest.approx(1 + 0.8 + 0.56 + 0.336 + 0.168)
    assert np.all(low < tau) and np.all(tau < high) and np.all(high <= np.arange(2, 6))
    assert (tau[-1] - 1) / (low[-1] - 1) == pytest.approx((a.tau - 1) / (a.tau - 0.2 - 1))
    tight = Acceptance(3.0, 0.0, 4).taus(8)
    assert np.array_equal(tight[0], tight[1]) and len(tight[0]) == 8
    with pytest.raises(ValueError, match="per_position"):
        Acceptance(3.0, 0.1, 4, (0.9, 0.8))


def test_the_modeled_table_finds_the_same_best_k_as_acceptance_best_k():
    a = Acceptance(3.4, 0.0, 4)  # i.i.d. alpha of tau 3.4 at k = 4, searched to k = 8
    B = np.arange(1, 129)
    t = modeled_table("spire", a, B, 512, "seqax-67m", "spire-draft")
    s = schedule(t, merge=False)
    alpha = float(alpha_from_tau(3.4, 4))
    for b in (1, 8, 64, 128):
        k, tm = best_k("spire", alpha, b, 512, "seqax-67m", "spire-draft", k_max=8)
        assert s.k_at(b) == k and t.at(k)[0][b - 1] == pytest.approx(tm)
    assert len({r.k for r in s.ranges}) > 1  # the depth does change with B here


def best_at(k, others=1.0, best=2.0, n=2):
    """A table over B = 1..n, K = 3, whose best k is `k` at every batch size."""
    tm = np.full((3, n), others)
    tm[k - 1] = best
    return table(tm, spread=0.001)


def test_a_minimum_context_run_merges_short_runs_and_counts_the_switches_before_and_after():
    tables = {64: best_at(1), 128: best_at(2), 256: best_at(1), 1024: best_at(2)}  # runs of 64, 64, 128, 768 tokens
    by_context = {L: schedule(t) for L, t in tables.items()}
    assert context_switches(by_context, 1) == 3 and context_switches(by_context, 1, lo=256) == 1
    long_runs = min_context_run(tables, by_context, 512)
    assert [long_runs[L].k_at(1) for L in tables] == [2, 2, 2, 2] and context_switches(long_runs, 1) == 0
    assert min_context_run(tables, by_context, 64) == by_context  # every run lasts 64 tokens or more
    unchanged = min_context_run(tables, by_context, 0)
    assert [unchanged[L].k_at(2) for L in tables] == [1, 2, 1, 2]


def test_a_short_context_run_takes_the_neighbouring_k_that_loses_less():
    middle = table([[1.5, 1.5], [1.2, 1.2], [2.0, 2.0]])  # at L = 1100 k = 3 is best; k = 1 loses less than k = 2
    tables = {1000: best_at(1), 1100: middle, 3000: best_at(2)}  # runs of 1000, 100, 1900 tokens
    long_runs = min_context_run(tables, {L: schedule(t) for L, t in tables.items()}, 500)
    assert [long_runs[L].k_at(1) for L in tables] == [1, 1, 2]


# ---------------------------------------------------------------------------- a run folder

RESULTS = {"04_measure_tau": {
    "tau": {"spire": {"512": {"mean": 3.2, "ci95": 0.05, "n_contexts": 10}},
            "vanilla": {"512": {"mean": 2.5, "ci95": 0.04, "n_contexts": 10}},
            "magicdec": {"512": {"mean": 2.9, "ci95": 0.04, "n_contexts": 10}}},
    "per_position_acceptance": {"spire": {"512": {"p": [0.8, 0.7, 0.6, 0.5]}}},
    "tau_protocol": {"k": 4}}}


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(RESULTS))
    (folder / "run.json").write_text(json.dumps({"params": {"series": {}}, "notebooks": {
        "06_speedup_explorer": {"parameters": {"context_length": 512}}}}))
    return folder


def test_deploy_writes_every_format_and_each_engine_reads_back_the_schedule(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm", "--shapes", "paper", "--max-batch", "128",
                     "--contexts", "256,512,1024", "--cuda-graph-bs", "1,2,4,8,16,32,64", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(engines.SERVING) and "MagicDec: B 1-" in printed
    inp = deploy_inputs.inputs(run_dir, hardware="h100-sxm", shapes="paper", max_batch=128, contexts=(256, 512, 1024))
    graphs = (1, 2, 4, 8, 16, 32, 64)
    for method in ("spire", "vanilla", "magicdec"):
        doc = yaml.safe_load((out / method / "schedule.yaml").read_text())
        s = schedule(inp.table(method), max_batch=128)
        assert [r["k"] for r in doc["schedule"]] == [r.k for r in s.ranges]
        assert doc["inputs"]["hardware"] == "h100-sxm" and doc["inputs"]["hoi"] == pytest.approx(590.746, abs=1e-3)
        assert doc["serving"] == engines.SERVING and doc["inputs"]["sglang_cuda_graph_bs"] == list(graphs)
        assert {e["release"] for e in doc["engines"].values()} == {e.release for e in engines.ENGINES.values()}
        vllm = json.loads((out / method / "vllm.json").read_text())
        assert engines.vllm_problems(vllm) == [] and all(engines.vllm_k(vllm, b) == s.k_at(b) for b in range(1, 129))
        assert ("num_speculative_tokens_per_batch_size" in vllm) == (len(s.ranges) > 1)
        ctx = json.loads((out / method / "vllm-context-pr48944.json").read_text())
        tables = {L: inp.table(method, L) for L in (256, 512, 1024)}
        per_l = {L: schedule(t, max_batch=128) for L, t in tables.items()}
        long_runs = min_context_run(tables, per_l, deploy_inputs.MIN_CONTEXT_RUN, 128)
        for L in (256, 512, 1024):
            assert all(engines.vllm_context_k(ctx, b, L) == long_runs[L].k_at(b) for b in range(1, 129))
        assert doc["context_switches"]["per_batch"]["1"] == {"before": context_switches(per_l, 1),
                                                             "after": context_switches(long_runs, 1)}
        trt_text = (out / method / "trtllm.yaml").read_text()
        trt = yaml.safe_load(trt_text)["speculative_config"]
        header = " ".join(line[2:] for line in trt_text.splitlines() if line.startswith("# "))
        assert engines.trtllm_problems(trt) == [] and f"Keys of {engines.ENGINES['trtllm'].release}" in header
        _, expressed = engines.trtllm_config(s, inp.table(method))
        assert all(engines.trtllm_k(trt, b) == expressed.k_at(b) for b in range(1, 129))
        args = doc["sglang_server_args"]
        path = out / method / "sglang-adaptive.json"
        config = json.loads(path.read_text()) if path.exists() else None
        _, _, held = engines.sglang_config(s, inp.table(method), card(method).engines.get("sglang"))
        assert engines.sglang_problems(config, args) == [] and args["speculative_num_steps"] >= 1
        assert all(engines.sglang_k(config, args, b, graphs) == held.k_at(engines.sglang_padded(b, graphs))
                   for b in range(1, 129))
        assert set(doc["collapsed_cost"]) == {"256", "512", "1024"} and doc["collapsed_cost"]["512"] == 0.0
    assert yaml.safe_load((out / "vanilla" / "schedule.yaml").read_text())["sglang_server_args"][
        "speculative_algorithm"] == "STANDALONE"
    magicdec = yaml.safe_load((out / "magicdec" / "schedule.yaml").read_text())
    assert magicdec["schedule"][0]["k"] == 0  # off at B = 1: TensorRT-LLM holds another k there, SGLang a 0 slot
    assert f"    TensorRT-LLM cannot hold it: {magicdec['engines']['trtllm']['note']}" in printed.splitlines()
    assert "    SGLang cannot hold it" not in printed and json.loads((out / "magicdec" / "sglang-adaptive.json").read_text(
        ))["1"] == {"candidate_steps": [0]}
    assert not (out / "vanilla" / "sglang-adaptive.json").exists()  # STANDALONE would ignore it


GUIDED_AND_LOOKUP = {"guided": {"512": {"mean": 3.0, "ci95": 0.05, "n_contexts": 10}},
                     "lookup": {"512": {"mean": 1.6, "ci95": 0.03, "n_contexts": 10}}}


def test_deploy_prices_the_guided_draft_and_prompt_lookup_with_lookups_ngram_keys_in_each_engine_file(
        run_dir, tmp_path, capsys):
    results = json.loads((run_dir / "results.json").read_text())
    results["04_measure_tau"]["tau"].update(GUIDED_AND_LOOKUP)
    (run_dir / "results.json").write_text(json.dumps(results))
    out = tmp_path / "out"
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm", "--shapes", "paper", "--max-batch", "64",
                     "--contexts", "512", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "guided sparse: B 1-" in printed and "prompt lookup: B 1-" in printed
    inp = deploy_inputs.inputs(run_dir, hardware="h100-sxm", shapes="paper", max_batch=64, contexts=(512,))
    assert list(inp.acceptance) == ["spire", "vanilla", "magicdec", "guided", "lookup"]
    for method in ("guided", "lookup"):
        doc = yaml.safe_load((out / method / "schedule.yaml").read_text())
        s = schedule(inp.table(method), max_batch=64)
        assert [r["k"] for r in doc["schedule"]] == [r.k for r in s.ranges] and doc["inputs"]["tau"] == inp.acceptance[
            method].tau
    lengths = card("lookup").ngrams
    vllm = json.loads((out / "lookup" / "vllm.json").read_text())
    assert {k: vllm[k] for k in engines.VLLM_NGRAM} == {"method": "ngram", "prompt_lookup_min": lengths[0],
                                                        "prompt_lookup_max": lengths[1]}
    assert engines.vllm_problems(vllm) == [] and "method" not in json.loads((out / "guided" / "vllm.json").read_text())
    trt = yaml.safe_load((out / "lookup" / "trtllm.yaml").read_text())["speculative_config"]
    assert trt["decoding_type"] == "NGram" and trt["max_matching_ngram_size"] == lengths[1]
    assert "draft_len_schedule" not in trt and engines.trtllm_problems(trt) == []
    lookup = yaml.safe_load((out / "lookup" / "schedule.yaml").read_text())
    args = lookup["sglang_server_args"]
    assert args["speculative_algorithm"] == "NGRAM" and args["speculative_ngram_max_bfs_breadth"] == 1
    assert not (out / "lookup" / "sglang-adaptive.json").exists()  # NGRAM ignores the adaptive config
    assert "NGRAM drafts from its own cache" in lookup["engines"]["sglang"]["note"]
    guided = yaml.safe_load((out / "guided" / "schedule.yaml").read_text())
    assert "speculative_algorithm" not in guided["sglang_server_args"]  # no engine implements it: none named


def test_series_scenarios_compare_the_paper_and_the_trained_shapes():
    from spirelib.model.config import vanilla_draft_config
    series = Series.from_dict({})
    taus = {"vanilla": 2.0, "spire": 3.0}
    scenarios = deploy_inputs.series_scenarios(series, taus, 300.0, "src")
    paper, trained = scenarios["paper shapes"], scenarios["trained shapes"]
    assert (paper.taus, paper.k, paper.hoi, paper.label) == (taus, series.k, 300.0, "paper shapes, src")
    assert paper.target == Scenario.paper().target
    assert trained == Scenario.trained(series.target, vanilla_draft_config(series.target), series.spire.num_layers,
                                       series.spire.window, taus, k=series.k, hoi=300.0,
                                       label=f"trained shapes (window {series.spire.window}), src")


def test_the_served_shapes_are_the_papers_for_a_series_trained_from_scratch_and_k_says_where_it_is_capped(
        run_dir, tmp_path, capsys):
    inp = deploy_inputs.inputs(run_dir, hardware="h100-sxm", max_batch=8, contexts=(512,))
    assert inp.shapes == "paper" and inp.scenario.target == deploy_inputs.inputs(
        run_dir, hardware="h100-sxm", max_batch=8, contexts=(512,), shapes="paper").scenario.target
    assert inp.scenario.target != deploy_inputs.inputs(run_dir, hardware="h100-sxm", max_batch=8, contexts=(512,),
                                                 shapes="trained").scenario.target
    results = json.loads((run_dir / "results.json").read_text())
    results["04_measure_tau"]["per_position_acceptance"]["spire"]["512"]["p"] = [0.99, 0.99, 0.99, 0.99]
    results["04_measure_tau"]["tau"]["spire"]["512"]["mean"] = 4.9
    results["04_measure_tau"]["tau"]["magicdec"]["512"]["mean"] = 4.9  # no curve: i.i.d. alpha, searched to 8
    (run_dir / "results.json").write_text(json.dumps(results))
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm", "--max-batch", "8", "--contexts", "512",
                     "--draft", "spire", "--draft", "magicdec", "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "paper shapes" in printed and printed.count("[k capped at the measured depth 4]") == 1
    assert "capped at the measured depth 4" in yaml.safe_load(
        (tmp_path / "o" / "spire" / "schedule.yaml").read_text())["inputs"]["k_searched"]
    magicdec = yaml.safe_load((tmp_path / "o" / "magicdec" / "schedule.yaml").read_text())
    assert magicdec["inputs"]["k_searched"] == "1..8" and magicdec["schedule"][0]["k"] == 8


def test_trtllm_keeps_its_first_k_the_deepest_at_the_least_modeled_loss():
    tm = [[1.5, 1.5, 1.5, 1.5],
          [1.2, 1.6, 2.0, 2.4]]  # best: k = 1 at B = 1, k = 2 after
    t = table(tm, spread=0.0)
    s = schedule(t)
    config, expressed = engines.trtllm_config(s, t)
    assert [r.k for r in expressed.ranges] == [2, 2] and config == {"max_draft_len": 2}  # one k held: static
    assert engines.trtllm_problems(config) == []
    assert expressed_cost(t, expressed) == pytest.approx(1 - 1.2 / 1.5)  # raised beats clamped (1 - 1.5/2.4)


def test_explain_reads_a_file_as_the_engine_would_beside_the_workbooks_schedule(run_dir, tmp_path, capsys):
    hand = tmp_path / "trt.yaml"
    hand.write_text(yaml.safe_dump({"speculative_config": {"max_draft_len": 3, "draft_len_schedule": {4: 3, 16: 1}}}))
    assert cli.main(["deploy", "--explain", str(hand), "--engine", "trtllm", "--max-batch", "20"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(engines.SERVING)
    rows = [line.split() for line in printed.splitlines() if line.startswith("  ") and line.split()[0][0].isdigit()]
    assert rows == [["1-4", "3"], ["5-16", "1"], ["17-20", "0"]]
    assert cli.main(["deploy", str(run_dir), "--explain", str(hand), "--engine", "trtllm", "--max-batch", "20",
                     "--hardware", "h100-sxm", "--draft", "spire"]) == 0
    printed = capsys.readouterr().out
    inp = deploy_inputs.inputs(run_dir, hardware="h100-sxm", max_batch=20, methods=["spire"])
    s, t = schedule(inp.table("spire"), max_batch=20), inp.table("spire")
    first = next(line.split() for line in printed.splitlines() if line.strip().startswith("1"))
    assert first[2] == str(s.k_at(1)) and float(first[-2].split("-")[0]) == pytest.approx(t.at(s.k_at(1))[0][0], abs=0.005)
    assert float(first[-1].split("-")[0]) == pytest.approx(t.at(3)[0][0], abs=0.005)  # the file's k = 3 at B = 1
    assert "differs" in printed  # the hand-edited file turns speculation off above 16, the schedule does not
    hand.write_text("{not: [valid")
    assert cli.main(["deploy", "--explain", str(hand), "--engine", "trtllm"]) == 2
    assert "not valid YAML/JSON" in capsys.readouterr().err
    assert cli.main(["deploy", "--explain", str(hand)]) == 2
    assert "--explain needs --engine" in capsys.readouterr().err
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps({"num_speculative_tokens": 2, "ctx_agg": "mean", "speculative_token_schedule": [
        [1, 8, 1, 512, 2], [1, 8, 513, 4096, 1], [9, 64, 1, 512, 1], [9, 64, 513, 4096, 0]]}))
    assert cli.main(["deploy", "--explain", str(ctx), "--engine", "vllm_pr48944", "--max-batch", "12",
                     "--contexts", "512,513,9000"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")
            and line.split()[0][0].isdigit()]
    assert rows == [["1-8", "512", "2"], ["9-12", "512", "1"], ["1-8", "513", "1"], ["9-12", "513", "0"],
                    ["1-8", "9000", "1"], ["9-12", "9000", "0"]]  # past the last context bucket: the last one
    vllm = tmp_path / "v.json"
    vllm.write_text(json.dumps({"max_draft_len": 3}))
    assert cli.main(["deploy", "--explain", str(vllm), "--engine", "vllm"]) == 2
    assert "not in that engine's form" in capsys.readouterr().err


def test_refusals_name_the_problem_before_any_compute(run_dir, tmp_path, capsys):
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100", "--draft", "spire"]) == 2
    assert "--hardware h100: unknown device; known: h100-sxm" in capsys.readouterr().err
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm", "--draft", "eagle"]) == 2
    assert "--draft eagle: no such draft in this run; it measured spire, vanilla, magicdec" in capsys.readouterr().err
    assert cli.main(["deploy", str(tmp_path / "nothing"), "--hardware", "h100-sxm"]) == 2
    assert "no results.json" in capsys.readouterr().err
    assert cli.main(["deploy", str(run_dir), "--hardware", "a100-sxm", "--dtype", "fp8"]) == 2
    assert "a100-sxm has no fp8 peak" in capsys.readouterr().err
    (run_dir / "results.json").write_text("{}")
    assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm"]) == 2
    assert "recorded no tau" in capsys.readouterr().err
    assert not (run_dir / "deploy").exists()


def test_a_device_given_as_peak_and_bandwidth_sets_the_hoi(run_dir):
    inp = deploy_inputs.inputs(run_dir, peak_flops=1e15, bandwidth=2e12, dtype="bf16", max_batch=8, contexts=(512,))
    assert inp.hardware.hoi("bf16") == 500.0 and inp.scenario.hoi == 500.0 and inp.scenario.bytes_per_value == 2.0
    with pytest.raises(deploy.DeployError, match="both --peak-flops and --bandwidth"):
        deploy_inputs.inputs(run_dir, peak_flops=1e15)
    with pytest.raises(deploy.DeployError, match="--min-batch-run 0: batch sizes"):
        deploy_inputs.inputs(run_dir, hardware="h100-sxm", min_batch_run=0)
    wide = deploy_inputs.inputs(run_dir, hardware="h100-sxm", max_batch=64, contexts=(512,), min_batch_run=64)
    assert len(wide.schedule(wide.table("magicdec")).ranges) == 1


# ---------------------------------------------------------------------------- this machine's profiled model

COST = profiled.ProfiledCost(2e10, 5e9, per_token_layer_s=1.5e-4, per_key_s=7e-6, sampling_per_logit_s=4.7e-7,
                             bookkeeping_s=1.7e-4, bookkeeping_per_logit_s=2.5e-7,
                             drafts={"spire": profiled.DraftOverhead(-1e-3, 8e-3)})


def test_the_profiled_table_is_the_profiled_speedup_with_its_error_around_taus_interval():
    a = Acceptance(4.5, 0.3, 4, (0.93, 0.96, 0.99, 0.95))
    target = pm.ModelShape(2, 64, 2, 2, 16, 128)
    draft = profiled.DraftShape("spire", pm.ModelShape(1, 64, 2, 2, 16, 128), KVBudget(1, 16), memory_layers=1)
    priced = profiled.PricedTarget(target, 256, 4)
    t = profiled_table(ProfiledPricing(COST, priced, 64, 0.1), draft, a, [1, 2, 4], 64)
    tau, low, _ = a.taus(4)
    assert t.tm[2, 1] == pytest.approx(profiled.speedup(COST, draft, tau[2], priced, 2, 64, 64, 3))
    assert t.low[2, 1] == pytest.approx(profiled.speedup(COST, draft, low[2], priced, 2, 64, 64, 3) / 1.1)
    assert np.all(t.low < t.tm) and np.all(t.tm < t.high)


def test_deploy_on_this_machine_uses_the_profiled_model_notebook_09_recorded(run_dir, tmp_path):
    results = json.loads((run_dir / "results.json").read_text())
    with pytest.raises(deploy.DeployError, match="notebook 09's profiled model"):
        deploy_inputs.inputs(run_dir, model="profiled")
    results["09_measured_vs_modeled"] = {
        "profiled_model": {**COST.to_dict(), "median_error": 0.1, "held_out_max_error": 0.5},
        "machine": {"peak_flops": 2e10, "precision": "fp32", "bandwidth": 5e9, "bytes_per_value": 4, "device": "cpu"}}
    (run_dir / "results.json").write_text(json.dumps(results))
    with pytest.raises(deploy.DeployError, match="drop --hardware"):
        deploy_inputs.inputs(run_dir, model="profiled", hardware="h100-sxm")
    inp = deploy_inputs.inputs(run_dir, model="profiled", max_batch=4, contexts=(64,), context=64, methods=["spire"])
    assert inp.device == "this-machine" and inp.dtype == "fp32" and inp.hardware.hoi("fp32") == 4.0
    draft = inp.profiled.drafts["spire"]
    spire = Series.from_dict({}).spire  # the series' SPIRe: its sink + window, memory in every layer
    assert draft.keys == spire.sink + spire.window and draft.memory_layers == spire.num_layers
    pricing = ProfiledPricing(COST, profiled.PricedTarget(Series.from_dict({}).target.shape(), 256, 4), 64, 0.1)
    assert inp.profiled.pricing == pricing and inp.profiled.held_out_max_error == 0.5  # as 09 recorded it
    expected = profiled_table(pricing, draft, inp.acceptance["spire"], np.arange(1, 5), 64)
    made = inp.table("spire")
    assert np.allclose(made.tm, expected.tm) and np.allclose(made.low, expected.low)
    deploy.write(inp, tmp_path / "cpu")
    doc = yaml.safe_load((tmp_path / "cpu" / "spire" / "schedule.yaml").read_text())
    assert "profiled cost model" in doc["inputs"]["model"] and doc["inputs"]["hardware"] == "this-machine"


def test_the_profiled_model_prices_every_measured_draft_at_notebook_09s_own_shapes(run_dir, monkeypatch):
    from spirelib.measure import wallclock
    results = json.loads((run_dir / "results.json").read_text())
    results["04_measure_tau"]["tau"].update(GUIDED_AND_LOOKUP)
    results["09_measured_vs_modeled"] = {
        "profiled_model": {**COST.to_dict(), "median_error": 0.1, "held_out_max_error": 0.5},
        "machine": {"peak_flops": 2e10, "precision": "fp32", "bandwidth": 5e9, "bytes_per_value": 4, "device": "cpu"}}
    (run_dir / "results.json").write_text(json.dumps(results))
    shared = wallclock.profiled_draft_shapes
    calls = []
    monkeypatch.setattr(wallclock, "profiled_draft_shapes", lambda *a, **k: calls.append(shared(*a, **k)) or calls[-1])
    inp = deploy_inputs.inputs(run_dir, model="profiled", max_batch=4, contexts=(64,), context=64)
    assert set(inp.acceptance) == {"spire", "vanilla", "magicdec", "guided", "lookup"}
    assert len(calls) == 1 and inp.profiled.drafts is calls[0]  # 09's shapes, the very object, none of its own
    series = Series.from_dict({})
    assert calls[0] == series.draft_shapes()
    assert calls[0]["guided"].scores and not calls[0]["lookup"].passes(4)
    for method in ("guided", "lookup"):
        expected = profiled_table(inp.profiled.pricing, calls[0][method], inp.acceptance[method], np.arange(1, 5), 64)
        assert np.allclose(inp.table(method).tm, expected.tm)


def test_a_run_writes_its_schedules_and_the_index_links_every_file_written(run_dir):
    written = deploy.write_run(run_dir)
    assert set(written) == {"h100-sxm-fp8"}  # no notebook 09 in this run: no schedule for this machine
    entry = written["h100-sxm-fp8"]
    for method, made in entry["methods"].items():
        assert made["files"][0] == "schedule.yaml" and len(made["files"]) > 1
        assert all((run_dir / entry["folder"] / method / f).is_file() for f in made["files"])
        doc = yaml.safe_load((run_dir / entry["folder"] / method / "schedule.yaml").read_text())
        assert made["ranges"] == ", ".join(f"B {r['batch'][0]}-{r['batch'][1]}: k={r['k']}" for r in doc["schedule"])
    page = report.schedules_section({"deploy": written}, {})
    assert page.count("<a href=") == sum(len(m["files"]) for m in entry["methods"].values())
    assert "deploy/h100-sxm-fp8/spire/vllm.json" in page and "SPIRe" in page
    assert report.schedules_section({}, {}) == ""
    (run_dir / "results.json").write_text("{}")
    assert "recorded no tau" in deploy.write_run(run_dir)["h100-sxm-fp8"]["skipped"]


def test_spire_run_writes_the_schedules_after_a_notebook_they_read(tmp_path, monkeypatch):
    fixtures = Path(__file__).parents[1] / "fixtures"
    monkeypatch.setattr(deploy, "write_run", lambda out_dir: {"h100-sxm-fp8": {"skipped": f"stub for {out_dir.name}"}})
    monkeypatch.setattr(deploy, "READS", ("01_record",))
    execute, _ = runner.notebook_stack()
    monkeypatch.setattr(execute, "execute", lambda *args, **kwargs: ("ok", 0.0, None))  # no kernel: the hook is tested
    assert cli.main(["run", "--params", str(fixtures / "params.yaml"), "--notebooks", str(fixtures / "notebooks"),
                     "--only", "01", "--out", str(tmp_path / "reads")]) == 0
    assert json.loads((tmp_path / "reads" / "run.json").read_text())["deploy"] == {
        "h100-sxm-fp8": {"skipped": "stub for reads"}}
    assert "not written: stub for reads" in (tmp_path / "reads" / "index.html").read_text()


def test_only_runs_that_touch_what_the_schedules_read_rewrite_them():
    assert deploy.reads_any(["01_performance_model", "04_measure_tau"])
    assert deploy.reads_any(["09_measured_vs_modeled"])
    assert not deploy.reads_any(["06_speedup_explorer", "08_cost_analysis"])


# ---------------------------------------------------------------------------- EAGLE-3: the lines that serve it

EAGLE3 = {"tau": {"512": {"mean": 2.864, "ci95": 0.001, "n_contexts": 10}},
          "per_position_acceptance": {"512": {"p": [0.8, 0.7, 0.6, 0.5], "accepted": [80, 56, 34, 17],
                                              "reached": [100, 80, 56, 34]}}}
LOW_HOI = ["--peak-flops", "4e13", "--bandwidth", "2e12", "--dtype", "bf16"]  # HOI 20: k changes with B


def with_eagle3(run_dir, export=None):
    results = json.loads((run_dir / "results.json").read_text())
    results["04_measure_tau"]["tau"]["eagle3"] = EAGLE3["tau"]
    results["04_measure_tau"]["per_position_acceptance"]["eagle3"] = EAGLE3["per_position_acceptance"]
    if export is not None:
        results["03_train_drafts"] = {"eagle3_export": export}
    (run_dir / "results.json").write_text(json.dumps(results))


def exported(folder, verifier="org/target-model"):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3", "speculators_config": {
        "algorithm": "eagle3", "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}))
    return folder


def command(script):
    """The argv a serve-*.sh runs (its one exec line, continued over lines)."""
    import shlex
    body = script.replace("\\\n", " ").splitlines()
    assert body[0] == "#!/bin/sh" and all(line.startswith("# ") for line in body[1:-1])
    return shlex.split(body[-1])[1:]  # after exec


def test_deploy_writes_eagle3s_serving_lines_with_its_exported_folder_and_its_acceptance_profile(
        run_dir, tmp_path, capsys):
    draft = exported(run_dir / "drafts" / "eagle3")
    with_eagle3(run_dir, "drafts/eagle3")  # relative to the run's folder
    out = tmp_path / "out"
    assert cli.main(["deploy", str(run_dir), *LOW_HOI, "--shapes", "paper", "--max-batch", "64", "--contexts", "512",
                     "--cuda-graph-bs", "1,2,4,8,16,32,64", "--draft", "eagle3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(engines.SERVING) and f"served by serve-vllm.sh, serve-sglang.sh (draft model: {draft})" \
        in printed
    folder = out / "eagle3"
    inp = deploy_inputs.inputs(run_dir, peak_flops=4e13, bandwidth=2e12, dtype="bf16", shapes="paper", max_batch=64,
                               contexts=(512,), methods=["eagle3"], graph_bs=(1, 2, 4, 8, 16, 32, 64))
    s = schedule(inp.table("eagle3"), max_batch=64)
    assert len(s.ranges) > 1  # k changes with B: vLLM's dynamic key, SGLang's adaptive file
    vllm = json.loads((folder / "vllm.json").read_text())
    assert vllm["method"] == "eagle3" and vllm["model"] == str(draft) and engines.vllm_problems(vllm) == []
    assert all(engines.vllm_k(vllm, b) == s.k_at(b) for b in range(1, 65))
    ctx = json.loads((folder / "vllm-context-pr48944.json").read_text())
    assert (ctx["method"], ctx["model"]) == ("eagle3", str(draft))
    argv = command((folder / "serve-vllm.sh").read_text())
    assert argv[:3] == ["vllm", "serve", "org/target-model"]  # the target the export names
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == vllm and "--max-num-seqs" in argv
    doc = yaml.safe_load((folder / "schedule.yaml").read_text())
    args = doc["sglang_server_args"]
    assert list(args)[:2] == ["speculative_algorithm", "speculative_draft_model_path"]
    assert args["speculative_algorithm"] == "EAGLE3" and args["speculative_draft_model_path"] == str(draft)
    adaptive = json.loads((folder / "sglang-adaptive.json").read_text())  # EAGLE3 reads the keyed schedule
    assert engines.sglang_problems(adaptive, args) == [] and args["speculative_num_steps"] == max(r.k for r in s.ranges)
    assert all(engines.sglang_k(adaptive, args, b, inp.graph_bs) == s.k_at(engines.sglang_padded(b, inp.graph_bs))
               for b in range(1, 65))
    argv = command((folder / "serve-sglang.sh").read_text())
    assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "org/target-model"]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        assert flag in argv and (value is True or argv[argv.index(flag) + 1] == str(value))
    assert argv[argv.index("--speculative-adaptive-config") + 1] == str((folder / "sglang-adaptive.json").resolve())
    assert argv[argv.index("--cuda-graph-bs") + 1:argv.index("--cuda-graph-bs") + 8] == ["1", "2", "4", "8", "16",
                                                                                         "32", "64"]
    assert doc["draft_model"] == {"path": str(draft), "placeholder": None, "target": "org/target-model",
                                  "note": f"exported to {draft} (results.json's 03_train_drafts.eagle3_export)"}
    profile = json.loads((folder / "acceptance_profile.json").read_text())
    assert doc["acceptance_profile"] == "acceptance_profile.json" and profile["method"] == "eagle3"
    assert profile["conditional_accept_rates"] == [0.8, 0.7, 0.607143, 0.5] and profile["rounds"] == 100
    assert profile["marginal_accept_rates"] == [0.8, 0.56, 0.34, 0.17] and profile["mean_accept_length"] == 2.87
    assert profile["context_lengths"] == [512] and profile["source"]["run"] == run_dir.name
    for value in ({"path": str(draft)}, str(draft)):  # read tolerantly: absolute, or a mapping holding the path
        with_eagle3(run_dir, value)
        assert deploy_inputs.inputs(run_dir, hardware="h100-sxm", methods=["eagle3"]).drafts["eagle3"].path == str(draft)


def test_without_an_exported_folder_eagle3s_lines_carry_a_placeholder_and_say_how_to_export(run_dir, tmp_path):
    for export in (None, "nowhere/eagle3"):  # none recorded; recorded but not there
        with_eagle3(run_dir, export)
        out = tmp_path / str(export).replace("/", "-")
        assert cli.main(["deploy", str(run_dir), "--hardware", "h100-sxm", "--max-batch", "16", "--contexts", "512",
                         "--out", str(out)]) == 0
        vllm = json.loads((out / "eagle3" / "vllm.json").read_text())
        assert vllm["model"] == "<EAGLE3_DRAFT_DIR>" and "placeholder" in engines.vllm_problems(vllm)[0]
        doc = yaml.safe_load((out / "eagle3" / "schedule.yaml").read_text())
        assert doc["draft_model"]["path"] is None and doc["draft_model"]["placeholder"] == "<EAGLE3_DRAFT_DIR>"
        assert "spirelib.training.eagle3_export.export_eagle3" in doc["draft_model"]["note"]
        for name in ("serve-vllm.sh", "serve-sglang.sh"):
            script = (out / "eagle3" / name).read_text()
            assert "<EAGLE3_DRAFT_DIR>" in command(script)[-1] or "<EAGLE3_DRAFT_DIR>" in command(script)
            assert "export_eagle3" in script and "<TARGET_MODEL>" in command(script)
        assert not (out / "vanilla" / "serve-vllm.sh").exists()  # no export recorded for it: its schedule only
        assert not (out / "spire" / "serve-vllm.sh").exists() and (out / "spire" / "acceptance_profile.json").exists()
    assert "nowhere/eagle3" in doc["draft_model"]["note"]


NO_TORCH = """import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is unimportable here")
sys.meta_path.insert(0, NoTorch())
from spirelib import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_deploy_runs_with_torch_unimportable_and_writes_what_it_writes_beside_torch(run_dir, tmp_path):
    """`spire deploy` reads JSON and prices with numpy: with torch unimportable it writes byte for byte
    the files it writes in a process that has torch, for a series trained from scratch (its trained
    shapes from the series' configs) and for an imported target (its config.json read, no weights)."""
    hf = tmp_path / "llama"
    hf.mkdir()
    (hf / "config.json").write_text((Path(__file__).parents[1] / "fixtures" / "hf_configs" /
                                     "llama-3.1-8b-instruct.json").read_text())
    imported = tmp_path / "imported"
    imported.mkdir()
    (imported / "results.json").write_text((run_dir / "results.json").read_text())
    (imported / "run.json").write_text(json.dumps({"params": {"series": {"target_source": f"hf:{hf}",
                                                                         "tokenizer": "hf"}}}))
    for run, shapes in ((run_dir, "trained"), (run_dir, "paper"), (imported, "served")):
        args = ["deploy", str(run), "--hardware", "h100-sxm", "--shapes", shapes, "--contexts", "256,512"]
        beside, alone = tmp_path / f"beside-{run.name}-{shapes}", tmp_path / f"alone-{run.name}-{shapes}"
        assert cli.main([*args, "--out", str(beside)]) == 0
        done = subprocess.run([sys.executable, "-c", NO_TORCH, *args, "--out", str(alone)], capture_output=True,
                              text=True, cwd=Path(__file__).parents[2])
        assert done.returncode == 0, done.stderr[-2000:]
        files = sorted(p.relative_to(beside) for p in beside.rglob("*") if p.is_file())
        assert files and files == sorted(p.relative_to(alone) for p in alone.rglob("*") if p.is_file())
        assert all((beside / f).read_bytes() == (alone / f).read_bytes() for f in files), (run.name, shapes)
