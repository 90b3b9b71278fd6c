"""What a serving engine does with a batch-size -> k schedule, as its named release reads it
(docs/deploy.md, which cites each engine's file, issue or PR): the keys we write for it, a small
executable model of its own lookup (the k it picks at a batch size, and a context where it reads
one), its refusals in short, its command line (`vllm_command`, `sglang_command`), and which drafts
it can serve at all, as the drafting methods' cards say (`serving`).

The schedule is `schedule`'s (the best k per batch size, method §2 and §8); here it meets each
engine's form. Where a form cannot hold the schedule, the writer returns the schedule it does hold
(`expressed`) so its modeled loss can be said (`schedule.expressed_cost`). Plain Python and numpy.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json

from spirelib.throughput.methods import DECODED, card
from spirelib.throughput.schedule import OFF, Schedule, Table, expressed_cost


def serving(cards=None) -> str:
    """Which drafts an engine can serve, from the drafting methods' cards (`methods.CARDS`, the decoded
    ones by default): a draft is served iff its card names an engine's method for it."""
    cards = [card(m) for m in DECODED] if cards is None else list(cards)
    served = [c for c in cards if c.engines]
    names = {"vllm": 'vLLM method "{}"', "sglang": "SGLang --speculative-algorithm {}"}
    text = "Which drafts an engine can serve (each draft's card names its engines): " + "; ".join(
        c.label + (" (its exported draft model)" if c.needs_model else "") + " through "
        + " and ".join(names[e].format(n) for e, n in c.engines.items() if e in names) for c in served) + (
        ". " if served else "none. ")
    if served:
        text += ("A served draft's engine files name its method, and its draft model where the run recorded its "
                 "export, with the command lines in serve-vllm.sh and serve-sglang.sh; else merge a file's keys next "
                 "to the draft's method and model. TensorRT-LLM's file holds the schedule's keys only (prompt "
                 "lookup's with its NGram keys). ")
    unserved = [c.label for c in cards if not c.engines]
    if unserved:
        text += (f"{', '.join(unserved[:-1]) + ' and ' if len(unserved) > 1 else ''}{unserved[-1]} need an engine "
                 "that implements them, and none does today: their files are the schedule such an implementation "
                 "would take.")
    return text.strip()


SERVING = serving()


@dataclasses.dataclass(frozen=True)
class Engine:
    """A serving engine's schedule form: the release whose keys we write, the file, what the
    engine counts as its batch size and what it does past the schedule's last entry."""

    name: str
    label: str
    release: str
    file: str
    batch: str
    beyond: str


ENGINES = {
    "vllm": Engine(
        "vllm", "vLLM", "vLLM v0.25.0 (speculative_config: num_speculative_tokens, "
        "num_speculative_tokens_per_batch_size)", "vllm.json",
        "scheduled requests per step, prefill chunks included (len(num_scheduled_tokens))",
        "the last entry's k (gaps and batch sizes past the last entry inherit), up to max_num_seqs"),
    "vllm_pr48944": Engine(
        "vllm_pr48944", "vLLM, open PR #48944", "no release: the open vLLM PR #48944 (speculative_token_schedule "
        "with 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, k] entries, ctx_agg); a released vLLM refuses these keys",
        "vllm-context-pr48944.json", "as vllm; the context is the mean of the batch's computed tokens",
        "as vllm along B; the last context range is open-ended"),
    "trtllm": Engine(
        "trtllm", "TensorRT-LLM", "TensorRT-LLM 1.3.0rc27 (speculative_config: max_draft_len, draft_len_schedule)",
        "trtllm.yaml", "active requests of the iteration (as reported; not confirmed from its source)",
        "k = 0: speculation off above the largest key; set --max-batch to your max_batch_size"),
    "sglang": Engine(
        "sglang", "SGLang", "SGLang after PR #24055 (--speculative-adaptive-config keyed by batch size; the "
        "first release carrying it is not confirmed)", "sglang-adaptive.json",
        "the decode batch padded up to its CUDA-graph batch size",
        "the last slot's steps (a slot serves every padded batch size from its key up)"),
}

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")  # the only algorithms whose adaptive path reads the config
# SGLang's captured decode batch sizes when --cuda-graph-bs is not given: an assumption, not read from a
# release; pass your server's list (`spire deploy --cuda-graph-bs`).
CUDA_GRAPH_BS = (1, 2, 4, 8, 12, *range(16, 257, 8))


def _ks(s: Schedule) -> set[int]:
    return {r.k for r in s.ranges}


def ngram_keys(engine: str, ngram: tuple[int, int]) -> dict:
    """Prompt lookup's keys for `engine` ("vllm" or "trtllm") beside the schedule's, at its n-gram
    lengths `ngram` = (shortest, longest) tried: vLLM's method and lengths; TensorRT-LLM's decoding
    type and longest n-gram (it tries shorter ones down to 1, the oldest match first, as ours
    does) with a pool per request (ours reads only the request's own tokens)."""
    shortest, longest = ngram
    if engine == "vllm":
        return {"method": "ngram", "prompt_lookup_min": shortest, "prompt_lookup_max": longest}
    return {"decoding_type": "NGram", "max_matching_ngram_size": longest, "is_public_pool": False}


def static(s: Schedule, table: Table) -> Schedule:
    """`s` served at one k >= 1 everywhere: the k that loses least on `table`."""
    statics = [dataclasses.replace(s, ranges=tuple(dataclasses.replace(r, k=k) for r in s.ranges))
               for k in sorted(_ks(s) - {OFF})]
    return min(statics, key=lambda e: expressed_cost(table, e))


# ---------------------------------------------------------------------------- vLLM

def vllm_config(s: Schedule, ngram: tuple[int, int] | None = None) -> dict | None:
    """vLLM's `speculative_config` keys: one k anywhere -> only the static `num_speculative_tokens`
    (the dynamic key alone turns dynamic speculation on, and with it PIECEWISE CUDA graphs); else
    that maximum and the inclusive [lo, hi, k] entries of `num_speculative_tokens_per_batch_size`,
    the first from 1; with `ngram` (prompt lookup's n-gram lengths) method "ngram" and its lengths
    first. None when speculation is off everywhere."""
    top = max(_ks(s))
    if top == OFF:
        return None
    keys = {**(ngram_keys("vllm", ngram) if ngram else {}), "num_speculative_tokens": top}
    if len(_ks(s)) == 1:
        return keys
    return {**keys, "num_speculative_tokens_per_batch_size": [[r.lo, r.hi, r.k] for r in s.ranges]}


def vllm_k(config: dict, batch: int) -> int:
    """The k vLLM schedules at `batch`: the entry whose inclusive range holds it, a gap or a
    batch size past the last entry inheriting the entry before; clamped to
    num_speculative_tokens; without a schedule, num_speculative_tokens."""
    entries = config.get("num_speculative_tokens_per_batch_size")
    if not entries:
        return config["num_speculative_tokens"]
    k = OFF
    for lo, _, value in sorted(entries):
        if lo > batch:
            break
        k = value
    return min(config["num_speculative_tokens"], k)


VLLM_NGRAM = ("method", "prompt_lookup_min", "prompt_lookup_max")  # vLLM's n-gram keys (`ngram_keys`)
#: vLLM's methods that load a draft model (the cards of drafts that need one): "model" must name it.
VLLM_MODEL_METHODS = tuple(c.engines["vllm"] for c in map(card, DECODED) if c.needs_model and "vllm" in c.engines)


def vllm_problems(config: dict) -> list[str]:
    """What vLLM's validation refuses in `config`, in short (3-item entries); a draft model's method
    without its model, or with a placeholder (`<...>`) for it, is refused too (nothing to load)."""
    found = [] if config.get("num_speculative_tokens", 0) > 0 else ["num_speculative_tokens must be > 0"]
    unknown = set(config) - {"num_speculative_tokens", "num_speculative_tokens_per_batch_size", "model", *VLLM_NGRAM}
    found += [f"{key}: not a key of the release (its config forbids extra fields)" for key in sorted(unknown)]
    model = config.get("model")
    if config.get("method") in VLLM_MODEL_METHODS and not model:
        found.append(f"method {config['method']} needs the draft's model (its exported folder)")
    if isinstance(model, str) and model.startswith("<"):
        found.append(f"model {model} is a placeholder: export the draft and give its folder")
    if config.get("prompt_lookup_min", 1) > config.get("prompt_lookup_max", config.get("prompt_lookup_min", 1)):
        found.append("prompt_lookup_min must be <= prompt_lookup_max")
    entries = config.get("num_speculative_tokens_per_batch_size")
    if entries is None:
        return found
    if not entries or any(len(e) != 3 for e in entries):
        return [*found, "entries must be non-empty [bs_lo, bs_hi, k] lists"]
    ranges = sorted((e[0], e[1]) for e in entries)
    if ranges[0][0] != 1:
        found.append("the first batch-size range must start at 1")
    if any(lo > hi for lo, hi in ranges) or any(b[0] <= a[1] for a, b in itertools.pairwise(ranges)):
        found.append("batch-size ranges must be increasing and non-overlapping")
    if any(e[2] < 0 for e in entries):
        found.append("k must be >= 0")
    return found


def vllm_context_config(by_context: dict[int, Schedule], ngram: tuple[int, int] | None = None) -> dict | None:
    """The open PR's (batch x context) form: 5-item [bs_lo, bs_hi, ctx_lo, ctx_hi, k] entries on a
    rectangular grid, context ranges contiguous from 1, the last open-ended; a context bucket
    (L_prev, L] takes the k of its upper end L; prompt lookup's keys first with `ngram`, as
    `vllm_config`. None when speculation is off everywhere."""
    lengths = sorted(by_context)
    top = max(r.k for s in by_context.values() for r in s.ranges)
    if top == OFF:
        return None
    starts = sorted({r.lo for s in by_context.values() for r in s.ranges})
    ends = [b - 1 for b in starts[1:]] + [max(s.ranges[-1].hi for s in by_context.values())]
    entries = [[lo, hi, 1 if j == 0 else lengths[j - 1] + 1, L, by_context[L].k_at(lo)]
               for lo, hi in zip(starts, ends) for j, L in enumerate(lengths)]
    return {**(ngram_keys("vllm", ngram) if ngram else {}), "num_speculative_tokens": top,
            "speculative_token_schedule": entries, "ctx_agg": "mean"}


def vllm_context_k(config: dict, batch: int, context: int) -> int:
    """The k the open PR's lookup picks at (`batch`, `context`): the context bucket holding it
    (past the last: the last), then as `vllm_k` along the batch sizes of that bucket."""
    entries = config["speculative_token_schedule"]
    buckets = sorted({(e[2], e[3]) for e in entries})
    bucket = next((b for b in buckets if context <= b[1]), buckets[-1])
    rows = [[e[0], e[1], e[4]] for e in entries if (e[2], e[3]) == bucket]
    return vllm_k({"num_speculative_tokens": config["num_speculative_tokens"],
                   "num_speculative_tokens_per_batch_size": rows}, batch)


# ---------------------------------------------------------------------------- TensorRT-LLM

def trtllm_config(s: Schedule, table: Table, ngram: tuple[int, int] | None = None) -> tuple[dict | None, Schedule]:
    """TensorRT-LLM's keys and the schedule they hold. Its `draft_len_schedule` maps inclusive
    upper batch sizes to k, off above the largest key; its smallest key must map to
    `max_draft_len` and no k may exceed it, so every range deeper than the first is clamped to the
    first's k, or the first raised to the deepest, whichever loses less on `table`; trailing k = 0
    ranges are implicit. One k everywhere -> only the static `max_draft_len`. None when that
    leaves speculation off at B = 1 (max_draft_len must be > 0). With `ngram` (prompt lookup's
    n-gram lengths): NGramDecodingConfig's keys at the one static k that loses least (`static`),
    since the algorithms its dynamic draft length reaches (TensorRT-LLM PR #12262) do not name
    NGram; None when speculation is off everywhere."""
    if ngram is not None:
        if max(_ks(s)) == OFF:
            return None, s
        held = static(s, table)
        return {**ngram_keys("trtllm", ngram), "max_draft_len": held.ranges[0].k}, held
    deepest = max(_ks(s))
    clamped = dataclasses.replace(s, ranges=tuple(dataclasses.replace(r, k=min(r.k, s.ranges[0].k))
                                                  for r in s.ranges))
    raised = dataclasses.replace(s, ranges=(dataclasses.replace(s.ranges[0], k=deepest), *s.ranges[1:]))
    expressed = min((clamped, raised), key=lambda e: expressed_cost(table, e))
    first = expressed.ranges[0].k
    if first == OFF:
        return None, expressed
    if _ks(expressed) == {first}:
        return {"max_draft_len": first}, expressed
    entries = {r.hi: r.k for r in expressed.ranges}
    while entries[max(entries)] == OFF:
        del entries[max(entries)]
    return {"max_draft_len": first, "draft_len_schedule": entries}, expressed


def trtllm_k(config: dict, batch: int) -> int:
    """The draft length TensorRT-LLM runs at `batch`: the k of the first key >= batch
    (bisect_left over the sorted keys), 0 above the largest key; without a schedule,
    max_draft_len."""
    schedule = {int(key): k for key, k in (config.get("draft_len_schedule") or {}).items()}
    if not schedule:
        return config["max_draft_len"]
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, batch)
    return schedule[keys[i]] if i < len(keys) else OFF


def trtllm_problems(config: dict) -> list[str]:
    """What TensorRT-LLM's validator refuses in `config`, in short."""
    top = config.get("max_draft_len", 0)
    found = [] if top > 0 else ["max_draft_len must be > 0"]
    schedule = {int(key): k for key, k in (config.get("draft_len_schedule") or {}).items()}
    if not schedule:
        return found
    found += [f"key {b} < 1" for b in schedule if b < 1] + [f"k {k} < 0" for k in schedule.values() if k < 0]
    if schedule[min(schedule)] != top:
        found.append("the smallest key must map to max_draft_len")
    found += [f"k {k} > max_draft_len" for k in schedule.values() if k > top]
    return found


# ---------------------------------------------------------------------------- SGLang

def sglang_padded(batch: int, graph_bs=CUDA_GRAPH_BS) -> int:
    """The batch size SGLang runs `batch` at: the smallest captured CUDA-graph batch size >= it
    (none: `batch` itself, no graph)."""
    graphs = sorted(graph_bs)
    i = bisect.bisect_left(graphs, batch)
    return graphs[i] if i < len(graphs) else batch


def sglang_config(s: Schedule, table: Table, algorithm: str | None) -> tuple[dict | None, dict | None, Schedule]:
    """SGLang's adaptive config ({lower batch size: {"candidate_steps": [k]}}, one candidate per
    slot, so the slot runs that k; a slot may hold 0 steps, its validator takes non-negative
    steps), its server arguments and the schedule they hold. `speculative_num_steps` is never 0:
    the deepest k (a candidate of a slot; the union sizes the buffers). `algorithm` is the method's
    SGLang algorithm (None: none implements the draft, none is named; the config is what such an
    implementation would read). One k, or an algorithm whose adaptive path is off
    (`ADAPTIVE_ALGORITHMS`), gets static server arguments only, at the k >= 1 that loses least on
    `table`. (None, None, s) when speculation is off everywhere."""
    if max(_ks(s)) == OFF:
        return None, None, s
    if len(_ks(s)) > 1 and (algorithm is None or algorithm in ADAPTIVE_ALGORITHMS):
        expressed, config, steps = s, {str(r.lo): {"candidate_steps": [r.k]} for r in s.ranges}, max(_ks(s))
    else:
        expressed, config = static(s, table), None
        steps = expressed.ranges[0].k
    args = {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}
    if algorithm is not None:
        args = {"speculative_algorithm": algorithm, **args}
    if algorithm == "NGRAM":  # its top-k is its BFS breadth: one branch, a chain of `steps` drafts, as measured
        args["speculative_ngram_max_bfs_breadth"] = 1
    if config is not None:
        args["speculative_adaptive"] = True
    return config, args, expressed


def sglang_k(config: dict | None, server_args: dict, batch: int, graph_bs=CUDA_GRAPH_BS) -> int:
    """The steps SGLang runs at `batch`: static `speculative_num_steps` unless the adaptive path
    reads `config` (adaptive on, an EAGLE-family algorithm or none named); then the batch is padded
    to its CUDA-graph size (`sglang_padded`) and served by the slot of the largest key at or below
    that (the first slot below every key), its one candidate."""
    algorithm = server_args.get("speculative_algorithm")
    if config is None or not server_args.get("speculative_adaptive") or (
            algorithm is not None and algorithm not in ADAPTIVE_ALGORITHMS):
        return server_args["speculative_num_steps"]
    keys = sorted(int(key) for key in config)
    slot = keys[max(0, bisect.bisect_right(keys, sglang_padded(batch, graph_bs)) - 1)]
    return config[str(slot)]["candidate_steps"][0]


def sglang_problems(config: dict | None, server_args: dict) -> list[str]:
    """What SGLang refuses or ignores in `config` and `server_args`, in short."""
    steps = server_args.get("speculative_num_steps", 0)
    found = [] if steps >= 1 else ["speculative_num_steps must be >= 1 (no k = 0 server argument)"]
    if server_args.get("speculative_num_draft_tokens") != steps + 1 or server_args.get("speculative_eagle_topk") != 1:
        found.append("a chain draft needs speculative_eagle_topk 1 and speculative_num_draft_tokens = steps + 1")
    if config is None:
        return found
    algorithm = server_args.get("speculative_algorithm")
    if algorithm is not None and algorithm not in ADAPTIVE_ALGORITHMS:
        found.append(f"{algorithm} ignores the adaptive config (only {', '.join(ADAPTIVE_ALGORITHMS)} read it)")
    if any(not key.isdigit() or int(key) < 1 for key in config):
        found.append("slot keys must be batch sizes >= 1")
    candidates = {k for slot in config.values() for k in slot.get("candidate_steps", [])}
    if not candidates or min(candidates) < 0:
        found.append("candidate_steps must be non-empty lists of steps >= 0")
    if steps not in candidates:
        found.append("speculative_num_steps must be one of the candidate steps")
    return found


# ---------------------------------------------------------------------------- command lines

def vllm_command(config: dict, target: str, max_batch: int) -> list[str]:
    """`vllm serve` of `target` with `config` as its --speculative-config (JSON) and --max-num-seqs
    `max_batch`, the largest batch the schedule covers: an argv, each item one shell word."""
    return ["vllm", "serve", target, "--max-num-seqs", str(max_batch),
            "--speculative-config", json.dumps(config, separators=(",", ":"))]


def sglang_command(server_args: dict, target: str, max_batch: int, adaptive_config: str | None = None,
                   graph_bs=None) -> list[str]:
    """SGLang's server of `target` with `server_args` (`sglang_config`'s, True a bare flag) and
    --max-running-requests `max_batch`; with `adaptive_config` (the file's path) the keyed schedule
    and the CUDA-graph batch sizes `graph_bs` it was padded to (`sglang_padded`): an argv."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--max-running-requests", str(max_batch)]
    for key, value in server_args.items():
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    if adaptive_config is not None:
        argv += ["--speculative-adaptive-config", adaptive_config, *(["--cuda-graph-bs", *map(str, graph_bs)]
                                                                     if graph_bs else [])]
    return argv
