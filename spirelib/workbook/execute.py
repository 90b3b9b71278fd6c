"""One notebook executed headlessly with papermill (`spire run`'s kernels; docs/ARCHITECTURE.md).

The part of `spire run` that needs the notebook extra (papermill, jupyter_client): the runner
imports this module only when it executes notebooks, so `spire check`, `train`, `bench` and
`deploy` start on a core install. Parameters are injected as readable blocks (`ReadableTranslator`),
and a finished notebook's kernel is stopped outright, without jupyter_client's SIGINT first
(`QuietShutdownKernelManager`, `SHUTDOWN`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import papermill
from jupyter_client.manager import AsyncKernelManager
from papermill.translators import PythonTranslator, papermill_translators

from spirelib.frontend import HEADLESS_ENV, PROGRESS_ENV
from spirelib.workbook import results


@contextlib.contextmanager
def _environment(**values: str):
    """Set environment variables for the kernels started inside, restoring them afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]  # ipykernel warns on every start otherwise


class QuietShutdownKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager (nbclient's default), except that shutting a kernel down
    does not interrupt it first. jupyter_client sends SIGINT before every shutdown; the kernel of a
    finished notebook is idle, and ipykernel reports the signal on the runner's terminal as
    "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." after every notebook."""

    async def _async_interrupt_kernel(self) -> None:
        if not self.shutting_down:
            await super()._async_interrupt_kernel()


#: How nbclient stops a kernel once its notebook is done (or failed, or timed out): killed with its
#: process group, not asked to shut down. Every cell's outputs have arrived by then and every file a
#: cell writes is written; a shutdown request instead races in ipykernel 7 (its control handler
#: flushes stderr into the IOPub pipe the shutdown is closing) and tornado then prints "ERROR ...
#: ZMQError: Socket operation on non-socket" with a traceback on the runner's terminal.
SHUTDOWN = "immediate"

INJECTED_WIDTH = 120  # no line of an injected parameters cell is longer


def python_literal(value, indent: int = 0, column: int = 0, width: int = INJECTED_WIDTH) -> str:
    """`value` (plain YAML data) as a Python literal that reads as a block: on one line when it fits
    in `width` from `column`, where it starts, else a dict or list with one entry per line, indented
    by 4 from `indent` (its line's indentation) and nested the same way."""
    flat = PythonTranslator.translate(value)
    if column + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        keys = [f"{PythonTranslator.translate_str(k)}: " for k in value]
        items = [f"{pad}{key}{python_literal(v, indent + 4, indent + 4 + len(key) + 1, width)},"
                 for key, v in zip(keys, value.values())]  # + 1: the comma
        opening, closing = "{", "}"
    else:
        items = [f"{pad}{python_literal(v, indent + 4, indent + 5, width)}," for v in value]
        opening, closing = "[", "]"
    return opening + "\n" + "\n".join(items) + "\n" + " " * indent + closing


class ReadableTranslator(PythonTranslator):
    """papermill's Python translator, writing each injected parameter as a block (`python_literal`)
    instead of one line: a report's series section (600 characters) reads as the params file did."""

    @classmethod
    def codify(cls, parameters, comment="Parameters"):
        lines = [cls.comment(comment)] + [f"{name} = {python_literal(value, 0, len(name) + 3)}"
                                          for name, value in parameters.items()]
        return "\n".join(lines) + "\n"


papermill_translators.register("python", ReadableTranslator)


@dataclass(frozen=True)
class Kernels:
    """How `spire run` executes every notebook of a run: in the folder `cwd` (the series'), on the
    Jupyter kernel `kernel`, each cell within `cell_timeout` seconds (None: no limit), cell output
    streamed through logging with `log_output`; `dry_run`: every budget scaled down (the runner's
    `--dry-run`)."""

    cwd: Path
    log_output: bool
    kernel: str
    cell_timeout: float | None
    dry_run: bool


def execute(nb: Path, parameters: dict, out_dir: Path, kernels: Kernels, feed: Path | None = None):
    """Run one notebook with papermill as `kernels` says: (status, seconds, error message or None). A
    dry run's models go to <out>/cache unless SPIRE_CACHE_DIR says where. The kernel's progress bars
    feed the file `feed` (`spirelib.workbook.progress`)."""
    nb_results = out_dir / "results" / f"{nb.stem}.json"
    for stale in (nb_results, out_dir / f"{nb.stem}.ipynb", out_dir / f"{nb.stem}.html"):
        stale.unlink(missing_ok=True)  # never report an earlier run's notebook as this one's
    start = time.perf_counter()
    env = {results.RESULTS_FILE_ENV: str(nb_results.resolve()),
           results.RUN_RESULTS_ENV: str((out_dir / "results.json").resolve()),
           HEADLESS_ENV: "1", PROGRESS_ENV: str(feed.resolve()) if feed else ""}
    if kernels.dry_run and not os.environ.get("SPIRE_CACHE_DIR"):
        env["SPIRE_CACHE_DIR"] = str((out_dir / "cache").resolve())
    try:
        with _environment(**env):
            papermill.execute_notebook(str(nb), str(out_dir / f"{nb.stem}.ipynb"), parameters=parameters,
                                       cwd=str(kernels.cwd), kernel_name=kernels.kernel,
                                       log_output=kernels.log_output, progress_bar=False,
                                       extra_arguments=_QUIET_KERNEL, execution_timeout=kernels.cell_timeout,
                                       kernel_manager_class=QuietShutdownKernelManager, shutdown_kernel=SHUTDOWN)
        return "ok", time.perf_counter() - start, None
    except papermill.PapermillExecutionError as e:
        return "failed", time.perf_counter() - start, f"{e.ename}: {e.evalue}"
    except KeyboardInterrupt:
        return "interrupted", time.perf_counter() - start, "interrupted by the user"
    except Exception as e:  # kernel death, timeouts: the run record says what happened
        return "failed", time.perf_counter() - start, f"{type(e).__name__}: {e}"
