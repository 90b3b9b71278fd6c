"""A worker script under torchrun (2 CPU ranks) and the same script in one process, its
reference, run at the same time (`ranks_and_reference`): each process starts by importing torch,
seconds of one core each, and the torchrun launcher mostly waits, so on two cores the reference
runs while the ranks start, where one after the other costs a whole start more."""

from __future__ import annotations

import subprocess
import sys

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def ranks_and_reference(script, ranks_args: list[str], reference_args: list[str], env: dict, timeout: float):
    """(torchrun's CompletedProcess, the reference's), each with its return code and its output
    as text; neither is checked here."""
    reference = subprocess.Popen([sys.executable, str(script), *reference_args], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ranks = subprocess.run([*TORCHRUN, str(script), *ranks_args], env=env, capture_output=True, text=True,
                               timeout=timeout)
        out, err = reference.communicate(timeout=timeout)
    finally:
        if reference.poll() is None:  # torchrun timed out or failed to start: do not leave the reference running
            reference.kill()
            reference.communicate()
    return ranks, subprocess.CompletedProcess(reference.args, reference.returncode, out, err)
