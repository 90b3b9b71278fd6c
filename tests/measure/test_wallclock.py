"""How `wallclock.time_cells` shares the machine: between methods, interleaved round by round (each
method on its own copy of the prefill) or run by run on the shared prefill; between cells, run
by run."""

import contextlib
import json

import pytest
import torch

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.graphs import GRAPHS
from spirelib.decoding.prefill import prefill, speculative_capacity
from spirelib.decoding.sections import SectionTimer
from spirelib.decoding.speculative import Options, finish, speculative_rounds
from spirelib.measure.stopping import SpeedupRule, ratio_interval
from spirelib.measure.tau import DecodingProtocol
from spirelib.measure.wallclock import _lockstep, speedup_interval, time_cells, time_decoding
from spirelib.model.config import ModelConfig, SpireConfig, vanilla_draft_config
from spirelib.model.spire import SpireDraftModel
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget

CFG = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = Transformer(CFG).eval()
    vanilla = Transformer(vanilla_draft_config(CFG)).eval()
    spire = SpireDraftModel.from_target(target, SpireConfig(num_layers=1, window=8, k=3)).eval()
    factories = {"vanilla": draft_factory("vanilla", target, vanilla, temperature=1.0),
                 "magicdec": draft_factory("magicdec", target, temperature=1.0, budget=KVBudget(1, 8)),
                 "spire": draft_factory("spire", target, spire, temperature=1.0)}
    return target, factories


def test_interleaved_rounds_decode_what_whole_runs_decode(models):
    """Each method's rounds (and so its tau) are the same whether the methods run round by round
    on copies of the prefill or one after another on the shared one: the copies are independent
    and the interleaving changes only when a round runs, not what it computes."""
    target, factories = models

    def contexts(run):
        return torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(run))

    by_mode = {mode: time_decoding(target, factories, contexts, DecodingProtocol(k=3, new_tokens=12),
                                   SpeedupRule(3, 3), interleave=mode)
               for mode in ("rounds", "runs")}
    for rounds, runs in zip(*by_mode.values()):
        assert (rounds.method, rounds.taus, rounds.rounds) == (runs.method, runs.taus, runs.rounds)
        assert len(rounds.seconds) == 3 and all(s > 0 for s in rounds.seconds)
    assert len({tuple(t.taus) for t in by_mode["rounds"][1:]}) > 1  # the drafts differ: a real check


def test_a_prefill_copy_is_independent_of_its_source(models):
    """Decoding from a `Prefill.copy` writes its own cache: the source's entries are untouched."""
    target, factories = models
    contexts = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    shared = prefill(target, contexts, capacity=speculative_capacity(20, 10, 3), layers=(0, 1, 2))
    before = [t.clone() for t in shared.cache.k]
    copy = shared.copy()
    gen = torch.Generator().manual_seed(0)
    finish(speculative_rounds(target, factories["spire"](), contexts, 10, 3, Options(generator=gen, prefilled=copy)))
    assert all(torch.equal(a, b) for a, b in zip(before, shared.cache.k))
    assert not all(torch.equal(a, b) for a, b in zip(before, copy.cache.k))


def test_lockstep_advances_the_method_with_the_least_time_so_far():
    """`_lockstep` runs the next round of whichever method has taken the least decode time, so
    methods with slow rounds and methods with fast ones progress through the same wall time."""
    order = []

    def method(name, cost, rounds, timer):
        for _ in range(rounds):
            order.append(name)
            timer.seconds["verify"] = timer.seconds.get("verify", 0.0) + cost
            yield
        return name.upper()

    sections = {"ad": SectionTimer(), "sd": SectionTimer()}
    outs = _lockstep({"ad": method("ad", 1.0, 6, sections["ad"]), "sd": method("sd", 2.5, 2, sections["sd"])}, sections)
    assert outs == {"ad": "AD", "sd": "SD"}
    # ad 0 | sd 0 -> ad 1, 2 (ad at 3 > sd's 2.5) -> sd (5) -> ad 3, 4, 5 (ad at 6)
    assert order == ["ad", "sd", "ad", "ad", "sd", "ad", "ad", "ad"]


def test_time_decoding_refuses_what_it_cannot_interleave(models):
    target, factories = models
    contexts = torch.randint(0, 64, (1, 16))
    with pytest.raises(ValueError, match="'rounds' or 'runs'"):
        time_decoding(target, factories, contexts, DecodingProtocol(new_tokens=4), SpeedupRule(3, 3),
                      interleave="methods")


def test_a_run_during_which_a_round_graph_was_recorded_is_taken_again(models, monkeypatch):
    """A timed run whose rounds recorded a CUDA graph (a sync and a capture inside the timing) is
    not kept: the cell runs again, and says how often; one that records every time is refused."""
    target, factories = models
    contexts = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    recorded = iter([0, 1, 0, 0])  # the warm-up, then a kept run that recorded, then two clean ones

    @contextlib.contextmanager
    def watch():
        yield [next(recorded, 0)]
    monkeypatch.setattr(GRAPHS, "watch", watch)
    timings = time_decoding(target, {"spire": factories["spire"]}, contexts, DecodingProtocol(k=3, new_tokens=4),
                            SpeedupRule(2, 2))
    assert all(len(t.seconds) == 2 and t.retaken == 1 for t in timings), [(t.method, t.retaken) for t in timings]

    @contextlib.contextmanager
    def always():
        yield [1]
    monkeypatch.setattr(GRAPHS, "watch", always)
    with pytest.raises(RuntimeError, match="recorded in 3 timed runs"):
        time_decoding(target, {"spire": factories["spire"]}, contexts, DecodingProtocol(k=3, new_tokens=4),
                            SpeedupRule(2, 2))


def test_cells_take_turns_run_by_run(models, tmp_path, monkeypatch):
    """Every pass runs each unfinished cell once (its run 0 a warm-up), so a slow minute of the
    machine falls on every cell alike; the timings come back cell by cell. The runner's terminal is
    told how many cells are done of all, and each cell's run of its most."""
    from spirelib import frontend

    monkeypatch.setenv(frontend.PROGRESS_ENV, str(tmp_path / "progress.jsonl"))
    target, factories = models
    seen = []

    def cell(B, L):
        def contexts(run):
            seen.append((B, L, run))
            return torch.randint(0, 64, (B, L), generator=torch.Generator().manual_seed(run))
        return contexts

    timings = time_cells(target, {"vanilla": factories["vanilla"]}, [cell(1, 16), cell(2, 24)],
                         DecodingProtocol(k=3, new_tokens=6), SpeedupRule.from_repeats(1, 3, 0.0))
    assert seen == [(1, 16, 0), (2, 24, 0), (1, 16, 1), (2, 24, 1), (1, 16, 2), (2, 24, 2), (1, 16, 3), (2, 24, 3)]
    assert [(t.method, t.batch, t.context, len(t.seconds)) for t in timings] == [
        ("ad", 1, 16, 3), ("vanilla", 1, 16, 3), ("ad", 2, 24, 3), ("vanilla", 2, 24, 3)]
    fed = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(r["n"], r["total"], r["unit"]) for r in fed] == [(0, 2, "cell")] * 6 + [(1, 2, "cell"), (2, 2, "cell")]
    assert [r["postfix"] for r in fed[-2:]] == ["(B, L) = (1, 16), run 3 of 3", "(B, L) = (2, 24), run 3 of 3"]


def test_a_cell_stops_at_its_first_look_once_every_speedup_is_resolved(models):
    """`stopping.SpeedupRule` in `time_cells`: a cell whose every speedup is resolved after
    `repeats` runs (here: any finite interval is narrow enough) stops there, short of `max_repeats`;
    one that is not (no interval is narrow enough, none can exclude 1 from one run) runs to its
    second look. Both designs have two looks, so both report their intervals at 97.5% a look."""
    target, factories = models
    contexts = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    resolved = time_decoding(target, {"vanilla": factories["vanilla"]}, contexts, DecodingProtocol(k=3, new_tokens=4),
                             SpeedupRule.from_repeats(2, 6, 1e9))
    assert [len(t.seconds) for t in resolved] == [2, 2]
    open_ = time_decoding(target, {"vanilla": factories["vanilla"]}, contexts, DecodingProtocol(k=3, new_tokens=4),
                          SpeedupRule.from_repeats(1, 3, 1e9))
    assert [len(t.seconds) for t in open_] == [3, 3]
    assert {t.level for t in resolved + open_} == {0.975}
    assert speedup_interval(resolved[1], resolved[0]) == ratio_interval(
        [s / a for s, a in zip(resolved[1].tokens_per_s, resolved[0].tokens_per_s)], 0.975)
