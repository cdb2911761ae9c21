"""Packaging a run for others: checkpoints as Hugging Face revisions, the data order, cards, verification."""
