"""Documents written to a store's URL: staged locally, published with commit order and skip-on-rerun.

fsspec's in-memory filesystem stands in for s3:// or gs://: the publish runs in the driving process,
so the store needs to be reachable from this process only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import pytest

from smelt.config import DataConfig, SourceConfig
from smelt.data.curate import curate
from smelt.errors import UserError
from smelt.storage import PUBLISHED, publish, staging_dir

pytestmark = pytest.mark.slow  # each test curates eight speeches (about half a second)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _store_tree(url: str) -> dict[str, bytes]:
    fs = fsspec.filesystem("memory")
    root = fs._strip_protocol(url).rstrip("/")
    return {path.removeprefix(root).lstrip("/"): fs.cat_file(path) for path in sorted(fs.find(root))}


def _config(root: Path, cache: Path, **kw) -> DataConfig:
    source = SourceConfig(name="speeches", root=str(root), include=["*.txt"])
    return DataConfig(sources=[source], min_chars=64, val_fraction=0.2, workers=1, url_cache=str(cache), **kw)


@pytest.fixture
def speeches(shared_data, tmp_path) -> Path:
    root = tmp_path / "speeches"
    root.mkdir()
    for path in sorted((shared_data / "corpus/prose/nltk_inaugural").glob("18*.txt"))[:8]:
        shutil.copyfile(path, root / path.name)
    return root


@pytest.fixture
def uploads(monkeypatch) -> list[str]:
    """The store paths put, in order."""
    memory = type(fsspec.filesystem("memory"))
    put_file = memory.put_file
    done: list[str] = []
    monkeypatch.setattr(
        memory, "put_file", lambda fs, src, dst, **kw: done.append(dst) or put_file(fs, src, dst, **kw)
    )
    return done


def test_documents_to_a_store_are_the_local_bytes_and_stats_json_comes_last(speeches, tmp_path, uploads):
    url = f"memory://smelt-out-{tmp_path.name}/documents"
    local = curate(_config(speeches, tmp_path / "cache"), tmp_path / "local")
    remote = curate(_config(speeches, tmp_path / "cache"), url)
    assert remote == local and local["documents_kept"] > 0
    assert _store_tree(url) == _tree(tmp_path / "local")  # byte for byte, no _work or staging files
    assert uploads[-1].endswith("/documents/stats.json")  # what says the documents are complete, last
    assert (staging_dir(str(tmp_path / "cache"), url) / "train").is_dir()  # where the map tasks wrote
    uploads.clear()
    curate(_config(speeches, tmp_path / "cache"), url)
    assert uploads == []  # a rerun making the same bytes uploads nothing


def test_an_interrupted_publish_resumes_with_the_files_not_committed(
    speeches, tmp_path, uploads, monkeypatch
):
    url = f"memory://smelt-out-{tmp_path.name}/documents"
    staging = tmp_path / "staging"
    curate(_config(speeches, tmp_path / "cache", docs_per_part=2), staging)
    files = _tree(staging)
    memory = type(fsspec.filesystem("memory"))
    real_put = memory.put_file  # the fixture's, which notes each upload

    def fail_on_fifth(fs, src, dst, **kw):
        if len(uploads) == 4:
            raise ConnectionError("the store went away")
        return real_put(fs, src, dst, **kw)

    monkeypatch.setattr(memory, "put_file", fail_on_fifth)
    with pytest.raises(ConnectionError):
        publish(staging, url, "curate", ["train", "val"], last=("stats.json",))
    assert len(_store_tree(url)) == 4 and "stats.json" not in _store_tree(url)  # visibly incomplete
    monkeypatch.setattr(memory, "put_file", real_put)
    assert publish(staging, url, "curate", ["train", "val"], last=("stats.json",)) == len(files) - 4
    assert _store_tree(url) == files
    assert (tmp_path / f"staging{PUBLISHED}").is_file()  # the commit index lives beside the staging tree

    # a new run with fewer, larger parts: the store's output loses the parts the new run did not write,
    # and they, with every file the new run replaced by other bytes, are moved aside, not deleted
    shutil.rmtree(staging)
    curate(_config(speeches, tmp_path / "cache", docs_per_part=1000), staging)
    publish(staging, url, "curate", ["train", "val"], last=("stats.json",))
    assert _store_tree(url) == _tree(staging) and len(_tree(staging)) < len(files)
    (stamp,) = fsspec.filesystem("memory").ls(
        fsspec.filesystem("memory")._strip_protocol(url) + ".superseded"
    )
    set_aside = _store_tree(f"memory://{stamp['name'] if isinstance(stamp, dict) else stamp}")
    assert set_aside == {rel: data for rel, data in files.items() if _tree(staging).get(rel) != data}


def test_output_url_without_its_filesystem_is_a_user_error(speeches, tmp_path):
    with pytest.raises(UserError) as info:
        curate(_config(speeches, tmp_path / "cache"), "s3://bucket/documents")
    message = str(info.value)
    assert message.startswith("the curate URL 's3://bucket/documents' needs the fsspec filesystem for s3://")
    assert "Install its package (s3fs for s3://" in message


def test_smelt_curate_publish_copies_the_run_documents_to_a_store(speeches, tmp_path, capsys, monkeypatch):
    from smelt.cli import main

    monkeypatch.setenv("SMELT_QUIET", "0")  # the log lines are under test

    config = tmp_path / "r.toml"
    config.write_text(
        f'[run]\nname = "r"\ndir = "{tmp_path / "runs"}"\n[data]\nmin_chars = 64\nworkers = 1\n'
        f'[[data.sources]]\nname = "speeches"\nroot = "{speeches}"\ninclude = ["*.txt"]\n'
    )
    url = f"memory://smelt-cli-{tmp_path.name}/documents"
    assert main(["curate", str(config), "--publish", url]) == 0
    documents = tmp_path / "runs" / "r" / "documents"
    assert _store_tree(url) == _tree(documents)  # the stage's manifest.json included
    assert main(["curate", str(config), "--publish", url]) == 0  # up to date, and so is the store
    assert f"curate: {url} holds these {len(_tree(documents))} files already" in capsys.readouterr().err
