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
    corpus: str             "sotu" | "stdlib" | "text" | "longcrawl64"   (spirelib.training.corpus)
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
    vanilla_training: dict  the vanilla draft's TrainConfig (its shape: `config.vanilla_draft_config`, method §4)
    spire: dict             SpireConfig fields (method §3; an ablation changes them, `config.ABLATIONS`)
    spire_training: dict    the SPIRe draft's TrainConfig
    eagle3: dict            Eagle3Config fields (EAGLE-3, arXiv 2503.01840: target layers, draft vocabulary, k)
    eagle3_training: dict   the EAGLE-3 draft's TrainConfig
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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from spirelib.model.config import Eagle3Config, ModelConfig, SpireConfig, ablation, vanilla_draft_config
from spirelib.paths import resolve_path
from spirelib.throughput.methods import BUDGETED, KVBudget, card
from spirelib.training.config import TrainConfig
from spirelib.training.series_params import (
    FROM_CHECKPOINT,
    HF_PREFIX,
    SMOKE,
    MagicDecOptions,
    SeriesError,
    dry_run,
    field_problems,
    parse,
    training_config,
)

if TYPE_CHECKING:
    from spirelib.training import pipeline
    from spirelib.training.train import Session


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
    eagle3: Eagle3Config = field(default_factory=lambda: Eagle3Config(**SMOKE["eagle3"]))
    eagle3_training: TrainConfig = field(default_factory=lambda: TrainConfig(**SMOKE["eagle3_training"]))
    k: int = 4
    new_tokens: int = 64
    temperature: float = 1.0
    tau_seed: int = 0
    magicdec: MagicDecOptions = field(default_factory=MagicDecOptions)
    compile_decoding: bool = False

    def __post_init__(self):
        problems = field_problems(self)
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
        values, problems = parse(cls, d or {})
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
            if self.target_source and f.name in FROM_CHECKPOINT:
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
        return training_config(d, self.seed if seed is None else seed, what)

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
        from spirelib.training import pipeline  # torch: only when a model is built

        def build():
            from spirelib.training import hf_tokenizer

            tokenizer = hf_tokenizer.load_tokenizer(self.imported) if self.imported else self.tokenizer
            return pipeline.token_data(self.corpus, self.corpus_path, tokenizer, self.vocab_size)

        return self._cached("data", build)

    def session(self, progress: bool = True) -> Session:
        """How the series' models train (`train.Session`): on its `device`, torchrun's ranks sharing each
        as `parallel` says, with a progress bar or not."""
        from spirelib.training.train import Session  # torch: only when a model is built

        return Session(self.device, self.parallel, progress)

    def trained_target(self, progress: bool = True) -> pipeline.TrainedModel:
        """The target: trained only when no finished checkpoint of the same identity exists, or
        the imported checkpoint, evaluated on the validation split (`pipeline.imported_target`)."""
        from spirelib.training import pipeline  # torch: only when a model is built

        if self.imported:
            return self._cached("target", lambda: pipeline.imported_target(
                self.imported, self.data(), self.target_training, device=self.device, parallel=self.parallel))
        return self._cached("target", lambda: pipeline.for_decoding(pipeline.train_language_model(
            self.target, self.target_training, self.data(), name=pipeline.TARGET, session=self.session(progress))))

    def trained_vanilla_draft(self, progress: bool = True) -> pipeline.TrainedModel:
        """The vanilla SD draft for the target (method §4)."""
        from spirelib.training import pipeline  # torch: only when a model is built

        return self._cached("vanilla", lambda: pipeline.trained_vanilla_draft(
            self.trained_target(progress), self.vanilla_training, session=self.session(progress)))

    def trained_spire_draft(self, variant: str = "spire", training: TrainConfig | None = None,
                            progress: bool = True) -> pipeline.TrainedModel:
        """The SPIRe draft (method §3), or an ablation `variant` of it (method §3.8) trained on `training`
        (default: the series' spire_training)."""
        from spirelib.training import pipeline  # torch: only when a model is built

        cfg, train_cfg = ablation(variant, self.spire), training or self.spire_training
        return self._cached(("spire", cfg, train_cfg), lambda: pipeline.trained_spire_draft(
            self.trained_target(progress), cfg, train_cfg, session=self.session(progress)))

    def trained_eagle3_draft(self, progress: bool = True) -> pipeline.TrainedModel:
        """The EAGLE-3 draft for the target (`training.eagle3`), the engines' draft beside SPIRe."""
        from spirelib.training.eagle3 import trained_eagle3_draft

        return self._cached("eagle3", lambda: trained_eagle3_draft(
            self.trained_target(progress), self.eagle3, self.eagle3_training, session=self.session(progress)))

    def exported_eagle3_draft(self) -> Path:
        """The EAGLE-3 draft as the speculators folder vLLM and SGLang load (`eagle3_export`), beside
        its checkpoint; its verifier is the imported target's folder, or the trained target written
        as a Hugging Face folder beside its own checkpoint (`hf_export.save_model`)."""
        from spirelib.training import hf_export
        from spirelib.training.eagle3_export import export_eagle3

        draft, target = self.trained_eagle3_draft(), self.trained_target()
        verifier = self.imported or hf_export.save_model(target.model, target.result.path.parent / "hf",
                                                         self.data().tokenizer)
        return export_eagle3(draft.model, draft.result.path.parent / "speculators", verifier=str(verifier), k=self.k)

    def rank_problems(self, model: str, world: int) -> list[str]:
        """What stops `model` ("target", "vanilla", "spire" or "eagle3") from training over `world` ranks, found
        before any compute: a batch that does not split over them. (Under `parallel: fsdp` any number
        of blocks shards over any number of ranks: FSDP2 splits every parameter over all of them.)"""
        if world < 2:
            return []
        trainings = {"target": ("target_training",), "vanilla": ("target_training", "vanilla_training"),
                     "spire": ("target_training", "spire_training"),
                     "eagle3": ("target_training", "eagle3_training")}[model]
        return [f"{name}.batch_size: {getattr(self, name).batch_size} windows do not split over {world} ranks"
                for name in trainings if getattr(self, name).batch_size % world
                and not (name == "target_training" and self.imported)]

    def decoding(self):
        """The decoding protocol (method §5) of this series: its k, G and temperature."""
        from spirelib.measure.tau import DecodingProtocol

        return DecodingProtocol(self.k, self.new_tokens, self.temperature)

    def protocol(self, batch_size: int):
        """The tau protocol (method §5) of this series, decoding `batch_size` rows in lockstep."""
        from spirelib.measure.tau import TauProtocol

        return TauProtocol(**dataclasses.asdict(self.decoding()), batch_size=batch_size, seed=self.tau_seed)

    def draft_factories(self, methods, models: dict | None = None, entries: int | None = None) -> dict:
        """A draft factory per method name (`builders.draft_factory`) at the series' temperature: the
        series' trained drafts (or `models[method]`), each with its `draft_options` (at `entries`)."""
        from spirelib.decoding.builders import draft_factory

        trained = {"vanilla": self.trained_vanilla_draft, "spire": self.trained_spire_draft,
                   "eagle3": self.trained_eagle3_draft}
        given = models or {}
        models = {m: given[m] if m in given else trained[m]().model if m in trained else None for m in methods}
        return {m: draft_factory(m, self.trained_target().model, models[m], temperature=self.temperature,
                                 **self.draft_options(m, entries)) for m in methods}

    def kv_budgets(self, entries: int | None = None) -> dict[str, KVBudget]:
        """Each sparse draft's KV budget (method §3.4, §4): SPIRe's, and each budgeted self-draft's
        (`methods.BUDGETED`) spending of MagicDec's sink + window as its card says (`MethodCard.budget`:
        MagicDec's ring, the guided draft's split); at `entries` (the sweep), as many, with the same sink."""
        m = self.magicdec
        total = m.sink + m.window if entries is None else entries
        return {"spire": KVBudget(self.spire.sink, self.spire.window),
                **{method: card(method).budget(total, m.sink) for method in BUDGETED}}

    def draft_options(self, method: str, entries: int | None = None) -> dict:
        """`method`'s builder options: a budgeted self-draft's KV budget (`kv_budgets`), and MagicDec's
        rope mode."""
        if method not in BUDGETED:
            return {}
        return {"budget": self.kv_budgets(entries)[method],
                **({"rope_mode": self.magicdec.rope_mode} if method == "magicdec" else {})}

    def draft_shapes(self) -> dict:
        """Each decoded draft's `profiled.DraftShape` on the series' target, as 09 prices them."""
        from spirelib.measure.wallclock import profiled_draft_shapes

        t = self.target
        models = {"vanilla": vanilla_draft_config(t), "spire": dataclasses.replace(t, num_layers=self.spire.num_layers),
                  "eagle3": dataclasses.replace(t, num_layers=1, d_ff=self.eagle3.d_ff or t.d_ff)}
        return profiled_draft_shapes(models, self.kv_budgets(), self.spire)

    def budget_factories(self, budgets) -> dict:
        """The KV-budget sweep (method §4): MagicDec and the guided draft at each budget b in
        `budgets` (`kv_budgets(b)`), as draft factories named "magicdec@b" and "guided@b"."""
        return {f"{m}@{b}": f for b in budgets for m, f in self.draft_factories(["magicdec", "guided"],
                                                                                entries=b).items()}

def problems(d: dict) -> list[str]:
    """Every problem of a params `series` section (empty when it builds), without raising."""
    values, found = parse(Series, d)
    if not found:
        try:
            Series(**values)
        except SeriesError as e:
            found = e.problems
    return found
