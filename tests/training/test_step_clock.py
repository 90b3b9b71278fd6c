"""The trainer's throughput clock reads the time only once the device has finished the steps.

A GPU runs a step's kernels after `opt.step()` has returned; a clock read then stops early and
overstates tokens/s (and MFU). `metrics._drain` (torch.cuda.synchronize on a GPU) is monkeypatched
here into a device that finishes `LAG` seconds after the host has queued the work: every figure
must include that wait, and the drain must come only where the host waits anyway.
"""

from __future__ import annotations

import numpy as np
import torch

from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.training import metrics
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.objectives import lm_objective
from spirelib.training.train import Session, TrainingRun, train

LAG = 0.25  # seconds the simulated device still needs when the host asks it to drain


def test_tokens_per_s_waits_for_the_device_and_drains_only_at_log_lines(tmp_path, monkeypatch):
    drains = []

    def lagging_drain(device):
        drains.append(device)
        import time

        time.sleep(LAG)

    monkeypatch.setattr(metrics, "_drain", lagging_drain)
    cfg = TrainConfig(batch_size=2, seq_len=8, steps=5, lr=1e-3, log_every=2, checkpoint_every=100)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=16, num_layers=1, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32))
    docs = FlatDocs(np.arange(400) % 16, np.array([0]), np.array([400]))
    result = train(model, lm_objective, docs, cfg, run=TrainingRun(tmp_path / "run", {"m": 1}),
                   session=Session("cpu", progress=False))
    # the first step (kept apart), then the log lines at steps 2, 4 and 5: one drain each, none per step
    assert len(drains) == 4
    tokens = cfg.tokens_per_step()
    # timed steps 2-5 (4 steps) waited for the device at 3 drains
    assert result.summary["tokens_per_s"] <= 4 * tokens / (3 * LAG)
    assert result.summary["first_step_s"] >= LAG
    for entry in (e for e in result.metrics if e["kind"] == "train"):  # each interval waited once
        steps = 1 if entry["step"] == 5 else 2
        assert entry["tokens_per_s"] <= steps * tokens / LAG
