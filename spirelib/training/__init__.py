"""Training and data (layer 3): corpora, tokenizers, the trainer, checkpoints, Hugging Face
checkpoints in and out, the recipes and the series configuration. Imports the engine and the
numpy model below it, never the workbook (docs/ARCHITECTURE.md)."""
