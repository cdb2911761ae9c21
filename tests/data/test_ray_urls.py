"""Source roots and the documents directory given as URLs (fsspec): file://, and a remote store
(fsspec's in-memory filesystem stands in for s3:// or gs://, whose packages are not installed here).
Documents written to a store's URL: tests/data/test_url_outputs.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import fsspec
import pytest

from smelt.config import DataConfig, SourceConfig
from smelt.data.curate import curate
from smelt.errors import UserError
from smelt.storage import mirror_dir


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _config(root: str, cache: Path) -> DataConfig:
    source = SourceConfig(name="speeches", root=root, include=["**/*.txt"], exclude=["skip/*"])
    return DataConfig(sources=[source], min_chars=64, val_fraction=0.2, workers=1, url_cache=str(cache))


@pytest.fixture
def speeches(shared_data, tmp_path) -> Path:
    """Eight real inaugural addresses in two folders, and one file the exclude pattern leaves out."""
    root = tmp_path / "speeches"
    files = sorted((shared_data / "corpus/prose/nltk_inaugural").glob("18*.txt"))[:8]
    for i, path in enumerate(files):
        target = root / ("early" if i < 4 else "late") / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (root / "skip").mkdir()
    shutil.copyfile(files[0], root / "skip" / "copy.txt")
    return root


def test_file_urls_read_and_write_like_paths(speeches, tmp_path):
    by_path = curate(_config(str(speeches), tmp_path / "cache"), tmp_path / "by_path")
    by_url = curate(_config(speeches.as_uri(), tmp_path / "cache"), (tmp_path / "by_url").as_uri())
    assert by_path["documents_in"] == 8
    assert _tree(tmp_path / "by_url") == _tree(tmp_path / "by_path") and by_url == by_path
    assert not (tmp_path / "cache").exists()  # local files are read where they are, never copied


def test_remote_root_is_mirrored_and_refetched_only_when_changed(speeches, tmp_path, monkeypatch):
    memory = fsspec.filesystem("memory")
    url = f"memory://smelt-test-{tmp_path.name}/corpus"
    for path in sorted(p for p in speeches.rglob("*") if p.is_file()):
        memory.pipe(f"{url}/{path.relative_to(speeches).as_posix()}", path.read_bytes())
    cache = tmp_path / "cache"
    local = curate(_config(str(speeches), cache), tmp_path / "local")
    remote = curate(_config(url, cache), tmp_path / "remote")
    assert _tree(tmp_path / "remote") == _tree(tmp_path / "local") and remote == local
    mirror = mirror_dir(str(cache), url)
    assert sorted(p.relative_to(mirror).as_posix() for p in mirror.rglob("*") if p.is_file()) == sorted(
        p.relative_to(speeches).as_posix() for p in speeches.rglob("*.txt") if p.parent.name != "skip"
    )

    fetched: list[str] = []
    get_file = type(memory).get_file
    monkeypatch.setattr(
        type(memory),
        "get_file",
        lambda fs, src, dst, **kw: fetched.append(src) or get_file(fs, src, dst, **kw),
    )
    first = sorted(speeches.rglob("early/*.txt"))[0].relative_to(speeches).as_posix()
    memory.pipe(f"{url}/{first}", b"A new address, long enough to be kept by the length filter. " * 3)
    last = sorted(speeches.rglob("late/*.txt"))[-1].relative_to(speeches).as_posix()
    memory.rm(f"{url}/{last}")
    again = curate(_config(url, cache), tmp_path / "again")
    assert [f.rsplit("/", 1)[-1] for f in fetched] == [first.rsplit("/", 1)[-1]]  # only the changed file
    assert again["documents_in"] == 7 and not (mirror / last).exists()  # a deleted file leaves the mirror


def test_url_user_errors(tmp_path):
    with pytest.raises(
        UserError, match=r"source 'speeches': root 's3://bucket/crawl' needs the fsspec .*s3fs"
    ):
        curate(_config("s3://bucket/crawl", tmp_path / "cache"), tmp_path / "out")
    with pytest.raises(UserError, match=r"names the host 'otherhost'; a file:// URL must name a local path"):
        curate(_config("file://otherhost/data", tmp_path / "cache"), tmp_path / "out")
    with pytest.raises(UserError, match=r"root 'memory://nothing-here' has no files \(or does not exist\)"):
        curate(_config("memory://nothing-here", tmp_path / "cache"), tmp_path / "out")


def folder_store_class() -> type:
    """A store whose buckets are folders: teststore://bucket/key is $SMELT_TEST_STORE/bucket/key. Every
    file fetched is noted with the process that fetched it, in $SMELT_TEST_STORE.fetches. Made by a
    function so that a Ray worker, which cannot import this module, can be sent the function and make
    the class (the class itself holds fsspec's instance cache and lock, which do not pickle)."""
    import os
    from pathlib import Path

    from fsspec.implementations.local import LocalFileSystem

    class FolderStore(LocalFileSystem):
        protocol = ("teststore",)

        @classmethod
        def _strip_protocol(cls, path):
            path = str(path)
            if path.startswith("teststore://"):
                base = os.environ["SMELT_TEST_STORE"]
                return os.path.join(base, path.removeprefix("teststore://")).rstrip("/")
            return super()._strip_protocol(path)

        def get_file(self, path1, path2, *args, **kwargs):
            with open(os.environ["SMELT_TEST_STORE"] + ".fetches", "a") as log:
                log.write(f"{os.getpid()} {Path(path1).name}\n")
            return super().get_file(path1, path2, *args, **kwargs)

    return FolderStore


FolderStore = folder_store_class()


@pytest.mark.slow
def test_store_files_are_read_by_the_tasks_not_the_driver(speeches, tmp_path, monkeypatch):
    store = tmp_path / "store"
    shutil.copytree(speeches, store / "bucket" / "corpus")
    monkeypatch.setenv("SMELT_TEST_STORE", str(store))
    fsspec.register_implementation("teststore", FolderStore, clobber=True)  # forked workers inherit it
    cache = tmp_path / "cache"
    local_cfg, store_cfg = _config(str(speeches), cache), _config("teststore://bucket/corpus", cache)
    local_cfg.workers = store_cfg.workers = 2
    local = curate(local_cfg, tmp_path / "local")
    remote = curate(store_cfg, tmp_path / "remote")
    assert _tree(tmp_path / "remote") == _tree(tmp_path / "local") and remote == local
    fetches = [line.split() for line in (tmp_path / "store.fetches").read_text().splitlines()]
    assert sorted(name for _, name in fetches) == sorted(p.name for p in speeches.glob("[el]*/*.txt"))
    assert str(os.getpid()) not in {pid for pid, _ in fetches}  # every file was read by a map task
    assert not cache.exists()  # and nothing was mirrored by the driver


def test_a_stores_files_key_the_curate_stage_by_their_listed_versions(speeches, tmp_path, monkeypatch):
    from smelt.config import load_config
    from smelt.run.pipeline import _stage_inputs

    store = tmp_path / "store"
    shutil.copytree(speeches, store / "bucket" / "corpus")
    monkeypatch.setenv("SMELT_TEST_STORE", str(store))
    fsspec.register_implementation("teststore", FolderStore, clobber=True)
    path = tmp_path / "run.toml"
    path.write_text(
        f'[run]\ndir = "{tmp_path}"\n[[data.sources]]\nname = "s"\nroot = "teststore://bucket/corpus"\n'
        f'include = ["**/*.txt"]\n'
    )
    cfg = load_config(path, [])
    before = _stage_inputs(cfg, "curate")
    changed = next((store / "bucket" / "corpus" / "late").iterdir())
    changed.write_text(changed.read_text() + "\nOne more line.\n")
    assert _stage_inputs(cfg, "curate") != before  # a changed file in the store makes the stage stale
    assert not (tmp_path / "store.fetches").exists()  # keyed without reading a file


def test_a_store_file_gone_before_its_task_reads_it_is_a_user_error(tmp_path, monkeypatch):
    from smelt.storage import task_local

    monkeypatch.setenv("SMELT_TEST_STORE", str(tmp_path))
    fsspec.register_implementation("teststore", FolderStore, clobber=True)
    (tmp_path / "bucket").mkdir()
    with pytest.raises(UserError) as info, task_local("teststore://bucket", "teststore://bucket/gone.txt"):
        pass
    assert str(info.value) == (
        "teststore://bucket/gone.txt was listed when the run started but is not in the store any more. "
        "Run again: the store is listed anew, and the curation starts over on what it holds now."
    )
    missing = r"^s3://bucket/a.txt: this worker has no fsspec filesystem for s3://"
    with pytest.raises(UserError, match=missing), task_local("s3://bucket", "s3://bucket/a.txt"):
        pass
