"""The EAGLE-3 draft exported in the speculators format (`training.eagle3_export`): config.json and
model.safetensors hold the fields, names and shapes speculators 0.9.0's `Eagle3DraftModel` (Llama
layer) expects, read from its released source; and (slow, in a venv with speculators 0.9.0:
SPECULATORS_PYTHON, default /tmp/specvenv/bin/python) speculators' own loader and forward give our
logits on the same target hidden states, every training-time-test step."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from spirelib.model.config import Eagle3Config, ModelConfig
from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.model.transformer import Transformer
from spirelib.training.eagle3_export import export_eagle3, hf_rope_order
from spirelib.training.hf_export import save_model

CFG = ModelConfig(vocab_size=40, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)
D2T = torch.tensor([0, 3, 4, 9, 11, 17, 20, 21, 30, 39])
SPECULATORS_PYTHON = os.environ.get("SPECULATORS_PYTHON", "/tmp/specvenv/bin/python")
HELPER = Path(__file__).resolve().parents[1] / "support" / "speculators_logits.py"


def models(draft_vocab=10):
    torch.manual_seed(0)
    target = Transformer(CFG).double()
    target.reset_parameters(0.3)
    draft = Eagle3DraftModel.from_target(target, Eagle3Config(draft_vocab=draft_vocab, k=3),
                                         D2T if draft_vocab else None).double()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name != "embed.weight":
                p.add_(0.2 * torch.randn_like(p))
    return target, draft


def speculators_shapes(d, V, Vd, n_q, n_kv, dh, d_ff, reduced):
    """The state speculators 0.9.0's Eagle3DraftModel (llama first layer: LlamaDecoderEagle3FirstLayer)
    loads, less what it ignores on save (verifier_lm_head, verifier_norm) and the rotary buffer:
    names from speculators/models/eagle3/core.py, model_definitions.py and model.py (DraftVocabMixin)."""
    p = "layers.0."
    shapes = {"embed_tokens.weight": (V, d), "fc.weight": (d, 3 * d), p + "input_layernorm.weight": (d,),
              p + "hidden_norm.weight": (d,), p + "self_attn.q_proj.weight": (n_q * dh, 2 * d),
              p + "self_attn.k_proj.weight": (n_kv * dh, 2 * d), p + "self_attn.v_proj.weight": (n_kv * dh, 2 * d),
              p + "self_attn.o_proj.weight": (d, n_q * dh), p + "post_attention_layernorm.weight": (d,),
              p + "mlp.gate_proj.weight": (d_ff, d), p + "mlp.up_proj.weight": (d_ff, d),
              p + "mlp.down_proj.weight": (d, d_ff), "norm.weight": (d,), "lm_head.weight": (Vd, d)}
    return shapes | ({"d2t": (Vd,), "t2d": (V,)} if reduced else {})


@pytest.mark.parametrize("draft_vocab", [None, 10], ids=["full-vocab", "reduced-vocab"])
def test_the_folder_has_speculators_names_shapes_and_config(tmp_path, draft_vocab):
    _, draft = models(draft_vocab)
    folder = export_eagle3(draft, tmp_path / "eagle3", verifier="org/target", verifier_architectures=["LlamaForCausalLM"])
    Vd = draft_vocab or CFG.vocab_size
    with safe_open(folder / "model.safetensors", "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    assert shapes == speculators_shapes(CFG.d_model, CFG.vocab_size, Vd, CFG.n_q, CFG.n_kv, CFG.d_head, CFG.d_ff,
                                        draft_vocab is not None)
    if draft_vocab:  # speculators' d2t holds offsets (target id = draft id + d2t), t2d a bool mask
        assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
        assert torch.equal(tensors["d2t"] + torch.arange(Vd), D2T)
        assert torch.equal(tensors["t2d"].nonzero()[:, 0], D2T)
    assert torch.equal(tensors["layers.0.self_attn.q_proj.weight"], hf_rope_order(draft.attn.wqkv.weight[:32], 4))
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == Vd
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4] and config["target_hidden_size"] == CFG.d_model
    assert config["norm_before_residual"] is False
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["vocab_size"] == CFG.vocab_size and layer["num_hidden_layers"] == 1
    assert (layer["hidden_size"], layer["head_dim"], layer["num_attention_heads"]) == (32, 8, 4)
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 3,
                                           "verifier_accept_k": 1, "accept_tolerance": 0.0}
    assert spec["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}


def test_hf_rope_order_is_the_rotate_half_permutation():
    """Our adjacent pairs (2j, 2j + 1) become Hugging Face's (j, j + d_head / 2), head by head."""
    rows = torch.arange(2 * 8)[:, None]  # 2 heads of d_head 8
    assert hf_rope_order(rows, 2)[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]


def speculators_available() -> str | None:
    """Why the slow test cannot run, or None."""
    if not Path(SPECULATORS_PYTHON).exists():
        return f"no interpreter at {SPECULATORS_PYTHON} (set SPECULATORS_PYTHON to a venv with speculators 0.9.0)"
    found = subprocess.run([SPECULATORS_PYTHON, "-c", "import speculators.models.eagle3"], capture_output=True)
    return None if found.returncode == 0 else f"speculators is not importable by {SPECULATORS_PYTHON}"


@pytest.mark.slow
@pytest.mark.parametrize("draft_vocab", [None, 10], ids=["full-vocab", "reduced-vocab"])
def test_speculators_loads_the_folder_and_computes_our_logits(tmp_path, draft_vocab):
    reason = speculators_available()
    if reason:
        pytest.skip(reason)
    target, draft = models(draft_vocab)
    verifier = save_model(target.float(), tmp_path / "target")  # speculators reads the verifier's config
    target.double()
    folder = export_eagle3(draft, tmp_path / "eagle3", verifier=str(verifier))
    T, k = 12, 3
    tokens = torch.randint(0, CFG.vocab_size, (1, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        stream = target.residual_stream(tokens, layers=draft.target_layers)  # (3, 1, T, d)
        hidden = draft.unrolled_hidden(tokens, stream, k)  # (1, k, T - 1, d)
    # speculators' pairing: entry p reads token p and the target features of p - 1, at position p
    save_file({"hidden_states": torch.cat(list(stream[:, :, :-1]), -1).contiguous(),
               "input_ids": tokens[:, 1:].contiguous(), "position_ids": torch.arange(1, T)[None].contiguous()},
              tmp_path / "inputs.safetensors")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([SPECULATORS_PYTHON, str(HELPER), str(folder), str(tmp_path / "inputs.safetensors"),
                           str(tmp_path / "out.safetensors"), str(k)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = load_file(tmp_path / "out.safetensors")
    for j in range(k):
        ours = draft.head(draft.norm(hidden[:, j, : T - 1 - j])).detach()  # entries with p + j inside the window
        # their weights load in fp32: agreement to fp32 rounding (a misplaced weight moves logits by O(1))
        torch.testing.assert_close(theirs[f"step_{j}"][:, : T - 1 - j], ours, rtol=1e-5, atol=1e-5, msg=f"step {j}")
