"""Bring your own target: Hugging Face Llama, Qwen2 and Mistral checkpoints in, our models out.

`load_model(folder)` builds a `model.Transformer` from a Hugging Face Llama 2 / 3.0 / 3.1 /
3.2 (and SmolLM2), Qwen2 / Qwen2.5 or Mistral folder (``config.json`` plus ``model.safetensors`` or a sharded
``model.safetensors.index.json``), `load_tokenizer(folder)` wraps its ``tokenizer.json``
with the interface of `spirelib.training.tokenizer`'s tokenizers, and `save_model(model, folder)`
writes a folder that ``transformers.LlamaForCausalLM.from_pretrained`` (``Qwen2ForCausalLM``
for a model with q/k/v biases, ``MistralForCausalLM`` for one with a sliding window) loads and that computes our logits. The architecture is the
one of method §2 "Models" (pre-RMSNorm GQA-SwiGLU, rotary positions), which is Llama's, with
four `ModelConfig` options: Llama 3.1's RoPE scaling (`rope_scaling`, rope_type "llama3",
`rope.rope_frequencies`), tied embedding and unembedding (`tie_embeddings`, from
``tie_word_embeddings``; the checkpoint then has no lm_head.weight, or one equal to the
embedding) and Qwen2's q/k/v biases (`qkv_bias`, set by model_type "qwen2", whose
sliding-window fields are accepted while ``use_sliding_window`` is false) and Mistral's sliding
window (`sliding_window`, model_type "mistral": each query sees the last W positions, itself
included, in every forward and the target's own cache); `transformers` itself is not
imported: config.json is read with `json`, the weights with `safetensors`. Pickle
checkpoints are never unpickled.

Layout mapping (Hugging Face name (shape) -> ours), n_q query heads, n_kv key/value heads
of dh dimensions each, d = hidden size, f = intermediate size, V = vocabulary:

    model.embed_tokens.weight                  (V, d)        -> embed.weight
    model.layers.{i}.input_layernorm.weight    (d,)          -> blocks.{i}.attn_norm.weight
    model.layers.{i}.self_attn.q_proj.weight   (n_q dh, d)   -+ rows permuted per head (RoPE),
    model.layers.{i}.self_attn.k_proj.weight   (n_kv dh, d)  -+ then q, k, v rows concatenated
    model.layers.{i}.self_attn.v_proj.weight   (n_kv dh, d)  -+ -> blocks.{i}.attn.wqkv.weight ((n_q + 2 n_kv) dh, d)
    model.layers.{i}.self_attn.o_proj.weight   (d, n_q dh)   -> blocks.{i}.attn.wo.weight
    model.layers.{i}.post_attention_layernorm.weight (d,)    -> blocks.{i}.mlp_norm.weight
    model.layers.{i}.mlp.gate_proj.weight      (f, d)        -+ gate rows, then up rows
    model.layers.{i}.mlp.up_proj.weight        (f, d)        -+ -> blocks.{i}.mlp.w_gate_up.weight (2f, d)
    model.layers.{i}.mlp.down_proj.weight      (d, f)        -> blocks.{i}.mlp.w_down.weight
    model.norm.weight                          (d,)          -> norm.weight
    lm_head.weight                             (V, d)        -> unembed.weight (absent when tied)
    Qwen2: model.layers.{i}.self_attn.{q,k,v}_proj.bias      -> blocks.{i}.attn.wqkv.bias, q and k
                                                                biases permuted as their weight rows

RoPE order. `spirelib.model.rope` treats head dimensions (2j, 2j+1) as one complex number and
rotates it by position x base^(-2j/dh); Hugging Face Llama ("rotate_half") rotates the pair
(j, j + dh/2) by the same angle. Same rotations, different order of the dimensions within
a head: our dimension 2j + s (s = 0, 1) is Hugging Face's dimension j + s dh/2. q.k is a
sum over dimensions, so permuting the rows of W_q and W_k the same way within every head
leaves attention unchanged; v and o keep their order. `_from_hf_rope_order` is the inverse
of the permutation in transformers' ``convert_llama_weights_to_hf.py`` (which goes from
Meta's interleaved order, ours, to Hugging Face's), `_to_hf_rope_order` is that permutation.

Not implemented, so refused by name before any weight is read (`REFUSED_FIELDS`): mixture
of experts, RoPE scaling other than "llama3" (linear, dynamic, yarn, longrope), Llama's
attention_bias (o_proj bias too) and MLP biases, logit soft-capping, activations other than
SiLU, sliding windows (Mistral's, Qwen2's when on), quantized weights, custom modeling code,
nanotron's interleaved RoPE and Qwen2-VL's multimodal RoPE when on, and any config field this
module does not know to be harmless (the message names it and says what to do). Every
published config.json of the families above loads as transformers 4.31 to 5.x wrote it
(tests/fixtures/hf_configs holds real ones, their sources in SOURCES.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from spirelib.model.rope import LLAMA3_SCALING_FIELDS, rope_frequencies
from spirelib.model.transformer import ModelConfig, Transformer

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
ARCHITECTURE = "LlamaForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
MISTRAL = "MistralForCausalLM"
ARCHITECTURES = {"llama": ARCHITECTURE, "qwen2": QWEN2, "mistral": MISTRAL}  # model_type -> architecture
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
GB = 1e9

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

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
}


# ---------------------------------------------------------------- config


def _refuse(field: str, value, what: str) -> ValueError:
    advice = REFUSED_ADVICE.get(field, f"this checkpoint cannot load ({SUPPORTED})")
    return ValueError(f"config.json: {field}={value!r} ({what}) is not implemented by spirelib.training.hf; "
                      f"{advice}")


def _unknown(field: str, value, model_type: str) -> ValueError:
    return ValueError(f"config.json: {field}={value!r} is a field spirelib.training.hf does not know, so it cannot "
                      f"tell whether it changes the forward. If transformers' {model_type} model never reads it "
                      "(metadata), delete it from config.json and load again; if it does, this checkpoint is not "
                      f"supported ({SUPPORTED})")


def _rope(config: dict) -> tuple[float, tuple | None]:
    """RoPE base and scaling (None, or `rope.LLAMA3_SCALING_FIELDS`) from either config format:
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


# ---------------------------------------------------------------- layout


def _from_hf_rope_order(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q or k projection rows (n_heads dh, d) from Hugging Face's per-head order (j, j + dh/2)
    to ours (2j, 2j + 1): our row h dh + 2j + s is their row h dh + s dh/2 + j."""
    rows, rest = w.shape[0], w.shape[1:]  # a bias (rows,) moves as its weight's rows do
    return w.view(n_heads, 2, rows // n_heads // 2, *rest).transpose(1, 2).reshape(rows, *rest)


def _to_hf_rope_order(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `_from_hf_rope_order` (transformers' `permute` in convert_llama_weights_to_hf.py)."""
    rows, rest = w.shape[0], w.shape[1:]
    return w.view(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama (Qwen2) checkpoint of shape `cfg` holds, with its shape; a tied
    one holds no lm_head.weight (`_check_tensors` accepts one equal to the embedding)."""
    d, f, V, h = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.d_head
    shapes = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (V, d)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (cfg.n_q * h, d), p + "self_attn.k_proj.weight": (cfg.n_kv * h, d),
            p + "self_attn.v_proj.weight": (cfg.n_kv * h, d), p + "self_attn.o_proj.weight": (d, cfg.n_q * h),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        }
        if cfg.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (cfg.n_q * h,), p + "self_attn.k_proj.bias": (cfg.n_kv * h,),
                       p + "self_attn.v_proj.bias": (cfg.n_kv * h,)}
    return shapes


def _is_inv_freq(name: str) -> bool:
    """RoPE frequencies that old transformers versions saved as a buffer: derived, not weights."""
    return name.startswith("model.layers.") and name.endswith(".self_attn.rotary_emb.inv_freq")


# ---------------------------------------------------------------- memory


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a model on `device`: MemAvailable of /proc/meminfo on CPU, free memory
    of the GPU on CUDA, None where unknown (no check then)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def check_memory(n_params: int, dtype: torch.dtype, device: torch.device | str, available: int | None, *,
                 world: int = 1, largest: int = 0) -> None:
    """Refuse (MemoryError, with the numbers and a hint) when a model of `n_params` parameters
    in `dtype` needs more than `available` bytes on `device` (None: unknown, no check).
    Counts the weights only: the KV cache and activations of decoding come on top. Sharded over
    `world` ranks (`load_model_sharded`, parallel: fsdp) a rank holds its 1/world share plus two
    whole tensors of `largest` parameters (one being converted, one gathered); a refusal names the
    fewest ranks that would fit."""
    size = torch.empty((), dtype=dtype).element_size()
    extra = 2 * largest if world > 1 else 0
    need = (-(-n_params // world) + extra) * size
    if available is None or need <= available:
        return
    name = str(dtype).removeprefix("torch.")
    smaller = " load it in bfloat16 (dtype=torch.bfloat16)," if size > 2 else ""
    room = available // size - 2 * largest  # parameters a rank can hold besides the whole tensors
    fewest = -(-n_params // room) if room > 0 else None
    shard = (f" shard it with parallel: fsdp over at least {fewest} ranks (torchrun --nproc_per_node {fewest}),"
             if fewest and fewest > world else "")
    per = f" per rank (of {world})" if world > 1 else ""
    raise MemoryError(f"the model ({_count(n_params)} parameters) in {name} needs {need / GB:.1f} GB{per}; "
                      f"{device} has {available / GB:.1f} GB available:{smaller}{shard} use a device with more "
                      f"memory, or free some")


# ---------------------------------------------------------------- loading


def _refuse_pickles(folder: Path) -> None:
    found = sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)})
    detail = f" only pickle checkpoints ({', '.join(found)}), which spirelib never unpickles" if found else " none"
    raise ValueError(f"{folder}: no {SINGLE} or {INDEX};{detail}. Convert to safetensors first, where you "
                     "trust the files: transformers' AutoModelForCausalLM.from_pretrained(folder)"
                     ".save_pretrained(out, safe_serialization=True)")


def _shard_headers(folder: Path) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """Name -> (file, safetensors dtype, shape) of every tensor, from the file headers only."""
    from safetensors import safe_open

    single, index = folder / SINGLE, folder / INDEX
    if single.is_file() and index.is_file():
        raise ValueError(f"{folder}: both {SINGLE} and {INDEX}; keep one")
    if single.is_file():
        shards, weight_map = [single], None
    elif index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if Path(n).name != n or not n.endswith(".safetensors")]
        if bad:
            raise ValueError(f"{index}: shard names {bad} are not .safetensors files in {folder}")
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(f"{index}: missing shard(s) {missing} in {folder}")
        shards = [folder / n for n in names]
    else:
        _refuse_pickles(folder)
    headers = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                if name in headers:
                    raise ValueError(f"{folder}: tensor {name} is in both {headers[name][0].name} and {shard.name}")
                s = f.get_slice(name)
                headers[name] = (shard, s.get_dtype(), tuple(s.get_shape()))
    if weight_map is not None:
        wrong = sorted(n for n, file in weight_map.items() if n not in headers or headers[n][0].name != file)
        if wrong:
            raise ValueError(f"{index}: tensors {_some(wrong)} are not in the shards the index names")
        unlisted = sorted(set(headers) - set(weight_map))
        if unlisted:
            raise ValueError(f"{folder}: tensors {_some(unlisted)} are in shards but not in {INDEX}")
    return headers


def _some(names: list[str], n: int = 5) -> str:
    return f"{names[:n]}" + (f" and {len(names) - n} more" if len(names) > n else "")


def _check_tensors(headers: dict, cfg: ModelConfig) -> None:
    expected = hf_shapes(cfg)
    if cfg.tie_embeddings and "lm_head.weight" in headers:  # some tied checkpoints store it anyway
        expected["lm_head.weight"] = (cfg.vocab_size, cfg.d_model)
    unknown = sorted(n for n in headers if n not in expected and not _is_inv_freq(n))
    if unknown:
        biases = [n for n in unknown if n.endswith(".bias")]
        what = (" (biases are implemented only as Qwen2's q/k/v biases, model_type qwen2)" if biases else "")
        raise ValueError(f"checkpoint holds tensors this Llama config does not have{what}: {_some(unknown)}")
    missing = sorted(n for n in expected if n not in headers)
    if missing:
        raise ValueError(f"checkpoint lacks tensors: {_some(missing)}")
    for name, shape in expected.items():
        if headers[name][2] != shape:
            raise ValueError(f"tensor {name} has shape {list(headers[name][2])}; config.json implies {list(shape)}")
    for name, (_, dt, _) in headers.items():
        if dt not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name} is stored as {dt}; only floating-point weights load "
                             f"({', '.join(_SAFETENSORS_DTYPES)}), not quantized ones")


def _check_inv_freq(headers: dict, cfg: ModelConfig) -> None:
    """Saved RoPE frequencies must be the ones config.json implies (a scaled RoPE would not be)."""
    from safetensors import safe_open

    want = rope_frequencies(cfg.d_head, cfg.rope_base, cfg.rope_scaling).double()
    for name, (file, _, shape) in headers.items():
        if _is_inv_freq(name):
            with safe_open(str(file), framework="pt") as f:
                got = f.get_tensor(name).double()
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=0):
                raise ValueError(f"tensor {name} holds RoPE frequencies that rope_theta={cfg.rope_base} and "
                                 f"rope_scaling={cfg.rope_scaling} do not give")


def _resolve_dtype(headers: dict, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        return dtype
    stored = sorted({dt for n, (_, dt, _) in headers.items() if not _is_inv_freq(n)})
    if len(stored) > 1:
        raise ValueError(f"the checkpoint mixes dtypes {stored}: pass dtype= to choose one")
    return _SAFETENSORS_DTYPES[stored[0]]


def load_model(path: str | os.PathLike, *, device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> Transformer:
    """A `Transformer` with the weights of the Hugging Face Llama folder `path`.

    Everything that can be checked is checked before any weight is read: config.json
    (`config_from_hf` refuses what is not implemented), the safetensors headers (missing,
    unknown or misshapen tensors, missing shards), and the memory the model needs in `dtype`
    on `device` (`check_memory`). The model is built on the meta device and the weights
    assigned in the stored dtype (or `dtype`), tensor by tensor, so no copy of the model in
    another dtype ever exists. Any error leaves nothing behind: the model is returned only
    when complete.
    """
    folder = Path(path)
    device = torch.device(device if device is not None else "cpu")
    cfg, headers, dtype = _checked(folder, device, dtype)
    state = dict(_converted(headers, cfg, device, dtype))
    if cfg.tie_embeddings:
        lm_head = state.pop("unembed.weight", None)
        if lm_head is not None and not torch.equal(lm_head, state["embed.weight"]):
            raise ValueError("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
        state["unembed.weight"] = state["embed.weight"]
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie()  # assign=True replaced the shared Parameter by two
    return model.eval()


def _checked(folder: Path, device: torch.device, dtype: torch.dtype | None, world: int = 1):
    """(config, headers, dtype) of a checkpoint, after every check `load_model` makes before reading
    a weight; the memory check counts a 1/`world` share of the weights plus the largest tensor (a
    sharded load, `load_model_sharded`, holds one whole converted tensor at a time)."""
    cfg = config_from_hf(read_config(folder))
    headers = _shard_headers(folder)
    _check_tensors(headers, cfg)
    dtype = _resolve_dtype(headers, dtype)
    sizes = [math.prod(shape) for name, (_, _, shape) in headers.items()
             if not _is_inv_freq(name) and not (cfg.tie_embeddings and name == "lm_head.weight")]
    check_memory(sum(sizes), dtype, device, available_bytes(device), world=world, largest=max(sizes))
    _check_inv_freq(headers, cfg)
    return cfg, headers, dtype


def _converted(headers: dict, cfg: ModelConfig, device: torch.device, dtype: torch.dtype):
    """(our name, tensor) of every weight, converted (fused q/k/v and gate/up, RoPE row order),
    yielded as soon as its group is complete: read file by file, memory-mapped, so at most a
    layer's q/k/v or gate/up wait for their partners."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, (file, _, _) in headers.items():
        by_file.setdefault(file, []).append(name)
    hf: dict[str, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for name in names:
                if _is_inv_freq(name):
                    continue
                hf[name] = f.get_tensor(name).to(device=device, dtype=dtype)
                _convert_ready(hf, state, cfg)
                while state:
                    yield state.popitem()
    if hf:  # every tensor was checked present, so every group completed
        raise AssertionError(f"unconverted tensors {_some(sorted(hf))}")


def load_model_sharded(path: str | os.PathLike, mesh, *, device: torch.device | str | None = None,
                       dtype: torch.dtype | None = None) -> Transformer:
    """`load_model`, sharded with FSDP2 over `mesh` as a frozen target (`fsdp.shard_frozen_target`:
    block by block, `residual_stream` and `loss` registered): built on the meta device, sharded,
    then filled tensor by tensor from the memory-mapped safetensors through the same conversion,
    each rank keeping its rows (`fsdp.place`, `distribute_tensor`). No rank ever holds the whole
    model: at most one converted tensor in full (a layer's fused q/k/v or gate/up, the embedding).
    The memory check counts this rank's share. Collective: every rank of `mesh` calls it."""
    from spirelib.training import fsdp

    folder = Path(path)
    device = torch.device(device if device is not None else "cpu")
    cfg, headers, dtype = _checked(folder, device, dtype, world=mesh.size())
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    fsdp.shard_frozen_target(model, mesh, device)
    tensors = ((n, t) for n, t in _converted(headers, cfg, device, dtype)
               if not (cfg.tie_embeddings and n == "unembed.weight"))  # the embedding's Parameter
    fsdp.load_sharded(model, tensors, device)
    return model.eval()


_TOP = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "unembed.weight"}
_PER_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "mlp_norm.weight",
              "self_attn.o_proj.weight": "attn.wo.weight", "mlp.down_proj.weight": "mlp.w_down.weight"}


def _convert_ready(hf: dict[str, torch.Tensor], state: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """Move every complete group of Hugging Face tensors in `hf` into our `state`, so that at
    most a layer's q/k/v or gate/up wait for their partners (no second copy of the model)."""
    for name in list(hf):
        if name not in hf:  # taken with its group
            continue
        if name in _TOP:
            state[_TOP[name]] = hf.pop(name)
            continue
        _, _, i, rest = name.split(".", 3)  # model.layers.{i}.{rest}
        p, ours = f"model.layers.{i}.", f"blocks.{i}."
        if rest in _PER_LAYER:
            state[ours + _PER_LAYER[rest]] = hf.pop(name)
        elif rest.startswith("self_attn."):
            for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                qkv = [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"]
                if all(n in hf for n in qkv):
                    q, k, v = (hf.pop(n) for n in qkv)  # (n_q dh, d), (n_kv dh, d), (n_kv dh, d); biases (rows,)
                    state[ours + f"attn.wqkv.{kind}"] = torch.cat(
                        [_from_hf_rope_order(q, cfg.n_q), _from_hf_rope_order(k, cfg.n_kv), v])  # ((n_q + 2 n_kv) dh, ...)
        else:
            gate_up = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
            if all(n in hf for n in gate_up):
                state[ours + "mlp.w_gate_up.weight"] = torch.cat([hf.pop(n) for n in gate_up])  # (2 d_ff, d)


# ---------------------------------------------------------------- saving


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face Llama names, q/k rows back in its RoPE order; every
    tensor is its own contiguous copy (safetensors refuses shared storage)."""
    cfg = model.cfg
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    q_dim, kv_dim = cfg.n_q * cfg.d_head, cfg.n_kv * cfg.d_head
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:  # tied: transformers re-ties lm_head to the embedding on load
        out["lm_head.weight"] = sd["unembed.weight"]
    for i in range(cfg.num_layers):
        p, ours = f"model.layers.{i}.", f"blocks.{i}."
        q, k, v = sd[ours + "attn.wqkv.weight"].split([q_dim, kv_dim, kv_dim])  # (n_q dh, d), (n_kv dh, d) x 2
        gate, up = sd[ours + "mlp.w_gate_up.weight"].chunk(2)  # (d_ff, d) each
        out |= {
            p + "input_layernorm.weight": sd[ours + "attn_norm.weight"],
            p + "post_attention_layernorm.weight": sd[ours + "mlp_norm.weight"],
            p + "self_attn.q_proj.weight": _to_hf_rope_order(q, cfg.n_q),
            p + "self_attn.k_proj.weight": _to_hf_rope_order(k, cfg.n_kv),
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": sd[ours + "attn.wo.weight"],
            p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": sd[ours + "mlp.w_down.weight"],
        }
        if cfg.qkv_bias:
            qb, kb, vb = sd[ours + "attn.wqkv.bias"].split([q_dim, kv_dim, kv_dim])
            out |= {p + "self_attn.q_proj.bias": _to_hf_rope_order(qb, cfg.n_q),
                    p + "self_attn.k_proj.bias": _to_hf_rope_order(kb, cfg.n_kv), p + "self_attn.v_proj.bias": vb}
    return {k: v.to("cpu").clone(memory_format=torch.contiguous_format) for k, v in out.items()}


def save_model(model: Transformer, path: str | os.PathLike, tokenizer=None, *,
               max_position_embeddings: int = 4096) -> Path:
    """Write `model` as a Hugging Face Llama folder: config.json and model.safetensors (issue
    13), which `transformers.LlamaForCausalLM.from_pretrained(path)` loads and `load_model`
    reads back bitwise. With a `tokenizer` from `spirelib.training.tokenizer` or `load_tokenizer`,
    its eos id goes into config.json and, where it has a `tokenizers.Tokenizer` (BPE, hf),
    tokenizer.json and tokenizer_config.json are written too. Returns the folder."""
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.d_model % cfg.n_q:
        raise ValueError(f"transformers' LlamaConfig needs hidden_size ({cfg.d_model}) to be a multiple of "
                         f"num_attention_heads ({cfg.n_q}), even with head_dim set; this model cannot be exported")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    clashing = sorted({p.name for pattern in (INDEX, "model-*.safetensors", *PICKLE_PATTERNS)
                       for p in folder.glob(pattern)})
    if clashing:
        raise ValueError(f"{folder} already holds other weights ({', '.join(clashing)}); save into an empty folder")
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"the model mixes dtypes {sorted(map(str, dtypes))}; cast it to one first")
    eos = None if tokenizer is None else getattr(tokenizer, "eos_id", None)
    config = config_to_hf(cfg, dtypes.pop(), eos_token_id=None if eos is None else int(eos),
                          max_position_embeddings=max_position_embeddings)
    _atomic_write(folder / SINGLE, lambda tmp: save_file(hf_state_dict(model), str(tmp), metadata={"format": "pt"}))
    if tokenizer is not None and hasattr(tokenizer, "tokenizer"):
        tok = tokenizer.tokenizer
        _atomic_write(folder / TOKENIZER, lambda tmp: tok.save(str(tmp)))
        special = {"tokenizer_class": "PreTrainedTokenizerFast"}
        if eos is not None and tok.id_to_token(int(eos)) is not None:
            special["eos_token"] = tok.id_to_token(int(eos))
        _atomic_write(folder / "tokenizer_config.json", lambda tmp: tmp.write_text(json.dumps(special, indent=2)))
    _atomic_write(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return folder


def _atomic_write(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def checkpoint_digest(path: str | os.PathLike) -> str:
    """sha256 over the folder's config.json and weight files (names and bytes): the identity
    of an imported target, so drafts trained for it retrain when its weights change. Each
    file's digest is cached under the cache folder by (path, size, mtime), so a series reads a
    large checkpoint's bytes once, not in every notebook."""
    from spirelib.paths import cache_dir

    folder = Path(path).resolve()
    files = [folder / CONFIG] + sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.safetensors.index.json"))
    store = cache_dir() / "hf" / "digests.json"
    known = json.loads(store.read_text()) if store.is_file() else {}
    total, before = hashlib.sha256(), len(known)
    for f in files:
        stat = f.stat()
        key = f"{f}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in known:
            digest = hashlib.sha256()
            with open(f, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 24), b""):
                    digest.update(block)
            known[key] = digest.hexdigest()
        total.update(f"{f.name}:{known[key]}\n".encode())
    if len(known) > before:  # new digests only: a series reads the checkpoint once, writes the store once
        store.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(store, lambda tmp: tmp.write_text(json.dumps(known, indent=1)))
    return total.hexdigest()


# ---------------------------------------------------------------- tokenizer


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` with the interface of `spirelib.training.tokenizer`'s
    tokenizers (`kind`, `vocab_size`, `bos_id`, `eos_id`, their tokens, `checksum`, `encode_batch`,
    `decode`), plus `encode` of one text, following the checkpoint's own conventions: end-of-text
    is config.json's `eos_token_id`, not a looked-up string; BOS is what the tokenizer's
    post-processor puts before a text (`_prepended`: Llama 2 / 3 and Mistral prepend theirs,
    SmolLM2 and Qwen2 nothing). `encode_batch` encodes documents for the token stream: BOS, then
    the text's tokens, nothing the post-processor would append (the stream puts `eos_id` between
    documents, `tokenizer.tokenize`)."""

    kind = "hf"

    def __init__(self, tokenizer, eos_id: int):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = int(eos_id)
        self.eos_token = tokenizer.id_to_token(self.eos_id)
        prepended = _prepended(tokenizer)
        if len(prepended) > 1:
            raise ValueError(f"the tokenizer's post-processor puts {[tokenizer.id_to_token(i) for i in prepended]} "
                             "before every text; only a single BOS token is implemented")
        self.bos_id = prepended[0] if prepended else None
        self.bos_token = None if self.bos_id is None else tokenizer.id_to_token(self.bos_id)
        # The ids that frame each document are part of what `tokenizer.tokenize` caches.
        self.checksum = hashlib.sha256(
            (tokenizer.to_str() + f"\nbos_id={self.bos_id}\neos_id={self.eos_id}").encode()).hexdigest()

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        head = [] if self.bos_id is None else [self.bos_id]
        return [np.asarray(head + e.ids, dtype=np.int64)
                for e in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def _prepended(tokenizer) -> list[int]:
    """The ids the post-processor puts before a text (TemplateProcessing "<|begin_of_text|> $A":
    [128000]; ByteLevel or none: []): a probe encoded with special tokens, less its own tokens."""
    probe = "a"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    raise ValueError("the tokenizer's post-processor changes a text's own tokens; only added special tokens "
                     "are implemented")


def load_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """The tokenizer of the Hugging Face folder `path`: its tokenizer.json, with end-of-text
    from config.json's `eos_token_id` (int, or a list whose first id is taken; else
    generation_config.json's) and BOS from its post-processor (`HFTokenizer`)."""
    from tokenizers import Tokenizer

    folder = Path(path)
    file = folder / TOKENIZER
    if not file.is_file():
        raise ValueError(f"{folder}: no {TOKENIZER} (only fast tokenizers' tokenizer.json files load, "
                         "not sentencepiece tokenizer.model)")
    eos = read_config(folder).get("eos_token_id")
    generation = folder / "generation_config.json"
    if eos is None and generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        raise ValueError(f"{folder}: config.json has no eos_token_id (nor generation_config.json)")
    tok = Tokenizer.from_file(str(file))
    if tok.id_to_token(int(eos)) is None:
        raise ValueError(f"{folder}: eos_token_id={eos} is not in the tokenizer's vocabulary of {tok.get_vocab_size()}")
    return HFTokenizer(tok, int(eos))
