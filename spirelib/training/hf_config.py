"""Hugging Face config.json in and out: Llama 2 / 3.x (SmolLM2), Qwen2 / 2.5 and Mistral, as our `ModelConfig`.

`config_from_hf` reads a config.json dict (`read_config`) as the architecture of method §2 "Models"
(pre-RMSNorm GQA-SwiGLU, rotary positions: Llama's) with four `ModelConfig` options: Llama 3.1's RoPE
scaling (`rope_scaling`, rope_type "llama3"), tied embeddings (`tie_embeddings`), Qwen2's q/k/v biases
(`qkv_bias`; its sliding-window fields accepted while ``use_sliding_window`` is false) and Mistral's
sliding window (`sliding_window`); `config_to_hf` writes one back, in both RoPE formats. `transformers`
is not imported. Not implemented, so refused by name before any weight is read (`REFUSED_FIELDS`):
mixture of experts, RoPE scaling other than "llama3", Llama's attention and MLP biases, logit
soft-capping, activations other than SiLU, Qwen2's sliding window when on, quantized weights, custom
modeling code, nanotron's interleaved RoPE, Qwen2-VL's M-RoPE, and any field this module does not know
to be harmless (the message names it and says what to do). Every published config.json of these
families loads as transformers 4.31 to 5.x wrote it (tests/fixtures/hf_configs, sources in SOURCES.md).
The weights are `hf_weights`', the tokenizer `hf_tokenizer`'s, a model out `hf_export`'s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from spirelib.model.config import LLAMA3_SCALING_FIELDS, ModelConfig

if TYPE_CHECKING:
    import torch  # config_to_hf names a dtype; reading a config needs no torch

CONFIG = "config.json"
ARCHITECTURE = "LlamaForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
MISTRAL = "MistralForCausalLM"
ARCHITECTURES = {"llama": ARCHITECTURE, "qwen2": QWEN2, "mistral": MISTRAL}  # model_type -> architecture

# Config fields that change nothing our forward computes: metadata, special-token ids,
# generation defaults, training-only settings (dropout, initialization). pretraining_tp > 1
# only slices the matmuls in older transformers (the same product); max_position_embeddings
# does not enter default RoPE. is_llama_config is nanotron's marker of its Llama config class
# (SmolLM2's conversion writes it; transformers reads nothing of it); _model_name_or_path
# (general.name) and unk_token_id are what transformers' GGUF import adds.
HARMLESS_FIELDS = frozenset({
    "architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
    "_model_name_or_path", "is_llama_config",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "unk_token_id",
    "use_cache", "initializer_range", "max_position_embeddings", "attention_dropout", "pretraining_tp",
    "tokenizer_class", "_attn_implementation", "_attn_implementation_autoset", "output_attentions",
    "output_hidden_states", "return_dict", "torchscript", "use_bfloat16", "id2label", "label2id",
    "problem_type", "finetuning_task", "prefix", "task_specific_params", "is_decoder", "is_encoder_decoder",
    "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size", "chunk_size_feed_forward",
    "tf_legacy_loss", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "pruned_heads",
})
# The shape and the math we implement (read by `config_from_hf`).
MODEL_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "hidden_act", "attention_bias", "mlp_bias", "tie_word_embeddings",
})
# Qwen2's sliding-window fields, harmless while use_sliding_window is false (`_check_qwen2_window`).
QWEN2_WINDOW_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
# Fields that change the math, refused unless absent, null or false; the value names what is missing.
REFUSED_FIELDS = {
    "attention_bias": "q/k/v/o biases",
    "mlp_bias": "MLP biases",
    "qkv_bias": "q/k/v biases",
    "bias": "biases",
    "rope_scaling": "RoPE scaling other than Llama 3.1's llama3 (linear, dynamic, yarn, longrope)",
    "partial_rotary_factor": "partial rotary embeddings",
    "sliding_window": "sliding-window attention",
    "use_sliding_window": "sliding-window attention",
    "max_window_layers": "sliding-window attention",
    "layer_types": "per-layer attention types",
    "num_local_experts": "mixture of experts",
    "num_experts": "mixture of experts",
    "num_experts_per_tok": "mixture of experts",
    "moe_intermediate_size": "mixture of experts",
    "n_routed_experts": "mixture of experts",
    "n_shared_experts": "mixture of experts",
    "router_aux_loss_coef": "mixture of experts",
    "decoder_sparse_step": "mixture of experts",
    "final_logit_softcapping": "logit soft-capping",
    "attn_logit_softcapping": "attention logit soft-capping",
    "query_pre_attn_scalar": "a non-default attention scale",
    "attention_multiplier": "a non-default attention scale",
    "embedding_multiplier": "embedding scaling",
    "residual_multiplier": "residual scaling",
    "logits_scaling": "logit scaling",
    "clip_qkv": "q/k/v clipping",
    "use_qk_norm": "q/k normalization",
    "qk_layernorm": "q/k normalization",
    "no_rope_layers": "layers without RoPE",
    "quantization_config": "quantized weights",
    "auto_map": "custom modeling code (the checkpoint's own classes, run with trust_remote_code)",
    "use_mrope": "multimodal RoPE (Qwen2-VL's M-RoPE)",
    # nanotron's flag for its own RoPE layout (pairs (2j, 2j+1)); transformers ignores it and always
    # rotates the pairs (j, j + dh/2), so true says the weights were trained interleaved, not how
    # the conversion left their q/k rows (nanotron's exporter ignored the flag until it was fixed).
    "rope_interleaved": "RoPE over interleaved dimension pairs, nanotron's layout",
}
# What to do about a refused field, where more can be said than that it is not implemented.
REFUSED_ADVICE = {
    "rope_interleaved": "transformers ignores this field and rotates half-split pairs; if the checkpoint's "
                        "logits in transformers are right, its q/k rows are in that order: set the field to false",
}
SUPPORTED = "what loads: Llama 2 / 3.x (SmolLM2, TinyLlama), Qwen2 / 2.5 and Mistral checkpoints"
SILU = ("silu", "swish")  # transformers' ACT2FN maps both to nn.SiLU


def _refuse(field: str, value, what: str) -> ValueError:
    advice = REFUSED_ADVICE.get(field, f"this checkpoint cannot load ({SUPPORTED})")
    return ValueError(f"config.json: {field}={value!r} ({what}) is not implemented by spirelib.training.hf_config; "
                      f"{advice}")


def _unknown(field: str, value, model_type: str) -> ValueError:
    return ValueError(f"config.json: {field}={value!r} is a field spirelib.training.hf_config does not know, so it "
                      f"cannot tell whether it changes the forward. If transformers' {model_type} model never reads it "
                      "(metadata), delete it from config.json and load again; if it does, this checkpoint is not "
                      f"supported ({SUPPORTED})")


def _rope(config: dict) -> tuple[float, tuple | None]:
    """RoPE base and scaling (None, or `config.LLAMA3_SCALING_FIELDS`) from either config format:
    `rope_theta` + `rope_scaling`, or the newer `rope_parameters` dict (both must agree);
    rope types "default" and "llama3" are implemented."""
    theta, scaling = config.get("rope_theta"), None
    for field in ("rope_scaling", "rope_parameters"):
        params = config.get(field)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise _refuse(field, params, "an unknown RoPE format")
        kind = params.get("rope_type", params.get("type", "default"))
        name = "rope_scaling" if field == "rope_scaling" else "rope_parameters.rope_type"
        shown = params if field == "rope_scaling" else kind
        if kind not in ("default", "llama3"):
            raise _refuse(name, shown, REFUSED_FIELDS["rope_scaling"])
        allowed = {"rope_type", "type", "rope_theta"} | (set(LLAMA3_SCALING_FIELDS) if kind == "llama3" else set())
        for key, value in params.items():
            if key in allowed or (key == "partial_rotary_factor" and value == 1.0):
                continue
            if field == "rope_scaling":
                raise _refuse(field, params, REFUSED_FIELDS["rope_scaling"])
            raise _refuse(f"rope_parameters.{key}", value, f"a RoPE parameter rope type {kind!r} does not have")
        theta = _same_theta(theta, params.get("rope_theta"), f"{field}.rope_theta")
        this = None
        if kind == "llama3":
            values = dict(params)
            values.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
            missing = [k for k in LLAMA3_SCALING_FIELDS if values.get(k) is None]
            if missing:
                raise ValueError(f"config.json: {field} of rope_type 'llama3' lacks {missing}")
            this = tuple(float(values[k]) for k in LLAMA3_SCALING_FIELDS)
        if field == "rope_parameters" and config.get("rope_scaling") is not None and this != scaling:
            raise ValueError(f"config.json: rope_scaling={config['rope_scaling']!r} and rope_parameters={params!r} "
                             "disagree")
        scaling = this
    return (10000.0 if theta is None else float(theta)), scaling


def _check_qwen2_window(config: dict) -> None:
    """Qwen2 configs carry sliding-window fields; they change nothing while use_sliding_window is false."""
    use = config.get("use_sliding_window", False)
    if use:
        raise _refuse("use_sliding_window", use, "sliding-window attention")
    types = config.get("layer_types")
    if types is not None and any(t != "full_attention" for t in types):
        raise _refuse("layer_types", types, "per-layer attention types")


def _same_theta(theta, other, name: str):
    if other is None:
        return theta
    if theta is not None and float(theta) != float(other):
        raise ValueError(f"config.json: rope_theta={theta!r} and {name}={other!r} disagree")
    return other


def config_from_hf(config: dict) -> ModelConfig:
    """Our `ModelConfig` for a Hugging Face Llama config.json dict; raises ValueError naming
    the field and value of anything that would change the math and is not implemented."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    if model_type is None and architectures is None:
        raise ValueError("config.json names neither model_type nor architectures; expected a Llama config")
    if model_type is not None and model_type not in ARCHITECTURES:
        raise _refuse("model_type", model_type, "a model family other than Llama, Qwen2 and Mistral")
    if architectures is not None and list(architectures) not in ([a] for a in ARCHITECTURES.values()):
        raise _refuse("architectures", architectures, f"an architecture other than {sorted(ARCHITECTURES.values())}")
    if model_type is None:
        model_type = {a: t for t, a in ARCHITECTURES.items()}[architectures[0]]
    if architectures is not None and list(architectures) != [ARCHITECTURES[model_type]]:
        raise _refuse("architectures", architectures,
                      f"an architecture other than {ARCHITECTURES[model_type]} for model_type {model_type}")
    qwen2, mistral = model_type == "qwen2", model_type == "mistral"
    if qwen2:
        _check_qwen2_window(config)
    window = config.get("sliding_window") if mistral else None  # Mistral v0.1: 4096; v0.2 and later: null
    for field, value in config.items():
        if (qwen2 and field in QWEN2_WINDOW_FIELDS) or (mistral and field == "sliding_window"):
            continue
        if field in REFUSED_FIELDS:
            if field == "rope_scaling" or value is None or value is False:
                continue
            raise _refuse(field, value, REFUSED_FIELDS[field])
        if field not in HARMLESS_FIELDS and field not in MODEL_FIELDS:
            raise _unknown(field, value, model_type)
    act = config.get("hidden_act", "silu")
    if act not in SILU:
        raise _refuse("hidden_act", act, "an MLP activation other than SiLU (SwiGLU)")
    rope_base, rope_scaling = _rope(config)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if field not in config:
            raise ValueError(f"config.json lacks {field}")
    n_q = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_q)
    if n_q % n_kv:
        raise ValueError(f"config.json: num_attention_heads={n_q} is not a multiple of num_key_value_heads={n_kv}")
    d_model = int(config["hidden_size"])
    d_head = config.get("head_dim")
    if d_head is None:
        if d_model % n_q:
            raise ValueError(f"config.json: hidden_size={d_model} is not a multiple of num_attention_heads={n_q} "
                             "and no head_dim is given")
        d_head = d_model // n_q
    return ModelConfig(vocab_size=int(config["vocab_size"]), num_layers=int(config["num_hidden_layers"]),
                       d_model=d_model, n_q_per_kv=n_q // n_kv, n_kv=n_kv, d_head=int(d_head),
                       d_ff=int(config["intermediate_size"]), rope_base=rope_base,
                       norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_scaling=rope_scaling,
                       tie_embeddings=bool(config.get("tie_word_embeddings", False)), qkv_bias=qwen2,
                       sliding_window=None if window is None else int(window))


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype, *, eos_token_id: int | None = None,
                 bos_token_id: int | None = None, max_position_embeddings: int = 4096) -> dict:
    """A Hugging Face config.json dict for `cfg`, LlamaForCausalLM (MistralForCausalLM with a
    sliding window, Qwen2ForCausalLM with q/k/v
    biases), in both RoPE formats (`rope_theta` + `rope_scaling` for transformers 4,
    `rope_parameters` for 5). Special-token ids default to None, not LlamaConfig's 1 and 2
    (which `generate` would stop at)."""
    name = str(dtype).removeprefix("torch.")
    scaling = None if cfg.rope_scaling is None else {
        "rope_type": "llama3", **dict(zip(LLAMA3_SCALING_FIELDS, cfg.rope_scaling))}
    if scaling is not None:
        scaling["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
    if cfg.qkv_bias and cfg.sliding_window is not None:
        raise ValueError("a model with both q/k/v biases and a sliding window has no Hugging Face family here")
    model_type = "qwen2" if cfg.qkv_bias else "mistral" if cfg.sliding_window is not None else "llama"
    family = {"qwen2": {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.num_layers},
              "mistral": {"sliding_window": cfg.sliding_window},
              "llama": {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}}[model_type]
    return family | {
        "architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.n_q, "num_key_value_heads": cfg.n_kv,
        "head_dim": cfg.d_head, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base, "rope_scaling": scaling,
        "rope_parameters": (scaling or {"rope_type": "default"}) | {"rope_theta": cfg.rope_base},
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": max_position_embeddings, "attention_dropout": 0.0,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": None,
        "torch_dtype": name, "dtype": name, "use_cache": True, "initializer_range": 0.02,
    }


def read_config(path: str | os.PathLike) -> dict:
    file = Path(path) / CONFIG
    if not file.is_file():
        raise ValueError(f"{path}: no {CONFIG}; expected a Hugging Face model folder")
    return json.loads(file.read_text())
