"""Each serving engine's lookup model (`throughput.engines`) read against the engine's own documented
examples, and each written form read back by that model at every batch size: the k the engine
would pick is the schedule's (or the documented nearest the form can hold)."""

import dataclasses

import numpy as np
import pytest

from spirelib.throughput import engines
from spirelib.throughput.methods import card
from spirelib.throughput.schedule import Table, expressed_cost, schedule


def table(tm, spread=0.01):
    """A Table over B = 1..N from tm (K, N), its interval +-spread relative."""
    tm = np.asarray(tm, dtype=float)
    return Table(np.arange(1, tm.shape[0] + 1), np.arange(1, tm.shape[1] + 1), tm, tm * (1 - spread),
                 tm * (1 + spread))


def stepped(n, cuts):
    """A table over B = 1..n, K = 4, whose best k is 4, 3, 2, 1, 0 in turn at the batch sizes `cuts`
    (the first batch size of each next k), each best by a wide margin."""
    best = np.searchsorted(cuts, np.arange(1, n + 1), side="right")  # 0 -> k = 4, 1 -> k = 3, ...
    tm = np.full((4, n), 0.5)
    for b, i in enumerate(best):
        if i < 4:
            tm[3 - i, b] = 2.0
    return table(tm, spread=0.001)


MAX = 64
SCHEDULE = schedule(stepped(MAX, [4, 9, 17, 33]), max_batch=MAX)  # k = 4 to B 3, 3 to 8, 2 to 16, 1 to 32, off after


def test_the_schedule_under_test_changes_k_four_times_and_turns_off():
    assert SCHEDULE.describe() == "B 1-3: k=4, B 4-8: k=3, B 9-16: k=2, B 17-32: k=1, B 33-64: k=0"


# ---------------------------------------------------------------------------- the engines' own examples

def test_vllm_reads_its_documented_example_ranges_inclusive_with_gaps_inheriting():
    # vLLM's docs (v0.25.0): [1, 64, 3], [65, 128, 1], [129, 512, 0]; PR #32374: gaps inherit, k clamped
    docs = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 128, 1],
                                                                                  [129, 512, 0]]}
    assert [engines.vllm_k(docs, b) for b in (1, 64, 65, 128, 129, 512, 600)] == [3, 3, 1, 1, 0, 0, 0]
    gappy = {"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 16, 3], [64, 128, 1]]}
    assert [engines.vllm_k(gappy, b) for b in (1, 16, 17, 63, 64, 500)] == [2, 2, 2, 2, 1, 1]
    assert engines.vllm_problems(docs) == [] and engines.vllm_k({"num_speculative_tokens": 5}, 300) == 5
    assert engines.vllm_problems({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]})
    assert "ctx_agg" in engines.vllm_problems({"num_speculative_tokens": 3, "ctx_agg": "mean"})[0]


def test_trtllm_reads_its_documented_example_as_upper_bounds_with_speculation_off_above():
    # PR #10860: {4: 4, 8: 2, 32: 1} is 4 for B 1-4, 2 for 5-8, 1 for 9-32, 0 from 33
    docs = {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 2, 32: 1}}
    assert [engines.trtllm_k(docs, b) for b in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    assert engines.trtllm_problems(docs) == [] and engines.trtllm_k({"max_draft_len": 3}, 10_000) == 3
    assert engines.trtllm_problems({"max_draft_len": 4, "draft_len_schedule": {4: 2, 8: 4}})


def test_sglang_pads_to_a_graph_size_then_takes_the_slot_at_or_below():
    # adaptive_step_router: bisect_left over the graph sizes, then bisect_right - 1 over the slot keys
    config = {"1": {"candidate_steps": [7]}, "8": {"candidate_steps": [3]}, "32": {"candidate_steps": [1]}}
    args = {"speculative_algorithm": "EAGLE", "speculative_adaptive": True, "speculative_num_steps": 7,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 8}
    graphs = (1, 2, 4, 8, 12, 48)
    assert [engines.sglang_padded(b, graphs) for b in (1, 3, 5, 12, 13, 47, 48, 49)] == [1, 4, 8, 12, 48, 48, 48, 49]
    assert [engines.sglang_k(config, args, b, graphs) for b in (1, 4, 5, 7, 8, 9, 13, 31, 32, 49)] == [
        7, 7, 3, 3, 3, 3, 1, 1, 1, 1]  # 5 runs padded as 8: slot 8; 13 as 48: slot 32
    assert engines.sglang_problems(config, args) == []
    standalone = {**args, "speculative_algorithm": "STANDALONE"}
    assert {engines.sglang_k(config, standalone, b, graphs) for b in range(1, 60)} == {7}  # the config is ignored
    assert "STANDALONE ignores the adaptive config" in engines.sglang_problems(config, standalone)[0]
    assert engines.sglang_problems(None, {**args, "speculative_num_steps": 0, "speculative_num_draft_tokens": 1})


# ---------------------------------------------------------------------------- every written form, every batch size

def test_vllm_picks_the_schedules_k_at_every_batch_size_and_past_the_last_entry():
    config = engines.vllm_config(SCHEDULE)
    assert engines.vllm_problems(config) == [] and config["num_speculative_tokens"] == 4
    assert [engines.vllm_k(config, b) for b in range(1, MAX + 1)] == [SCHEDULE.k_at(b) for b in range(1, MAX + 1)]
    assert engines.vllm_k(config, 4 * MAX) == SCHEDULE.ranges[-1].k  # a larger max_num_seqs inherits the last k


def test_trtllm_picks_the_k_its_form_holds_at_every_batch_size_and_none_above_the_last_key():
    t = stepped(MAX, [4, 9, 17, 33])
    config, expressed = engines.trtllm_config(SCHEDULE, t)
    assert engines.trtllm_problems(config) == [] and max(config["draft_len_schedule"]) == 32  # off: implicit
    assert [engines.trtllm_k(config, b) for b in range(1, MAX + 1)] == [expressed.k_at(b) for b in range(1, MAX + 1)]
    assert expressed == SCHEDULE  # deepest first: nothing to clamp here
    assert engines.trtllm_k(config, MAX + 1) == 0


@pytest.mark.parametrize("graphs", [engines.CUDA_GRAPH_BS, (1, 2, 4, 8, 16, 32), (1, 3, 20)])
def test_sglang_picks_the_schedules_k_at_the_padded_batch_size(graphs):
    t = stepped(MAX, [4, 9, 17, 33])
    config, args, expressed = engines.sglang_config(SCHEDULE, t, "EAGLE3")
    assert engines.sglang_problems(config, args) == [] and args["speculative_num_steps"] == 4  # never 0
    assert expressed == SCHEDULE and config[str(MAX // 2 + 1)] == {"candidate_steps": [0]}  # a slot may be off
    for b in range(1, MAX + 1):
        padded = min([g for g in graphs if g >= b], default=b)  # the batch SGLang runs: the documented nearest
        assert engines.sglang_k(config, args, b, graphs) == SCHEDULE.k_at(padded)


# ---------------------------------------------------------------------------- one k, off-switches, refusals

def test_one_k_is_written_as_the_static_key_and_dynamic_speculation_stays_off():
    t = table([[1.5] * 8, [2.0] * 8])
    one = schedule(t)
    assert engines.vllm_config(one) == {"num_speculative_tokens": 2}
    assert engines.trtllm_config(one, t)[0] == {"max_draft_len": 2}
    config, args, _ = engines.sglang_config(one, t, "EAGLE")
    assert config is None and "speculative_adaptive" not in args and args["speculative_num_steps"] == 2
    off = schedule(table([[0.5] * 8]))
    assert engines.vllm_config(off) is None and engines.sglang_config(off, table([[0.5] * 8]), "EAGLE")[0] is None


def test_a_standalone_draft_is_served_static_at_the_k_that_loses_least():
    t = stepped(MAX, [4, 9, 17, 33])
    config, args, expressed = engines.sglang_config(SCHEDULE, t, "STANDALONE")
    assert config is None and args["speculative_algorithm"] == "STANDALONE" and len({r.k for r in expressed.ranges}) == 1
    static = {k: expressed_cost(t, dataclasses.replace(SCHEDULE, ranges=tuple(dataclasses.replace(r, k=k)
                                                                           for r in SCHEDULE.ranges)))
              for k in (1, 2, 3, 4)}  # a static 0 is no speculation at all: not a server argument
    assert args["speculative_num_steps"] == min(static, key=static.get)
    assert {engines.sglang_k(config, args, b) for b in range(1, MAX + 1)} == {args["speculative_num_steps"]}


def test_vllm_context_form_of_the_open_pr_reads_each_bucket_at_its_upper_end():
    low, high = schedule(stepped(16, [4, 9, 17, 33]), max_batch=16), schedule(table([[2.0] * 16]), max_batch=16)
    config = engines.vllm_context_config({256: low, 1024: high})
    assert config["speculative_token_schedule"][:2] == [[1, 3, 1, 256, 4], [1, 3, 257, 1024, 1]]
    for b in range(1, 17):
        assert engines.vllm_context_k(config, b, 100) == engines.vllm_context_k(config, b, 256) == low.k_at(b)
        assert engines.vllm_context_k(config, b, 257) == engines.vllm_context_k(config, b, 10**6) == high.k_at(b)


# ---------------------------------------------------------------------------- prompt lookup's n-gram drafting

def test_prompt_lookup_files_carry_each_engines_ngram_keys_and_hold_what_its_ngram_path_takes():
    t = stepped(MAX, [4, 9, 17, 33])
    vllm = engines.vllm_config(SCHEDULE, (1, 5))  # vLLM's config takes the per-batch-size key with method ngram
    ngram = {k: vllm[k] for k in engines.VLLM_NGRAM}
    assert ngram == {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 5}
    assert engines.vllm_problems(vllm) == [] and "num_speculative_tokens_per_batch_size" in vllm
    assert [engines.vllm_k(vllm, b) for b in range(1, MAX + 1)] == [SCHEDULE.k_at(b) for b in range(1, MAX + 1)]
    assert engines.vllm_problems({**vllm, "prompt_lookup_min": 6})  # vLLM refuses min > max
    assert "method" not in engines.vllm_config(SCHEDULE)  # a draft model's file stays the schedule's keys only
    context = engines.vllm_context_config({256: SCHEDULE}, (1, 5))
    assert context["method"] == "ngram" and engines.vllm_context_k(context, 5, 100) == SCHEDULE.k_at(5)
    trt, held = engines.trtllm_config(SCHEDULE, t, (1, 5))  # NGram: one static k, the one that loses least
    assert trt == {"decoding_type": "NGram", "max_matching_ngram_size": 5, "is_public_pool": False,
                   "max_draft_len": held.ranges[0].k} and len({r.k for r in held.ranges}) == 1
    assert held == engines.static(SCHEDULE, t) and engines.trtllm_problems(trt) == []
    assert {engines.trtllm_k(trt, b) for b in range(1, 4 * MAX)} == {held.ranges[0].k}
    config, args, expressed = engines.sglang_config(SCHEDULE, t, card("lookup").engines["sglang"])
    assert config is None and args["speculative_algorithm"] == "NGRAM" and expressed == held  # NGRAM: not adaptive
    assert args["speculative_ngram_max_bfs_breadth"] == 1 and engines.sglang_problems(config, args) == []
    off = schedule(table([[0.5] * 8]))
    assert engines.trtllm_config(off, table([[0.5] * 8]), (1, 5))[0] is None


# ---------------------------------------------------------------------------- which drafts, and how they are served

def test_the_serving_statement_comes_from_the_cards_a_draft_served_iff_its_card_names_engines():
    from spirelib.throughput.methods import DECODED

    for method in DECODED:
        c = card(method)
        assert c.label in engines.SERVING
        for name in c.engines.values():
            assert name in engines.SERVING
    unserved = engines.SERVING.split("need an engine")[0].rsplit(". ", 1)[1]  # the sentence naming the unserved
    assert {m for m in DECODED if card(m).label in unserved} == {m for m in DECODED if not card(m).engines}
    assert "EAGLE-3 (its exported draft model) through vLLM method \"eagle3\" and SGLang --speculative-algorithm " \
           "EAGLE3" in engines.SERVING
    served_spire = dataclasses.replace(card("spire"), engines={"vllm": "spire_x"})  # a card that gains an engine
    text = engines.serving([card("magicdec"), served_spire])
    assert 'SPIRe (its exported draft model) through vLLM method "spire_x"' in text
    assert text.endswith("MagicDec need an engine that implements them, and none does today: their files are the "
                         "schedule such an implementation would take.")
    assert "need an engine" not in engines.serving([card("eagle3")])


def test_vllm_takes_a_draft_models_method_and_model_and_refuses_it_without_a_loadable_model():
    keys = {"method": "eagle3", "model": "/drafts/eagle3", **engines.vllm_config(SCHEDULE)}
    assert engines.vllm_problems(keys) == [] and engines.VLLM_MODEL_METHODS == ("draft_model", "eagle3")
    assert [engines.vllm_k(keys, b) for b in range(1, MAX + 1)] == [SCHEDULE.k_at(b) for b in range(1, MAX + 1)]
    assert engines.vllm_problems({**keys, "model": None}) == ["method eagle3 needs the draft's model (its exported "
                                                               "folder)"]
    assert "placeholder" in engines.vllm_problems({**keys, "model": "<EAGLE3_DRAFT_DIR>"})[0]


def sglang_flags(argv):
    """SGLang's server arguments from its argv: `--a-b v` -> {"a_b": "v"}, a bare flag -> True, and a
    flag's several values (--cuda-graph-bs) as a list."""
    args, key = {}, None
    for word in argv[3:]:  # python -m sglang.launch_server
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            args[key] = True
        else:
            args[key] = word if args[key] is True else [*(args[key] if isinstance(args[key], list) else [args[key]]),
                                                        word]
    return args


def test_the_command_lines_carry_the_config_and_the_server_arguments_as_written():
    import json

    keys = {"method": "eagle3", "model": "/d", **engines.vllm_config(SCHEDULE)}
    argv = engines.vllm_command(keys, "my/target", MAX)
    assert argv[:3] == ["vllm", "serve", "my/target"] and argv[argv.index("--max-num-seqs") + 1] == str(MAX)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == keys
    config, args, _ = engines.sglang_config(SCHEDULE, stepped(MAX, [4, 9, 17, 33]), "EAGLE3")
    args = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d", **args}
    argv = engines.sglang_command(args, "my/target", MAX, "/deploy/sglang-adaptive.json", (1, 2, 4, 8))
    flags = sglang_flags(argv)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"] and flags["model_path"] == "my/target"
    assert flags["speculative_adaptive"] is True and flags["speculative_adaptive_config"] == "/deploy/sglang-adaptive.json"
    assert flags["cuda_graph_bs"] == ["1", "2", "4", "8"] and flags["max_running_requests"] == str(MAX)
    parsed = {k: v if v is True or k == "speculative_algorithm" or k.endswith("path") else int(v)
              for k, v in flags.items() if k in args}
    assert parsed == args and engines.sglang_problems(config, parsed) == []
    static = engines.sglang_command({"speculative_algorithm": "NGRAM", "speculative_num_steps": 2}, "t", 8)
    assert "--speculative-adaptive-config" not in static and "--cuda-graph-bs" not in static
