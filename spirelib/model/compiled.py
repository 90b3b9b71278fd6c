"""Decode-time forwards as torch.compile graphs: how every model compiles one (`compile_for_decoding`)
and what a draft model with a compiled step shares (`CompiledStep`: SPIRe's and EAGLE-3's)."""

from __future__ import annotations

import torch


def compile_for_decoding(fn, device: torch.device):
    """`fn` compiled as a decoding forward: one graph without breaks and one static graph per
    shape (never dynamic ones: a graph symbolic in B or S, which dynamo would otherwise make at
    the second shape it sees, runs its kernels without the shape's constants, measurably slower
    at every cell but the first); on CPU C++ kernels called from C++ (the Python wrapper would
    cost about as much as the kernels at B = 1), on CUDA Triton kernels that a decoding round's
    graph captures whole (`decoding.graphs`: one graph a round, not one a forward)."""
    # Every model's graphs count against one code object's limit (the default 8 recompiles): the
    # target's, the drafts' and the profiling pass's shapes (prefills and steps of a whole grid),
    # kinds (dense, ring) and outputs.
    for limit in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 512))
    options = {} if device.type == "cuda" else {"options": {"cpp_wrapper": True}}
    return torch.compile(fn, fullgraph=True, dynamic=False, **options)


class CompiledStep:
    """What a draft model whose decoding `_step` can run compiled shares (SPIRe's, EAGLE-3's): the
    compiled step or None (`compile_step`), whether it runs compiled, and copies that leave it
    behind (a copy, or a pickle, compiles its own: `drafts.in_dtype`). Mixed in before
    `nn.Module`."""

    _compiled_step = None  # `_step`, compiled (`compile_step`)

    @property
    def compiled_decoding(self) -> bool:
        """Whether `step` runs compiled."""
        return self._compiled_step is not None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_compiled_step", None)
        return state

    def compile_step(self, enabled: bool, device: torch.device) -> None:
        """Run `_step` as one compiled graph on `device` (`compile_for_decoding`), or, with `enabled`
        False, eagerly again (the reference)."""
        self._compiled_step = compile_for_decoding(self._step, device) if enabled else None

    def run_step(self, *args):
        """`_step(*args)`, through its compiled graph where there is one."""
        return (self._compiled_step or self._step)(*args)
