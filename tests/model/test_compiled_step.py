"""`model.compiled`: the compiled step a draft model shares (`CompiledStep`), its plumbing apart
from inductor (tests/decoding/test_compiled.py decodes through real compiled graphs)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from spirelib.model import compiled
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.spire import SpireDraftModel


class Doubler(compiled.CompiledStep, nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def _step(self, x):
        return self.scale * x


def test_a_compiled_step_runs_through_its_graph_and_a_copy_leaves_it_behind(monkeypatch):
    calls = []

    def fake_compile(fn, device):
        calls.append(device)
        return lambda *args: fn(*args) + 1  # a "graph" that shows it ran

    monkeypatch.setattr(compiled, "compile_for_decoding", fake_compile)
    model = Doubler()
    x = torch.ones(3)
    assert not model.compiled_decoding and torch.equal(model.run_step(x), 2 * x)  # eager: the reference
    model.compile_step(True, torch.device("cpu"))
    assert model.compiled_decoding and calls == [torch.device("cpu")] and torch.equal(model.run_step(x), 2 * x + 1)
    twin = copy.deepcopy(model)  # a copy compiles its own (drafts.in_dtype)
    assert not twin.compiled_decoding and torch.equal(twin.run_step(x), 2 * x)
    model.compile_step(False, torch.device("cpu"))
    assert not model.compiled_decoding and torch.equal(model.run_step(x), 2 * x)


def test_both_compiled_drafts_share_it():
    assert issubclass(SpireDraftModel, compiled.CompiledStep) and issubclass(Eagle3DraftModel, compiled.CompiledStep)
    assert "_compiled_step" not in vars(SpireDraftModel) and "_compiled_step" not in vars(Eagle3DraftModel)
