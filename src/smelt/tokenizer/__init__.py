"""Tokenizer stage: train byte-level BPE tokenizers (train.py) and load them (load.py)."""
