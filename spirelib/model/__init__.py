"""The models (layer 2): the transformer every target and draft is built from, rotary positions,
the KV caches and their visibility rule, the fused cross-entropy, and the SPIRe draft's
architecture with its k-pass attention (method §2-3). Imports `spirelib.throughput` and the base."""
