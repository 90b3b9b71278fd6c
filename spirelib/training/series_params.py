"""A series' params section (`series.Series`): its smoke defaults, each field parsed and checked
before any compute (unknown or mistyped keys, nested fields included: `parse`, `field_problems`,
`SeriesError` listing every problem at once), MagicDec's options, and the dry run's budgets
(`dry_run`, what `spire run --dry-run` runs)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from spirelib.model.config import Eagle3Config, ModelConfig, SinkWindow, SpireConfig
from spirelib.paths import resolve_path
from spirelib.throughput.sharding import PARALLEL
from spirelib.training.config import TrainConfig, from_dict_checked
from spirelib.training.corpus import CORPORA
from spirelib.training.tokenizer import TOKENIZERS

#: The smoke defaults of the nested configs, in params form (seconds-long; the tests run them).
SMOKE = {
    "target": {"num_layers": 2, "d_model": 64, "n_q_per_kv": 2, "n_kv": 2, "d_head": 16, "d_ff": 128},
    "target_training": {"batch_size": 8, "seq_len": 256, "steps": 40, "eval_every": 20, "eval_windows": 16,
                        "log_every": 5},
    "vanilla_training": {"batch_size": 8, "seq_len": 256, "steps": 40, "eval_every": 20, "eval_windows": 16,
                         "log_every": 5},
    "spire": {"num_layers": 1, "sink": 1, "window": 16, "k": 4},
    "spire_training": {"batch_size": 8, "seq_len": 256, "steps": 30, "eval_every": 15, "eval_windows": 16,
                       "log_every": 5},
    "magicdec": {},
    "eagle3": {"k": 4},
    "eagle3_training": {"batch_size": 8, "seq_len": 256, "steps": 30, "eval_every": 15, "eval_windows": 16,
                        "log_every": 5},
}
TRAININGS = ("target_training", "vanilla_training", "spire_training", "eagle3_training")
#: The dry run (`dry_run`): series fields set outright. CPU, and a short generation (G).
DRY_RUN = {"device": "cpu", "new_tokens": 8}
#: The dry run's budget for every training (the optimizer settings stay as given): a couple of
#: steps on one window of 128 tokens (longer than SPIRe's sink + window of 65 positions, so its
#: k-pass training evicts), one validation window, no torch.compile.
DRY_RUN_TRAINING = {"batch_size": 1, "seq_len": 128, "steps": 2, "tokens_per_param": 0.0, "micro_batch_size": 0,
                    "eval_every": 0, "eval_windows": 1, "checkpoint_every": 1000, "log_every": 1, "compile": False}
TOKENIZER_MINIMUM = {"bytes": 256, "gpt2": 50257, "bpe": 257}
HF_PREFIX = "hf:"
FROM_CHECKPOINT = ("target", "vocab_size")  # an imported target's config.json gives these


class SeriesError(ValueError):
    """A series configuration that does not hold together; the message lists every problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(["series: " + problems[0]] + problems[1:]) if len(problems) == 1 else
                         "\n".join([f"series: {len(problems)} problems"] + [f"  {p}" for p in problems]))


@dataclass(frozen=True)
class MagicDecOptions:
    """MagicDec's sparse self-draft (method §4): sink + window of the target's own cache and the
    rotary convention of its keys ("cache": positions in the cache, its implementation)."""

    sink: int = 1
    window: int = 64
    rope_mode: str = "cache"

    def __post_init__(self):
        SinkWindow(self.sink, self.window)  # validates
        if self.rope_mode not in ("cache", "original"):
            raise ValueError(f"magicdec.rope_mode must be 'cache' or 'original', got {self.rope_mode!r}")


def with_fields(d, **extra):
    """A params dict with the series-wide fields added (a non-dict is left to be refused by its checker)."""
    return {**d, **extra} if isinstance(d, dict) else d


def training_config(d: dict, seed: int, what: str) -> TrainConfig:
    if isinstance(d, dict) and "seed" in d:
        raise ValueError(f"{what}: the seed is the series' seed field, not a {what} field")
    return from_dict_checked(TrainConfig, with_fields(d, seed=seed), what)


# ---------------------------------------------------------------------------- validation

NESTED = {"target": "model", "target_training": "training", "vanilla_training": "training",
           "spire": "spire", "spire_training": "training", "magicdec": "magicdec", "eagle3": "eagle3",
           "eagle3_training": "training"}


def parse(cls, d: dict) -> tuple[dict, list[str]]:
    """Params values -> the constructor arguments of `cls` (`series.Series`), and every problem found."""
    if not isinstance(d, dict):
        return {}, [f"must map Series fields to values, got {type(d).__name__}"]
    names = [f.name for f in fields(cls)]
    problems = []
    for key in d:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{key}: not a series field{hint}; fields: {', '.join(names)}")
    values = {}
    for f in fields(cls):
        if f.name in NESTED or f.name not in d:
            continue
        value, kind = d[f.name], f.type
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "str": isinstance(value, str), "bool": isinstance(value, bool)}[kind]
        if not ok:
            problems.append(f"{f.name}: expected {kind}, got {type(value).__name__} {value!r}")
        else:
            values[f.name] = float(value) if kind == "float" else value
    imported = imported_config(values, d, problems)
    if imported is not None:
        values.update(target=imported, vocab_size=imported.vocab_size)
        values.setdefault("tokenizer", "hf")
    seed, vocab = values.get("seed", cls.seed), values.get("vocab_size", cls.vocab_size)
    for name, kind in NESTED.items():
        if name == "target" and imported is not None:
            continue
        given = d.get(name, SMOKE[name])
        try:
            if kind == "model":
                if isinstance(given, dict) and "vocab_size" in given:
                    raise ValueError("set vocab_size as the series' vocab_size field, not inside target")
                values[name] = from_dict_checked(ModelConfig, with_fields(given, vocab_size=vocab), name)
            elif kind == "training":
                values[name] = training_config(given, seed, name)
            else:
                checked = {"spire": SpireConfig, "magicdec": MagicDecOptions, "eagle3": Eagle3Config}[kind]
                values[name] = from_dict_checked(checked, given, name)
        except (ValueError, TypeError) as e:
            problems.append(str(e) if str(e).startswith(name) else f"{name}: {e}")
    return values, problems


def imported_config(values: dict, d: dict, problems: list[str]) -> ModelConfig | None:
    """The ModelConfig of `target_source: "hf:PATH"` from its config.json (no weights read), or
    None; what is wrong with it goes to `problems`."""
    source = values.get("target_source", "")
    if not source:
        return None
    if not source.startswith(HF_PREFIX):
        problems.append(f"target_source: {source!r} is neither empty (train the target) nor 'hf:PATH', a local "
                        "Hugging Face checkpoint folder")
        return None
    from spirelib.training import hf_config

    folder = resolve_path(source[len(HF_PREFIX):])
    if not (folder / hf_config.CONFIG).is_file():
        problems.append(f"target_source: no {hf_config.CONFIG} in {folder}; put the checkpoint there first (this "
                        "project never downloads at run time: README, 'Bring your own target')")
        return None
    given = [name for name in FROM_CHECKPOINT if name in d]
    if given:
        problems.append(f"{', '.join(given)}: an imported target's come from its config.json; leave them out")
    try:
        return hf_config.config_from_hf(hf_config.read_config(folder))
    except ValueError as e:
        problems.append(f"target_source: {e}")
        return None


def field_problems(s) -> list[str]:
    """What is wrong with the combination of a Series' fields (each field on its own is valid)."""
    problems = []
    if s.corpus not in CORPORA:
        problems.append(f"corpus: unknown corpus {s.corpus!r}; choose one of {list(CORPORA)}")
    if s.target_source or s.tokenizer == "hf":
        if not s.target_source or s.tokenizer != "hf":
            problems.append("tokenizer hf (an imported target's tokenizer.json) goes with target_source hf:PATH, "
                            "and only with it")
        if s.corpus == "longcrawl64":
            problems.append("corpus longcrawl64 is pre-tokenized GPT-2 ids, not an imported target's tokens: "
                            "use a text corpus (sotu, stdlib, text)")
    elif s.tokenizer not in TOKENIZERS:
        problems.append(f"tokenizer: unknown tokenizer {s.tokenizer!r}; choose one of {list(TOKENIZERS)}")
    elif (s.corpus == "longcrawl64") != (s.tokenizer == "gpt2"):
        problems.append("corpus longcrawl64 is pre-tokenized GPT-2 ids: use it with tokenizer: gpt2 (and only it)")
    elif s.vocab_size < TOKENIZER_MINIMUM[s.tokenizer]:
        problems.append(f"vocab_size: {s.vocab_size} is below the {s.tokenizer} tokenizer's minimum "
                        f"{TOKENIZER_MINIMUM[s.tokenizer]}")
    if s.device != "auto" and not (s.device in ("cpu", "cuda") or s.device.startswith("cuda:")):
        problems.append(f"device: must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {s.device!r}")
    if s.parallel not in PARALLEL:
        problems.append(f"parallel: must be one of {list(PARALLEL)}, got {s.parallel!r}")
    if s.k < 1 or s.new_tokens < 1 or s.temperature < 0:
        problems.append(f"need k >= 1, new_tokens >= 1 and temperature >= 0, got k={s.k}, "
                        f"new_tokens={s.new_tokens}, temperature={s.temperature}")
    if s.spire.num_layers > s.target.num_layers:
        problems.append(f"spire.num_layers: the draft's {s.spire.num_layers} layers exceed the target's "
                        f"{s.target.num_layers}")
    entries = s.eagle3.target_layers or ()
    if any(not 0 <= i <= s.target.num_layers for i in entries):
        problems.append(f"eagle3.target_layers: {list(entries)} are not residual-stream entries 0..{s.target.num_layers}")
    if s.eagle3.draft_vocab is not None and s.eagle3.draft_vocab > s.vocab_size:
        problems.append(f"eagle3.draft_vocab: {s.eagle3.draft_vocab} exceeds the vocabulary of {s.vocab_size}")
    if s.target.vocab_size != s.vocab_size:  # only possible when built directly, not through from_dict
        problems.append(f"target.vocab_size {s.target.vocab_size} differs from vocab_size {s.vocab_size}")
    for name in TRAININGS:
        if getattr(s, name).seed != s.seed:
            problems.append(f"{name}.seed {getattr(s, name).seed} differs from the series' seed {s.seed}")
    return problems




# ---------------------------------------------------------------------------- dry run

def dry_run(d: dict) -> dict:
    """A params `series` section with the same shapes (target, vocabulary, drafts, k, corpus and
    tokenizer) and every budget scaled down: `DRY_RUN` set, and each training's budget replaced
    by `DRY_RUN_TRAINING` (a training left out starts from the smoke default). A non-mapping
    value is left for `problems` to refuse."""
    if not isinstance(d, dict):
        return d
    out = {**d, **DRY_RUN}
    for name in TRAININGS:
        given = d.get(name, SMOKE[name])
        out[name] = {**given, **DRY_RUN_TRAINING} if isinstance(given, dict) else given
    return out
