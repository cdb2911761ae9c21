"""Curation and tokenization as Ray tasks: same bytes as the process pool, killed workers tolerated.

One local Ray (`ray.init(num_cpus=2)`) serves every test of this module and is shut down after it, so
no other test module forks pool workers from a process holding Ray's threads. The process-pool
baselines run before Ray starts.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from smelt.config import DataConfig, SourceConfig, TokenizerConfig, TokensConfig
from smelt.data.curate import curate
from smelt.data.executor import map_shard as real_map_shard
from smelt.errors import UserError
from smelt.executors import make_executor
from smelt.tokenizer.train import train_tokenizer
from smelt.tokens.tokenize import tokenize

ray = pytest.importorskip("ray")
# The fault-injecting task wrappers below live in this test module, which Ray's workers cannot import:
# send them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


pytestmark = pytest.mark.slow  # the module starts a heavy shared fixture


def _data_config(shared: Path, **kw) -> DataConfig:
    """Real sources (a text tree and a JSONL crawl sample) cut into a dozen work shards, with MinHash
    near-dedup (and not exact dedup) on, and a few speeches read twice, so that the signature tasks
    find clusters and the reduce removes copies."""
    speeches = str(shared / "corpus/prose/nltk_inaugural")
    sources = [
        SourceConfig(name="inaugural", root=speeches, include=["*.txt"]),
        SourceConfig(name="again", root=speeches, include=["17*.txt"]),
        SourceConfig(
            name="web",
            format="jsonl",
            root=str(shared / "corpus/web/dolma-cc-sample"),
            include=["*.jsonl"],
            id_field="id",
        ),
    ]
    cfg = DataConfig(
        sources=sources, min_chars=64, val_fraction=0.1, workers=2, shard_bytes=80_000, exact_dedup=False
    )
    cfg.near_dedup.enabled = True
    for key, value in kw.items():
        setattr(cfg, key, value)
    return cfg


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _identity_holds(stats: dict) -> bool:
    return all(
        block["documents_in"]
        == block["documents_kept"] + sum(block["dropped"].values()) + sum(block["quarantined"].values())
        for block in [stats, *stats["sources"].values()]
    )


@pytest.fixture(scope="module")
def pool_run(shared_data, tmp_path_factory):
    """The process pool's documents, a tokenizer trained on them, and the pool's token shards."""
    root = tmp_path_factory.mktemp("pool")
    stats = curate(_data_config(shared_data), root / "documents")
    train_tokenizer(
        TokenizerConfig(vocab_size=400, sample_bytes=200_000), root / "documents", root / "tok", 0
    )
    tokens_cfg = TokensConfig(shard_tokens=20_000, batch_docs=16, workers=2)
    tokenize(tokens_cfg, root / "documents", root / "tok", root / "tokens")
    return {
        "root": root,
        "stats": stats,
        "documents": _tree(root / "documents"),
        "tokens": _tree(root / "tokens"),
    }


@pytest.fixture(scope="module")
def local_ray(pool_run):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # never a cluster left running here
    yield ray
    ray.shutdown()
    for sig, handler in handlers.items():  # ray.init replaced them; later tests check the defaults
        signal.signal(sig, handler)


def test_ray_curate_is_byte_identical_to_the_pool(
    pool_run, local_ray, shared_data, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("SMELT_QUIET", "0")
    stats = curate(_data_config(shared_data, executor="ray"), tmp_path / "documents")
    assert _tree(tmp_path / "documents") == pool_run["documents"]
    assert stats == pool_run["stats"] and _identity_holds(stats)
    assert stats["near_dedup"]["documents_in_clusters"] == 6  # the signature tasks found the copies
    assert stats["dropped"]["near_duplicate"] == 3
    err = capsys.readouterr().err
    assert "work shards on 2 Ray CPUs" in err  # progress and counts from Ray tasks reach the terminal
    assert "curate: map" in err


def _kill_first_then_map(marker: str, shard, steps, map_dir):
    """The first task to get here leaves a half-written output and dies like an OOM-killed worker."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return real_map_shard(shard, steps, map_dir)
    (Path(map_dir) / f"{shard.key}.parquet.tmp").write_bytes(b"half a parquet file")
    os.kill(os.getpid(), signal.SIGKILL)


def test_killed_ray_worker_is_retried_with_identical_output(
    pool_run, local_ray, shared_data, tmp_path, monkeypatch
):
    marker = tmp_path / "killed-once"
    monkeypatch.setattr("smelt.data.executor.map_shard", functools.partial(_kill_first_then_map, str(marker)))
    stats = curate(_data_config(shared_data, executor="ray", retries=2), tmp_path / "documents")
    assert marker.exists()  # a worker did die
    assert _tree(tmp_path / "documents") == pool_run["documents"]  # no document lost or duplicated
    assert _identity_holds(stats) and stats == pool_run["stats"]


def _record_then_map(log_dir: str, kill_marker: str, shard, steps, map_dir):
    """Note which shard ran; with a kill marker, the first task dies (and, with no retries, fails)."""
    (Path(log_dir) / shard.key).write_text("")
    if kill_marker:
        return _kill_first_then_map(kill_marker, shard, steps, map_dir)
    return real_map_shard(shard, steps, map_dir)


def test_rerun_after_a_failed_task_skips_finished_shards(
    pool_run, local_ray, shared_data, tmp_path, monkeypatch
):
    out = tmp_path / "documents"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    cfg = _data_config(shared_data, executor="ray", retries=0)
    kill = str(tmp_path / "killed-once")
    monkeypatch.setattr(
        "smelt.data.executor.map_shard", functools.partial(_record_then_map, str(first), kill)
    )
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        curate(cfg, out)
    done = {p.name.removesuffix(".done") for p in (out / "_work" / "map").glob("*.done")}
    monkeypatch.setattr("smelt.data.executor.map_shard", functools.partial(_record_then_map, str(second), ""))
    stats = curate(cfg, out)
    rerun = {p.name for p in second.iterdir()}
    assert rerun and not rerun & done  # finished shards were skipped, the rest were done
    assert _tree(out) == pool_run["documents"] and _identity_holds(stats)


def test_ray_tokenize_is_byte_identical_to_the_pool(pool_run, local_ray, tmp_path):
    root = pool_run["root"]
    cfg = TokensConfig(shard_tokens=20_000, batch_docs=16, workers=2, executor="ray")
    result = tokenize(cfg, root / "documents", root / "tok", tmp_path / "tokens")
    assert result["workers"] == 2
    assert _tree(tmp_path / "tokens") == pool_run["tokens"]
    assert json.loads((tmp_path / "tokens" / "stats.json").read_text())["documents"] > 0


def _die_first_time(marker: str, value: int) -> int:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return value * 2
    os.kill(os.getpid(), signal.SIGKILL)
    return -1


def _refuse(value: int) -> int:
    raise UserError(f"record {value} is bad: fix it")


def _break(value: int) -> int:
    raise ValueError(f"bug on {value}")


def test_ray_executor_retries_killed_tasks_and_passes_user_errors_on(local_ray, tmp_path):
    executor = make_executor("ray", 0, retries=1)
    future = executor.submit(_die_first_time, str(tmp_path / "marker"), 21)
    assert future.result() == 42
    results = dict(executor.run(_die_first_time, [(str(tmp_path / "m2"), i) for i in range(4)]))
    assert sorted(results) == [0, 1, 2, 3] and sorted(results.values()) == [0, 2, 4, 6]
    with pytest.raises(UserError) as info:
        executor.submit(_refuse, 7).result()
    assert str(info.value) == "record 7 is bad: fix it"  # the message alone, not Ray's traceback
    with pytest.raises(ValueError, match="bug on 3") as bug:
        executor.submit(_break, 3).result()
    assert "in _break" in str(bug.value)  # any other error keeps the worker's traceback
    executor.close()
    assert ray.is_initialized()  # a Ray it did not start is left running


def _from_store_then_map(store: str, make_store_class, shard, steps, map_dir):
    """Ray's workers are not forked from the test: register the test's store in the worker first."""
    import fsspec

    os.environ["SMELT_TEST_STORE"] = store
    fsspec.register_implementation("teststore", make_store_class(), clobber=True)
    return real_map_shard(shard, steps, map_dir)


def test_ray_tasks_read_a_stores_files_themselves(pool_run, local_ray, shared_data, tmp_path, monkeypatch):
    import fsspec

    from .test_ray_urls import FolderStore, folder_store_class

    # the workers cannot import the test modules: the store's class goes by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[FolderStore.__module__])
    store = tmp_path / "store"
    speeches = shared_data / "corpus/prose/nltk_inaugural"
    (store / "bucket").mkdir(parents=True)
    for path in sorted(speeches.glob("18*.txt"))[:6]:
        (store / "bucket" / path.name).write_bytes(path.read_bytes())
    monkeypatch.setenv("SMELT_TEST_STORE", str(store))
    fsspec.register_implementation("teststore", FolderStore, clobber=True)  # for the driver's listing
    monkeypatch.setattr(
        "smelt.data.executor.map_shard",
        functools.partial(_from_store_then_map, str(store), folder_store_class),
    )

    def config(root: str) -> DataConfig:
        source = SourceConfig(name="inaugural", root=root, include=["*.txt"])
        return DataConfig(sources=[source], min_chars=64, workers=2, shard_bytes=40_000, executor="ray")

    by_ray = curate(config("teststore://bucket"), tmp_path / "by_ray")
    fetches = [line.split() for line in (tmp_path / "store.fetches").read_text().splitlines()]
    assert len(fetches) == 6 and str(os.getpid()) not in {pid for pid, _ in fetches}  # read in Ray workers
    local = curate(config(str(store / "bucket")), tmp_path / "local")
    assert _tree(tmp_path / "by_ray") == _tree(tmp_path / "local") and by_ray == local
