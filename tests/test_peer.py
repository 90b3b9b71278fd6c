"""`spire bench peer` at toy sizes: it runs against transformers, compares greedy tokens, and
refuses with an install hint when transformers is missing."""

import sys

import pytest
import torch

from spirelib import cli
from spirelib.bench import peer
from spirelib.engine.drafts import vanilla_draft_config
from spirelib.engine.transformer import ModelConfig, Transformer

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
    rows = peer.rows_of(3, 9, peer.time_cell(bench, 3, 9, ["eager"], 5, 1, cfg.vocab_size), 5)
    assert rows[0]["rows_differ"] == 0
    with torch.no_grad():  # transformers' copy of the weights no longer the same: its tokens change
        bench.theirs["eager"].lm_head.weight.copy_(torch.randn_like(bench.theirs["eager"].lm_head.weight))
    rows = peer.rows_of(3, 9, peer.time_cell(bench, 3, 9, ["eager"], 5, 1, cfg.vocab_size), 5)
    assert rows[0]["rows_differ"] > 0


def test_peer_without_transformers_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    assert cli.main(["bench", "peer", "--cells", "1x10", *TOY]) == 2
    err = capsys.readouterr().err
    assert "needs transformers" in err and "pip install" in err
    with pytest.raises(RuntimeError, match="pip install"):
        peer.import_transformers()
