"""Where training runs (`training.devices`): torch's deterministic algorithms on while a CPU trains
(every step of `train` runs under them) and as they were afterwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.training.config import TrainConfig
from spirelib.training.corpus import FlatDocs
from spirelib.training.devices import deterministic_on_cpu
from spirelib.training.objectives import lm_objective
from spirelib.training.train import Session, TrainingRun, train


def test_deterministic_algorithms_are_on_while_a_cpu_trains_and_as_they_were_afterwards():
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_on_cpu(torch.device("cpu")):
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError, match="inside"), deterministic_on_cpu(torch.device("cpu")):
        raise RuntimeError("inside")
    assert not torch.are_deterministic_algorithms_enabled()  # restored on an error too
    with deterministic_on_cpu(torch.device("cuda")):  # a GPU trains as before (no CUDA needed to say so)
        assert not torch.are_deterministic_algorithms_enabled()


def test_a_cpu_training_step_runs_under_deterministic_algorithms_and_leaves_them_as_they_were(tmp_path):
    """Every step of `train` on the CPU runs with them on (what makes a compiled step bit-reproducible
    there: three compiled 60-step runs of the default target from one seed ended with one set of weights
    under them and with three different sets without them), and the process has them as before."""
    cfg = ModelConfig(vocab_size=64, num_layers=1, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 2_000)
    seen = []

    def objective(model, batch):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return lm_objective(model, batch)

    train(Transformer(cfg), objective, FlatDocs(tokens, np.array([0]), np.array([len(tokens)])),
          TrainConfig(batch_size=2, seq_len=32, steps=2, eval_every=0, log_every=1), run=TrainingRun(tmp_path, {}),
          session=Session(progress=False))
    assert seen == [True, True] and not torch.are_deterministic_algorithms_enabled()
