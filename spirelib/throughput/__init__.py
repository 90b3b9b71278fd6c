"""The numpy model (layer 1): the paper's throughput model, acceptance, hardware, costs and the
profiled cost model. Needs numpy only; imports nothing from the layers above (docs/ARCHITECTURE.md)."""
