"""A layout of `smelt plan memory` as the `[train]` keys that train it (train/parallel/mesh.py reads them)."""

from __future__ import annotations

from typing import Any

from smelt.config.train import LAYOUT_KEYS
from smelt.plan.memory import Layout


def train_keys(layout: Layout, global_batch_tokens: int) -> tuple[dict[str, Any], list[str]]:
    """The `[train]` keys that train `layout` (see train/parallel/mesh.py), and the parts smelt cannot train yet
    (none today: every layout the planner weighs has its keys).

    ZeRO 0 is train.parallel = "ddp"; ZeRO 1 to 3 are "fsdp": FSDP2 shards weights, gradients and
    optimizer state, so it needs no more memory per GPU than the stage the plan assumed (and exchanges
    more: weights are gathered per layer). The global batch becomes train.batch_tokens, which the
    trainer splits into micro batches per data-parallel rank and accumulation steps itself. Pipeline
    stages are train.pipeline_parallel with the 1F1B schedule (the default, train.pipeline_schedule),
    which the plan's activation memory assumes; a pipelined model must have untied embeddings
    (`smelt train --check` names model.tie_embeddings otherwise).

    The parallel keys are the run's layout (config/train.py LAYOUT_KEYS): a run resumes from its checkpoints
    under another layout. seq_len, micro_batch and batch_tokens are its plan, kept for its whole life.
    """
    keys: dict[str, Any] = {
        "parallel": "fsdp" if layout.zero >= 1 else "ddp",
        "data_parallel": layout.dp,
        "tensor_parallel": layout.tp,
        "pipeline_parallel": layout.pp,
        "seq_len": layout.seq_len,
        "micro_batch": layout.micro_batch,
        "batch_tokens": global_batch_tokens,
    }
    not_built: list[str] = []
    return keys, not_built


def train_keys_toml(layout: Layout, global_batch_tokens: int) -> str:
    """`train_keys` as a `[train]` table to paste into a run config."""
    keys, _ = train_keys(layout, global_batch_tokens)
    lines = ["[train]"]
    for key, value in keys.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
    return "\n".join(lines)


def print_train_keys(layout: Layout, global_batch_tokens: int) -> dict[str, Any]:
    """Print the recommended layout's keys (and what of it is not built); returns them for --json."""
    keys, not_built = train_keys(layout, global_batch_tokens)
    print(
        f"\nthe layout as config keys (`smelt train --check` checks them):\n{train_keys_toml(layout, global_batch_tokens)}"
    )
    layout = ", ".join(key for key in keys if key in LAYOUT_KEYS)
    plan = ", ".join(key for key in keys if key not in LAYOUT_KEYS)
    print(
        f"# {layout}: the layout, which an interrupted run may change when it resumes;\n"
        f"# {plan}: the plan, kept for the run's life"
    )
    for missing in not_built:
        print(f"\nnot built: {missing}")
    return {"train_keys": keys, "not_built": not_built}
