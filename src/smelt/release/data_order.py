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
from smelt.layout import step_dir_name
from smelt.manifest import hash_file, write_json
from smelt.tokens.batches import INDEX, ORDER_DIR, index_header, order_file_name, write_order_file


class RunData:
    """The run's training loader and batch plan, rebuilt as the trainer built them."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]):
        import dataclasses

        from smelt.config import config_from_dict
        from smelt.tokens.loader import TokenLoader
        from smelt.train.batching import batch_plan

        if "config" not in meta:
            raise UserError(
                f"the checkpoints of {run_dir} do not record their config (meta.json has no 'config'), so their "
                f"data order cannot be rebuilt; release a run trained by `smelt train`."
            )
        cfg = config_from_dict(meta["config"], origin=f"{run_dir} checkpoint meta.json")
        world_size = int(meta.get("world_size") or 1)
        self.plan = batch_plan(cfg.train, world_size)
        # With a batch ramp the loader's step is the starting batch and an optimizer step takes several.
        loader_cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, batch_tokens=self.plan.loader_batch_tokens)
        )
        self.loader = TokenLoader.from_config(
            loader_cfg, run_dir / "tokens", run_dir / "tokenizer", world_size=world_size, verify="size"
        )

    def loader_step(self, step: int) -> int:
        """Loader steps consumed after optimizer step `step`."""
        if not self.plan.units or step == 0:
            return step
        return self.plan._consumed[step - 1]

    def loader_steps(self, step: int) -> range:
        """The loader steps optimizer step `step` trained on."""
        return range(self.loader_step(step - 1) + 1, self.loader_step(step) + 1)

    def global_batches(self, step: int) -> list[Any]:
        """What the loader produced for optimizer step `step`: one global batch per loader step."""
        return [self.loader.global_batch(u) for u in self.loader_steps(step)]


def loader_for_run(run_dir: Path, meta: dict[str, Any]) -> RunData:
    return RunData(run_dir, meta)


def check_state(data: RunData, meta: dict[str, Any], name: str) -> None:
    """A UserError when the rebuilt loader is not the one whose state checkpoint `name` saved."""
    loader = data.loader
    state = meta.get("loader") or {}
    step = data.loader_step(int(meta.get("step", -1)))
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
    data = RunData(run_dir, checkpoints[-1][1])
    loader = data.loader
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
        check_state(data, meta, step_dir_name(step))
        path = order_dir / order_file_name(step)
        before, after = loader.cursors(data.loader_step(previous)), loader.cursors(data.loader_step(step))
        steps = [(k, data.loader_steps(k)) for k in range(previous + 1, step + 1)]
        entries.append(
            {
                "step": step,
                "first_step": previous + 1,
                "last_step": step,
                "rows": write_order_file(loader, steps, path),
                "tokens": (data.loader_step(step) - data.loader_step(previous))
                * loader.batch_size
                * loader.seq_len,
                "tokens_by_source": {name: (after[name] - before[name]) * loader.seq_len for name in after},
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
