"""One configuration for the whole notebook series: data, target, drafts and the decoding protocol.

Every notebook that trains, loads or decodes with the series' models declares one parameter,
`series: dict = {}`, and builds `Series.from_dict(series)`; the runner injects the params
file's `series` section into it (params/README.md). The defaults are the seconds-long smoke
configuration, so a notebook run on its own loads the same cached models as the series.

Fields (params keys):

    device: str             "auto" | "cpu" | "cuda" | "cuda:N"
    parallel: str           "ddp" (default) | "fsdp": how torchrun's ranks share every training
                            (spirelib.training.fsdp: under fsdp the frozen target is sharded block
                            by block and no rank holds it whole; one process ignores it)
    seed: int               model init and training-window seed (every trainer)
    corpus: str             "sotu" | "stdlib" | "text" | "longcrawl64"   (spirelib.training.data)
    corpus_path: str        files for "text", the Zarr folder for "longcrawl64" (relative to the project root)
    tokenizer: str          "bpe" | "bytes" | "gpt2" (gpt2: LongCrawl64's ids) | "hf" (an imported target's)
    vocab_size: int         the models' vocabulary; BPE is trained to this size; it may pad a
                            fixed tokenizer's vocabulary (GPT-2's 50257 -> 50304)
    target_source: str      "" (train the target) or "hf:PATH", a local Hugging Face checkpoint
                            folder (config.json, *.safetensors, tokenizer.json; relative to the
                            project root) used as the target: its config gives `target` and
                            `vocab_size`, its tokenizer.json tokenizes the corpus (`tokenizer: hf`)
    target: dict            ModelConfig fields except vocab_size (method §2)
    target_training: dict   TrainConfig fields except seed (spirelib.training.train); an imported target
                            is evaluated on its eval_windows of seq_len tokens
    vanilla_training: dict  the vanilla draft's TrainConfig (its shape: `drafts.vanilla_draft_config`, method §4)
    spire: dict             SpireConfig fields (method §3; an ablation changes them, `spire.ABLATIONS`)
    spire_training: dict    the SPIRe draft's TrainConfig
    k, new_tokens, temperature, tau_seed
                            the decoding protocol (method §5, 9): draft depth, G, T (0: greedy), seed
    magicdec: dict          MagicDec's sink, window and rope_mode (method §4)
    compile_decoding: bool  decode through compiled graphs (`Transformer.compile_decoding`): the
                            target and the trained drafts, in every notebook that decodes; eager
                            (false) is the reference, compiled costs seconds per new shape once

`dry_run(d)` (and `Series.dry_run()`) is the same series with every shape unchanged and every
budget scaled down to seconds (`DRY_RUN`, `DRY_RUN_TRAINING`): what `spire run --dry-run`
runs (params/README.md, "Dry run").

`Series.from_dict` checks everything (unknown or mistyped keys, nested fields included) before
any data is read or model built and raises `SeriesError` listing every problem at once;
`problems(d)` returns that list without raising (what `spire check` reports).

Multi-GPU (or multi-process CPU) training uses the same recipes from the command line
(`spire train`, `spirelib.cli`), and the notebooks then load the cached results:

    torchrun --nproc_per_node 8 -m spirelib train target --params params/paper.yaml
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path

from spirelib.model.kvcache import SinkWindow
from spirelib.model.spire import SpireConfig, ablation
from spirelib.model.transformer import ModelConfig
from spirelib.modeling.methods import KVBudget
from spirelib.training import pipeline
from spirelib.training.config import TrainConfig, from_dict_checked
from spirelib.training.data import CORPORA, resolve_path
from spirelib.training.fsdp import PARALLEL
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
}
TRAININGS = ("target_training", "vanilla_training", "spire_training")
#: The dry run (`dry_run`): series fields set outright. CPU, and a short generation (G).
DRY_RUN = {"device": "cpu", "new_tokens": 8}
#: The dry run's budget for every training (the optimizer settings stay as given): a couple of
#: steps on one window of 128 tokens (longer than SPIRe's sink + window of 65 positions, so its
#: k-pass training evicts), one validation window, no torch.compile.
DRY_RUN_TRAINING = {"batch_size": 1, "seq_len": 128, "steps": 2, "tokens_per_param": 0.0, "micro_batch_size": 0,
                    "eval_every": 0, "eval_windows": 1, "checkpoint_every": 1000, "log_every": 1, "compile": False}
_TOKENIZER_MINIMUM = {"bytes": 256, "gpt2": 50257, "bpe": 257}
HF_PREFIX = "hf:"
_FROM_CHECKPOINT = ("target", "vocab_size")  # an imported target's config.json gives these


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


def _with(d, **extra):
    """A params dict with the series-wide fields added (a non-dict is left to be refused by its checker)."""
    return {**d, **extra} if isinstance(d, dict) else d


def _training(d: dict, seed: int, what: str) -> TrainConfig:
    if isinstance(d, dict) and "seed" in d:
        raise ValueError(f"{what}: the seed is the series' seed field, not a {what} field")
    return from_dict_checked(TrainConfig, _with(d, seed=seed), what)


@dataclass(frozen=True)
class Series:
    """The series configuration (module docstring); build it with `from_dict`."""

    device: str = "auto"
    parallel: str = "ddp"
    seed: int = 0
    corpus: str = "stdlib"
    corpus_path: str = ""
    tokenizer: str = "bytes"
    vocab_size: int = 256
    target_source: str = ""
    target: ModelConfig = field(default_factory=lambda: ModelConfig(vocab_size=256, **SMOKE["target"]))
    target_training: TrainConfig = field(default_factory=lambda: TrainConfig(**SMOKE["target_training"]))
    vanilla_training: TrainConfig = field(default_factory=lambda: TrainConfig(**SMOKE["vanilla_training"]))
    spire: SpireConfig = field(default_factory=lambda: SpireConfig(**SMOKE["spire"]))
    spire_training: TrainConfig = field(default_factory=lambda: TrainConfig(**SMOKE["spire_training"]))
    k: int = 4
    new_tokens: int = 64
    temperature: float = 1.0
    tau_seed: int = 0
    magicdec: MagicDecOptions = field(default_factory=MagicDecOptions)
    compile_decoding: bool = False

    def __post_init__(self):
        problems = _field_problems(self)
        if problems:
            raise SeriesError(problems)
        object.__setattr__(self, "_memo", {})  # the trained models, built once per Series

    # ------------------------------------------------------------------ building and checking

    @classmethod
    def from_dict(cls, d: dict | Series | None = None) -> Series:
        """A Series from params values (plain dicts for the nested configs); raises SeriesError.
        A Series is returned as it is (so a notebook cell that builds one can run again)."""
        if isinstance(d, Series):
            return d
        values, problems = _parse(d or {})
        if problems:
            raise SeriesError(problems)
        return cls(**values)  # raises SeriesError on fields that do not fit together

    def dry_run(self) -> Series:
        """This series with its shapes unchanged and every budget scaled down (`dry_run`)."""
        return Series.from_dict(dry_run(self.to_dict()))

    def to_dict(self) -> dict:
        """The params form (what `from_dict` takes back)."""
        out = {}
        for f in fields(self):
            if self.target_source and f.name in _FROM_CHECKPOINT:
                continue
            if f.name == "parallel" and self.parallel == "ddp":  # added later: params without it are unchanged
                continue
            value = getattr(self, f.name)
            if isinstance(value, ModelConfig):
                value = {k: v for k, v in value.to_dict().items() if k != "vocab_size"}
            elif isinstance(value, TrainConfig):
                value = {k: v for k, v in value.to_dict().items() if k != "seed"}
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    def training(self, d: dict, what: str, seed: int | None = None) -> TrainConfig:
        """A TrainConfig from params fields with the series' seed, or `seed` (e.g. notebook 05's
        ablation budget, trained at several seeds)."""
        return _training(d, self.seed if seed is None else seed, what)

    # ------------------------------------------------------------------ the cached recipes

    def _cached(self, key, build):
        memo = self.__dict__["_memo"]
        if key not in memo:
            memo[key] = build()
            if self.compile_decoding and key != "data":
                memo[key].model.compile_decoding()
        return memo[key]

    @property
    def imported(self) -> Path | None:
        """The Hugging Face folder of an imported target (`target_source: "hf:PATH"`), else None."""
        return resolve_path(self.target_source[len(HF_PREFIX):]) if self.target_source else None

    def data(self) -> pipeline.Data:
        """Corpus -> split -> tokenizer -> cached token memmaps (`pipeline.token_data`); an
        imported target's corpus is tokenized with its own tokenizer.json."""
        def build():
            from spirelib.training import hf_tokenizer

            tokenizer = hf_tokenizer.load_tokenizer(self.imported) if self.imported else self.tokenizer
            return pipeline.token_data(self.corpus, self.corpus_path, tokenizer, self.vocab_size)

        return self._cached("data", build)

    def trained_target(self, progress: bool = True) -> pipeline.TrainedModel:
        """The target: trained only when no finished checkpoint of the same identity exists, or
        the imported checkpoint, evaluated on the validation split (`pipeline.imported_target`)."""
        if self.imported:
            return self._cached("target", lambda: pipeline.imported_target(
                self.imported, self.data(), self.target_training, device=self.device, parallel=self.parallel))
        return self._cached("target", lambda: pipeline.for_decoding(pipeline.train_language_model(
            self.target, self.target_training, self.data(), name=pipeline.TARGET, device=self.device, progress=progress,
            parallel=self.parallel)))

    def trained_vanilla_draft(self, progress: bool = True) -> pipeline.TrainedModel:
        """The vanilla SD draft for the target (method §4)."""
        return self._cached("vanilla", lambda: pipeline.trained_vanilla_draft(
            self.trained_target(progress), self.vanilla_training, device=self.device, progress=progress,
            parallel=self.parallel))

    def trained_spire_draft(self, variant: str = "spire", training: TrainConfig | None = None,
                            progress: bool = True) -> pipeline.TrainedModel:
        """The SPIRe draft (method §3), or an ablation `variant` of it (method §3.8) trained on `training`
        (default: the series' spire_training)."""
        cfg, train_cfg = ablation(variant, self.spire), training or self.spire_training
        return self._cached(("spire", cfg, train_cfg), lambda: pipeline.trained_spire_draft(
            self.trained_target(progress), cfg, train_cfg, device=self.device, progress=progress,
            parallel=self.parallel))

    def rank_problems(self, model: str, world: int) -> list[str]:
        """What stops `model` ("target", "vanilla" or "spire") from training over `world` ranks, found
        before any compute: a batch that does not split over them. (Under `parallel: fsdp` any number
        of blocks shards over any number of ranks: FSDP2 splits every parameter over all of them.)"""
        if world < 2:
            return []
        trainings = {"target": ("target_training",), "vanilla": ("target_training", "vanilla_training"),
                     "spire": ("target_training", "spire_training")}[model]
        return [f"{name}.batch_size: {getattr(self, name).batch_size} windows do not split over {world} ranks"
                for name in trainings if getattr(self, name).batch_size % world
                and not (name == "target_training" and self.imported)]

    def protocol(self, batch_size: int):
        """The tau protocol (method §5) of this series, decoding `batch_size` rows in lockstep."""
        from spirelib.measure.tau import TauProtocol

        return TauProtocol(k=self.k, new_tokens=self.new_tokens, temperature=self.temperature,
                           batch_size=batch_size, seed=self.tau_seed)

    def draft_factories(self, methods, models: dict | None = None, entries: int | None = None) -> dict:
        """A draft factory per method name (`builders.draft_factory`) at the series' temperature: the
        series' trained drafts (or `models[method]`), each with its `draft_options` (at `entries`)."""
        from spirelib.decoding.builders import draft_factory

        trained = {"vanilla": self.trained_vanilla_draft, "spire": self.trained_spire_draft}
        given = models or {}
        models = {m: given[m] if m in given else trained[m]().model if m in trained else None for m in methods}
        return {m: draft_factory(m, self.trained_target().model, models[m], temperature=self.temperature,
                                 **self.draft_options(m, entries)) for m in methods}

    def kv_budgets(self, entries: int | None = None) -> dict[str, KVBudget]:
        """Each sparse draft's KV budget (method §3.4, §4): SPIRe's, MagicDec's, and the guided draft's
        split of as many (`KVBudget.split`); at `entries` (the sweep), MagicDec keeps its sink."""
        m = self.magicdec
        total = m.sink + m.window if entries is None else entries
        guided = KVBudget.split(total, m.sink)  # refuses a budget with no room past the sink first
        return {"spire": KVBudget(self.spire.sink, self.spire.window), "magicdec": KVBudget(m.sink, total - m.sink),
                "guided": guided}

    def draft_options(self, method: str, entries: int | None = None) -> dict:
        """`method`'s builder options: a self-draft's KV budget (`kv_budgets`), MagicDec's rope mode."""
        extra = {"magicdec": {"rope_mode": self.magicdec.rope_mode}, "guided": {}}
        return {"budget": self.kv_budgets(entries)[method], **extra[method]} if method in extra else {}

    def draft_shapes(self) -> dict:
        """Each decoded draft's `profiled.DraftShape` on the series' target, as 09 prices them."""
        from spirelib.decoding.drafts import vanilla_draft_config
        from spirelib.measure.wallclock import profiled_draft_shapes

        spire = dataclasses.replace(self.target, num_layers=self.spire.num_layers)
        return profiled_draft_shapes({"vanilla": vanilla_draft_config(self.target), "spire": spire},
                                     self.kv_budgets(), self.spire)

    def budget_factories(self, budgets) -> dict:
        """The KV-budget sweep (method §4): MagicDec and the guided draft at each budget b in
        `budgets` (`kv_budgets(b)`), as draft factories named "magicdec@b" and "guided@b"."""
        return {f"{m}@{b}": f for b in budgets for m, f in self.draft_factories(["magicdec", "guided"],
                                                                                entries=b).items()}


# ---------------------------------------------------------------------------- validation

_NESTED = {"target": "model", "target_training": "training", "vanilla_training": "training",
           "spire": "spire", "spire_training": "training", "magicdec": "magicdec"}


def _parse(d: dict) -> tuple[dict, list[str]]:
    """Params values -> Series constructor arguments, and every problem found."""
    if not isinstance(d, dict):
        return {}, [f"must map Series fields to values, got {type(d).__name__}"]
    names = [f.name for f in fields(Series)]
    problems = []
    for key in d:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{key}: not a series field{hint}; fields: {', '.join(names)}")
    values = {}
    for f in fields(Series):
        if f.name in _NESTED or f.name not in d:
            continue
        value, kind = d[f.name], f.type
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "str": isinstance(value, str), "bool": isinstance(value, bool)}[kind]
        if not ok:
            problems.append(f"{f.name}: expected {kind}, got {type(value).__name__} {value!r}")
        else:
            values[f.name] = float(value) if kind == "float" else value
    imported = _imported_config(values, d, problems)
    if imported is not None:
        values.update(target=imported, vocab_size=imported.vocab_size)
        values.setdefault("tokenizer", "hf")
    seed, vocab = values.get("seed", Series.seed), values.get("vocab_size", Series.vocab_size)
    for name, kind in _NESTED.items():
        if name == "target" and imported is not None:
            continue
        given = d.get(name, SMOKE[name])
        try:
            if kind == "model":
                if isinstance(given, dict) and "vocab_size" in given:
                    raise ValueError("set vocab_size as the series' vocab_size field, not inside target")
                values[name] = from_dict_checked(ModelConfig, _with(given, vocab_size=vocab), name)
            elif kind == "training":
                values[name] = _training(given, seed, name)
            else:
                values[name] = from_dict_checked(SpireConfig if kind == "spire" else MagicDecOptions, given, name)
        except (ValueError, TypeError) as e:
            problems.append(str(e) if str(e).startswith(name) else f"{name}: {e}")
    return values, problems


def _imported_config(values: dict, d: dict, problems: list[str]) -> ModelConfig | None:
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
    given = [name for name in _FROM_CHECKPOINT if name in d]
    if given:
        problems.append(f"{', '.join(given)}: an imported target's come from its config.json; leave them out")
    try:
        return hf_config.config_from_hf(hf_config.read_config(folder))
    except ValueError as e:
        problems.append(f"target_source: {e}")
        return None


def _field_problems(s: Series) -> list[str]:
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
    elif s.vocab_size < _TOKENIZER_MINIMUM[s.tokenizer]:
        problems.append(f"vocab_size: {s.vocab_size} is below the {s.tokenizer} tokenizer's minimum "
                        f"{_TOKENIZER_MINIMUM[s.tokenizer]}")
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
    if s.target.vocab_size != s.vocab_size:  # only possible when built directly, not through from_dict
        problems.append(f"target.vocab_size {s.target.vocab_size} differs from vocab_size {s.vocab_size}")
    for name in TRAININGS:
        if getattr(s, name).seed != s.seed:
            problems.append(f"{name}.seed {getattr(s, name).seed} differs from the series' seed {s.seed}")
    return problems


def problems(d: dict) -> list[str]:
    """Every problem of a params `series` section (empty when it builds), without raising."""
    values, found = _parse(d)
    if not found:
        try:
            Series(**values)
        except SeriesError as e:
            found = e.problems
    return found


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
