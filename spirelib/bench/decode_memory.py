"""What a decoding benchmark holds in memory, checked before it runs (`spire bench decode`).

`held_bytes`: the weights, the target's caches (one per method when they interleave round by
round), each draft's cache as its method card prices it, and the residual-stream entries the
prefill keeps, at one (B, L); `memory_problems`: the cell that holds most against the memory free
on the device, with what would fit instead. Activations are not counted: a forward's are freed
before the next.
"""

from __future__ import annotations

import argparse

import torch

from spirelib.bench import model_config, torch_dtype
from spirelib.bench.roofline import kv_budgets, model_cfgs, ring_slots
from spirelib.decoding.prefill import speculative_capacity
from spirelib.measure.tau import DecodingProtocol
from spirelib.model.config import SpireConfig
from spirelib.throughput.methods import BUDGET, CARDS, TARGET, card
from spirelib.training.hf_weights import available_bytes


def cache_bytes(cfg, batch: int, slots: int, value_bytes: int) -> int:
    """Bytes of a KV cache of `slots` positions a row (`kvcache.KVCache`: keys and values of every
    layer, the positions' int64 bookkeeping, one more trash slot, the rows' int64 lengths)."""
    per_slot = 2 * cfg.num_layers * cfg.n_kv * cfg.d_head * value_bytes + 8
    return batch * (slots + 1) * per_slot + 8 * batch


def held_bytes(cfg, methods: list[str], batch: int, context: int, decoding: DecodingProtocol, window: int,
               interleave: str, value_bytes: int = 4) -> dict[str, int]:
    """What one run of `wallclock.time_cells` at (B, L) under `decoding` (its G and k) holds at once,
    by part, in bytes: the weights, the target's caches (one per method interleaved by "rounds",
    each on its own copy of the prefill; one by "runs"), the drafts' caches (the vanilla draft's
    dense one, MagicDec's and SPIRe's sink + window rings, the guided draft's chosen entries and
    the scores it reads) and the residual-stream entries the prefill keeps for SPIRe.
    Activations are not counted: a forward's are freed before the next."""
    capacity = speculative_capacity(context, decoding.new_tokens, decoding.k)
    spire = SpireConfig(window=window)
    cfgs, budgets = model_cfgs(cfg), kv_budgets(window)
    scores = 4 * cfg.num_layers * batch * cfg.n_kv * capacity  # the guided draft's fp32 scores in the target cache
    copies = len(methods) if interleave == "rounds" else 1

    def draft_cache(m: str) -> int:  # as its card says: its model's (or the target's) dense cache or budget
        c = card(m)
        if c.drafter is None:
            return 0
        slots = ring_slots(budgets[m], decoding.k) if c.reads == BUDGET else capacity
        return (cache_bytes(cfg if c.drafter == TARGET else cfgs[m], batch, slots, value_bytes)
                + (scores if c.scores else 0))
    return {"weights": value_bytes * (cfg.num_params() + sum(cfgs[m].num_params() for m in methods
                                                             if m in CARDS and card(m).needs_model)),
            f"target caches ({copies})": copies * cache_bytes(cfg, batch, capacity, value_bytes),
            "draft caches": sum(draft_cache(m) for m in methods if m != "ad"),
            "kept residual stream": ("spire" in methods) * spire.num_layers * batch * (context - 1) * cfg.d_model
            * value_bytes}


def memory_problems(args: argparse.Namespace, cells: list[tuple[int, int]]) -> list[str]:
    """Why the timed runs would not fit the memory free on `--device` (`hf_weights.available_bytes`; empty:
    they fit, or it is unknown): at the cell that holds most (`held_bytes`), with what fits instead
    (`--interleave runs`, one target cache). Checked before anything runs."""
    free = available_bytes(torch.device(args.device))
    if free is None:
        return []
    cfg, protocol = model_config(args), DecodingProtocol(args.k, args.new_tokens, args.temperature)
    value_bytes = torch_dtype(args.dtype).itemsize

    def held(interleave):
        return max(((held_bytes(cfg, args.methods, B, L, protocol, args.window, interleave, value_bytes), (B, L))
                    for B, L in cells), key=lambda pair: sum(pair[0].values()))

    parts, (B, L) = held(args.interleave)
    if sum(parts.values()) <= free:
        return []
    gb = " + ".join(f"{name} {n / 1e9:.2f}" for name, n in parts.items() if n)
    instead = ""
    if args.interleave == "rounds":
        runs = sum(held("runs")[0].values())
        instead = (f"; --interleave runs (one target cache) holds {runs / 1e9:.2f} GB, which fits" if runs <= free
                   else f"; --interleave runs would hold {runs / 1e9:.2f} GB, which does not fit either")
    return [(f"at B {B} x L {L} the timed runs hold {gb} = {sum(parts.values()) / 1e9:.2f} GB, more than the "
             f"{free / 1e9:.2f} GB free on {args.device}{instead}; or lower --batch or --context")]
