"""The torch engine (layer 2): the transformer, caches, sampling, the speculative round loop, the
drafting methods (vanilla, MagicDec, SPIRe with its k-pass training objective), tau and timing.
Imports `spirelib.modeling` and the base modules only (docs/ARCHITECTURE.md)."""
