from pathlib import Path

import pytest

from smelt.config import DataConfig, SourceConfig


def _source(name: str, root: Path | str, **kw) -> SourceConfig:
    """A source with no heuristic filters unless `filters` is given: most tests use tiny documents."""
    return SourceConfig(name=name, root=str(root), **{"filters": [], **kw})


def _config(*sources: SourceConfig, **kw) -> DataConfig:
    defaults = {"min_chars": 1, "val_fraction": 0.0, "workers": 1}
    return DataConfig(sources=list(sources), **{**defaults, **kw})


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode("utf-8"))
    return root


@pytest.fixture
def source():
    """source(name, root, **SourceConfig fields)"""
    return _source


@pytest.fixture
def config():
    """config(*sources, **DataConfig fields): min_chars=1, val_fraction=0, workers=1 unless given."""
    return _config


@pytest.fixture
def write():
    """write(root, {relative path: text or bytes}) -> root"""
    return _write
