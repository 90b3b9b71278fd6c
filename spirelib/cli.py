"""`spire`: the workbook's one command line (also `python -m spirelib`, the form torchrun runs).

    spire run    --params params/default.yaml        run the notebook series, write the HTML reports
    spire check  --params params/paper.yaml          validate a params file against the notebooks
    spire train  {target,vanilla,spire} --params P   train and cache one of the series' models
    spire data   {fetch,fixture} ...                 the default corpus; a LongCrawl64 fixture
    spire bench  {decode,memory,...} [options]       benchmarks (tokens/s, MFU, roofline, memory)
    spire deploy outputs/default --hardware h100-sxm  per draft a batch-size -> k schedule for serving engines

Every subcommand checks all of its input before any compute and exits 2 naming every problem.
`spire train` runs under torchrun as it is (one process per device), e.g.

    torchrun --nproc_per_node 8 -m spirelib train target --params params/paper.yaml

(with `parallel: fsdp` in the series, the target and the trained model are sharded over the ranks,
docs/scaling-out.md), and the notebooks (or `spire run`) then load the cached checkpoints.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

MODELS = ("target", "vanilla", "spire", "eagle3")


def _lazy(module: str, name: str, *bound):
    """`module.name(*bound, *args)`, the module imported when it is called: a command imports only
    what it runs (`spire deploy` reads JSON with numpy and needs no torch)."""
    def call(*args):
        return getattr(importlib.import_module(module), name)(*args, *bound)
    return call


# ---------------------------------------------------------------------------- spire train

def _train_arguments(parser: argparse.ArgumentParser) -> None:
    from spirelib.model.config import ABLATIONS

    parser.add_argument("model", choices=MODELS, help="which of the series' models (the drafts need the target; "
                                                      "a cached target is loaded, a missing one trained first)")
    parser.add_argument("--params", type=Path, required=True, help="a params/*.yaml file; its series section is used")
    parser.add_argument("--variant", default="spire", metavar="NAME",
                        help=f"SPIRe only: an ablation of the draft (default spire; one of {', '.join(ABLATIONS)})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _train(args: argparse.Namespace) -> int:
    """Train (or load) the series' `args.model` into the model cache. Under torchrun every rank runs
    this; rank 0 tokenizes and caches the data first, the others then read that cache."""
    from spirelib.model.config import ABLATIONS
    from spirelib.training.params import ParamsError, load_params
    from spirelib.training.series import Series, problems

    try:
        section = load_params(args.params)["series"]
    except (ParamsError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = [f"series.{p}" for p in problems(section)]
    if args.variant not in ABLATIONS:
        found.append(f"--variant {args.variant}: no such SPIRe variant; choose from {', '.join(ABLATIONS)}")
    elif args.variant != "spire" and args.model != "spire":
        found.append(f"--variant {args.variant}: only the spire draft has variants, not the {args.model}")
    if found:
        print(f"error: {args.params}: {len(found)} problem{'s' * (len(found) > 1)}, nothing was run:\n  "
              + "\n  ".join(found), file=sys.stderr)
        return 2
    series = Series.from_dict(section)
    world = int(os.environ.get("WORLD_SIZE", 1))
    found = series.rank_problems(args.model, world)
    if found:
        print(f"error: {args.params} over {world} ranks: {len(found)} problem{'s' * (len(found) > 1)}, nothing was "
              "run:\n  " + "\n  ".join(found), file=sys.stderr)
        return 2
    if world > 1:
        import torch.distributed as dist

        from spirelib.training.devices import init_distributed, resolve_device

        if init_distributed(resolve_device(series.device))[0] == 0:
            series.data()
        dist.barrier()
    progress = not args.no_progress
    run = {"target": lambda: series.trained_target(progress),
           "vanilla": lambda: series.trained_vanilla_draft(progress),
           "spire": lambda: series.trained_spire_draft(args.variant, progress=progress),
           "eagle3": lambda: series.trained_eagle3_draft(progress)}[args.model]()
    print(f"{run.result.path.parent.name}: {run.summary}")
    if world > 1:  # gloo's and nccl's threads must not outlive the interpreter
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------- spire bench

def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from spirelib import bench

    names = parser.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(bench.available()) + "}")
    for name, module in bench.available().items():
        summary = module.__doc__.split("\n\n")[0].split(": ", 1)[-1]
        sub = names.add_parser(name, help=summary, description=module.__doc__.split("\n\n")[0]
                               + "\n\nMore: the docstring of spirelib.bench." + name.replace("-", "_"),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(module=module)


def _bench(args: argparse.Namespace) -> int:
    found = args.module.problems(args)
    if found:
        print(f"error: spire bench {args.bench}: {len(found)} problem{'s' * (len(found) > 1)}, nothing was run:\n  "
              + "\n  ".join(found), file=sys.stderr)
        return 2
    return args.module.main(args) or 0


# ---------------------------------------------------------------------------- the program

COMMANDS = {  # name -> (one line of help, add the arguments, run)
    "run": ("run the notebook series and write the HTML reports and their index",
            _lazy("spirelib.workbook.runner", "add_arguments", "run"), _lazy("spirelib.workbook.runner", "command")),
    "check": ("check a params file against the series and the notebooks; run nothing",
              _lazy("spirelib.workbook.runner", "add_arguments", "check"), _lazy("spirelib.workbook.runner", "command")),
    "train": ("train (or load) one of the series' models into the cache; torchrun-ready", _train_arguments, _train),
    "data": ("fetch the default corpus, or write a LongCrawl64 fixture", _lazy("spirelib.training.corpus", "add_arguments"),
             _lazy("spirelib.training.corpus", "command")),
    "deploy": ("a finished run's batch-size -> k schedules for vLLM, SGLang and TensorRT-LLM (docs/deploy.md)",
               _lazy("spirelib.workbook.deploy", "add_arguments"), _lazy("spirelib.workbook.deploy", "command")),
    "bench": ("benchmarks: decoding tokens/s and roofline, training MFU, memory, the model's speed",
              _bench_arguments, _bench),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `command`, only that command's arguments are added (the others are
    listed, and import nothing)."""
    top = argparse.ArgumentParser(prog="spire", description=__doc__.split("\n\n")[0],
                                  epilog="`spire COMMAND --help` says more about each.")
    commands = top.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (summary, configure, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        if command is None or name == command:
            configure(sub)
        sub.set_defaults(run=run)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = parser(chosen if chosen in COMMANDS else None).parse_args(argv)
    return args.run(args)
