"""A target trained in the run decodes on a GPU in bf16 (`pipeline.for_decoding`), as an imported
checkpoint does in its stored dtype; on the CPU it stays fp32. A fake CUDA tensor stands in for the GPU."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from spirelib.training import pipeline


class _Model:
    """A trained model's parameters (a fake CUDA tensor stands for the GPU's) and the dtype it is cast to."""

    def __init__(self, param: torch.Tensor):
        self.param, self.cast_to = param, None

    def parameters(self):
        yield self.param

    def to(self, dtype):
        self.cast_to = dtype
        return self


def test_a_trained_target_decodes_in_bf16_on_a_gpu_and_fp32_on_the_cpu():
    with FakeTensorMode():
        on_gpu = pipeline.for_decoding(SimpleNamespace(model=_Model(torch.empty(4, 4, device="cuda"))))
    assert on_gpu.model.cast_to == torch.bfloat16
    on_cpu = pipeline.for_decoding(SimpleNamespace(model=_Model(torch.empty(4, 4))))
    assert on_cpu.model.cast_to is None
    model = nn.Linear(2, 2)  # a real module on the CPU keeps its fp32 weights
    assert pipeline.for_decoding(SimpleNamespace(model=model)).model.weight.dtype == torch.float32


def test_the_series_target_goes_through_for_decoding(monkeypatch):
    from spirelib.training.series import Series

    seen = []
    monkeypatch.setattr(pipeline, "train_language_model", lambda *a, **kw: "trained")
    monkeypatch.setattr(pipeline, "for_decoding", lambda t: seen.append(t) or "cast")
    series = Series()
    monkeypatch.setattr(Series, "data", lambda self: None)
    assert series.trained_target(progress=False) == "cast" and seen == ["trained"]
