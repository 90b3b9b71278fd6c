"""Hugging Face Llama checkpoints in, our models out (spirelib/training/hf_config.py, hf_weights.py,
hf_export.py, hf_tokenizer.py).

Tiny random Llama models built here with `transformers` (a test-only dependency; nothing
is downloaded), saved with `save_pretrained`, loaded with `hf.load_model` and compared
with transformers' own forward (eager attention, fp32) in every way our engine uses a
target: full forward, one-token cached decoding, k+1 verify chunks with rollback, ragged
right-padded prefill, greedy autoregressive and speculative decoding. transformers gets an
all-ones attention mask throughout: without one, a jump in position_ids reads as a new
packed sequence.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from spirelib.decoding.drafts import MagicDecDraft, VanillaDraft  # noqa: E402
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate  # noqa: E402
from spirelib.model.config import ModelConfig, SinkWindow
from spirelib.model.kvcache import DenseKVCache
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget
from spirelib.training import hf_export, hf_tokenizer, hf_weights  # noqa: E402

V = 101
TOL = 1e-4


def random_llama(seed: int, *, layers=2, hidden=64, heads=4, kv=2, ff=96, head_dim=None, theta=500000.0,
                 family="llama", **extra):
    """A random LlamaForCausalLM (Qwen2ForCausalLM with family="qwen2", MistralForCausalLM with
    family="mistral"), `randomized`."""
    torch.manual_seed(seed)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                             "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[family]
    extra = {"tie_word_embeddings": False, "rope_theta": theta} | extra
    if head_dim is not None:
        extra["head_dim"] = head_dim
    config = config_cls(vocab_size=V, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv,
                        max_position_embeddings=256, rms_norm_eps=1e-5, attn_implementation="eager", **extra)
    return randomized(model_cls(config))


def randomized(model):
    """`model` (transformers', eval mode) with weights (biases too) large enough that attention is far
    from uniform and norm gains that are not all one, so that swapped or skipped tensors show."""
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
    model.generation_config.eos_token_id = None  # generate must not stop early
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(transformers model, its folder, our model loaded from it)."""
    ref = random_llama(0)
    folder = tmp_path_factory.mktemp("llama")
    ref.save_pretrained(folder, safe_serialization=True)
    return ref, folder, hf_weights.load_model(folder)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A second model, 1 layer, head_dim given (4 x 16 heads on hidden 32): the vanilla draft."""
    ref = random_llama(1, layers=1, hidden=32, heads=4, kv=1, ff=48, head_dim=16)
    folder = tmp_path_factory.mktemp("llama_small")
    ref.save_pretrained(folder, safe_serialization=True)
    return ref, folder, hf_weights.load_model(folder)


def hf_logits(ref, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref(tokens, attention_mask=torch.ones_like(tokens)).logits  # (B, T, V)


def tokens(seed: int, *shape) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def new_cache(model: Transformer, batch: int, capacity: int) -> DenseKVCache:
    cfg = model.cfg
    return DenseKVCache(cfg.num_layers, batch, cfg.n_kv, cfg.d_head, capacity)


def rewrite_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


# ---------------------------------------------------------------- logits


@pytest.mark.parametrize("which", ["target", "small"])
def test_full_forward_matches_transformers(which, request):
    ref, _, ours = request.getfixturevalue(which)
    x = tokens(1, 2, 24)
    assert not any(p.is_meta for p in ours.parameters()) and {p.dtype for p in ours.parameters()} == {torch.float32}
    want = hf_logits(ref, x)
    with torch.no_grad():
        got = ours(x)
    assert want.std() > 1  # logits far from uniform
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_one_token_cached_decoding_matches_transformers(target):
    ref, _, ours = target
    x = tokens(2, 2, 24)
    want = hf_logits(ref, x)
    cache = new_cache(ours, 2, 24)
    with torch.no_grad():
        got = [ours(x[:, :8], cache=cache)]
        for t in range(8, 24):
            got.append(ours(x[:, t : t + 1], torch.full((2, 1), t), cache))
    torch.testing.assert_close(torch.cat(got, 1), want, atol=TOL, rtol=0)


def test_verify_chunks_with_rollback_match_transformers(target):
    """k + 1 = 4 positions per pass, some of them wrong drafts that are rolled back and then
    overwritten: each chunk's logits are transformers' on the verified text plus that chunk."""
    ref, _, ours = target
    text = tokens(3, 1, 40)
    cache = new_cache(ours, 1, 48)
    with torch.no_grad():
        ours(text[:, :10], cache=cache)
    n, gen = 10, torch.Generator().manual_seed(4)
    for accepted in (3, 0, 1, 3, 2, 0):
        chunk = text[:, n : n + 4].clone()
        chunk[:, 1 + accepted :] = torch.randint(0, V, (1, 3 - accepted), generator=gen)  # rejected drafts
        with torch.no_grad():
            got = ours(chunk, n + torch.arange(4)[None], cache)
        want = hf_logits(ref, torch.cat([text[:, :n], chunk], 1))[:, n:]
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
        n += accepted + 1
        cache.rollback(torch.tensor([n]))


def test_ragged_right_padded_prefill_matches_transformers_row_by_row(target):
    ref, _, ours = target
    lengths = torch.tensor([17, 5, 11])
    x = tokens(5, 3, 17)
    pad = torch.arange(17)[None] >= lengths[:, None]
    x = x.masked_fill(pad, 0)
    cache = new_cache(ours, 3, 20)
    nxt = tokens(6, 3)
    with torch.no_grad():
        got = ours(x, torch.arange(17).expand(3, 17), cache, valid=~pad)
        step = ours(nxt[:, None], lengths[:, None], cache)[:, 0]  # one decode step after the ragged prefill
    for i, n in enumerate(lengths.tolist()):
        row = x[i : i + 1, :n]
        torch.testing.assert_close(got[i, :n], hf_logits(ref, row)[0], atol=TOL, rtol=0)
        torch.testing.assert_close(step[i], hf_logits(ref, torch.cat([row, nxt[i : i + 1, None]], 1))[0, -1],
                                   atol=TOL, rtol=0)


# ---------------------------------------------------------------- decoding


def test_greedy_and_speculative_decoding_give_transformers_greedy_tokens(target, small):
    ref, _, ours = target
    lengths = torch.tensor([9, 4, 7])
    contexts = tokens(7, 3, 9).masked_fill(torch.arange(9)[None] >= lengths[:, None], 0)
    G = 12
    want = []
    for i, n in enumerate(lengths.tolist()):
        row = contexts[i : i + 1, :n]
        out = ref.generate(row, attention_mask=torch.ones_like(row), max_new_tokens=G, do_sample=False)
        want.append(out[0, n:])
    want = torch.stack(want)
    assert len(set(want.flatten().tolist())) > 3  # not one repeated token

    ar = autoregressive_generate(ours, contexts, G, temperature=0, lengths=lengths)
    assert torch.equal(ar.tokens, want)
    drafts = {"vanilla": VanillaDraft(small[2], temperature=0),
              "magicdec": MagicDecDraft(ours, KVBudget(1, 3), temperature=0)}
    for name, draft in drafts.items():
        sd = speculative_generate(ours, draft, contexts, G, k=3, temperature=0, lengths=lengths)
        assert torch.equal(sd.tokens, want), name
        assert (sd.accepted >= 0).any()


# ---------------------------------------------------------------- formats


def test_sharded_checkpoint_loads_identically(target, tmp_path):
    ref, _, ours = target
    ref.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / hf_weights.INDEX).is_file() and len(list(tmp_path.glob("model-*.safetensors"))) > 2
    sharded = hf_weights.load_model(tmp_path)
    assert sharded.cfg == ours.cfg
    a, b = sharded.state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_both_rope_config_formats_give_the_same_model(target, tmp_path):
    """transformers 5 writes `rope_parameters`; Llama 2/3 checkpoints carry `rope_theta` and
    `rope_scaling: null` (and `torch_dtype`)."""
    _, folder, ours = target
    assert "rope_parameters" in json.loads((folder / "config.json").read_text())
    assert ours.cfg.rope_base == 500000.0 and ours.cfg.norm_eps == 1e-5
    shutil.copytree(folder, tmp_path / "old")
    rewrite_config(tmp_path / "old", rope_parameters=..., dtype=..., rope_theta=500000.0, rope_scaling=None,
                   torch_dtype="float32")
    old = hf_weights.load_model(tmp_path / "old")
    assert old.cfg == ours.cfg
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), ours.state_dict().values()))


def test_load_in_another_dtype(target):
    _, folder, ours = target
    half = hf_weights.load_model(folder, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    a, b = half.state_dict(), ours.state_dict()
    assert all(torch.equal(a[k], b[k].to(torch.bfloat16)) for k in a)


def random_ours(seed: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, num_layers=2, d_model=64, n_q_per_kv=2, n_kv=2, d_head=16, d_ff=96,
                      rope_base=20000.0, norm_eps=1e-5)
    model = Transformer(cfg)
    model.reset_parameters(std=0.3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model.eval()


def test_export_round_trip_through_transformers(tmp_path):
    ours = random_ours(8)
    hf_export.save_model(ours, tmp_path)
    ref, info = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32,
                                                 output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    x = tokens(9, 2, 20)
    with torch.no_grad():
        got = ours(x)
    torch.testing.assert_close(hf_logits(ref.eval(), x), got, atol=TOL, rtol=0)

    back = hf_weights.load_model(tmp_path)
    assert back.cfg == ours.cfg
    a, b = back.state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_save_refuses_a_folder_with_other_weights(tmp_path):
    (tmp_path / hf_weights.INDEX).write_text("{}")
    with pytest.raises(ValueError, match="already holds other weights"):
        hf_export.save_model(random_ours(0), tmp_path)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("field, value", [
    ("attention_bias", True),
    ("mlp_bias", True),
    ("use_sliding_window", True),
    ("hidden_act", "gelu"),
    ("sliding_window", 4096),
    ("num_local_experts", 8),
    ("final_logit_softcapping", 30.0),
    ("rope_scaling", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    ("model_type", "gemma2"),
    ("quantization_config", {"quant_method": "gptq"}),
    ("rope_interleaved", True),
    ("use_mrope", True),
    ("auto_map", {"AutoModelForCausalLM": "modeling_llama.LlamaForCausalLM"}),
    ("a_new_field", 1),
])
def test_unsupported_config_fields_are_refused_by_name_before_any_weight_is_read(target, tmp_path, field, value):
    _, folder, _ = target
    shutil.copy(folder / "config.json", tmp_path / "config.json")  # no weights at all: refused from the config
    rewrite_config(tmp_path, **{field: value})
    with pytest.raises(ValueError) as err:
        hf_weights.load_model(tmp_path)
    message = str(err.value)
    shown = "rope_type" if field == "rope_parameters" else field
    shown_value = value["rope_type"] if field == "rope_parameters" else value
    assert shown in message and repr(shown_value) in message, message
    assert "issue" not in message.lower(), message  # says what to do, in the user's terms
    assert ("set the field to false" if field == "rope_interleaved" else "what loads") in message, message


def test_disagreeing_rope_thetas_are_refused(target, tmp_path):
    shutil.copy(target[1] / "config.json", tmp_path / "config.json")
    rewrite_config(tmp_path, rope_theta=10000.0)
    with pytest.raises(ValueError, match="rope_theta=10000.0 and rope_parameters.rope_theta=500000.0 disagree"):
        hf_weights.load_model(tmp_path)


def test_a_missing_shard_is_refused(target, tmp_path):
    target[0].save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    gone = sorted(tmp_path.glob("model-*.safetensors"))[1]
    gone.unlink()
    with pytest.raises(ValueError, match=f"missing shard.*{gone.name}"):
        hf_weights.load_model(tmp_path)


def _edit_weights(folder, edit):
    file = folder / hf_weights.SINGLE
    weights = load_file(file)
    edit(weights)
    save_file(weights, file, metadata={"format": "pt"})


def test_a_shape_mismatch_is_refused_by_tensor_name(target, tmp_path):
    shutil.copytree(target[1], tmp_path / "m")
    rewrite_config(tmp_path / "m", intermediate_size=95)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight has shape \[96, 64\]; "
                                         r"config.json implies \[95, 64\]"):
        hf_weights.load_model(tmp_path / "m")


def test_unknown_and_missing_tensors_are_refused_by_name(target, tmp_path):
    shutil.copytree(target[1], tmp_path / "bias")
    _edit_weights(tmp_path / "bias", lambda w: w.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}))
    with pytest.raises(ValueError, match=r"biases.*model.layers.0.self_attn.q_proj.bias"):
        hf_weights.load_model(tmp_path / "bias")
    shutil.copytree(target[1], tmp_path / "tied")
    _edit_weights(tmp_path / "tied", lambda w: w.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"lacks tensors: \['lm_head.weight'\]"):
        hf_weights.load_model(tmp_path / "tied")


def test_a_pickle_only_folder_is_refused_and_never_unpickled(target, tmp_path):
    shutil.copy(target[1] / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle: unpickling this would raise UnpicklingError")
    with pytest.raises(ValueError, match=r"pytorch_model.bin.*never unpickles.*safetensors"):
        hf_weights.load_model(tmp_path)


def test_too_little_memory_is_refused_with_the_numbers_before_loading(target, monkeypatch):
    with pytest.raises(MemoryError, match=r"the model \(8B parameters\) in float32 needs 32.0 GB; "
                                          r"cpu has 24.0 GB available"):
        hf_weights.check_memory(8_000_000_000, torch.float32, "cpu", available=24_000_000_000)
    hf_weights.check_memory(8_000_000_000, torch.bfloat16, "cpu", available=24_000_000_000)  # 16 GB fits
    hf_weights.check_memory(8_000_000_000, torch.float32, "cpu", available=None)  # unknown: no check

    _, folder, ours = target
    need = sum(p.numel() for p in ours.parameters()) * 4

    def no_reading(*args):
        raise AssertionError("a weight was read before the memory check")

    monkeypatch.setattr(hf_weights, "available_bytes", lambda device: need - 1)
    monkeypatch.setattr(hf_weights, "_convert_ready", no_reading)
    with pytest.raises(MemoryError, match="needs"):
        hf_weights.load_model(folder)
    monkeypatch.setattr(hf_weights, "available_bytes", lambda device: 2 * need - 1)  # fits in fp32, not in fp64
    with pytest.raises(MemoryError, match="needs"):
        hf_weights.load_model(folder, dtype=torch.float64)
    assert hf_weights.available_bytes(torch.device("cpu")) > 0  # /proc/meminfo is read


# ---------------------------------------------------------------- tokenizer


def tiny_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the cat sat on the mat", "a dog ate the hat", "théorie naïve"] * 10, trainer)
    return tok


def test_load_tokenizer_takes_eos_from_config(tmp_path):
    tok = tiny_bpe()
    assert tok.token_to_id("</s>") == 2 and tok.token_to_id("<|endoftext|>") == 3
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [2, 3]}))
    loaded = hf_tokenizer.load_tokenizer(tmp_path)
    assert loaded.eos_id == 2 and loaded.vocab_size == tok.get_vocab_size() and loaded.kind == "hf"
    text = "the cat ate a naïve hat"
    ids = loaded.encode(text)
    assert ids.dtype.kind == "i" and len(ids) < len(text.encode())
    assert loaded.decode(ids) == text
    assert [a.tolist() for a in loaded.encode_batch([text, "dog"])] == [ids.tolist(), tok.encode("dog").ids]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 1}))
    other = hf_tokenizer.load_tokenizer(tmp_path)
    assert other.eos_id == 1 and other.checksum != loaded.checksum  # the eos id is part of the identity


def test_save_model_writes_the_tokenizer_and_its_eos(tmp_path):
    tok = hf_tokenizer.HFTokenizer(tiny_bpe(), 2)
    hf_export.save_model(random_ours(0), tmp_path, tokenizer=tok)
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == 2
    back = hf_tokenizer.load_tokenizer(tmp_path)
    assert back.eos_id == 2 and back.checksum == tok.checksum
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).eos_token == "</s>"


# ---------------------------------------------------------------- Llama 3.1 RoPE scaling, tied embeddings, Qwen2

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}  # tiny: positions past 16 are where scaling matters
LONG = 48


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """A Llama 3.1 style model (rope_type llama3, d_head 16 on theta 10000: wavelengths from 6 to
    ~20k, on both sides of the 4..16 band) with tied embeddings, as Llama 3.2 1B/3B have."""
    ref = random_llama(10, head_dim=16, theta=10000.0, rope_parameters={"rope_theta": 10000.0, **LLAMA3_ROPE},
                       tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("llama31")
    ref.save_pretrained(folder, safe_serialization=True)
    return ref, folder, hf_weights.load_model(folder)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """A Qwen2 model: q/k/v biases, sliding-window fields present but off."""
    ref = random_llama(11, family="qwen2", theta=1000000.0, use_sliding_window=False, sliding_window=4096,
                       max_window_layers=1)
    folder = tmp_path_factory.mktemp("qwen2")
    ref.save_pretrained(folder, safe_serialization=True)
    rewrite_config(folder, sliding_window=4096)  # as published Qwen2.5 configs carry it (transformers nulls it)
    return ref, folder, hf_weights.load_model(folder)


def test_llama3_rope_frequencies_are_transformers_bitwise():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from spirelib.model.rope import rope_frequencies

    config = LlamaConfig(hidden_size=128, num_attention_heads=1, head_dim=128, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192})
    want, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got = rope_frequencies(128, 500000.0, (8.0, 1.0, 4.0, 8192.0))
    assert attention_factor == 1.0 and torch.equal(got, want)
    plain = rope_frequencies(128, 500000.0)
    assert (got < plain).any() and (got == plain).any() and ((got > plain / 8) & (got < plain)).any()  # all 3 bands


@pytest.mark.parametrize("which", ["scaled", "qwen2"])
def test_full_forward_and_cached_decoding_match_transformers(which, request):
    ref, _, ours = request.getfixturevalue(which)
    x = tokens(12, 2, LONG)
    want = hf_logits(ref, x)
    assert want.std() > 1
    with torch.no_grad():
        torch.testing.assert_close(ours(x), want, atol=TOL, rtol=0)
        cache = new_cache(ours, 2, LONG)
        got = [ours(x[:, :8], cache=cache)]
        for t in range(8, LONG):
            got.append(ours(x[:, t : t + 1], torch.full((2, 1), t), cache))
    torch.testing.assert_close(torch.cat(got, 1), want, atol=TOL, rtol=0)


def test_the_llama31_config_gives_scaling_and_ties(scaled):
    _, folder, ours = scaled
    assert "lm_head.weight" not in load_file(folder / hf_weights.SINGLE)  # transformers does not save a tied head
    assert ours.cfg.rope_scaling == (4.0, 1.0, 4.0, 16.0) and ours.cfg.tie_embeddings and not ours.cfg.qkv_bias
    assert ours.unembed.weight is ours.embed.weight
    assert ours.cfg.num_params() == sum(p.numel() for p in ours.parameters())  # the tied matrix once


def test_qwen2_config_gives_biases_and_its_window_fields_are_harmless_only_when_off(qwen2, tmp_path):
    ref, folder, ours = qwen2
    assert ours.cfg.qkv_bias and not ours.cfg.tie_embeddings and ours.cfg.rope_base == 1000000.0
    assert ours.blocks[0].attn.wqkv.bias is not None and ours.blocks[0].attn.wo.bias is None
    assert ours.cfg.num_params() == sum(p.numel() for p in ours.parameters())
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    rewrite_config(tmp_path, use_sliding_window=True)
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        hf_weights.load_model(tmp_path)
    rewrite_config(tmp_path, use_sliding_window=False, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="layer_types"):
        hf_weights.load_model(tmp_path)


@torch.no_grad()
def test_separate_query_and_key_value_projections_use_the_biases(qwen2):
    """SPIRe's path (Block.queries / memory_kv) computes what the fused q/k/v projection does."""
    ours = qwen2[2]
    x = torch.randn(2, 7, ours.cfg.d_model, generator=torch.Generator().manual_seed(13))
    rope = ours.rope(torch.arange(7).expand(2, 7))
    block = ours.blocks[1]
    q, k, v = block.attn.qkv(block.attn_norm(x), rope)
    torch.testing.assert_close(block.queries(x, rope), q, atol=1e-6, rtol=0)
    k2, v2 = block.memory_kv(x, rope)
    torch.testing.assert_close(k2, k, atol=1e-6, rtol=0)
    torch.testing.assert_close(v2, v, atol=1e-6, rtol=0)


@torch.no_grad()
def test_magicdec_cache_positions_re_rotate_with_the_scaled_frequencies(scaled):
    """rope_mode="cache" at a query past original_max_position_embeddings: with one layer, a
    query over sink + window scores as the compacted sequence at positions 0..n-1 does (cf.
    test_transformer); the sink keys are re-rotated by the distance they move, in scaled frequencies."""
    from dataclasses import replace

    from spirelib.model.kvcache import SinkWindowKVCache

    torch.manual_seed(14)
    ours = Transformer(replace(scaled[2].cfg, num_layers=1)).eval()
    ours.reset_parameters(std=0.3)
    cfg, sparse = ours.cfg, SinkWindow(sink=2, window=4)
    x = tokens(14, 1, LONG)
    dense = new_cache(ours, 1, LONG)
    ours(x[:, : LONG - 1], cache=dense)
    ring = SinkWindowKVCache(cfg.num_layers, 1, cfg.n_kv, cfg.d_head, sparse, slack=1, rope_mode="cache",
                             rope_base=cfg.rope_base, rope_scaling=cfg.rope_scaling)
    ring.ingest(dense, torch.arange(LONG - 1)[None])
    out = ours(x[:, LONG - 1 :], torch.tensor([[LONG - 1]]), ring)
    compacted = torch.cat([x[:, :2], x[:, LONG - 5 :]], dim=1)  # sink, the 4 before the query, the query
    torch.testing.assert_close(out[:, 0], ours(compacted)[:, -1], atol=1e-4, rtol=0)


def test_greedy_and_speculative_decoding_give_transformers_greedy_tokens_past_the_original_context(scaled):
    from spirelib.decoding.drafts import SpireDraft
    from spirelib.model.config import SpireConfig
    from spirelib.model.spire import SpireDraftModel

    ref, _, ours = scaled
    lengths = torch.tensor([20, 14])
    contexts = tokens(15, 2, 20).masked_fill(torch.arange(20)[None] >= lengths[:, None], 0)
    G = 16
    want = []
    for i, n in enumerate(lengths.tolist()):
        row = contexts[i : i + 1, :n]
        want.append(ref.generate(row, attention_mask=torch.ones_like(row), max_new_tokens=G, do_sample=False)[0, n:])
    want = torch.stack(want)
    assert len(set(want.flatten().tolist())) > 3
    assert torch.equal(autoregressive_generate(ours, contexts, G, temperature=0, lengths=lengths).tokens, want)
    spire = SpireDraftModel.from_target(ours, SpireConfig(num_layers=1, sink=1, window=8, k=3))
    assert spire.body.cfg.rope_scaling == ours.cfg.rope_scaling
    assert spire.body.unembed.weight is spire.body.embed.weight  # the draft stays tied
    assert torch.equal(spire.body.embed.weight, ours.embed.weight)
    drafts = {"magicdec": MagicDecDraft(ours, KVBudget(1, 6), temperature=0),
              "spire": SpireDraft(spire, temperature=0)}
    for name, draft in drafts.items():
        sd = speculative_generate(ours, draft, contexts, G, k=3, temperature=0, lengths=lengths)
        assert torch.equal(sd.tokens, want), name
    assert drafts["magicdec"].cache.rope_scaling == ours.cfg.rope_scaling  # its cache re-rotates in scaled RoPE


@pytest.mark.parametrize("which", ["scaled", "qwen2"])
def test_export_round_trip_through_transformers_scaled_tied_and_biased(which, request, tmp_path):
    _, _, ours = request.getfixturevalue(which)
    hf_export.save_model(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    cls = transformers.Qwen2ForCausalLM if which == "qwen2" else LlamaForCausalLM
    ref, info = cls.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32,
                                    output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert (ref.lm_head.weight is ref.model.embed_tokens.weight) == ours.cfg.tie_embeddings
    x = tokens(16, 2, LONG)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(ref.eval(), x), ours(x), atol=TOL, rtol=0)
    back = hf_weights.load_model(tmp_path)
    assert back.cfg == ours.cfg and config["model_type"] == ("qwen2" if which == "qwen2" else "llama")
    a, b = back.state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_tied_checkpoint_with_a_different_lm_head_is_refused(scaled, tmp_path):
    shutil.copytree(scaled[1], tmp_path / "m")
    _edit_weights(tmp_path / "m", lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"] + 1}))
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        hf_weights.load_model(tmp_path / "m")
    _edit_weights(tmp_path / "m", lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"].clone()}))
    assert hf_weights.load_model(tmp_path / "m").unembed.weight is not None  # an equal stored head loads


def test_a_tied_model_checkpoints_once_stays_tied_and_resumes_training(scaled, tmp_path):
    from spirelib.training import checkpoint

    def fresh():
        torch.manual_seed(17)
        model = Transformer(scaled[2].cfg)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, seed):
        x = tokens(seed, 2, 12)
        opt.zero_grad()
        model.loss(x[:, :-1], x[:, 1:]).backward()
        opt.step()

    model, opt = fresh()
    for s in range(2):
        step(model, opt, s)
    identity = {"model": model.cfg.to_dict()}
    checkpoint.save_checkpoint(tmp_path / "ck", model, identity, step=2, finished=False, optimizer=opt)
    assert "unembed.weight" not in load_file(tmp_path / "ck" / "model.safetensors")
    step(model, opt, 2)  # the uninterrupted run

    resumed, opt2 = fresh()
    checkpoint.load_checkpoint(tmp_path / "ck", resumed, identity, optimizer=opt2)
    assert resumed.unembed.weight is resumed.embed.weight
    step(resumed, opt2, 2)
    assert resumed.unembed.weight is resumed.embed.weight
    a, b = resumed.state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- Mistral's sliding window


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """A Mistral v0.1 style model: a sliding window of 6 positions, far shorter than the tests' sequences."""
    ref = random_llama(13, family="mistral", theta=10000.0, sliding_window=6)
    folder = tmp_path_factory.mktemp("mistral")
    ref.save_pretrained(folder, safe_serialization=True)
    return ref, folder, hf_weights.load_model(folder)


def test_mistral_full_forward_and_cached_decoding_match_transformers_through_the_window(mistral):
    ref, _, ours = mistral
    assert ours.cfg.sliding_window == 6
    x = tokens(17, 2, LONG)
    want = hf_logits(ref, x)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), want, atol=TOL, rtol=0)
        cache = ours.new_cache(2, LONG)
        got = [ours(x[:, :8], cache=cache)]
        for t in range(8, LONG, 4):  # verify-sized chunks through the window
            got.append(ours(x[:, t : t + 4], torch.arange(t, t + 4).expand(2, 4), cache))
        torch.testing.assert_close(torch.cat(got, 1), want, atol=TOL, rtol=0)
        full = Transformer(ModelConfig(**{**ours.cfg.to_dict(), "sliding_window": None}))
        full.load_state_dict(ours.state_dict())
        assert (full(x) - want).abs().max() > 0.1  # the window matters at this length
        with pytest.raises(ValueError, match="sliding window of 6"):
            ours(x[:, :4], cache=new_cache(ours, 2, LONG))  # a cache that would ignore it is refused


def test_mistral_greedy_and_speculative_decoding_give_transformers_greedy_tokens(mistral):
    ref, _, ours = mistral
    lengths = torch.tensor([20, 13])
    contexts = tokens(18, 2, 20).masked_fill(torch.arange(20)[None] >= lengths[:, None], 0)
    G = 12
    want = torch.stack([ref.generate(contexts[i : i + 1, :n], attention_mask=torch.ones(1, n, dtype=torch.long),
                                     max_new_tokens=G, do_sample=False)[0, n:]
                        for i, n in enumerate(lengths.tolist())])
    assert len(set(want.flatten().tolist())) > 3
    assert torch.equal(autoregressive_generate(ours, contexts, G, temperature=0, lengths=lengths).tokens, want)
    sd = speculative_generate(ours, MagicDecDraft(ours, KVBudget(1, 4), temperature=0), contexts, G, k=3,
                              temperature=0, lengths=lengths)
    assert torch.equal(sd.tokens, want)


def test_mistral_export_round_trip_through_transformers(mistral, tmp_path):
    _, _, ours = mistral
    hf_export.save_model(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mistral" and config["sliding_window"] == 6
    ref = transformers.MistralForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32)
    x = tokens(19, 2, LONG)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(ref.eval(), x), ours(x), atol=TOL, rtol=0)
    assert hf_weights.load_model(tmp_path).cfg == ours.cfg
