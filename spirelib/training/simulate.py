"""One rank's memory and communication of a sharded training run, traced through the trainer's own
code with fake tensors on a fake process group (`spire bench memory --simulate`); no GPU runs here.

The run is built and stepped by the trainer's public pieces (`train.build_train_state`,
`step.train_step`), so that a change to the trainer changes what is simulated; then come the
checkpoint gather (`fsdp.full_state`), a resume (`fsdp.load_local_state`) and the end-of-run gather
(`step.TrainState.plain_model`). `FSDPMemTracker` counts the live bytes of every storage by kind,
one tracker session a phase; `_CommBytes` counts the collectives and their buffer sizes. What is
counted and what is not: `simulate`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

#: The models a series trains (`spire train {target,vanilla,spire}`).
KINDS = ("target", "vanilla", "spire")


@dataclass(frozen=True)
class Case:
    """One simulated run: the trained `kind` ("target", "vanilla", "spire") for a target of shape
    `target` (ModelConfig), the SPIRe draft's `spire` config, the `train` config, over `world` ranks."""

    name: str
    kind: str
    target: object  # model.config.ModelConfig
    train: object  # training.config.TrainConfig
    world: int
    spire: object | None = None  # model.config.SpireConfig
    #: Micro-batches of a step traced (at most): they are alike, so the second shows the steady state
    #: (gradients held from the first); a step's collectives are scaled up to all of its micro-batches.
    max_micro_batches: int = 2

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "spire" and self.spire is None:
            raise ValueError("a spire case needs its SpireConfig")
        if self.world < 1:
            raise ValueError(f"world must be >= 1, got {self.world}")
        self.train.micro_batches(self.world)  # a batch that does not split over the ranks: refused here


class _CommBytes(TorchDispatchMode):
    """Bytes of each collective's buffer, by kind: the gathered output of an all-gather, the
    input of a reduce-scatter, the tensor of an all-reduce (a ring moves (N-1)/N of it per rank);
    the whole (`counts`, `bytes`) and the part issued in the forward, outside autograd's backward
    (`forward`)."""

    KINDS = ("all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "broadcast")

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.forward: dict[str, dict[str, int]] = {"counts": {}, "bytes": {}}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        namespace, _, name = func.name().partition("::")
        kind = next((k for k in self.KINDS if k in name), None)
        if namespace in ("c10d", "_c10d_functional") and kind is not None:
            functional = namespace == "_c10d_functional"  # returns its output; c10d's ops write into args[0]
            kind = {"allgather": "all_gather", "allreduce": "all_reduce"}.get(kind, kind)
            if kind == "all_gather":
                buffer = out if functional else args[0]
            elif kind == "reduce_scatter":
                buffer = args[0] if functional else args[1]
            else:
                buffer = args[0]
            size = _bytes(_tensors(buffer))
            backward = torch._C._current_graph_task_id() != -1  # inside autograd's engine (a backward hook)
            tallies = [(self.counts, self.bytes)]
            if not backward:
                tallies.append((self.forward["counts"], self.forward["bytes"]))
            for counts, volume in tallies:
                counts[kind] = counts.get(kind, 0) + 1
                volume[kind] = volume.get(kind, 0) + size
        return out


class _UnwrittenRows:
    """`checkpoint.Rows` of a checkpoint never written: `files` ({file: {key: tensor}}) as
    `checkpoint.save_checkpoint` would write them (a tied alias too: never read). A read returns a new
    tensor of the rows asked for (fake under FakeTensorMode) and counts its bytes (`read_bytes`)."""

    def __init__(self, files: dict[str, dict[str, torch.Tensor]]):
        self.layout = {file: {key: (t.shape, t.dtype) for key, t in tensors.items()} for file, tensors in files.items()}
        self.read_bytes = 0

    def keys(self, file: str) -> list[str]:
        return list(self.layout[file])

    def shape(self, file: str, key: str) -> list[int]:
        return list(self.layout[file][key][0])

    def read(self, file: str, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        shape, dtype = self.layout[file][key]
        rows = torch.empty(shape if start is None else (stop - start, *shape[1:]), dtype=dtype)
        self.read_bytes += rows.numel() * rows.element_size()
        return rows


def _tracker(root, opt):
    """`FSDPMemTracker(root, opt)` that also follows sharded units run only through their registered
    forward methods (`fsdp.BLOCK_METHODS`, SPIRe's k-pass): FSDP2 calls their pre-forward directly, past
    the hooks the tracker wraps, so their first backward would find no module record; one is made then.
    The totals count every storage either way; only the per-module snapshots of those units are partial."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModMemStats
    from torch.utils.weak import WeakIdKeyDictionary

    tracker = FSDPMemTracker(root, opt)

    class ModuleStats(WeakIdKeyDictionary):
        def __getitem__(self, module):
            if module not in self:
                self[module] = _FSDPModMemStats(tracker._mod_tracker.get_known_fqn(module) or type(module).__name__)
            return super().__getitem__(module)

    tracker.memory_tracking = ModuleStats()
    return tracker


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _built_in(dtype: torch.dtype, build):
    """`build()` with `dtype` the default (a fake module's `.to(dtype)` fails: its tensors cannot be swapped)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return build()
    finally:
        torch.set_default_dtype(default)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def simulate(case: Case, device: str = "cpu", fake: bool = True) -> dict:
    """Trace `case` in this process. Every tensor is a `FakeTensorMode` tensor (shapes, dtypes and
    storages, no data), the process group is torch's fake one at the run's real world size (this
    process is rank 0; collectives return at once); the frozen target and the trained model are sharded
    as `train` and `pipeline.trained_spire_draft` shard them. `FSDPMemTracker`
    (torch.distributed._tools.fsdp2_mem_tracker) counts the live bytes of every storage by kind (sharded
    and unsharded parameters and gradients, all-gather and reduce-scatter buffers, activations,
    optimizer state); each phase is its own tracker session, so its peak is that phase's.

    The GPU's numerics are what is simulated: the frozen target in bf16, the trained model's fp32
    master weights under FSDP2's bf16 `MixedPrecisionPolicy` with fp32 reduction
    (`fsdp.mixed_precision`). The fake device is the CPU, so autocast (CUDA only) is off: the few
    ops outside the sharded blocks that autocast would run in bf16 (the loss's chunks) are counted
    in fp32, a slight overestimate. Not counted: the CUDA context, NCCL's buffers and the caching
    allocator's fragmentation (a few GB on a real GPU).

    The step traced is a steady-state one: AdamW's moments are allocated beforehand, as every step
    after the first finds them. Host memory: `build` is what building the trained model takes: a
    language model is built whole on each rank's host before sharding; the SPIRe draft is built on
    the meta device and each rank's shards filled from the sharded target's (`fsdp.init_spire_draft`),
    traced (its shards, on the device; its collectives in `comms["build"]`); `save` what rank 0
    gathers (model and AdamW state, traced), `resume` what each rank reads back of that checkpoint
    (`fsdp.load_local_state` run on the saved tensors' shapes, its reads counted: its rows of each).

    Returns {"case", "world", "params",
    "phases": {phase: {"peak_bytes", kind: bytes, ...}}, "comms": {"counts": {kind: n},
    "bytes": {kind: bytes}, "forward": {"counts", "bytes"} of the forwards alone} of one whole step,
    "host": {"build", "save", "resume"} bytes}.
    Initializes (and destroys) the fake process group: no process group may be active. `fake=False`
    runs the same code on real tensors (uninitialized weights) on `device`, one rank: what gpu-check
    measures on a GPU against the simulated figures."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from spirelib.model.config import vanilla_draft_config
    from spirelib.model.rope import clear_frequency_cache
    from spirelib.model.spire import SpireDraftModel
    from spirelib.model.transformer import Transformer
    from spirelib.training import fsdp
    from spirelib.training.checkpoint import optimizer_tensors
    from spirelib.training.devices import Placement
    from spirelib.training.objectives import SpireObjective, lm_objective
    from spirelib.training.step import train_step
    from spirelib.training.train import build_train_state

    if dist.is_initialized():
        raise RuntimeError("simulate needs its own (fake) process group; run it where none is initialized")
    dev = torch.device(device)
    cfg = case.train
    micro, n_micro = cfg.micro_batches(case.world)
    traced = min(n_micro, case.max_micro_batches)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case.world)
    clear_frequency_cache()  # RoPE's cached frequencies: fake tensors of this run, then of none
    try:
        mesh = fsdp.device_mesh(dev, case.world)  # real tensors: the mesh reads its ranks back
        frozen = initialize = None
        with FakeTensorMode() if fake else contextlib.nullcontext():
            with torch.device("meta"):  # built on the meta device, sharded, then materialized (`to_empty`)
                if case.kind == "spire":  # an imported target (bf16), the draft pruned from it
                    frozen = _built_in(torch.bfloat16, lambda: Transformer(case.target))
                else:
                    model = Transformer(case.target if case.kind == "target" else vanilla_draft_config(case.target))
            if frozen is not None:  # as pipeline.trained_spire_draft: the target sharded, its head replicated,
                fsdp.shard_frozen_target(frozen, mesh, dev)  # the draft on the meta device
                frozen.to_empty(device=dev)
                objective = SpireObjective(frozen, fsdp.teacher_head(frozen))
                model = SpireDraftModel.from_target(frozen, case.spire, device="meta")

                def initialize(draft):
                    fsdp.init_spire_draft(draft, frozen)
            else:
                objective = lm_objective
                built = _bytes(model.parameters())  # a language model is built whole on each rank's host
            building, build_tracker = _CommBytes(), MemTracker()
            if frozen is not None:  # the target's shards exist before: what the build reads of them is no new storage
                build_tracker.track_external(frozen)
            with building, build_tracker:  # sharded as `train` shards it, then its shards filled (the draft's from the target's)
                existing = build_tracker.get_tracker_snapshot("current").get(dev, {}).get("Total", 0)
                placement = Placement(dev, case.world, sharded=True, mesh=mesh, compute=torch.bfloat16)
                state = build_train_state(model, objective, cfg, placement, initialize=initialize)
            if frozen is not None:
                built = build_tracker.get_tracker_snapshot("peak").get(dev, {}).get("Total", 0) - existing
            opt = state.optimizer
            batch = torch.randint(0, case.target.vocab_size, (micro * traced, cfg.seq_len + 1), device=dev)
            for p in state.params:  # AdamW's moments exist from the second step on: allocated as that step finds them
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tracker = _tracker(state.wrapper, opt)
            if frozen is not None:  # outside the tracked root: its shards and the teacher head, tracked as inputs
                tracker.track_inputs((list(frozen.parameters()), list(objective.head_norm.parameters()),
                                      objective.head_weight))
            tracker.track_inputs((batch,))
            phases, counted = {}, {}

            @contextlib.contextmanager
            def phase(name):  # one tracker session (its peak: the phase's) and the phase's collectives
                counted[name] = _CommBytes()
                with counted[name], tracker:
                    yield
                snap = tracker.get_tracker_snapshot("peak").get(dev, {})
                phases[name] = {"peak_bytes": snap.get("Total", 0),
                                **{getattr(k, "value", k): v for k, v in snap.items() if k != "Total"}}

            def step_objective(windows):  # the root, one micro-batch a call
                tracker.reset_mod_stats()  # the tracker refuses a second root forward otherwise; peaks are kept
                return state.wrapper(windows)

            # The trainer's step on `traced` micro-batches (any learning rate traces alike); its outputs, (loss,
            # grad norm, metrics) on the device, stay held through the later phases, as the trainer holds them.
            outputs = train_step(replace(state, step_objective=step_objective), batch, cfg.lr, phase)
            passes, update = counted["forward+backward"], counted["optimizer"]
            scale = n_micro / traced
            comms = {what: {kind: round(getattr(passes, what).get(kind, 0) * scale) + getattr(update, what).get(kind, 0)
                            for kind in {*getattr(passes, what), *getattr(update, what)}} for what in ("counts", "bytes")}
            comms["forward"] = {what: {kind: round(n * scale) for kind, n in passes.forward[what].items()}
                                for what in ("counts", "bytes")}
            comms["build"] = {"counts": building.counts, "bytes": building.bytes}
            before_save = tracker.get_tracker_snapshot("current").get(dev, {}).get("Total", 0)
            with phase("save"):  # what `step.save_state` gathers
                model_state, optim_state = fsdp.full_state(state.model, opt)
            gathered = _bytes(model_state.values()) + _bytes(t for s in optim_state["state"].values()
                                                             for t in s.values() if isinstance(t, torch.Tensor))
            optim_tensors, rest = optimizer_tensors(optim_state)  # the checkpoint's files, as saved
            saved = _UnwrittenRows({"model.safetensors": model_state, "optimizer.safetensors": optim_tensors})
            del model_state, optim_state, optim_tensors
            opt.zero_grad(set_to_none=True)
            opt.state.clear()  # a resumed run's optimizer starts empty
            with phase("resume"):  # what `step.resume` reads of a sharded run's checkpoint
                fsdp.load_local_state(state.model, opt, saved, {"optimizer": rest})
            with phase("end of run"):
                state.plain_model()
            del outputs
            return {"case": case.name, "kind": case.kind, "world": case.world, "micro_batch": micro,
                    "micro_batches": n_micro, "micro_batches_traced": traced,
                    "params": sum(p.numel() for p in state.skeleton.parameters()), "phases": phases, "comms": comms,
                    "host": {"build": built, "save": gathered, "save_peak_increase": phases["save"]["peak_bytes"]
                             - before_save, "resume": saved.read_bytes}}
    finally:
        clear_frequency_cache()
        dist.destroy_process_group()


def peak(result: dict) -> int:
    """The run's peak bytes on one rank's device over the training phases (forward+backward,
    optimizer; the checkpoint gather and the end-of-run gather are reported apart)."""
    return max(result["phases"][p]["peak_bytes"] for p in ("forward+backward", "optimizer"))


#: Llama 3's vocabulary (8B and 70B), untied embeddings.
LLAMA3_VOCAB = 128_256


def params_cases(worlds=(8, 16)) -> list[Case]:
    """The runs the workbook's params files ask for: params/llama3-70b.yaml's SPIRe draft under fsdp
    over each of `worlds`; params/paper.yaml's target, vanilla and SPIRe trainings on one GPU; a
    SPIRe draft of Llama 3 8B (a quarter of its layers, the paper's ratio) on one GPU, one window
    per micro-batch."""
    from spirelib.model.config import ModelConfig, SpireConfig
    from spirelib.paths import project_root
    from spirelib.throughput.perfmodel import PRESETS
    from spirelib.training.config import TrainConfig
    from spirelib.training.params import load_params

    def llama3(name):
        return ModelConfig(vocab_size=LLAMA3_VOCAB, **vars(PRESETS[name]))

    root = project_root() / "params"
    big = load_params(root / "llama3-70b.yaml")["series"]
    cases = [Case(f"llama3-70b spire, {n} ranks", "spire", llama3("llama3-70b"),
                  TrainConfig.from_dict(big["spire_training"]), n, SpireConfig(**big["spire"])) for n in worlds]
    paper = load_params(root / "paper.yaml")["series"]
    target = ModelConfig(vocab_size=paper["vocab_size"], **paper["target"])
    for kind in KINDS:
        train = TrainConfig.from_dict({k: v for k, v in paper[f"{kind}_training"].items() if k != "compile"})
        cases.append(Case(f"paper {kind}, 1 GPU", kind, target, train, 1,
                          SpireConfig(**paper["spire"]) if kind == "spire" else None))
    eight = llama3("llama3-8b")
    cases.append(Case("llama3-8b spire, 1 GPU", "spire", eight,
                      TrainConfig(batch_size=64, seq_len=1024, steps=1, micro_batch_size=1), 1,
                      SpireConfig(num_layers=eight.num_layers // 4, sink=1, window=64, k=4)))
    return cases
