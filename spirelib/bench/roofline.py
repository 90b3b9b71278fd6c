"""The roofline of a decoding round (method §2, at this machine's calibrated peak and bandwidth):
the forward kinds a round runs (`forward_shapes`: the AD step, the verification, each drafting
method's step as its card says), a method's round as those kinds (`round_forwards`, from
`MethodCard.round`), the caches they read (`capacities`, `ring_slots`) and their FLOPs, bytes and
roofline milliseconds (`roofline`), for `bench decode --roofline` and `make gpu-check`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

from spirelib.decoding.prefill import speculative_capacity
from spirelib.model.config import SpireConfig, vanilla_draft_config
from spirelib.throughput import profiled
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import BUDGET, BUDGETED, DECODED, TARGET, KVBudget, card, label
from spirelib.throughput.perfmodel import fused_params

#: Rounds a generation runs before `round_rows` times one: the first runs eagerly, the second records
#: the round's CUDA graph (`graphs.RoundGraphs.run`), the third replays it.
WARM_ROUNDS = 3


class Forward(NamedTuple):
    """A forward kind of `forward_shapes`: its model's `ModelConfig`, the new tokens a row, the live
    keys a row attends to (what the forward needs), the slots a row's attention reads (what its
    kernel moves: a cache reads all of its slots, masked), whether its queries also score every
    key (the guided draft's verification), and the weights it runs per token beyond its layer
    stack (`perfmodel.fused_params`: EAGLE-3's fusion and 2 d wide W_q, W_k, W_v)."""

    cfg: object
    new: int
    keys: int
    reads: int
    scores: bool = False
    extra: int = 0


def kv_budgets(window: int) -> dict[str, KVBudget]:
    """Each sparse draft's KV budget at a `window` (sink 1): SPIRe's cache, and each budgeted
    self-draft's spending of as many entries as its card says (`methods.BUDGETED`)."""
    return {"spire": KVBudget(1, window), **{m: card(m).budget(1 + window, 1) for m in BUDGETED}}


def ring_slots(budget: KVBudget, k: int) -> int:
    """Slots a row of a sparse draft's cache holds: its budget's entries + k + 1 of slack
    (`SinkWindowKVCache`: MagicDec's and SPIRe's rings; `SelectedKVCache`: the guided draft's entries)."""
    return budget.entries + k + 1


def round_tokens(method: str, rounds: int, k: int) -> int:
    """New tokens a row of `round_generation` decodes so that it runs at least `rounds` rounds: AD
    one a round after the prefill's; a draft `rounds` x (k + 1) (a round emits at most k + 1)."""
    return rounds + 1 if method == "ad" else rounds * (k + 1)


def capacities(context: int, k: int, rounds: int) -> dict[str, int]:
    """Slots a row of the target's dense cache holds in `round_generation`'s generations of `rounds`
    rounds at context L, which every decode-time forward reads whole (`kvcache.DenseKVCache`): "ad"
    (`autoregressive_rounds`: L + G) and "sd" (`speculative_capacity`, the vanilla draft's too)."""
    return {"ad": context + round_tokens("ad", rounds, k),
            "sd": speculative_capacity(context, round_tokens("sd", rounds, k), k)}


def step_kind(method: str) -> str:
    """The forward kind of `method`'s draft pass (`forward_shapes`)."""
    return f"{label(method)} step"


def verify_kind(k: int, scores: bool) -> str:
    """The forward kind of the verification (with `scores`: scoring every key, the guided draft's)."""
    return f"verify ({k + 1}) + scores" if scores else f"verify ({k + 1} tokens)"


def forward_shapes(cfgs: dict, context: int, k: int, budgets: dict[str, KVBudget],
                   capacity: dict[str, int]) -> dict[str, Forward]:
    """Forward kind -> `Forward` at context L: the AD step (1 token; live keys L + 1), verification
    (k + 1 tokens), the same scoring every key (`verify_kind`), and each decoded draft's step as its
    card says (`methods.card`, `step_kind`): its model (the target for a self-draft) over every key
    of its dense cache, or over its KV budget (`budgets`) and the keys it writes itself. Each reads
    its cache whole: the dense ones `capacity` ("ad", "sd": `capacities`), the sparse ones
    `ring_slots`. `cfgs`: "target" and each draft model's `ModelConfig` by method (`model_cfgs`)."""
    ad, sd = capacity["ad"], capacity["sd"]
    kinds = {"AD step": Forward(cfgs["target"], 1, context + 1, ad),
             verify_kind(k, False): Forward(cfgs["target"], k + 1, context + k + 1, sd),
             verify_kind(k, True): Forward(cfgs["target"], k + 1, context + k + 1, sd, scores=True)}
    for m in DECODED:
        c = card(m)
        if c.drafter is None:
            continue
        cfg = cfgs["target"] if c.drafter == TARGET else cfgs[m]
        if c.reads == BUDGET:
            b = budgets[m]
            kinds[step_kind(m)] = Forward(cfg, 1, min(context, b.entries) + c.own, ring_slots(b, k))
        else:
            kinds[step_kind(m)] = Forward(cfg, 1, context + 1, sd, extra=fused_params(m, cfg.shape()))
    return kinds


def round_forwards(method: str, k: int) -> list[tuple[str, int]]:
    """The forwards of one round of `method` as (kind of `forward_shapes`, new tokens a row): AD's
    step, or the passes of the method's card (`MethodCard.round`)."""
    if method == "ad":
        return [("AD step", 1)]
    return [(verify_kind(k, p.scores) if p.verify else step_kind(method), p.new) for p in card(method).round(k)]


def roofline(kinds: dict[str, Forward], forwards: list[tuple[str, int]], batch: int, machine: Machine, *,
             live: bool = False) -> tuple[float, float, float]:
    """(GFLOP, MB, roofline ms) of `forwards` (`round_forwards`' pairs) at batch B on `machine`: per
    forward `profiled.forward_work` (body, attention over the slots it reads, unembedding; weights and
    KV at the machine's bytes per value, read once; with the guided draft's scoring, `profiled.scored`)
    and max(FLOPs / peak, bytes / bandwidth), summed over the forwards. `live`: over the live keys alone instead
    (what a kernel that skipped the masked slots would need: the useful part)."""
    flops = moved = ms = 0.0
    value_bytes = machine.bytes_per_value
    for kind, new in forwards:
        f = kinds[kind]
        work = profiled.forward_work(f.cfg.shape(), f.cfg.vocab_size, batch, new, f.keys if live else f.reads,
                                     bytes_per_value=value_bytes)
        if f.scores:
            work = profiled.scored(work, f.cfg.shape(), value_bytes)
        work = replace(work, flops=work.flops + 2.0 * f.extra * batch * new, bytes=work.bytes + f.extra * value_bytes)
        flops, moved = flops + work.flops, moved + work.bytes
        ms += 1e3 * max(work.flops / machine.peak_flops, work.bytes / machine.bandwidth)
    return flops / 1e9, moved / 1e6, ms


@dataclass(frozen=True)
class RooflineTiming:
    """How `bench decode --roofline` times its rows and prices them: each row's `repeats` timed calls
    or rounds (`round_count`), through compiled graphs with `compiled`
    (`Transformer.compile_decoding`), against the roofline of `machine` (its peak and bandwidth, at
    the target's bytes per value)."""

    machine: Machine
    repeats: int = 20
    compiled: bool = False


def roofline_row(kind: str, batch: int, context: int, seconds: list[float], work: tuple[float, float, float],
                 useful: tuple[float, float, float], compiled: bool, recorded: int = 0) -> dict:
    """A row of `--roofline`: measured ms (median of `seconds`), its work and roofline (`roofline`:
    the slots the kernels read), measured / roofline (`ratio`), roofline / measured (`fraction`: 1 is
    the hardware's limit), the same at the live keys alone (`useful_fraction`: `useful`, a
    `roofline(live=True)`) and the round graphs recorded while it was timed (not 0 flags the timing)."""
    ms = 1e3 * statistics.median(seconds)
    gflop, mbytes, roof = work
    return {"kind": kind, "batch": batch, "context": context, "ms": ms, "gflop": gflop, "mbytes": mbytes,
            "roofline_ms": roof, "ratio": ms / roof, "fraction": roof / ms, "useful_mbytes": useful[1],
            "useful_fraction": useful[2] / ms, "mode": "compiled" if compiled else "eager", "recorded": recorded}


def model_cfgs(cfg) -> dict:
    """The `ModelConfig` of a target (`cfg`) and of the draft models `build_methods` builds for it:
    "target", "vanilla" (`vanilla_draft_config`), "spire" (the SPIRe draft's body, pruned to
    `SpireConfig`'s layers) and "eagle3" (its one layer, `Eagle3DraftModel.layer_cfg`)."""
    return {"target": cfg, "vanilla": vanilla_draft_config(cfg), "spire": replace(cfg, num_layers=SpireConfig().num_layers),
            "eagle3": replace(cfg, num_layers=1)}


def round_count(repeats: int) -> int:
    """Rounds each generation of `round_rows` runs at least: the warm-up's (`WARM_ROUNDS`), and the
    timed one's first (with the prefill, untimed) and `repeats` timed ones."""
    return max(repeats + 1, WARM_ROUNDS)


def rooflines(kinds: dict[str, Forward], forwards: list[tuple[str, int]], batch: int, machine: Machine
              ) -> tuple[tuple, tuple]:
    """`roofline` of `forwards` over the slots they read and over their live keys (the useful part)."""
    return tuple(roofline(kinds, forwards, batch, machine, live=live) for live in (False, True))
