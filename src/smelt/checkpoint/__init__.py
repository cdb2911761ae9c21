"""Checkpoints written with torch.distributed.checkpoint, verified by checksums, committed by a marker."""

from smelt.checkpoint.store import (
    latest_checkpoint,
    list_checkpoints,
    load_model,
    load_training_state,
    prune_checkpoints,
    read_meta,
    save_checkpoint,
)

__all__ = [
    "latest_checkpoint",
    "list_checkpoints",
    "load_model",
    "load_training_state",
    "prune_checkpoints",
    "read_meta",
    "save_checkpoint",
]
