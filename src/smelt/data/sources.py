"""Which files a source reads: root resolution (`{stdlib}`), include/exclude globs, `max_files`."""

from __future__ import annotations

import os
import re
import sysconfig
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from smelt.config import DataConfig, SourceConfig
from smelt.errors import UserError
from smelt.storage import StoreFile, local_source, store_files

STDLIB = "{stdlib}"
# Third-party packages live under the stdlib directory but are not the standard library.
_NOT_STDLIB = {"site-packages", "dist-packages"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def resolve_root(source: SourceConfig) -> Path:
    """The directory a source's globs are relative to; `{stdlib}` is this interpreter's stdlib."""
    text = source.root.replace(STDLIB, str(stdlib_dir()))
    root = Path(os.path.expanduser(text)).resolve()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UserError(
            f"source {source.name!r}: root {source.root!r} {what} (resolved to {root}). "
            f"Set data.sources root to an existing directory (relative paths are relative to the "
            f"directory you run smelt from), or '{STDLIB}' for this Python's standard library."
        )
    return root


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern:
    """A glob over posix relative paths: `**` spans directories, `*` and `?` stay within one."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches(rel: str, patterns: list[str]) -> bool:
    return any(glob_regex(p).match(rel) for p in patterns)


def walk_glob(root: Path, pattern: str, prune: set[str]) -> Iterator[tuple[str, Path]]:
    """(relative posix path, path) of the files under root matching pattern; directories named in
    `prune` are never entered. Walks only below the pattern's literal prefix, and only as deep as needed."""
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    fixed: list[str] = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    base = root.joinpath(*fixed)
    if prune.intersection(fixed) or not base.is_dir():
        return
    max_depth = None if "**" in pattern else len(parts) - len(fixed) - 1
    regex = glob_regex("/".join(parts))
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        depth = len(Path(dirpath).relative_to(base).parts)
        dirnames[:] = (
            [] if max_depth is not None and depth >= max_depth else [d for d in dirnames if d not in prune]
        )
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if regex.match(rel):
                yield rel, Path(dirpath) / name


def _check_pattern(source: SourceConfig, key: str, pattern: str) -> None:
    if not pattern or pattern.startswith(("/", "~")) or ".." in Path(pattern).parts:
        raise UserError(
            f"source {source.name!r}: {key} pattern {pattern!r} must be a non-empty glob relative to root "
            f"{source.root!r} (no leading '/', '~' or '..'). Move the directory into root instead."
        )


def source_files(source: SourceConfig) -> tuple[Path, list[Path]]:
    """(root, files) for one source: matched by include, not by exclude, sorted, capped by max_files."""
    root = resolve_root(source)
    for key in ("include", "exclude"):
        for pattern in getattr(source, key):
            _check_pattern(source, key, pattern)
    prune = _NOT_STDLIB if source.root.startswith(STDLIB) else set()
    found: dict[str, Path] = {}
    for pattern in source.include:
        for rel, path in walk_glob(root, pattern, prune):
            if rel not in found and not matches(rel, source.exclude) and path.is_file():
                found[rel] = path
    files = [found[rel] for rel in sorted(found)]
    if source.max_files:
        files = files[: source.max_files]
    if not files:
        excluded = f" and exclude = {source.exclude!r}" if source.exclude else ""
        raise UserError(
            f"source {source.name!r}: include = {source.include!r}{excluded} matches no files under root "
            f"{source.root!r} ({root}). Fix the include patterns (they are relative to root; use "
            f"'**/*.txt' to match recursively) or the root."
        )
    return root, files


def resolve_all(cfg: DataConfig) -> dict[str, tuple[Path | str, list[Path] | list[StoreFile]]]:
    """(root, files) per source name, in config order; a store's root stays a URL, its files StoreFiles."""
    if not cfg.sources:
        raise UserError(
            "data.sources is empty: there is nothing to curate. Add at least one [[data.sources]] table "
            'with name, format, root and include, e.g. name = "stdlib", format = "text", '
            'root = "{stdlib}", include = ["**/*.py"].'
        )
    # A store's root is listed here and its files read by the tasks; any other root becomes a local path
    # first: file:// its path, a store only this process sees (memory://) its mirror.
    resolved = {}
    for source in cfg.sources:
        wanted = _wanted(source)
        in_store = store_files(source, wanted)
        resolved[source.name] = in_store or source_files(local_source(source, cfg.url_cache, wanted))
    return resolved


def _wanted(source: SourceConfig):
    return lambda rel: matches(rel, source.include) and not matches(rel, source.exclude)
