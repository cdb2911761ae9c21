"""The data order of a release: per released checkpoint, the token ranges of every batch since the
previous one, reconstructed from the loader's plan and checked against each checkpoint's saved state.

The format and the replay are `smelt.tokens.batches`; this module decides what is written: it rebuilds
the training loader from the config a checkpoint recorded, checks that the rebuilt plan is the one
that checkpoint's loader state names (plan fingerprint, sizes, seed, per-source cursors at its step),
and writes one file per released checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.manifest import hash_file, write_json
from smelt.tokens.batches import INDEX, ORDER_DIR, index_header, order_file_name, write_order_file


def loader_for_run(run_dir: Path, meta: dict[str, Any]) -> Any:
    """The training loader of the run, from the config the checkpoint recorded (shards sizes verified)."""
    from smelt.config import config_from_dict
    from smelt.tokens.loader import TokenLoader

    if "config" not in meta:
        raise UserError(
            f"the checkpoints of {run_dir} do not record their config (meta.json has no 'config'), so their "
            f"data order cannot be rebuilt; release a run trained by `smelt train`."
        )
    cfg = config_from_dict(meta["config"], origin=f"{run_dir} checkpoint meta.json")
    return TokenLoader.from_config(cfg, run_dir / "tokens", run_dir / "tokenizer", verify="size")


def check_state(loader: Any, meta: dict[str, Any], name: str) -> None:
    """A UserError when the rebuilt loader is not the one whose state checkpoint `name` saved."""
    state = meta.get("loader") or {}
    step = int(meta.get("step", state.get("step", -1)))
    expected = {
        "step": step,
        "split": loader.split,
        "seq_len": loader.seq_len,
        "batch_size": loader.batch_size,
        "seed": loader.seed,
        "sources": {s.name: s.sequences for s in loader.streams},
        "plan": loader.plan.fingerprint(),
    }
    if 0 <= step <= loader.plan.steps:
        expected["cursors"] = loader.cursors(step)
    different = [
        f"{key} saved {state.get(key)!r}, rebuilt {value!r}"
        for key, value in expected.items()
        if state.get(key) != value
    ]
    if different:
        raise UserError(
            f"checkpoint {name}: the data plan rebuilt from its config does not match the loader state it "
            f"saved ({'; '.join(different)}), so its data order cannot be reconstructed exactly. The run's "
            f"token shards or config changed after training; release from the run as it was trained."
        )


def write_data_order(
    run_dir: Path, checkpoints: list[tuple[int, dict[str, Any]]], out_dir: Path, shards_json: dict[str, Any]
) -> dict[str, Any]:
    """Write OUT/data_order/: one file per (step, meta) in `checkpoints` (ascending steps) and the index.

    Returns the index. `shards_json` is the tokens stage's shards.json, for each shard's sha256.
    """
    order_dir = out_dir / ORDER_DIR
    loader = loader_for_run(run_dir, checkpoints[-1][1])
    index = index_header(loader)
    index["tokens_dir"] = str((run_dir / "tokens").resolve())
    recorded = shards_json.get("splits", {}).get(loader.split, {})
    for rel, entry in index["shards"].items():
        _split, source, name = rel.split("/")
        for row in recorded.get(source, {}).get("shards", []):
            if f"{row['shard']}.bin" == name:
                entry["sha256"], entry["idx_sha256"] = row.get("sha256"), row.get("idx_sha256")
    entries = []
    previous = 0
    for step, meta in checkpoints:
        check_state(loader, meta, f"step_{step:07d}")
        path = order_dir / order_file_name(step)
        before = loader.cursors(previous)
        rows = write_order_file(loader, previous + 1, step, path)
        entries.append(
            {
                "step": step,
                "first_step": previous + 1,
                "last_step": step,
                "rows": rows,
                "tokens": (step - previous) * loader.batch_size * loader.seq_len,
                "tokens_by_source": {
                    name: (now - before[name]) * loader.seq_len for name, now in loader.cursors(step).items()
                },
                "file": path.name,
                "sha256": hash_file(path),
            }
        )
        previous = step
    index["checkpoints"] = entries
    write_json(order_dir / INDEX, index)
    return index


def tokens_per_source(index: dict[str, Any]) -> dict[str, int]:
    """Training tokens each source gave up to the last released checkpoint."""
    counts: dict[str, int] = {}
    for entry in index["checkpoints"]:
        for name, tokens in entry["tokens_by_source"].items():
            counts[name] = counts.get(name, 0) + tokens
    return counts


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
