"""Published config.json texts load (spirelib/training/hf_config.py; tests/fixtures/hf_configs, each file's
source in its SOURCES.md): every fixture parses to the shapes its model card states and to exactly
the tensors transformers' model of that config holds, as written and as transformers 5 writes it
back; one fixture per architecture, shrunk to a tiny width with its field set kept, loads with
random weights and computes transformers' logits. Nothing downloads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_hf import TOL, V, hf_logits, randomized, tokens  # noqa: E402

from spirelib.training import hf_config, hf_weights  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"
LLAMA31_8B = (8.0, 1.0, 4.0, 8192.0)  # rope_scaling: factor, low_freq_factor, high_freq_factor, original context
LLAMA32 = (32.0, 1.0, 4.0, 8192.0)

# fixture: (layers, d_model, query heads, kv heads, d_head, d_ff, vocab, tied, rope base, llama3 scaling,
#           q/k/v biases, sliding window), from each model's card
EXPECTED = {
    "llama-2-7b-hf": (32, 4096, 32, 32, 128, 11008, 32000, False, 1e4, None, False, None),
    "llama-2-13b-hf": (40, 5120, 40, 40, 128, 13824, 32000, False, 1e4, None, False, None),
    "llama-2-70b-chat-hf": (80, 8192, 64, 8, 128, 28672, 32000, False, 1e4, None, False, None),
    "meta-llama-3-8b-instruct": (32, 4096, 32, 8, 128, 14336, 128256, False, 5e5, None, False, None),
    "llama-3.1-8b-instruct": (32, 4096, 32, 8, 128, 14336, 128256, False, 5e5, LLAMA31_8B, False, None),
    "llama-3.1-70b-instruct": (80, 8192, 64, 8, 128, 28672, 128256, False, 5e5, LLAMA31_8B, False, None),
    "llama-3.2-1b-instruct": (16, 2048, 32, 8, 64, 8192, 128256, True, 5e5, LLAMA32, False, None),
    "llama-3.2-3b-instruct": (28, 3072, 24, 8, 128, 8192, 128256, True, 5e5, LLAMA32, False, None),
    "tinyllama-1.1b-chat-v1.0": (22, 2048, 32, 4, 64, 5632, 32000, False, 1e4, None, False, None),
    "smollm2-135m": (30, 576, 9, 3, 64, 1536, 49152, True, 1e5, None, False, None),
    "smollm2-135m-4.57-dict": (30, 576, 9, 3, 64, 1536, 49152, True, 1e5, None, False, None),
    "qwen2-0.5b": (24, 896, 14, 2, 64, 4864, 151936, True, 1e6, None, True, None),
    "qwen2.5-0.5b": (24, 896, 14, 2, 64, 4864, 151936, True, 1e6, None, True, None),
    "qwen2.5-1.5b-instruct": (28, 1536, 12, 2, 128, 8960, 151936, True, 1e6, None, True, None),
    "qwen2.5-7b-instruct": (28, 3584, 28, 4, 128, 18944, 152064, False, 1e6, None, True, None),
    "qwen2.5-32b-instruct": (64, 5120, 40, 8, 128, 27648, 152064, False, 1e6, None, True, None),
    "mistral-7b-instruct-v0.3": (32, 4096, 32, 8, 128, 14336, 32768, False, 1e6, None, False, None),
    "zephyr-7b-beta": (32, 4096, 32, 8, 128, 14336, 32000, False, 1e4, None, False, 4096),
}
PARAMS = {"llama-3.2-1b-instruct": 1_235_814_400, "qwen2.5-0.5b": 494_032_768, "meta-llama-3-8b-instruct": 8_030_261_248}


def published(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shape(cfg) -> tuple:
    return (cfg.num_layers, cfg.d_model, cfg.n_q, cfg.n_kv, cfg.d_head, cfg.d_ff, cfg.vocab_size, cfg.tie_embeddings,
            cfg.rope_base, cfg.rope_scaling, cfg.qkv_bias, cfg.sliding_window)


def test_every_fixture_is_listed_with_its_source():
    files = sorted(p.stem for p in FIXTURES.glob("*.json"))
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert files == sorted(EXPECTED) and len(files) >= 15
    assert all(f"| {name}.json |" in sources for name in files)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_published_config_gives_its_model_and_transformers_tensors(name):
    """As published and as transformers 5 writes it back (`dtype`, `rope_parameters`, Qwen2's
    `layer_types`, defaults filled in): the same model, whose tensors are exactly those of
    transformers' model of the config (built on the meta device: no memory)."""
    config = published(name)
    cfg = hf_config.config_from_hf(config)
    assert shape(cfg) == EXPECTED[name]
    rewritten = transformers.AutoConfig.for_model(**config)
    assert hf_config.config_from_hf(json.loads(rewritten.to_json_string(use_diff=True))) == cfg
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(rewritten)
    theirs = {n: tuple(t.shape) for n, t in ref.state_dict().items() if not (cfg.tie_embeddings and n == "lm_head.weight")}
    assert theirs == hf_weights.hf_shapes(cfg)
    assert cfg.num_params() == sum(p.numel() for p in ref.parameters()) == PARAMS.get(name, cfg.num_params())


def test_published_configs_meet_the_rest_of_the_loader():
    from spirelib.throughput.perfmodel import PRESETS

    llama3 = hf_config.config_from_hf(published("meta-llama-3-8b-instruct"))
    assert llama3.shape() == PRESETS["llama3-8b"] and llama3.norm_eps == 1e-5
    with pytest.raises(MemoryError, match=r"\(8.03B parameters\) in float32 needs 32.1 GB; cpu has 24.0 GB"):
        hf_weights.check_memory(llama3.num_params(), torch.float32, "cpu", available=24 * 10**9)
    yarn = published("llama-3.1-8b-instruct")
    yarn["rope_scaling"] = {"factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "yarn"}
    with pytest.raises(ValueError, match=r"rope_scaling=\{'factor': 8.0.*'rope_type': 'yarn'\}"):
        hf_config.config_from_hf(yarn)
    with pytest.raises(ValueError, match="architectures"):
        hf_config.config_from_hf(published("qwen2.5-0.5b") | {"architectures": ["LlamaForCausalLM"]})


def test_metadata_loads_and_what_changes_the_forward_is_refused_by_name():
    """SmolLM2's nanotron fields and transformers' GGUF import fields are metadata; rope_interleaved
    true (nanotron's layout, which transformers ignores), multimodal RoPE and unknown fields are
    refused by name, with what to do and no issue number."""
    smol = published("smollm2-135m")
    assert smol["is_llama_config"] is True and smol["rope_interleaved"] is False
    gguf = smol | {"_model_name_or_path": "SmolLM2 135M", "unk_token_id": 0}
    assert hf_config.config_from_hf(gguf) == hf_config.config_from_hf(smol)
    for config, field, says in [(smol | {"rope_interleaved": True}, "rope_interleaved", "set the field to false"),
                                (published("qwen2.5-0.5b") | {"use_mrope": True}, "use_mrope", "multimodal RoPE"),
                                (smol | {"attn_temperature": 0.5}, "attn_temperature", "delete it from config.json")]:
        with pytest.raises(ValueError) as err:
            hf_config.config_from_hf(config)
        message = str(err.value)
        assert f"{field}={config[field]!r}" in message and says in message, message
        assert "issue" not in message.lower(), message


# ---------------------------------------------------------------- tiny random checkpoints of published configs

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": V, "max_window_layers": 2, "sliding_window": 6}
LONG = 24  # past the tiny sliding window


def shrunk(config: dict) -> dict:
    """`config` with its shapes made tiny and every field kept, no field added (a sliding window,
    where there is a number, 6: shorter than the test's sequences)."""
    return {k: TINY[k] if k in TINY and not (k == "sliding_window" and config[k] is None) else v
            for k, v in config.items()}


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-0.5b", "zephyr-7b-beta"])  # llama, qwen2, mistral
def test_a_tiny_checkpoint_of_a_published_config_computes_transformers_logits(name, tmp_path):
    config = shrunk(published(name))
    torch.manual_seed(20)
    ref = randomized(transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=torch.float32, attn_implementation="eager"))
    ref.save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / hf_config.CONFIG).write_text(json.dumps(config, indent=2))  # the published field set, not transformers'
    ours = hf_weights.load_model(tmp_path)
    assert ours.cfg.sliding_window == (6 if name == "zephyr-7b-beta" else None)
    x = tokens(21, 2, LONG)
    want = hf_logits(ref, x)
    assert want.std() > 1
    with torch.no_grad():
        torch.testing.assert_close(ours(x), want, atol=TOL, rtol=0)
        cache = ours.new_cache(2, LONG)
        got = [ours(x[:, :8], cache=cache)] + [ours(x[:, t : t + 1], torch.full((2, 1), t), cache)
                                               for t in range(8, LONG)]
    torch.testing.assert_close(torch.cat(got, 1), want, atol=TOL, rtol=0)
