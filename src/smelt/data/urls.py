"""Source roots given as URLs, read through fsspec.

`file:///data/crawl` is the local directory `/data/crawl`. Any other protocol fsspec knows
(`s3://bucket/prefix` with s3fs installed, `gs://` with gcsfs, `hf://`, `memory://`, ...) is listed
where it lies; the files the source's include/exclude patterns (and `max_files`) select are copied into
a local mirror under `data.url_cache`, and curation reads the mirror. The mirror keeps what each file
was fetched from (size and, where the store reports them, ETag, checksum or modification time): a rerun
fetches only files that are new or changed, so a resumed run reads the same bytes. On a Ray cluster,
put `data.url_cache` on the filesystem every node shares, like the run directory.

Documents' ids and `file` fields are paths relative to the root, so a corpus read from a URL gives the
same documents as the same files read from a local directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smelt.config import SourceConfig
from smelt.errors import UserError
from smelt.progress import log

DEFAULT_CACHE = "~/.cache/smelt/urls"
MIRROR_INDEX = ".index.json"
# What a store reports that changes when a file's content does; size alone is always compared too.
VERSION_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum", "mtime", "LastModified", "last_modified")
_PROTOCOL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def url_protocol(text: str) -> str | None:
    """The protocol of a URL such as s3://bucket/key ("s3"), or None for a plain path."""
    match = _PROTOCOL.match(text)
    return match.group(1).lower() if match else None


def local_path(text: str) -> str:
    """A plain path, or the path of a file:// URL (the URL's path part, percent-decoded)."""
    if url_protocol(text) != "file":
        return text
    from urllib.parse import unquote, urlparse

    parsed = urlparse(text)
    if parsed.netloc not in ("", "localhost"):
        raise UserError(
            f"{text!r} names the host {parsed.netloc!r}; a file:// URL must name a local path "
            f"(file:///absolute/path). Mount the remote directory, or use its store's URL (s3://, gs://)."
        )
    return unquote(parsed.path)


def local_source(source: SourceConfig, cache: str, wanted: Callable[[str], bool]) -> SourceConfig:
    """The source with a root this machine can walk: a file:// root becomes its path, a remote root its
    mirror (fetched here, by this process); `wanted(relative posix path)` says which files the source reads."""
    protocol = url_protocol(source.root)
    if protocol is None:
        return source
    if protocol == "file":
        return dataclasses.replace(source, root=local_path(source.root))
    return dataclasses.replace(source, root=str(_mirror(source, protocol, cache, wanted)))


def _filesystem(source: SourceConfig, protocol: str):
    import fsspec

    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as exc:
        raise UserError(
            f"source {source.name!r}: root {source.root!r} needs the fsspec filesystem for {protocol}://, "
            f"which is not available ({exc}). Install its package (s3fs for s3://, gcsfs for gs://, adlfs "
            f"for az://), or copy the files to a local directory and point root there."
        ) from exc


def mirror_dir(cache: str, url: str) -> Path:
    """Where a remote root is mirrored: readable, and unique per URL."""
    base = Path(os.path.expanduser(cache or DEFAULT_CACHE)).resolve()
    protocol = url_protocol(url) or "file"
    rest = url.split("://", 1)[1].strip("/")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", rest)[-80:] or "root"
    digest = hashlib.blake2b(url.rstrip("/").encode(), digest_size=6).hexdigest()
    return base / protocol / f"{readable}-{digest}"


def _version(info: dict[str, Any]) -> dict[str, Any]:
    version = {"size": int(info.get("size") or 0)}
    for key in VERSION_KEYS:
        if info.get(key) is not None:
            version[key] = str(info[key])
    return version


def _mirror(source: SourceConfig, protocol: str, cache: str, wanted: Callable[[str], bool]) -> Path:
    fs = _filesystem(source, protocol)
    root = fs._strip_protocol(source.root).rstrip("/")
    try:
        listing = fs.find(root, detail=True)
    except (FileNotFoundError, PermissionError, OSError) as exc:
        raise UserError(
            f"source {source.name!r}: root {source.root!r} cannot be listed ({exc}). Check the URL and "
            f"the credentials fsspec uses for {protocol}://."
        ) from exc
    selected: dict[str, dict[str, Any]] = {}
    for path, info in listing.items():
        rel = path.removeprefix(root).lstrip("/")
        if info.get("type", "file") == "file" and rel and wanted(rel):
            selected[rel] = info
    if not selected:
        what = (
            "has no files (or does not exist)" if not listing else "has no files the include patterns match"
        )
        raise UserError(
            f"source {source.name!r}: root {source.root!r} {what}: include = {source.include!r}, "
            f"exclude = {source.exclude!r}. Fix the URL or the patterns (relative to the root; '**/*.txt' "
            f"matches recursively)."
        )
    rels = sorted(selected)
    if source.max_files:
        rels = rels[: source.max_files]
    target = mirror_dir(cache, source.root)
    target.mkdir(parents=True, exist_ok=True)
    index_path = target.with_name(target.name + MIRROR_INDEX)  # beside the tree: never read as a source file
    keep = set(rels)
    for path in [p for p in target.rglob("*") if p.is_file()]:
        if path.relative_to(target).as_posix() not in keep:  # gone from the store, or no longer selected
            path.unlink()
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    stale = [rel for rel in rels if index.get(rel) != _version(selected[rel]) or not (target / rel).is_file()]
    if stale:
        log(f"curate: source {source.name!r}: fetching {len(stale)} of {len(rels)} files from {source.root}")
    for rel in stale:
        local = target / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".fetching")
        fs.get_file(f"{root}/{rel}", str(tmp))
        os.replace(tmp, local)
        index[rel] = _version(selected[rel])
        index_path.write_text(json.dumps(index, sort_keys=True))
    return target
