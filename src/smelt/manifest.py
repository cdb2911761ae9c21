"""Manifests, content hashes and stage caching.

Every stage directory carries `manifest.json`: the resolved config of the stage and its hash, the
hashes of its inputs, the code and library versions, the seed, the wall time and the hashes of its
outputs. A stage whose config hash and input hashes match an existing, intact manifest is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import smelt

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def hash_file(path: str | Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(paths: Iterable[Path], root: Path) -> str:
    """One hash over many files: their paths relative to `root` and their content hashes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(hash_file(path).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def hash_outputs(stage_dir: Path) -> dict[str, str]:
    """Content hash of every file a stage wrote, keyed by its path relative to the stage directory."""
    return {
        path.relative_to(stage_dir).as_posix(): hash_file(path)
        for path in sorted(stage_dir.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def combined_hash(hashes: dict[str, str]) -> str:
    blob = json.dumps(hashes, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def code_version() -> dict[str, Any]:
    """The git commit and dirty flag of the source tree when it is a checkout, and the package version."""
    info: dict[str, Any] = {"package": smelt.__version__, "commit": None, "dirty": None}
    source = Path(smelt.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        info.update(commit=commit, dirty=bool(status.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("torch", "tokenizers", "pyarrow", "numpy", "safetensors"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except ImportError:
            versions[name] = "missing"
    return versions


@dataclass
class Stage:
    """A stage about to run: what it is, where it writes, and what decides whether it is up to date."""

    name: str
    directory: Path
    config: dict[str, Any]
    inputs: dict[str, str]
    seed: int

    @property
    def config_hash(self) -> str:
        blob = json.dumps(self.config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def read_manifest(self) -> dict[str, Any] | None:
        return read_manifest(self.directory)

    def up_to_date(self) -> bool:
        """True when the manifest matches this config and these inputs, and every output is intact."""
        manifest = self.read_manifest()
        if manifest is None:
            return False
        if manifest.get("config_hash") != self.config_hash or manifest.get("inputs") != self.inputs:
            return False
        for rel, digest in manifest.get("outputs", {}).items():
            path = self.directory / rel
            if not path.is_file() or hash_file(path) != digest:
                return False
        return True

    def write_manifest(self, started: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        outputs = hash_outputs(self.directory)
        manifest = {
            "stage": self.name,
            "config": self.config,
            "config_hash": self.config_hash,
            "inputs": self.inputs,
            "outputs": outputs,
            "outputs_hash": combined_hash(outputs),
            "seed": self.seed,
            "code": code_version(),
            "libraries": library_versions(),
            "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "wall_time_s": round(time.time() - started, 3),
        }
        if extra:
            manifest.update(extra)
        write_json(self.directory / MANIFEST, manifest)
        return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, OSError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
