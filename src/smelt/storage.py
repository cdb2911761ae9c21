"""Inputs and outputs given as URLs, through fsspec.

Inputs: `file:///data/crawl` is the local directory `/data/crawl`. A root in a store (`s3://bucket/prefix`
with s3fs installed, `gs://` with gcsfs, `hf://`, ...) is listed by the driver where it lies, and the
files the source's include/exclude patterns (and `max_files`) select become `StoreFile`s: their URL, size
and version (the ETag, checksum or modification time the store reports). The map tasks open their own
input URLs (each file is copied to the task's temporary directory, read, and deleted), so a cluster reads
raw data where it lies and the driver never holds the corpus. A filesystem that lives in one process
(fsspec's `memory://`) cannot be read by workers: its files are copied into a mirror under
`data.url_cache` by the driver instead, and curation reads the mirror. The mirror keeps what each file
was fetched from: a rerun fetches only files that are new or changed, so a resumed run reads the same
bytes.

Documents' ids and `file` fields are paths relative to the root, so a corpus read from a URL gives the
same documents as the same files read from a local directory.

Outputs: a stage asked to write to a store's URL writes its output to a local staging directory (with
its usual completion markers and resume), then `publish` copies the tree to the URL: data files first,
then completion markers, then the files that say the output is complete (`stats.json`), each committed
in an index beside the staging directory once the store holds it; a rerun uploads only what is not
committed or has changed, and removes from the store the stage's files the new output no longer has.
The store's tree is byte for byte the local one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from smelt.config import SourceConfig
from smelt.errors import UserError
from smelt.jsonl import json_object
from smelt.progress import log

DEFAULT_CACHE = "~/.cache/smelt/urls"
MIRROR_INDEX = ".index.json"
# What a store reports that changes when a file's content does; size alone is always compared too.
VERSION_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum", "mtime", "LastModified", "last_modified")
_PROTOCOL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# Filesystems that exist in one process only: worker processes cannot list or read them.
MIRRORED_PROTOCOLS = ("memory",)


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


@dataclasses.dataclass(frozen=True)
class StoreFile:
    """A source file in a store, as the driver listed it: the tasks open the URL themselves."""

    url: str
    size: int
    version: str  # what the store reports that changes with the content (JSON of _version)

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def stat(self) -> os.stat_result:
        """Size, and the version as the modification time, for what compares files by their stat."""
        stamp = int.from_bytes(hashlib.blake2b(self.version.encode(), digest_size=7).digest(), "big")
        return os.stat_result((0, 0, 0, 0, 0, 0, self.size, 0, 0, 0, 0, 0, 0, stamp))

    def __str__(self) -> str:
        return self.url


def store_files(source: SourceConfig, wanted: Callable[[str], bool]) -> tuple[str, list[StoreFile]] | None:
    """(root URL, files) of a source whose root is in a store the tasks read themselves; None for a
    local root, a file:// one, or a store read through the driver's mirror (MIRRORED_PROTOCOLS)."""
    protocol = url_protocol(source.root)
    if protocol in (None, "file", *MIRRORED_PROTOCOLS):
        return None
    fs, root, selected = _list(source, protocol, wanted)
    base = source.root.rstrip("/")
    return base, [
        StoreFile(f"{base}/{rel}", int(info.get("size") or 0), json.dumps(_version(info), sort_keys=True))
        for rel, info in selected.items()
    ]


def listing_hash(files: Iterable[StoreFile]) -> str:
    """One hash over a store's files as listed: their URLs, sizes and versions (not their content)."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.url):
        digest.update(f"{file.url}\0{file.size}\0{file.version}\n".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def task_local(root: str, path: str) -> Iterator[tuple[str, Path]]:
    """(root, path) to read a source file from in this process: as they are for a local file; for a
    store's file, a copy in a temporary directory (the same path relative to the root), deleted after."""
    if not is_remote(root):
        yield root, Path(path)
        return
    import fsspec

    rel = path.removeprefix(root.rstrip("/")).lstrip("/")
    protocol = url_protocol(path)
    with tempfile.TemporaryDirectory(prefix="smelt-input-") as tmp:
        local = Path(tmp) / rel
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            fs, remote = fsspec.core.url_to_fs(path)
        except (ImportError, ValueError) as exc:
            raise UserError(
                f"{path}: this worker has no fsspec filesystem for {protocol}:// ({exc}). Install its "
                f"package (s3fs for s3://, gcsfs for gs://, adlfs for az://) wherever tasks run: on every "
                f"node of a Ray cluster."
            ) from exc
        try:
            fs.get_file(remote, str(local))
        except FileNotFoundError as exc:
            raise UserError(
                f"{path} was listed when the run started but is not in the store any more. Run again: the "
                f"store is listed anew, and the curation starts over on what it holds now."
            ) from exc
        yield tmp, local


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
    return _cache_dir(cache, url, "")


def staging_dir(cache: str, url: str) -> Path:
    """Where a stage writes the output it publishes to a remote URL: readable, and unique per URL."""
    return _cache_dir(cache, url, "outputs")


def _cache_dir(cache: str, url: str, kind: str) -> Path:
    base = Path(os.path.expanduser(cache or DEFAULT_CACHE)).resolve()
    protocol = url_protocol(url) or "file"
    rest = url.split("://", 1)[1].strip("/")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", rest)[-80:] or "root"
    digest = hashlib.blake2b(url.rstrip("/").encode(), digest_size=6).hexdigest()
    return (base / kind if kind else base) / protocol / f"{readable}-{digest}"


def _version(info: dict[str, Any]) -> dict[str, Any]:
    version = {"size": int(info.get("size") or 0)}
    for key in VERSION_KEYS:
        if info.get(key) is not None:
            version[key] = str(info[key])
    return version


def _list(
    source: SourceConfig, protocol: str, wanted: Callable[[str], bool]
) -> tuple[Any, str, dict[str, dict[str, Any]]]:
    """(filesystem, root path, {relative path: listing info}) of the files the source selects, sorted."""
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
    return fs, root, {rel: selected[rel] for rel in rels}


def _mirror(source: SourceConfig, protocol: str, cache: str, wanted: Callable[[str], bool]) -> Path:
    fs, root, selected = _list(source, protocol, wanted)
    rels = list(selected)
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


# ---------------------------------------------------------------------------------------------
# Outputs

PUBLISHED = ".published.json"  # beside the staging directory: what the store holds of it
MARKER_SUFFIX = ".done"


def is_remote(text: str) -> bool:
    """A URL of a store (s3://, gs://, memory://, ...), not a plain path or a file:// URL."""
    return url_protocol(text) not in (None, "file")


def _output_filesystem(url: str, what: str):
    import fsspec

    protocol = url_protocol(url) or "file"
    try:
        fs = fsspec.filesystem(protocol)
    except (ImportError, ValueError) as exc:
        raise UserError(
            f"the {what} URL {url!r} needs the fsspec filesystem for {protocol}://, which is not "
            f"available ({exc}). Install its package (s3fs for s3://, gcsfs for gs://, adlfs for az://), "
            f"or write to a local path."
        ) from exc
    return fs, fs._strip_protocol(url).rstrip("/")


def _digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def publish(local: Path, url: str, what: str, owned: Iterable[str], last: Sequence[str] = ()) -> int:
    """Make the tree under the store's `url` the tree under `local` (temporary `*.tmp` files and the
    `_work` directory left out); return how many files were uploaded. Order: data files, then completion
    markers (`*.done`), then the top-level files named in `last` (what says the output is complete),
    which are first removed from the store while anything else changes. Files of the store under the
    top-level names in `owned` that `local` no longer has leave the output, and so do files about to be
    replaced by other bytes than this staging directory committed: both are moved under
    `URL.superseded/TIMESTAMP/`, never deleted. `what` names the output in
    messages ("documents", "tokens")."""
    fs, root = _output_filesystem(url, what)
    files = sorted(
        p.relative_to(local).as_posix()
        for p in local.rglob("*")
        if p.is_file() and not p.name.endswith(".tmp") and p.relative_to(local).parts[0] != "_work"
    )
    try:
        remote = {
            path.removeprefix(root).lstrip("/"): int(info.get("size") or 0)
            for path, info in fs.find(root, detail=True).items()
            if info.get("type", "file") == "file"
        }
    except FileNotFoundError:
        remote = {}
    index_path = local.with_name(local.name + PUBLISHED)
    committed = _read_published(index_path, url)
    digests = {rel: _digest(local / rel) for rel in files}
    todo = {
        rel
        for rel in files
        if committed.get(rel) != digests[rel] or remote.get(rel) != (local / rel).stat().st_size
    }
    owned = set(owned)
    stale = [rel for rel in remote if rel not in digests and rel.split("/", 1)[0] in owned]
    if not todo and not stale:
        log(f"{what}: {url} holds these {len(files)} files already")
        return 0
    log(f"{what}: publishing {len(todo)} of {len(files)} files to {url}")

    # What the store holds that this publish removes or replaces with other bytes took compute to make
    # (another run's parts, the output of an earlier config): it is moved aside, never deleted.
    replaced = [rel for rel in remote if rel in stale or (rel in todo and committed.get(rel) != digests[rel])]
    aside = f"{root}.superseded/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if replaced:
        log(
            f"{what}: moving the {len(replaced)} file(s) of {url} this publish replaces or removes to {aside}"
        )
    log_file = _published_log(index_path, url, committed)
    try:
        for rel in [*last, *stale]:  # the store's output is visibly incomplete until it is whole again
            if rel in remote:
                _remove_or_set_aside(fs, root, rel, aside if rel in replaced else None)
                _commit(log_file, rel, None)
            if rel in digests:
                todo.add(rel)
        for rel in replaced:
            if rel not in last and rel not in stale:
                _remove_or_set_aside(fs, root, rel, aside)
        made: set[str] = set()
        for rel in sorted(todo, key=lambda rel: _upload_rank(rel, last)):
            target = f"{root}/{rel}"
            if fs._parent(target) not in made:  # a no-op on object stores, needed on file-like ones
                fs.makedirs(fs._parent(target), exist_ok=True)
                made.add(fs._parent(target))
            fs.put_file(str(local / rel), target)
            size, stored = (local / rel).stat().st_size, fs.size(target)
            if stored != size:
                raise OSError(f"{url}/{rel}: the store holds {stored} bytes after the upload, not {size}")
            _commit(log_file, rel, digests[rel])
    finally:
        log_file.close()
    return len(todo)


def _remove_or_set_aside(fs: Any, root: str, rel: str, aside: str | None) -> None:
    """Take `rel` out of the store's output: moved under `aside` when given, else removed (bytes that
    are already committed elsewhere, such as a manifest that is uploaded again unchanged)."""
    if aside is None:
        fs.rm_file(f"{root}/{rel}")
        return
    target = f"{aside}/{rel}"
    fs.makedirs(fs._parent(target), exist_ok=True)
    fs.mv(f"{root}/{rel}", target)


def _upload_rank(rel: str, last: Sequence[str]) -> tuple:
    """Data files first, then completion markers, then what says the whole output is complete."""
    if rel in last:
        return (2, last.index(rel), rel)
    return (1 if rel.endswith(MARKER_SUFFIX) else 0, 0, rel)


def _read_published(index_path: Path, url: str) -> dict[str, str]:
    """The files committed to `url` (their digests) by earlier publishes of this staging directory."""
    committed: dict[str, str] = {}
    try:
        lines = index_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return committed
    header = json_object(lines[0]) if lines else None
    if header is None or header.get("url") != url:
        return committed
    for line in lines[1:]:  # [rel, digest] arrays, not objects, so not through smelt.jsonl
        try:
            rel, digest = json.loads(line)
        except ValueError:  # the line a killed publish was writing
            continue
        if digest is None:
            committed.pop(rel, None)
        else:
            committed[rel] = digest
    return committed


def _published_log(index_path: Path, url: str, committed: dict[str, str]):
    """The index, rewritten with what is committed now and open to append a line per file committed."""
    tmp = index_path.with_name(index_path.name + ".tmp")
    lines = [json.dumps({"url": url}), *(json.dumps([rel, committed[rel]]) for rel in sorted(committed))]
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, index_path)
    return open(index_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by publish


def _commit(log_file, rel: str, digest: str | None) -> None:
    log_file.write(json.dumps([rel, digest]) + "\n")
    log_file.flush()
