"""The models' shapes, as plain dataclasses that need no torch (method §2-4).

A target's `ModelConfig` (the performance model's `ModelShape` plus vocabulary, RoPE and the
fields imported checkpoints add), the vanilla draft's shape rule (`vanilla_draft_config`), the
SPIRe draft's `SpireConfig` with the paper's ablations as changes to it, the EAGLE-3 draft's
`Eagle3Config` with the target layers it reads, and the sink + window pattern (`SinkWindow`) that
SPIRe and the self-drafts attend with. The torch modules beside this one build models of these
shapes; `spire deploy` and the series' checks read them without importing torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from spirelib.throughput.perfmodel import ModelShape, body_params

#: Llama 3.1's RoPE scaling ("llama3" in Hugging Face configs), as a hashable tuple:
#: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
LLAMA3_SCALING_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class SinkWindow:
    """Sparse attention pattern: the first `sink` positions plus the `window` positions
    before the query (method §3.4: sink 1, window 64; method §9: the window counts the positions
    before the query, plus the sink)."""

    sink: int = 1
    window: int = 64

    def __post_init__(self):
        if self.sink < 0 or self.window < 1:
            raise ValueError(f"SinkWindow needs sink >= 0 and window >= 1, got {self}")


@dataclass(frozen=True)
class ModelConfig(ModelShape):
    """Shape of a model: the perf model's `ModelShape` (its fields, validation and every
    perfmodel function apply) plus vocabulary, RoPE base and norm epsilon."""

    vocab_size: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    # Fields added for imported checkpoints: `to_dict` leaves them out at their defaults, so the
    # config hash of every model that does not use them is what it was before them.
    rope_scaling: tuple | None = None  # Llama 3.1's: LLAMA3_SCALING_FIELDS, see rope.rope_frequencies
    tie_embeddings: bool = False  # unembed.weight is embed.weight (Llama 3.2 1B/3B, SmolLM2)
    qkv_bias: bool = False  # biases on W_q, W_k, W_v (Qwen2)
    sliding_window: int | None = None  # Mistral v0.1: each query sees the last W positions, itself included

    def __post_init__(self):
        super().__post_init__()
        if self.rope_scaling is not None:
            scaling = tuple(float(v) for v in self.rope_scaling)  # a JSON list comes back as a tuple
            if len(scaling) != len(LLAMA3_SCALING_FIELDS):
                raise ValueError(f"ModelConfig.rope_scaling must be {LLAMA3_SCALING_FIELDS}, got {self.rope_scaling!r}")
            factor, low, high, old_context = scaling
            if not (factor >= 1 and 0 < low < high and old_context > 0):
                raise ValueError(f"ModelConfig.rope_scaling {dict(zip(LLAMA3_SCALING_FIELDS, scaling))} needs "
                                 "factor >= 1, 0 < low_freq_factor < high_freq_factor, original_max > 0")
            object.__setattr__(self, "rope_scaling", scaling)
        if self.sliding_window is not None and self.sliding_window < 2:
            raise ValueError(f"ModelConfig.sliding_window must be None or >= 2 positions, got {self.sliding_window}")
        if self.vocab_size < 1:
            raise ValueError(f"ModelConfig.vocab_size must be >= 1, got {self.vocab_size}")
        if self.d_head % 2:
            raise ValueError(f"ModelConfig.d_head must be even for rotary embeddings, got {self.d_head}")

    @property
    def n_q(self) -> int:
        return self.n_q_per_kv * self.n_kv

    @property
    def attention_window(self) -> SinkWindow | None:
        """The sliding window as the caches' visibility rule sees it: no sink, the W - 1
        positions before the query (and the query itself); None for full attention."""
        return None if self.sliding_window is None else SinkWindow(0, self.sliding_window - 1)

    def body_params(self) -> int:
        """Parameters of the layer stack (method §2; `perfmodel.body_params`, plus q/k/v biases if any)."""
        biases = self.num_layers * (self.n_q + 2 * self.n_kv) * self.d_head if self.qkv_bias else 0
        return body_params(self) + biases

    def num_params(self) -> int:
        """Every parameter: the body, embedding and unembedding (once if tied), final norm gain."""
        return self.body_params() + (1 if self.tie_embeddings else 2) * self.vocab_size * self.d_model + self.d_model

    def shape(self) -> ModelShape:
        """This model's plain `perfmodel.ModelShape` (what the throughput model's tables name)."""
        return ModelShape(**{f.name: getattr(self, f.name) for f in fields(ModelShape)})

    def to_dict(self) -> dict:
        """The fields as a dict, `ModelConfig(**d)` rebuilds it; fields added after the first
        checkpoints were cached (`_LATER_FIELDS`) only where they differ from their defaults."""
        d = asdict(self)
        for name, default in _LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d


_LATER_FIELDS = {"rope_scaling": None, "tie_embeddings": False, "qkv_bias": False, "sliding_window": None}


def vanilla_draft_config(target: ModelConfig) -> ModelConfig:
    """The vanilla SD draft's shape (method §4): half the layers and half the width of the target
    (d_model, d_head and d_ff halved, same heads and vocabulary), about 1/8 of its body
    parameters (the paper's 8,390,656 for its 67,117,056 target)."""
    if target.num_layers < 2 or target.d_model % 2 or target.d_head % 4 or target.d_ff % 2:
        raise ValueError(f"cannot halve {target}: need >= 2 layers, even d_model and d_ff, d_head divisible by 4")
    return ModelConfig(vocab_size=target.vocab_size, num_layers=target.num_layers // 2, d_model=target.d_model // 2,
                       n_q_per_kv=target.n_q_per_kv, n_kv=target.n_kv, d_head=target.d_head // 2, d_ff=target.d_ff // 2,
                       rope_base=target.rope_base, norm_eps=target.norm_eps)


LOSSES = ("mixed", "hard")


@dataclass(frozen=True)
class SpireConfig:
    """The draft's architecture and training loss. `loss="mixed"` with `mix_weight` w is
    MixedLoss(w) (w = 1: distillation only); `loss="hard"` is HardTargetLoss."""

    num_layers: int = 2
    sink: int = 1
    window: int = 64
    k: int = 4  # block size of k-pass training: the draft depth it is trained for (method §3.6)
    feedback: bool = True
    target_activations: bool = True
    pruned_init: bool = True
    loss: str = "mixed"
    mix_weight: float = 0.5

    def __post_init__(self):
        if self.num_layers < 1:
            raise ValueError(f"SpireConfig.num_layers must be >= 1, got {self.num_layers}")
        if not 1 <= self.k <= self.window:
            raise ValueError(f"SpireConfig.k must be in 1..window ({self.window}) so a block sees its own start, got {self.k}")
        if self.loss not in LOSSES:
            raise ValueError(f"SpireConfig.loss must be one of {LOSSES}, got {self.loss!r}")
        if not 0.0 <= self.mix_weight <= 1.0:
            raise ValueError(f"SpireConfig.mix_weight must be in [0, 1], got {self.mix_weight}")
        if self.feedback and not self.target_activations:
            raise ValueError("feedback memory without target activations is not a SPIRe variant (method §3.8)")
        SinkWindow(self.sink, self.window)  # validates

    @property
    def sparse(self) -> SinkWindow:
        return SinkWindow(self.sink, self.window)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SpireConfig:
        allowed = {f.name for f in fields(cls)}
        unknown = set(d) - allowed
        if unknown:
            raise ValueError(f"unknown SpireConfig fields {sorted(unknown)}; allowed: {sorted(allowed)}")
        return cls(**d)


#: The paper's ablations (method §3.8) as changes to the SPIRe configuration.
ABLATIONS: dict[str, dict] = {
    "spire": {},
    "random_init": {"pruned_init": False},
    "distill_only": {"mix_weight": 1.0},
    "hard_target": {"loss": "hard"},
    "no_feedback": {"feedback": False},
    "no_feedback_no_target_acts": {"feedback": False, "target_activations": False},
}


def ablation(name: str, base: SpireConfig = SpireConfig()) -> SpireConfig:
    if name not in ABLATIONS:
        raise ValueError(f"unknown SPIRe ablation {name!r}; choose from {sorted(ABLATIONS)}")
    return replace(base, **ABLATIONS[name])


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """The target's residual-stream entries EAGLE-3 reads (entry i: the input of block i, as vLLM's
    and speculators' `eagle_aux_hidden_state_layer_ids` count them): their default (2, L // 2, L - 3)
    where those are three increasing entries (L >= 7), else low, middle and high spread over 1..L
    (a tiny test target: L = 4 gives (1, 2, 4); L = 2 gives (0, 1, 2))."""
    if num_layers < 2:
        raise ValueError(f"EAGLE-3 reads three residual-stream entries: the target needs >= 2 layers, got {num_layers}")
    default = (2, num_layers // 2, num_layers - 3)
    if default[0] < default[1] < default[2]:
        return default
    if num_layers == 2:
        return (0, 1, 2)
    return (1, (1 + num_layers) // 2, num_layers)


@dataclass(frozen=True)
class Eagle3Config:
    """The draft's shape and training. `target_layers`: the residual-stream entries it fuses (None:
    `eagle3_layers` of the target); `draft_vocab`: the size of its reduced vocabulary (None: the
    target's whole vocabulary); `k`: the steps of training-time test; `d_ff`: its MLP width (None:
    the target's); `init_head`: start the head (and final norm) as the target's unembedding rows
    of the draft vocabulary (and its final norm), else random."""

    target_layers: tuple[int, ...] | None = None
    draft_vocab: int | None = None
    k: int = 4
    d_ff: int | None = None
    init_head: bool = True

    def __post_init__(self):
        if self.target_layers is not None:
            object.__setattr__(self, "target_layers", tuple(int(i) for i in self.target_layers))
            if len(set(self.target_layers)) != len(self.target_layers) or not self.target_layers:
                raise ValueError(f"Eagle3Config.target_layers must be distinct entries, got {self.target_layers}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"Eagle3Config.draft_vocab must be None or >= 1, got {self.draft_vocab}")
        if self.k < 1:
            raise ValueError(f"Eagle3Config.k must be >= 1, got {self.k}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_layers"] = None if self.target_layers is None else list(self.target_layers)
        return d


