"""The data order: the exact token ranges of every training batch, written down and replayed.

The loader computes each step's global batch from the step alone (`smelt.tokens.loader`). A data
order file writes that computation out, so that someone holding only the token shards (and not
smelt's plan, seed or mixture code) can retrieve the exact tokens a checkpoint was trained on, as
LLM360 publishes its data chunks:

- `data_order/index.json`: the split, seq_len, global batch size, the shards (path relative to the
  tokens directory, tokens, sha256), the FIM settings, and one entry per checkpoint: its step, the
  steps its file covers (those since the previous released checkpoint) and the file's sha256;
- `data_order/step_NNNNNNN.jsonl.gz`: one JSON line per row of each global batch,
  `{"step", "row", "source", "sequence", "epoch", "ranges": [[shard, offset, length], ...]}`, where
  offset and length count tokens (not bytes) in that shard's `.bin`; a row is seq_len + 1 tokens
  (inputs and targets), usually one range, two where the window crosses a shard.

`replay_rows` reads the ranges back, finds document boundaries in the shards' `.idx` files, applies
the same FIM rewrite (a seeded function of the row) and packs the rows exactly as the loader does.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from smelt.errors import UserError
from smelt.jsonl import json_objects
from smelt.layout import step_dir_name
from smelt.tokens.decoded import decode_segments, segment_starts
from smelt.tokens.shards import ShardSet

ORDER_DIR = "data_order"
INDEX = "index.json"
FORMAT = 1


def order_file_name(step: int) -> str:
    return f"{step_dir_name(step)}.jsonl.gz"


def shard_table(loader: Any) -> dict[str, dict[str, Any]]:
    """Every shard of the loader's split: its path relative to the tokens directory and its size."""
    table = {}
    for stream in loader.streams:
        for shard in stream.shards.shards:
            rel = f"{loader.split}/{stream.name}/{shard.bin_path.name}"
            table[rel] = {"source": stream.name, "tokens": len(shard)}
    return table


def index_header(loader: Any) -> dict[str, Any]:
    """What a replay needs besides the rows: sizes, FIM settings and the shards (without checkpoints)."""
    return {
        "format": FORMAT,
        "split": loader.split,
        "seq_len": loader.seq_len,
        "batch_size": loader.batch_size,
        "seed": loader.seed,
        "dtype": str(loader.meta["dtype"]),
        "bos_id": loader._bos,  # a BOS after a document's EOS is kept out of a FIM rewrite
        "fim": {
            "rate": loader.fim_rate,
            "spm_rate": loader.cfg.fim_spm_rate,
            "sources": [name for name, on in zip(loader.sources, loader._fim, strict=True) if on],
            "ids": list(loader.fim_ids) if loader.fim_ids else None,
        },
        "shards": shard_table(loader),
    }


def _ranges(stream: Any, split: str, sequence: int) -> list[list[Any]]:
    """[shard, offset, length] pieces of window `sequence` (seq_len + 1 tokens) of a source stream."""
    start = sequence * stream.seq_len
    stop = start + stream.seq_len + 1
    starts = stream.shards.starts
    pieces = []
    k = int(np.searchsorted(starts, start, side="right")) - 1
    while start < stop:
        shard = stream.shards.shards[k]
        hi = min(stop, int(starts[k + 1]))
        pieces.append([f"{split}/{stream.name}/{shard.bin_path.name}", start - int(starts[k]), hi - start])
        start, k = hi, k + 1
    return pieces


def step_rows(loader: Any, step: int) -> list[dict[str, Any]]:
    """The rows of step's global batch as token ranges, from the loader's plan alone (nothing is read).

    The same arithmetic as `TokenLoader.rows`: the schedule gives each row's source and run-wide
    sequence number, which is epoch n div N and window permute(n mod N) of that source.
    """
    from smelt.tokens.order import permute

    source, number = loader.schedule(step)
    rows: list[dict[str, Any]] = [{} for _ in range(len(source))]
    for index, stream in enumerate(loader.streams):
        mine = np.flatnonzero(source == index)
        if not len(mine):
            continue
        epoch, offset = np.divmod(number[mine], stream.sequences)
        seq = np.empty_like(offset)
        for e in np.unique(epoch):
            at = epoch == e
            seq[at] = permute(offset[at], stream.sequences, loader.seed, stream.name, int(e))
        for row, q, e in zip(mine.tolist(), seq.tolist(), epoch.tolist(), strict=True):
            rows[row] = {
                "step": step,
                "row": row,
                "source": stream.name,
                "sequence": q,
                "epoch": e,
                "ranges": _ranges(stream, loader.split, q),
            }
    return rows


def write_order_file(loader: Any, steps: list[tuple[int, range]], path: Path) -> int:
    """Write the rows of each (optimizer step, its loader steps) to `path` (gzip JSONL, byte-identical on
    every run: no timestamp or name in the gzip header). Without a batch-size ramp an optimizer step is
    one loader step; with one it takes several, whose rows follow each other. Returns the rows written."""
    buffer = io.BytesIO()
    count = 0
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as out:
        for step, loader_steps in steps:
            row_number = 0
            for loader_step in loader_steps:
                for row in step_rows(loader, loader_step):
                    row.update(step=step, row=row_number)
                    out.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
                    row_number += 1
                    count += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return count


# -- reading and replaying ----------------------------------------------------------------------------


def read_index(order_dir: Path) -> dict[str, Any]:
    path = Path(order_dir) / INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(
            f"cannot read the data order index {path} ({exc}). Point at a release directory written by "
            f"`smelt release RUN OUT` (it holds data_order/index.json)."
        ) from exc
    if index.get("format") != FORMAT:
        raise UserError(
            f"{path} has data order format {index.get('format')}; this smelt reads format {FORMAT}."
        )
    return index


def checkpoint_for_step(index: dict[str, Any], step: int) -> dict[str, Any]:
    """The index entry whose file covers `step`; a UserError naming the covered steps otherwise."""
    for entry in index["checkpoints"]:
        if entry["first_step"] <= step <= entry["last_step"]:
            return entry
    last = index["checkpoints"][-1]["last_step"] if index["checkpoints"] else 0
    raise UserError(
        f"--step {step} is not in this data order: it covers steps 1..{last:,} (up to the last released "
        f"checkpoint); pick a step in that range."
    )


def read_rows(order_dir: Path, step: int) -> list[dict[str, Any]]:
    """The rows of step's global batch, from the data order file that covers it."""
    order_dir = Path(order_dir)
    entry = checkpoint_for_step(read_index(order_dir), step)
    path = order_dir / entry["file"]
    try:  # parses only the lines of this step (a substring test first), not through smelt.jsonl
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if f'"step":{step},' in line]
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read the data order file {path} ({exc}); fetch it again.") from exc
    return [row for row in rows if row["step"] == step]


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Every row of one data order file, in order."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for _, row in json_objects(handle, path, "data order file", "Fetch it again."):
            yield row


class ShardReader:
    """Token shards by their data-order path (split/source/NNNNN.bin), checked against the index sizes."""

    def __init__(self, tokens_dir: Path, index: dict[str, Any]):
        self.tokens_dir = Path(tokens_dir)
        self.index = index
        self._sets: dict[tuple[str, str], ShardSet] = {}

    def shard(self, rel: str) -> Any:
        recorded = self.index["shards"].get(rel)
        if recorded is None:
            raise UserError(
                f"the data order names shard {rel}, which its index does not list; the file is damaged."
            )
        split, source, name = rel.split("/")
        key = (split, source)
        if key not in self._sets:
            if not (self.tokens_dir / split / source).is_dir():
                raise UserError(
                    f"token shard {self.tokens_dir / rel} is not there: replaying the data order needs the run's "
                    f"token shards. Pass --tokens DIR (the run's tokens directory, or the release's tokens/)."
                )
            self._sets[key] = ShardSet(self.tokens_dir, split, source, verify="none")
        for shard in self._sets[key].shards:
            if shard.bin_path.name == name:
                if len(shard) != recorded["tokens"]:
                    raise UserError(
                        f"token shard {shard.bin_path} has {len(shard):,} tokens, the data order recorded "
                        f"{recorded['tokens']:,}: these are not the shards the run trained on."
                    )
                return shard
        raise UserError(
            f"token shard {self.tokens_dir / rel} is missing; it is needed to replay the data order."
        )


def replay_rows(rows: list[dict[str, Any]], index: dict[str, Any], tokens_dir: Path) -> Any:
    """The packed batch (`smelt.tokens.packing.Batch`) of these data-order rows, read from the shards."""
    from smelt.tokens.order import name_key
    from smelt.tokens.packing import Batch, apply_fim, pack

    width = index["seq_len"] + 1
    reader = ShardReader(tokens_dir, index)
    windows = np.empty((len(rows), width), dtype=np.int64)
    ends_rows, ends_positions = [], []
    fim = np.zeros(len(rows), dtype=bool)
    fim_cfg = index["fim"]
    for r, row in enumerate(rows):
        position, ends = 0, []
        for rel, offset, length in row["ranges"]:
            shard = reader.shard(rel)
            windows[r, position : position + length] = shard.tokens[offset : offset + length]
            # a document ends one token before the next one starts, and at the end of the shard
            i, j = np.searchsorted(shard.offsets, [offset + 1, offset + length + 1])
            found = np.asarray(shard.offsets[i:j], dtype=np.int64) - 1
            if offset <= len(shard) - 1 < offset + length:
                found = np.append(found, len(shard) - 1)
            ends.append(found - offset + position)
            position += length
        if position != width:
            raise UserError(
                f"data order row {row['row']} of step {row['step']} covers {position} tokens, not seq_len + 1 = "
                f"{width}; the file is damaged."
            )
        row_ends = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
        if row["source"] in fim_cfg["sources"]:
            rng = np.random.default_rng(
                [index["seed"], name_key(row["source"]), row["epoch"], row["sequence"]]
            )
            fim[r] = apply_fim(
                windows[r], row_ends, rng, fim_cfg["rate"], fim_cfg["spm_rate"], tuple(fim_cfg["ids"]),
                index.get("bos_id"),
            )  # fmt: skip
        ends_rows.append(np.full(len(row_ends), r, dtype=np.int64))
        ends_positions.append(row_ends)
    inputs, targets, doc_ids, position_ids, cu_seqlens = pack(
        windows,
        np.concatenate(ends_rows) if ends_rows else np.zeros(0, np.int64),
        np.concatenate(ends_positions) if ends_positions else np.zeros(0, np.int64),
    )
    return Batch(
        inputs.contiguous(),
        targets.contiguous(),
        doc_ids,
        position_ids,
        cu_seqlens,
        sources=[row["source"] for row in rows],
        sequences=np.array([row["sequence"] for row in rows], dtype=np.int64),
        epochs=np.array([row["epoch"] for row in rows], dtype=np.int64),
        fim=fim,
    )


def replay_step(order_dir: Path, step: int, tokens_dir: Path) -> Any:
    """The whole global batch of `step`, rebuilt from the data order and the token shards alone."""
    index = read_index(order_dir)
    return replay_rows(read_rows(order_dir, step), index, tokens_dir)


def describe_replay(order_dir: Path, step: int, tokens_dir: Path, tokenizer_dir: Path, rows: int = 8) -> str:
    """`smelt inspect batches RELEASE --step N`: the step's rows with their shard ranges, decoded."""
    from smelt.tokenizer.load import Tokenizer

    index = read_index(order_dir)
    entry = checkpoint_for_step(index, step)
    records = read_rows(order_dir, step)
    shown = records if rows <= 0 else records[:rows]
    batch = replay_rows(shown, index, tokens_dir)
    tokenizer = Tokenizer.load(tokenizer_dir)
    counts: dict[str, int] = {}
    for record in records:
        counts[record["source"]] = counts.get(record["source"], 0) + 1
    lines = [
        f"step {step:,}: trained into checkpoint step {entry['step']:,} (its data order covers steps "
        f"{entry['first_step']:,}-{entry['last_step']:,}); global batch {len(records)} sequences x "
        f"{index['seq_len']} tokens; sources: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}",
        f"replayed from {Path(order_dir) / entry['file']} and the shards in {tokens_dir}; "
        f"showing rows 0..{len(shown) - 1}",
    ]
    for r, record in enumerate(shown):
        starts = segment_starts(batch.doc_ids[r].numpy())
        ranges = ", ".join(f"{rel} [{off:,}, {off + n:,})" for rel, off, n in record["ranges"])
        lines.append(
            f"\n──────── row {record['row']}: {record['source']} sequence {record['sequence']} (epoch "
            f"{record['epoch']}), {ranges}, {len(starts)} document segment(s)"
            f"{', FIM' if batch.fim[r] else ''} ────────"
        )
        lines.append(decode_segments(tokenizer, batch.inputs[r].numpy(), starts))
    return "\n".join(lines) + "\n"


def inspect_batches(args: Any) -> int:
    """`smelt inspect batches TARGET --step N`: TARGET is a release (replayed from its data order), a run
    directory or a pipeline TOML file (the batch recomputed by the run's loader)."""
    target = Path(args.config)
    order_dir = target if (target / INDEX).is_file() else target / ORDER_DIR
    if (order_dir / INDEX).is_file():
        release = order_dir.parent
        tokens = getattr(args, "tokens", None)
        if tokens is None:
            tokens = (
                release / "tokens"
                if (release / "tokens").is_dir()
                else read_index(order_dir).get("tokens_dir")
            )
        if tokens is None:
            raise UserError(
                f"{order_dir} records no tokens directory; pass --tokens DIR (the run's token shards)."
            )
        print(describe_replay(order_dir, args.step, Path(tokens), release / "tokenizer", rows=args.rows))
        return 0
    from smelt.config import config_from_dict, load_config
    from smelt.tokens.decoded import describe_batch

    if target.is_dir():
        saved = target / "config.json"
        if not saved.is_file():
            raise UserError(
                f"{target} is neither a release (no data_order/index.json) nor a run directory (no config.json); "
                f"pass a release directory, a run directory such as runs/quickstart, or a pipeline TOML file."
            )
        from smelt.config import apply_override

        raw = json.loads(saved.read_text())
        for item in getattr(args, "overrides", []):
            apply_override(raw, item)
        cfg = config_from_dict(raw, origin=str(saved))
        cfg.run.dir, cfg.run.name = str(target.parent), target.name  # follow a moved run
    else:
        cfg = load_config(target, getattr(args, "overrides", []))
    print(describe_batch(cfg, args.step, rows=args.rows))
    return 0
