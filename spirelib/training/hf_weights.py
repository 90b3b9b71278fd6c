"""Hugging Face safetensors weights into our `Transformer` (`load_model`, `load_model_sharded`), and ours
under their names (`hf_state_dict`).

Everything that can be checked is checked before any weight is read: config.json
(`hf_config.config_from_hf`), the safetensors headers (missing, unknown or misshapen tensors, missing
shards; pickle checkpoints are never unpickled, `_refuse_pickles`) and the memory the model needs on
its device (`check_memory`). Weights are read file by file, memory-mapped, and converted as soon as
their group is complete (fused q/k/v and gate/up, q/k rows in our RoPE order: the layout below), so
no second copy of the model ever exists.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from spirelib.model.config import ModelConfig
from spirelib.model.rope import rope_frequencies
from spirelib.model.transformer import Transformer
from spirelib.training.hf_config import config_from_hf, read_config
from spirelib.units import count

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
GB = 1e9

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
}


# ---------------------------------------------------------------- layout
#
# Layout mapping (Hugging Face name (shape) -> ours), n_q query heads, n_kv key/value heads
# of dh dimensions each, d = hidden size, f = intermediate size, V = vocabulary:
#
#     model.embed_tokens.weight                  (V, d)        -> embed.weight
#     model.layers.{i}.input_layernorm.weight    (d,)          -> blocks.{i}.attn_norm.weight
#     model.layers.{i}.self_attn.q_proj.weight   (n_q dh, d)   -+ rows permuted per head (RoPE),
#     model.layers.{i}.self_attn.k_proj.weight   (n_kv dh, d)  -+ then q, k, v rows concatenated
#     model.layers.{i}.self_attn.v_proj.weight   (n_kv dh, d)  -+ -> blocks.{i}.attn.wqkv.weight ((n_q + 2 n_kv) dh, d)
#     model.layers.{i}.self_attn.o_proj.weight   (d, n_q dh)   -> blocks.{i}.attn.wo.weight
#     model.layers.{i}.post_attention_layernorm.weight (d,)    -> blocks.{i}.mlp_norm.weight
#     model.layers.{i}.mlp.gate_proj.weight      (f, d)        -+ gate rows, then up rows
#     model.layers.{i}.mlp.up_proj.weight        (f, d)        -+ -> blocks.{i}.mlp.w_gate_up.weight (2f, d)
#     model.layers.{i}.mlp.down_proj.weight      (d, f)        -> blocks.{i}.mlp.w_down.weight
#     model.norm.weight                          (d,)          -> norm.weight
#     lm_head.weight                             (V, d)        -> unembed.weight (absent when tied)
#     Qwen2: model.layers.{i}.self_attn.{q,k,v}_proj.bias      -> blocks.{i}.attn.wqkv.bias, q and k
#                                                                 biases permuted as their weight rows
#
# RoPE order. `spirelib.model.rope` treats head dimensions (2j, 2j+1) as one complex number and
# rotates it by position x base^(-2j/dh); Hugging Face Llama ("rotate_half") rotates the pair
# (j, j + dh/2) by the same angle. Same rotations, different order of the dimensions within
# a head: our dimension 2j + s (s = 0, 1) is Hugging Face's dimension j + s dh/2. q.k is a
# sum over dimensions, so permuting the rows of W_q and W_k the same way within every head
# leaves attention unchanged; v and o keep their order. `_from_hf_rope_order` is the inverse
# of the permutation in transformers' ``convert_llama_weights_to_hf.py`` (which goes from
# Meta's interleaved order, ours, to Hugging Face's), `_to_hf_rope_order` is that permutation.


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
    raise MemoryError(f"the model ({count(n_params)} parameters) in {name} needs {need / GB:.1f} GB{per}; "
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
    for name, (file, _, _) in headers.items():
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
                    state[ours + f"attn.wqkv.{kind}"] = torch.cat(  # ((n_q + 2 n_kv) dh, ...)
                        [_from_hf_rope_order(q, cfg.n_q), _from_hf_rope_order(k, cfg.n_kv), v])
        else:
            gate_up = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
            if all(n in hf for n in gate_up):
                state[ours + "mlp.w_gate_up.weight"] = torch.cat([hf.pop(n) for n in gate_up])  # (2 d_ff, d)
