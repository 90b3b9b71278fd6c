"""What a run leaves on the terminal, its kernels' writes included (`terminal_output`)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile


@contextlib.contextmanager
def terminal_output():
    """Collects what would reach the terminal inside: this process's prints (sys.stdout) and every
    write to file descriptors 1 and 2, which the kernels it starts inherit. Yields a list that
    holds the text once the block is left."""
    collected: list[str] = []
    printed = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+") as fds:
        os.dup2(fds.fileno(), 1)
        os.dup2(fds.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield collected
        finally:
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            fds.seek(0)
            collected.append(printed.getvalue() + fds.read())
