"""`spire bench peer` at toy sizes: it runs against transformers, compares greedy tokens (below
fp32 forgiving near-ties only), times to the end of a GPU's kernels, checks its device and dtype,
and refuses with an install hint when transformers is missing."""

import sys
from types import SimpleNamespace

import pytest
import torch

from spirelib import bench, cli
from spirelib.bench import TIE_LOGITS, peer
from spirelib.model.config import ModelConfig, vanilla_draft_config
from spirelib.model.transformer import Transformer

pytest.importorskip("transformers")

TOY = ["--vocab-size", "61", "--target-layers", "2", "--d-model", "32", "--n-kv", "2", "--d-head", "16",
       "--d-ff", "64"]


def test_peer_runs_and_reports_every_cell_and_mode(capsys):
    code = cli.main(["bench", "peer", "--cells", "1x10", "2x12", "--modes", "eager", "assisted", "--new-tokens", "4",
                     "--repeats", "1", "-k", "2", *TOY])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[:3] for r in rows] == [["1", "10", "eager"], ["1", "10", "assisted"], ["2", "12", "eager"]]
    assert all(r[-1] == "equal" for r in rows)


def test_peer_finds_tokens_that_differ(tmp_path):
    cfg = ModelConfig(vocab_size=61, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    torch.manual_seed(0)
    bench = peer.Peer(Transformer(cfg).eval(), Transformer(vanilla_draft_config(cfg)).eval(), tmp_path, k=2)
    rows = peer.rows_of(bench, 3, 9, peer.time_cell(bench, 3, 9, ["eager"], 5, 1, cfg.vocab_size), 5)
    assert rows[0]["rows_differ"] == 0
    with torch.no_grad():  # transformers' copy of the weights no longer the same: its tokens change
        bench.theirs["eager"].lm_head.weight.copy_(torch.randn_like(bench.theirs["eager"].lm_head.weight))
    rows = peer.rows_of(bench, 3, 9, peer.time_cell(bench, 3, 9, ["eager"], 5, 1, cfg.vocab_size), 5)
    assert rows[0]["rows_differ"] > 0


def test_peer_in_bf16_decodes_the_same_bf16_weights_on_both_sides(tmp_path):
    cfg = ModelConfig(vocab_size=61, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    torch.manual_seed(0)
    target = Transformer(cfg).to(torch.bfloat16).eval()
    bench = peer.Peer(target, Transformer(vanilla_draft_config(cfg)).to(torch.bfloat16).eval(), tmp_path, k=2)
    theirs = bench.theirs["eager"].lm_head.weight
    assert theirs.dtype == bench.theirs["compiled"].lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(theirs, bench.ours["eager"].unembed.weight)  # exported in bf16, loaded in bf16
    assert bench.tie == TIE_LOGITS  # below fp32 a near-tie may flip
    rows = peer.rows_of(bench, 2, 9, peer.time_cell(bench, 2, 9, ["eager"], 4, 1, cfg.vocab_size), 4)
    assert rows[0]["rows_differ"] == 0


def test_rows_that_differ_only_after_a_near_tie_are_ties_below_fp32():
    V, gap = 8, {"value": 1.0}

    def target(prefix):  # logits (1, T, V): token 3 leads token 5 by `gap` at every position
        logits = torch.zeros(1, prefix.shape[1], V)
        logits[..., 3] = gap["value"]
        return logits

    ours = peer.Times(tokens=torch.full((2, 4), 3), contexts=torch.zeros(2, 5, dtype=torch.long))
    theirs = peer.Times(tokens=ours.tokens.clone())
    theirs.tokens[1, 2:] = 5  # row 1 took the runner-up at new token 2
    bench = SimpleNamespace(ours={"eager": target}, tie=TIE_LOGITS)
    assert peer.differing_rows(bench, ours, theirs) == (1, 0)  # 1.0 apart: a real difference
    gap["value"] = TIE_LOGITS / 2
    assert peer.differing_rows(bench, ours, theirs) == (0, 1)
    assert peer.differing_rows(SimpleNamespace(ours={"eager": target}, tie=0.0), ours, theirs) == (1, 0)  # fp32


def test_timing_waits_for_the_gpus_kernels_before_each_clock_read(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))
    contexts = SimpleNamespace(device=torch.device("cuda:0"))  # stands in for a (B, L) tensor on a GPU
    side = peer.Side("ours", lambda c, g: events.append(("generate", g)) or torch.zeros(1, g))
    seconds, tokens = peer.timed(side, contexts, 3)
    assert events == [("sync", "cuda:0"), ("generate", 3), ("sync", "cuda:0")] and tokens.shape == (1, 3)
    assert seconds >= 0
    events.clear()
    peer.timed(side, SimpleNamespace(device=torch.device("cpu")), 3)
    assert events == [("generate", 3)]


def test_peer_checks_its_device_and_dtype_before_anything_runs(capsys):
    assert cli.main(["bench", "peer", "--device", "meta", "--device", "tpu", *TOY]) == 2  # the last one counts
    assert "--device tpu: not a device; use cpu, cuda or cuda:N" in capsys.readouterr().err
    assert cli.main(["bench", "peer", "--device", "meta", *TOY]) == 2
    assert "--device meta: the benchmarks run on cpu or cuda[:N]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "peer", "--dtype", "fp64", *TOY])
    assert "invalid choice: 'fp64'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["bench", "peer", "--device", "cuda", "--dtype", "bf16", *TOY]) == 2
        assert "--device cuda: no CUDA device here" in capsys.readouterr().err
    assert bench.device_problems("cpu") == []


def test_peer_without_transformers_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    assert cli.main(["bench", "peer", "--cells", "1x10", *TOY]) == 2
    err = capsys.readouterr().err
    assert "needs transformers" in err and "pip install" in err
    with pytest.raises(RuntimeError, match="pip install"):
        peer.import_transformers()


def test_peer_defaults_to_the_paper_target_in_bf16_at_two_cells_on_a_gpu_and_to_the_small_ones_on_the_cpu():
    from spirelib.bench.train import TARGETS

    args = cli.parser().parse_args(["bench", "peer", "--device", "cuda"])
    cfg = bench.model_config(peer.device_defaults(args))
    assert args.cells == [(1, 512), (64, 2048)] and args.dtype == "bf16" and cfg == TARGETS["paper"]
    args = cli.parser().parse_args(["bench", "peer"])
    cfg = bench.model_config(peer.device_defaults(args))
    assert args.cells == [(b, c) for c in peer.CONTEXTS for b in peer.BATCHES] and args.dtype == "fp32"
    assert cfg == TARGETS["workbook"]
    args = peer.device_defaults(cli.parser().parse_args(["bench", "peer", "--device", "cuda:0", "--cells", "2x8",
                                                         "--dtype", "fp32", "--d-model", "256"]))
    assert args.cells == [(2, 8)] and args.dtype == "fp32" and args.d_model == 256 and args.vocab_size == 50_304


def test_compiled_timings_follow_two_warm_ups_and_a_timing_that_recorded_is_retaken_or_flagged(monkeypatch):
    """With the compiled mode each side runs twice untimed (graphs recorded on both sides' second
    call), then `repeats` times; a timing during which one of our round graphs was recorded is
    taken again, and counted in the row if it still records."""
    from spirelib.decoding.graphs import GRAPHS

    calls = {"ours": 0, "transformers": 0}

    def side(name, records):
        def generate(contexts, new_tokens):
            calls[name] += 1
            GRAPHS.recordings += records
            return torch.zeros(contexts.shape[0], new_tokens, dtype=torch.long)
        return peer.Side(name, generate)

    monkeypatch.setattr(GRAPHS, "recordings", 0)
    fake = SimpleNamespace(device=torch.device("cpu"), sides=lambda mode: (side("ours", 0), side("transformers", 0)))
    times = peer.time_cell(fake, 1, 8, ["compiled"], 3, 2, 61)
    assert calls == {"ours": 2 * (2 + 2), "transformers": 2 * (2 + 2)}  # (warm-ups + repeats) x (whole, prefill)
    assert len(times["compiled"]["ours"].whole) == 2 and times["compiled"]["ours"].recorded == 0
    assert peer.warm_ups(["eager"]) == 1
    fake.sides = lambda mode: (side("ours", 1), side("transformers", 0))  # ours records every time
    times = peer.time_cell(fake, 1, 8, ["eager"], 3, 1, 61)
    assert times["eager"]["ours"].recorded == 2  # whole and prefill each still recording after its retakes
    assert times["eager"]["transformers"].recorded == 0
