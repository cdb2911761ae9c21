"""Work shards: how the input of a curate run is cut into units of work.

A shard is a run of consecutive files of one source (many small files grouped up to a byte target),
or a byte range of one large uncompressed JSONL file cut at line boundaries. Shards are processed
independently (in any order, by any worker) and each leaves a completion marker, so a killed run
resumes at the shards it had not finished. Concatenating the shards in plan order gives canonical
order (source order in the config, file order, record order), whatever the shard sizes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from smelt.data.ingest.readers import ReadSpec

MAX_FILES_PER_SHARD = 1000
SCAN_BLOCK = 1 << 24


@dataclass(frozen=True)
class WorkShard:
    key: str  # sortable: source index, then shard number within the source
    spec: ReadSpec
    files: tuple[str, ...]
    bytes: int
    start: int = 0  # byte range [start, end) of a single JSONL file; end None: whole files
    end: int | None = None
    first_line: int = 1

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> WorkShard:
        data = dict(data)
        data["spec"] = ReadSpec(**data["spec"])
        data["files"] = tuple(data["files"])
        return cls(**data)


def plan_shards(sources: list[tuple[ReadSpec, list[Path]]], target_bytes: int) -> list[WorkShard]:
    """Cut each source's files into shards of about `target_bytes` of input."""
    shards: list[WorkShard] = []
    for spec, files in sources:
        shards += _source_shards(spec, files, target_bytes)
    return shards


def _source_shards(spec: ReadSpec, files: list[Path], target_bytes: int) -> list[WorkShard]:
    shards: list[WorkShard] = []
    group: list[str] = []
    group_bytes = 0

    def key() -> str:
        return f"{spec.index:04d}-{len(shards):07d}"

    for path in files:
        size = path.stat().st_size
        # a file in a store (a StoreFile) is not cut: finding the line boundaries would read it here
        cut = isinstance(path, Path) and spec.format == "jsonl" and path.name.endswith(".jsonl")
        if cut and size > target_bytes:
            if group:
                shards.append(WorkShard(key(), spec, tuple(group), group_bytes))
                group, group_bytes = [], 0
            for start, end, first_line in line_ranges(path, target_bytes):
                shards.append(WorkShard(key(), spec, (str(path),), end - start, start, end, first_line))
            continue
        group.append(str(path))
        group_bytes += size
        if group_bytes >= target_bytes or len(group) >= MAX_FILES_PER_SHARD:
            shards.append(WorkShard(key(), spec, tuple(group), group_bytes))
            group, group_bytes = [], 0
    if group:
        shards.append(WorkShard(key(), spec, tuple(group), group_bytes))
    return shards


def line_ranges(path: Path, target_bytes: int) -> list[tuple[int, int, int]]:
    """[(start, end, number of the line at start)] covering the file, each range ending after a newline
    and holding about `target_bytes`. One pass over the file counting newlines (GB/s)."""
    size = path.stat().st_size
    ranges = []
    start, line = 0, 1
    with open(path, "rb") as handle:
        while start < size:
            cut = start + target_bytes
            if cut >= size:
                ranges.append((start, size, line))
                break
            handle.seek(cut)
            handle.readline()  # move the cut past the next newline
            end = handle.tell()
            ranges.append((start, end, line))
            line += _count_newlines(handle, start, end)
            start = end
    return ranges


def _count_newlines(handle, start: int, end: int) -> int:
    handle.seek(start)
    count = 0
    while start < end:
        block = handle.read(min(SCAN_BLOCK, end - start))
        if not block:
            break
        count += block.count(b"\n")
        start += len(block)
    return count


def write_plan(path: Path, fingerprint: str, shards: list[WorkShard]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"fingerprint": fingerprint, "shards": [s.to_json() for s in shards]}))
    tmp.replace(path)


def read_plan(path: Path, fingerprint: str) -> list[WorkShard] | None:
    """The stored plan of an interrupted run with the same fingerprint, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fingerprint") != fingerprint:
        return None
    return [WorkShard.from_json(s) for s in data["shards"]]
