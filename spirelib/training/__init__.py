"""Training and data (layer 5): corpora, tokenizers, the trainer, checkpoints, Hugging Face
checkpoints in and out, the recipes and the series configuration. Imports the models, decoding,
measurement and the numpy model below it, never the workbook (docs/ARCHITECTURE.md)."""
