"""Checkpoints written with torch.distributed.checkpoint, verified by checksums, committed by a marker."""

from __future__ import annotations

from typing import Any

__all__ = [
    "latest_checkpoint",
    "list_checkpoints",
    "load_model",
    "load_training_state",
    "prune_checkpoints",
    "read_meta",
    "save_checkpoint",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so that `smelt.cli.checkpoint` builds its parsers without torch.
    if name in __all__:
        from smelt.checkpoint import store

        return getattr(store, name)
    raise AttributeError(f"module 'smelt.checkpoint' has no attribute {name!r}")
