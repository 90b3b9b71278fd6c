"""FSDP2 under torchrun (`spirelib.training.fsdp`): 2 CPU processes (gloo), tiny models.

One torchrun launch (a module fixture) does every sharded check and writes its results; one
process computes the references; each test compares one thing:
- the target sharded block by block gives the single-process residual stream (<= 1e-6);
- one SPIRe step's draft gradients under fsdp equal the single-process ones (a reduction that
  sums instead of averaging, pytorch#162338, doubles them);
- the draft built sharded from the sharded target's shards (`fsdp.init_spire_draft`) starts with
  the weights one process builds (pruned and random init);
- N steps of `train` in a `Session(parallel="fsdp")` give the single-process weights (1e-5), the checkpoint
  loads in one process;
- a run stopped mid-way (`stop_at`, as a kill after a checkpoint) and restarted ends with the
  uninterrupted run's weights, exactly; the restart reads each rank's rows of the checkpoint and
  hashes each rank's share of it;
- an HF checkpoint loaded sharded (`hf_weights.load_model_sharded`) equals the unsharded load (weights
  and residual stream, untied and tied embeddings);
- fsdp over more ranks than blocks trains (a one-block target and draft over 2 ranks).
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = textwrap.dedent("""
    import json
    import os
    import sys
    from pathlib import Path
    import numpy as np
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from spirelib.model.config import SpireConfig, ablation
    from spirelib.model.spire import SpireDraftModel
    from spirelib.training.objectives import SpireObjective
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.training import checkpoint, fsdp
    from spirelib.training.checkpoint import load_checkpoint
    from spirelib.training.corpus import FlatDocs
    from spirelib.training.config import TrainConfig
    from spirelib.training.objectives import ObjectiveModule, lm_objective
    from spirelib.training.devices import init_distributed
    from spirelib.training.train import Session, TrainingRun, Validation, train

    torch.set_num_threads(1)
    VARIANTS = ("spire", "no_feedback", "no_feedback_no_target_acts")
    out = sys.argv[1]
    cpu = torch.device("cpu")
    rank, world = init_distributed(cpu)
    sharded = world > 1
    name = "fsdp" if sharded else "one"
    target_cfg = ModelConfig(vocab_size=32, num_layers=3, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)
    spire_cfg = SpireConfig(num_layers=2, sink=1, window=6, k=3)
    tokens = np.random.default_rng(0).integers(0, 32, 3000)
    docs = FlatDocs(tokens, np.array([0]), np.array([3000]))
    batch = torch.randint(0, 32, (4, 17), generator=torch.Generator().manual_seed(1))

    def new_target():
        torch.manual_seed(0)
        target = Transformer(target_cfg)
        target.reset_parameters(0.3)
        return target

    def new_draft(target):
        draft = SpireDraftModel.from_target(target, spire_cfg)
        torch.manual_seed(5)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(0.1 * torch.randn_like(p))
        return draft

    def sharded_objective(target):
        # the teacher head is copied before the target is sharded ...
        head = fsdp.teacher_head(target)
        mesh = fsdp.device_mesh(cpu, world)
        return SpireObjective(fsdp.shard_frozen_target(target, mesh, cpu), head)

    def objective(target):
        return sharded_objective(target) if sharded else SpireObjective(target)

    cfg = TrainConfig(batch_size=4, seq_len=16, steps=4, lr=1e-2, eval_windows=4, checkpoint_every=2,
                      micro_batch_size=1 if sharded else 0)
    if len(sys.argv) > 3:  # 4b. killed by SIGKILL in step 3 (after the step-2 checkpoint) with "kill", then restarted
        import signal

        target = new_target()
        draft = new_draft(target)  # built whole before the target is sharded
        inner, calls = objective(target), []

        def dying(model, b):
            calls.append(1)
            if sys.argv[3] == "kill" and rank == 0 and len(calls) == 5:  # step 3's first micro-batch
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(model, b)

        result = train(draft, dying, docs, cfg, run=TrainingRun(f"{out}/killed", {"spire": spire_cfg.to_dict()}),
                       validation=Validation(docs, inner), session=Session("cpu", "fsdp", progress=False))
        if rank == 0:
            save_file({k: v.contiguous() for k, v in result.model.state_dict().items()}, f"{out}/killed.safetensors")
            print("resumed from step", result.metrics[0]["step"] if result.metrics else None, "calls", len(calls))
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)

    results = {}
    # 1. residual stream of the sharded target
    target = new_target()
    draft = new_draft(target)
    obj = objective(target)
    results["stream"] = target.residual_stream(batch[:, :-1]).contiguous()

    # 2. one step's draft gradients: each rank its half of the batch; the variants that read no
    # feedback (a parameter without gradient) and no target activations (the blocks' forward)
    def sharded_draft(cfg, objective):  # as the sharded trainer builds it: on the meta device, then each rank's shards
        draft = SpireDraftModel.from_target(target, cfg, device="meta")
        step = fsdp.shard_units(ObjectiveModule(draft, objective), list(draft.blocks), fsdp.device_mesh(cpu, world), cpu)
        draft.to_empty(device=cpu)
        fsdp.init_spire_draft(draft, target)
        return draft, step

    for variant in VARIANTS:
        if sharded:
            draft, step = sharded_draft(ablation(variant, spire_cfg), obj)
            loss, _ = step(batch[rank::world])
        else:
            draft = SpireDraftModel.from_target(target, ablation(variant, spire_cfg))
            loss, _ = obj(draft, batch)
        loss.backward()
        for n, p in draft.named_parameters():
            if p.grad is not None:
                results[f"grad.{variant}.{n}"] = fsdp.full_tensor(p.grad).contiguous()

    # 2b. the draft's first weights, sharded: pruned from the sharded target's shards, or random_init's draws
    for variant in ("spire", "random_init"):
        torch.manual_seed(9)
        if sharded:
            draft, _ = sharded_draft(ablation(variant, spire_cfg), obj)
        else:
            draft = SpireDraftModel.from_target(target, ablation(variant, spire_cfg))
        for n, p in draft.named_parameters():
            results[f"init.{variant}.{n}"] = fsdp.full_tensor(p.detach()).contiguous()
        if variant == "random_init":  # the generator left where one process leaves it (train reseeds after a build)
            results[f"init.{variant}.rng"] = torch.rand(3)

    # 3. N steps through the trainer; 4. the same run stopped after step 2 and restarted, what the restart
    # reads recorded: rows of the checkpoint's tensors, files read whole, chunks hashed (in small chunks here)
    checkpoint.DIGEST_CHUNK = 4096
    reads, recording = [], []

    def recorded(kind, original, describe):
        def call(*args, **kwargs):
            if recording:
                reads.append([kind, *describe(*args, **kwargs)])
            return original(*args, **kwargs)
        return call

    checkpoint.Rows.read = recorded("rows", checkpoint.Rows.read, lambda rows, file, key, start=None, stop=None:
                                    [file, key, start, stop])
    checkpoint._sha256 = recorded("sha256", checkpoint._sha256, lambda path, offset=0, length=None:
                                  [Path(path).parent.name, Path(path).name, offset])
    checkpoint.load_file = recorded("whole", checkpoint.load_file, lambda path, *a, **k: [Path(path).name])
    for run, stops in (("full", (None,)), ("resumed", (2, None))):
        for stop in stops:
            target = new_target()
            draft = new_draft(target)
            recording[:] = [True] if run == "resumed" and stop is None else []
            result = train(draft, objective(target), docs, cfg,
                           run=TrainingRun(f"{out}/{name}-{run}", {"spire": spire_cfg.to_dict()}),
                           validation=Validation(docs), session=Session("cpu", "fsdp", progress=False, stop_at=stop))
        for k, v in result.model.state_dict().items():
            results[f"{run}.{k}"] = v.contiguous()
        results[f"{run}.val_loss"] = torch.tensor(result.summary["val_loss"])
    recording.clear()
    if sharded:
        by_rank = [None] * world
        dist.all_gather_object(by_rank, reads)
        if rank == 0:
            Path(f"{out}/{name}-reads.json").write_text(json.dumps(by_rank))
    loaded = SpireDraftModel(target_cfg, spire_cfg)  # the saved checkpoint, in this process alone
    load_checkpoint(result.path, loaded)
    for k, v in loaded.state_dict().items():
        results[f"loaded.{k}"] = v.contiguous()

    # 3b. a target's language-model training (`spire train target`): its blocks sharded through forward
    torch.manual_seed(11)
    lm = Transformer(target_cfg)
    lm_cfg = TrainConfig(batch_size=4, seq_len=16, steps=4, lr=1e-2, eval_windows=4)  # no micro-batches: DDP's
    # accumulation order alone moves one weight by 1.3e-5 here, as much under ddp as under fsdp
    result = train(lm, lm_objective, docs, lm_cfg, run=TrainingRun(f"{out}/{name}-lm", {"model": target_cfg.to_dict()}),
                   validation=Validation(docs), session=Session("cpu", "fsdp", progress=False))
    for k, v in result.model.state_dict().items():
        results[f"lm.{k}"] = v.contiguous()

    # 5. HF checkpoints loaded sharded, gathered back tensor by tensor (untied, tied embeddings)
    for kind in ("untied", "tied"):
        path = f"{sys.argv[2]}/{kind}"
        if sharded:
            from spirelib.training import hf_weights

            model = hf_weights.load_model_sharded(path, fsdp.device_mesh(cpu, world), device=cpu)
            for k, v in model.state_dict().items():
                results[f"hf.{kind}.{k}"] = fsdp.full_tensor(v).contiguous()
            results[f"hf.{kind}.stream"] = model.residual_stream(batch[:, :-1]).contiguous()

    # 6. more ranks than blocks: a one-block target and its one-block SPIRe draft (FSDP2 shards every
    # parameter over all ranks, whatever the number of blocks): the stream and one step's gradients
    torch.manual_seed(7)
    small = Transformer(ModelConfig(vocab_size=32, num_layers=1, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48))
    small.reset_parameters(0.3)
    small_draft = SpireDraftModel.from_target(small, SpireConfig(num_layers=1, sink=1, window=6, k=3))
    small_obj = objective(small)
    results["one_block.stream"] = small.residual_stream(batch[:, :-1]).contiguous()
    if sharded:
        step = fsdp.shard_units(ObjectiveModule(small_draft, small_obj), list(small_draft.blocks),
                                fsdp.device_mesh(cpu, world), cpu)
        loss, _ = step(batch[rank::world])
    else:
        loss, _ = small_obj(small_draft, batch)
    loss.backward()
    for n, p in small_draft.named_parameters():
        if p.grad is not None:
            results[f"one_block.grad.{n}"] = fsdp.full_tensor(p.grad).contiguous()

    # 7. EAGLE-3's draft (one layer, replicated under DDP) against the sharded target, its loss on the
    # target's replicated head (`training.eagle3.trained_eagle3_draft` under parallel: fsdp)
    from spirelib.model.config import Eagle3Config
    from spirelib.model.eagle3 import Eagle3DraftModel
    from spirelib.training.eagle3 import Eagle3Objective

    target = new_target()
    torch.manual_seed(13)
    eagle3 = Eagle3DraftModel.from_target(target, Eagle3Config(k=2))  # built whole before the target is sharded
    if sharded:
        head = fsdp.teacher_head(target)
        eagle3_obj = Eagle3Objective(fsdp.shard_frozen_target(target, fsdp.device_mesh(cpu, world), cpu), head)
    else:
        eagle3_obj = Eagle3Objective(target)
    result = train(eagle3, eagle3_obj, docs, TrainConfig(batch_size=4, seq_len=16, steps=3, lr=1e-2, eval_windows=4),
                   run=TrainingRun(f"{out}/{name}-eagle3", {"eagle3": 1}), validation=Validation(docs),
                   session=Session("cpu", "ddp", progress=False))
    for k, v in result.model.state_dict().items():
        results[f"eagle3.{k}"] = v.contiguous()

    if rank == 0:
        save_file(results, f"{out}/{name}.safetensors")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown at interpreter exit aborts now and then (tests/training/test_ddp.py)
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.training import hf_export

    torch.manual_seed(3)
    for kind in ("untied", "tied"):
        cfg = ModelConfig(vocab_size=32, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48,
                          tie_embeddings=kind == "tied")
        model = Transformer(cfg)
        model.reset_parameters(0.3)
        hf_export.save_model(model, tmp / "hf" / kind)
    script = tmp / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    sharded = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(script), str(tmp), str(tmp / "hf")], env=env, capture_output=True, text=True,
                             timeout=180, check=False)
    assert sharded.returncode == 0, sharded.stderr[-4000:]
    one = subprocess.run([sys.executable, str(script), str(tmp), str(tmp / "hf")], env=env, capture_output=True,
                         text=True, timeout=180, check=False)
    assert one.returncode == 0, one.stderr[-4000:]
    for mode in ("kill", "restart"):
        killed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 "2", str(script), str(tmp), str(tmp / "hf"), mode], env=env, capture_output=True,
                                text=True, timeout=180, check=False)
        assert (killed.returncode != 0) == (mode == "kill"), killed.stderr[-4000:]
    (tmp / "killed.log").write_text(killed.stdout)
    return load_file(tmp / "fsdp.safetensors"), load_file(tmp / "one.safetensors"), sharded.stdout, tmp / "hf"


def test_sharded_target_residual_stream_equals_single_process(runs):
    sharded, one, *_ = runs
    torch.testing.assert_close(sharded["stream"], one["stream"], rtol=0, atol=1e-6)


def test_one_spire_step_draft_gradients_equal_single_process(runs):
    """Catches a reduce-scatter that sums (gloo AVG under FSDP2, pytorch#162338): gradients x world.
    The draft's blocks are sharded and gathered per call of `fsdp.BLOCK_METHODS`, several a step."""
    sharded, one, *_ = runs
    grads = [k for k in one if k.startswith("grad.")]
    assert len(grads) == 16 + 15 + 15 and set(grads) == {k for k in sharded if k.startswith("grad.")}
    for k in grads:
        torch.testing.assert_close(sharded[k], one[k], rtol=1e-5, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")


def test_the_sharded_draft_starts_with_the_weights_one_process_builds(runs):
    """`fsdp.init_spire_draft`: the draft built on the meta device, sharded, each rank's shards copied
    from the sharded target's (pruned init) or drawn as one process draws them (random_init, one tensor
    at a time): `SpireDraftModel.from_target`'s weights exactly, and the generator left where it leaves it."""
    sharded, one, *_ = runs
    keys = [k for k in one if k.startswith("init.")]
    assert len(keys) == 2 * 16 + 1 and set(keys) == {k for k in sharded if k.startswith("init.")}
    for k in keys:
        assert torch.equal(sharded[k], one[k]), k
    assert not torch.equal(one["init.spire.body.embed.weight"], one["init.random_init.body.embed.weight"])


def test_n_fsdp_steps_give_single_process_weights(runs):
    """The SPIRe draft against the sharded target (2 micro-batches a rank), and a target's own
    language-model training (`spire train target`)."""
    sharded, one, *_ = runs
    keys = [k for k in one if k.startswith(("full.", "lm."))]
    assert len(keys) == 16 + 22
    for k in keys:
        torch.testing.assert_close(sharded[k], one[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    for k in (k for k in sharded if k.startswith("loaded.")):  # the fsdp checkpoint, loaded in one process
        assert torch.equal(sharded[k], sharded["resumed." + k[len("loaded."):]]), k


def test_eagle3_trains_against_the_sharded_target_as_in_one_process(runs):
    """EAGLE-3's draft (DDP, one layer) on two ranks against the FSDP2-sharded frozen target, its
    distillation read from the target's replicated head: three steps give one process's weights."""
    sharded, one, *_ = runs
    keys = [k for k in one if k.startswith("eagle3.")]
    assert len(keys) >= 10 and set(keys) == {k for k in sharded if k.startswith("eagle3.")}
    for k in keys:
        torch.testing.assert_close(sharded[k], one[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_fsdp_run_stopped_and_restarted_equals_uninterrupted(runs):
    sharded, one, *_ = runs
    for results in (sharded, one):
        for k in (k for k in results if k.startswith("full.")):
            assert torch.equal(results[k], results["resumed." + k[len("full."):]]), k


def test_a_sharded_resume_reads_each_ranks_rows_and_hashes_its_share(runs):
    """The restart of the stopped run: each rank reads its rows of every weight and AdamW moment
    (the two ranks' rows split each tensor, about half the bytes each; a 0-dim step whole; only the
    generators' file whole), where every rank read the whole checkpoint; the checkpoint's chunks are
    verified, and the next checkpoint's hashed when written, each rank its share."""
    from safetensors import safe_open

    folder = runs[3].parent
    by_rank = json.loads((folder / "fsdp-reads.json").read_text())
    ckpt = folder / "fsdp-resumed" / "checkpoint"
    assert [sorted({r[1] for r in reads if r[0] == "whole"}) for reads in by_rank] == [["rng.safetensors"]] * 2
    total, mine = {}, [0, 0]  # bytes by file, bytes read by each rank
    for file in ("model.safetensors", "optimizer.safetensors"):
        with safe_open(ckpt / file, framework="pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                ranges = [[(r[3], r[4]) for r in reads if r[:3] == ["rows", file, key]] for reads in by_rank]
                if not shape:  # AdamW's step
                    assert ranges == [[(None, None)]] * 2, key
                    continue
                assert [len(r) for r in ranges] == [1, 1], (key, ranges)
                (a, b), (c, d) = ranges[0][0], ranges[1][0]
                assert a == 0 < b == c < d == shape[0], (key, ranges)  # the rows split between the ranks
                row = 4 * math.prod(shape[1:])  # fp32
                total[file] = total.get(file, 0) + row * shape[0]
                mine = [mine[0] + row * (b - a), mine[1] + row * (d - c)]
    assert total["optimizer.safetensors"] == 2 * total["model.safetensors"]  # both moments
    assert all(abs(m / sum(total.values()) - 0.5) < 0.05 for m in mine), (mine, total)
    chunks = {(name, i * 4096) for name, entry in json.loads((ckpt / "meta.json").read_text())["files"].items()
              for i in range(len(entry["sha256"]))}
    assert len(chunks) > 20
    for folder_name in ("checkpoint", "checkpoint.tmp"):  # verified when resumed, hashed when written
        shares = [{(r[2], r[3]) for r in reads if r[:2] == ["sha256", folder_name]} for reads in by_rank]
        assert not shares[0] & shares[1] and shares[0] | shares[1] == chunks, folder_name
        assert all(len(share) >= len(chunks) // 2 for share in shares), folder_name


def test_fsdp_run_killed_mid_step_and_restarted_equals_uninterrupted(runs):
    """SIGKILL of rank 0 in step 3 (torchrun then ends rank 1); the restart resumes the step-2
    checkpoint (model, sharded optimizer state, RNG) and ends with the uninterrupted weights, exactly."""
    sharded, _, _, folder = runs
    killed = load_file(folder.parent / "killed.safetensors")
    log = (folder.parent / "killed.log").read_text()
    assert "calls 4" in log, log  # the restart ran steps 3 and 4 only: 2 micro-batches each
    for k, v in killed.items():
        assert torch.equal(v, sharded["full." + k]), k


def test_fsdp_over_more_ranks_than_blocks_trains(runs):
    """A one-block target and SPIRe draft over 2 ranks: FSDP2 splits every parameter over all ranks, so
    the stream and the draft's gradients are the single-process ones."""
    sharded, one, *_ = runs
    keys = [k for k in one if k.startswith("one_block.")]
    assert len(keys) > 5 and set(keys) == {k for k in sharded if k.startswith("one_block.")}
    for k in keys:
        torch.testing.assert_close(sharded[k], one[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def test_hf_checkpoint_loaded_sharded_equals_unsharded_load(runs):
    """`hf_weights.load_model_sharded` (meta device, block-by-block shards, each converted tensor placed
    with distribute_tensor) gives `hf_weights.load_model`'s weights and residual stream; tied embeddings stay tied."""
    from spirelib.training import hf_weights

    sharded, _, _, folder = runs
    batch = torch.randint(0, 32, (4, 17), generator=torch.Generator().manual_seed(1))
    for kind in ("untied", "tied"):
        whole = hf_weights.load_model(folder / kind)
        state = whole.state_dict()
        assert {k[len(f"hf.{kind}."):] for k in sharded if k.startswith(f"hf.{kind}.")} == {*state, "stream"}
        for k, v in state.items():
            assert torch.equal(sharded[f"hf.{kind}.{k}"], v), (kind, k)
        with torch.no_grad():
            torch.testing.assert_close(sharded[f"hf.{kind}.stream"], whole.residual_stream(batch[:, :-1]),
                                       rtol=0, atol=1e-6)


def test_per_rank_memory_model_and_the_fewest_ranks_that_fit():
    """`sharding.rank_memory`: fsdp divides the target and the draft state by N, ddp holds them whole;
    the 70B draft at the paper's ratio is 19B parameters; refusals name the fewest ranks."""
    from spirelib.throughput.sharding import rank_memory, smallest_world
    from spirelib.training import hf_weights

    ddp, fsdp = rank_memory("llama3-70b", "ddp", 8), rank_memory("llama3-70b", "fsdp", 8)
    assert ddp.target_weights == 8 * fsdp.target_weights == pytest.approx(141.1e9, rel=1e-3)
    assert ddp.draft_state == 8 * fsdp.draft_state == pytest.approx(16 * 19.21e9, rel=1e-3)
    assert fsdp.total == pytest.approx(99.1e9, rel=1e-3) and ddp.total > 5 * fsdp.total
    assert smallest_world("llama3-70b", "fsdp", 80e9) == 12 and smallest_world("llama3-70b", "ddp", 80e9) is None
    assert smallest_world("llama3-70b", "fsdp", 141e9) == 5
    # loading a 70B checkpoint (70.6B parameters, bf16) on one 80 GB device names the fewest ranks
    with pytest.raises(MemoryError, match=r"needs 141.1 GB; .*parallel: fsdp over at least 2 ranks"):
        hf_weights.check_memory(70_553_706_496, torch.bfloat16, "cuda", 80 * 10**9, largest=1_050_673_152)
    with pytest.raises(MemoryError, match=r"needs 39.5 GB per rank \(of 4\); .*at least 5 ranks"):
        hf_weights.check_memory(70_553_706_496, torch.bfloat16, "cuda", 36 * 10**9, world=4, largest=1_050_673_152)
    hf_weights.check_memory(70_553_706_496, torch.bfloat16, "cuda", 80 * 10**9, world=2, largest=1_050_673_152)


def _tiny_hf_target(folder: Path, num_layers: int) -> None:
    """A Llama-shaped checkpoint at scaled-down shapes with a tiny BPE tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer
    from spirelib.training import hf_export, hf_tokenizer

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the cat sat on the mat", "a dog ate the hat"] * 10, trainer)
    torch.manual_seed(7)
    model = Transformer(ModelConfig(vocab_size=320, num_layers=num_layers, d_model=32, n_q_per_kv=2, n_kv=2,
                                    d_head=8, d_ff=48, rope_base=500000.0))
    model.reset_parameters(0.1)
    hf_export.save_model(model, folder, tokenizer=hf_tokenizer.HFTokenizer(tok, 2))


def test_llama3_70b_example_dry_runs_sharded_under_torchrun_and_loads_in_one_process(tmp_path, monkeypatch):
    """params/llama3-70b.yaml's dry run at scaled-down shapes (an 8-layer stand-in for the 70B target,
    the draft a quarter of it): `torchrun -m spirelib train spire` on 2 gloo ranks loads the HF target
    sharded, trains the draft under fsdp and caches it; one process then loads that draft (no training)."""
    import yaml

    from spirelib.training.params import load_params
    from spirelib.training.series import Series, dry_run

    root = Path(__file__).resolve().parents[2]
    params = load_params(root / "params" / "llama3-70b.yaml")
    assert params["series"]["parallel"] == "fsdp" and params["series"]["spire"]["num_layers"] == 20
    _tiny_hf_target(tmp_path / "target", num_layers=8)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["the", "cat", "sat", "on", "the", "mat", "a", "dog", "ate", "the", "hat"]
    rng = torch.Generator().manual_seed(0)
    for i in range(10):
        ids = torch.randint(0, len(words), (400,), generator=rng).tolist()
        (corpus / f"doc{i}.txt").write_text(" ".join(words[j] for j in ids))
    series = dry_run({**params["series"], "target_source": f"hf:{tmp_path / 'target'}", "corpus": "text",
                      "corpus_path": str(corpus), "spire": {**params["series"]["spire"], "num_layers": 2}})
    series["spire_training"]["batch_size"] = 2  # a window per rank
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({**params, "series": series}))
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "SPIRE_CACHE_DIR": str(tmp_path / "cache"),
           "SPIRE_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "spirelib", "train", "spire", "--params", str(tmp_path / "p.yaml"), "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "'world_size': 2" in run.stdout, run.stdout
    for name in ("SPIRE_CACHE_DIR", "SPIRE_DATA_DIR"):
        monkeypatch.setenv(name, env[name])
    trained = Series.from_dict(series).trained_spire_draft(progress=False)
    assert trained.result.reused and trained.summary["world_size"] == 2
    assert trained.model.cfg.num_layers == 2 and trained.model.target_layers == 8


def test_parallel_is_a_validated_series_field_with_ddp_the_default():
    from spirelib.training.series import Series, SeriesError

    assert Series().parallel == "ddp" and "parallel" not in Series().to_dict()  # older params files unchanged
    s = Series.from_dict({"parallel": "fsdp"})
    assert s.to_dict()["parallel"] == "fsdp" and Series.from_dict(s.to_dict()) == s
    with pytest.raises(SeriesError, match=r"parallel: must be one of \['ddp', 'fsdp'\], got 'zero3'"):
        Series.from_dict({"parallel": "zero3"})
    with pytest.raises(SeriesError, match="parallel: expected str"):
        Series.from_dict({"parallel": 2})


def test_spire_train_refuses_a_batch_that_does_not_split_over_the_ranks_before_any_compute(tmp_path, monkeypatch,
                                                                                          capsys):
    """`spire train` under torchrun (WORLD_SIZE) checks the ranks against the series before reading data:
    a batch of 8 does not split over 3 ranks. More ranks than blocks is no problem under fsdp."""
    import yaml

    from spirelib import cli
    from spirelib.training.series import Series

    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"series": {"parallel": "fsdp"}}))
    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "no-data"))  # nothing may be read or written
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert cli.main(["train", "target", "--params", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "over 3 ranks: 1 problem" in err and "target_training.batch_size: 8 windows do not split over 3 ranks" in err
    assert not (tmp_path / "no-data").exists()
    # the smoke SPIRe draft has 1 block, the target 2: fine over 2 (and 8) ranks
    assert Series.from_dict({"parallel": "fsdp"}).rank_problems("spire", 2) == []
    assert Series.from_dict({"parallel": "fsdp"}).rank_problems("spire", 8) == []
