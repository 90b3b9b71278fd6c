"""A trained EAGLE-3 draft out in the speculators format (speculators 0.9.0's `Eagle3DraftModel`,
what vLLM and SGLang load as an EAGLE-3 speculator): a folder with config.json and model.safetensors.

config.json: `speculators_model_type` "eagle3", the draft layer's shape as a Llama config dict
(`transformer_layer_config`, its vocab_size the target's), `draft_vocab_size`, `target_hidden_size`,
the target's residual-stream entries it fuses (`eagle_aux_hidden_state_layer_ids`: entry i is the
input of block i, as vLLM collects them), `norm_before_residual` false (the residual is the raw
hidden state, as here), and `speculators_config` (algorithm, a greedy proposal of k tokens, the
verifier's name or path and architectures).

model.safetensors, speculators' names: embed_tokens, fc, layers.0.{input_layernorm, hidden_norm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm, lm_head, and with
a reduced vocabulary d2t (the offsets target id - draft id, as speculators stores them) and t2d (a
bool mask over the target's vocabulary). Q and K rows go from our interleaved RoPE order to Hugging
Face's rotate-half order within each head (`hf_rope_order`); the attention input's columns are
[embedding ; hidden] in both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from spirelib.model.eagle3 import Eagle3DraftModel
from spirelib.training.hf_config import config_to_hf

SPECULATORS_VERSION = "0.9.0"  # the release whose format this writes (and whose loader the slow test runs)


def hf_rope_order(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Q or K projection rows (n_heads d_head, ...) from our per-head order (2j, 2j + 1: adjacent pairs
    rotate together) to Hugging Face's (j, j + d_head / 2): their row h d_head + s d_head / 2 + j is our
    row h d_head + 2j + s."""
    rows, rest = w.shape[0], w.shape[1:]
    return w.view(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def speculators_state_dict(model: Eagle3DraftModel) -> dict[str, torch.Tensor]:
    """The draft's tensors under speculators' Eagle3DraftModel names (contiguous CPU copies)."""
    c = model.layer_cfg
    q_dim, kv_dim = c.n_q * c.d_head, c.n_kv * c.d_head
    q, k, v = model.attn.wqkv.weight.detach().split([q_dim, kv_dim, kv_dim])  # (n_q dh, 2 d), (n_kv dh, 2 d) x 2
    gate, up = model.mlp.w_gate_up.weight.detach().chunk(2)  # (d_ff, d) each
    p = "layers.0."
    out = {
        "embed_tokens.weight": model.embed.weight, "fc.weight": model.fc.weight,
        p + "input_layernorm.weight": model.input_norm.weight, p + "hidden_norm.weight": model.hidden_norm.weight,
        p + "self_attn.q_proj.weight": hf_rope_order(q, c.n_q), p + "self_attn.k_proj.weight": hf_rope_order(k, c.n_kv),
        p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": model.attn.wo.weight,
        p + "post_attention_layernorm.weight": model.mlp_norm.weight,
        p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": model.mlp.w_down.weight,
        "norm.weight": model.norm.weight, "lm_head.weight": model.head.weight,
    }
    out = {name: t.detach() for name, t in out.items()}
    if model.reduced:
        V = model.target_cfg.vocab_size
        out["d2t"] = model.d2t - torch.arange(model.draft_vocab, device=model.d2t.device)
        out["t2d"] = torch.zeros(V, dtype=torch.bool, device=model.d2t.device).index_fill(0, model.d2t, True)
    return {name: t.to("cpu").clone(memory_format=torch.contiguous_format) for name, t in out.items()}


def speculators_config(model: Eagle3DraftModel, *, verifier: str | None, verifier_architectures: list[str],
                       k: int | None = None, dtype: torch.dtype = torch.float32) -> dict:
    """config.json of the exported draft (the module docstring); `verifier`: the target's Hugging Face
    id or path (None: the loader fetches nothing), `k`: the proposal's speculative tokens (default its
    training steps)."""
    layer = config_to_hf(model.layer_cfg, dtype)  # a Llama config of one layer, the target's width and vocabulary
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION, "transformer_layer_config": layer,
        "draft_vocab_size": model.draft_vocab, "norm_before_residual": False,
        "target_hidden_size": model.target_cfg.d_model,
        "eagle_aux_hidden_state_layer_ids": list(model.target_layers),
        "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k or model.cfg.k,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "torch_dtype": str(dtype).removeprefix("torch."), "dtype": str(dtype).removeprefix("torch."),
    }


def export_eagle3(model: Eagle3DraftModel, path: str | os.PathLike, *, verifier: str | None = None,
                  verifier_architectures: list[str] | None = None, k: int | None = None,
                  dtype: torch.dtype | None = None) -> Path:
    """Write `model` to the folder `path` in the speculators format (config.json, model.safetensors),
    in `dtype` (default its own; d2t and t2d keep theirs). `verifier`: the target's Hugging Face id or
    path, as the serving engine should find it. Returns the folder."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.fc.weight.dtype
    tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in speculators_state_dict(model).items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = speculators_config(model, verifier=verifier, verifier_architectures=verifier_architectures
                                or ["LlamaForCausalLM"], k=k, dtype=dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
