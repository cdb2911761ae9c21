"""The executor seam without Ray: the process pool, and the messages when Ray is asked for but missing."""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import pytest

from smelt.config import DataConfig, SourceConfig
from smelt.data.curate import curate
from smelt.data.executor import map_shard as real_map_shard
from smelt.errors import UserError
from smelt.executors import ProcessPool, WorkerDied, make_executor


def _pid_and_square(value: int, offset: int) -> tuple[int, int]:
    return os.getpid(), value * value + offset


def _refuse(value: int) -> int:
    raise UserError(f"record {value} is bad")


def test_pool_runs_every_task_once_with_shared_arguments():
    with make_executor("pool", 2) as pool:
        results = dict(pool.run(_pid_and_square, [(i,) for i in range(6)], shared=(100,)))
    assert sorted(results) == list(range(6))
    assert sorted(v for _, v in results.values()) == [100 + i * i for i in range(6)]
    assert os.getpid() not in {pid for pid, _ in results.values()}  # they ran in worker processes


def test_one_worker_runs_inline_one_task_per_step():
    pool = ProcessPool(1)
    calls: list[int] = []
    results = pool.run(lambda value: calls.append(value) or value, [(1,), (2,), (3,)])
    assert calls == []  # nothing ran yet: a progress bar made now sees every task
    assert next(results) == (0, 1) and calls == [1]
    assert list(results) == [(1, 2), (2, 3)]
    with pytest.raises(UserError, match="record 7 is bad"):
        pool.submit(_refuse, 7).result()


def test_ray_missing_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    (tmp_path / "a.txt").write_text("some text long enough " * 10)
    cfg = DataConfig(sources=[SourceConfig(name="a", root=str(tmp_path))], executor="ray", workers=1)
    with pytest.raises(UserError) as info:
        curate(cfg, tmp_path / "out")
    assert str(info.value) == (
        'data.executor = "ray" needs Ray, which is not installed: install the ray extra '
        '(pip install "smelt[ray]"), or set data.executor = "pool".'
    )


def test_unknown_executor_is_a_user_error():
    with pytest.raises(
        UserError, match=r"tokens.executor = 'dask' is not an executor. Use one of: pool, ray"
    ):
        make_executor("dask", 1, key="tokens.executor")


def test_where_tasks_run_is_not_part_of_the_curate_stage_key(tmp_path):
    from smelt.config import load_config
    from smelt.run.pipeline import _stage_config

    path = tmp_path / "run.toml"
    path.write_text(f'[run]\ndir = "{tmp_path}"\n[[data.sources]]\nname = "a"\nroot = "{tmp_path}"\n')
    base = _stage_config(load_config(path, []), "curate")
    on_ray = load_config(path, ["data.executor=ray", "data.ray_address=auto", "data.url_cache=/tmp/c"])
    assert _stage_config(on_ray, "curate") == base  # a run resumes or stays up to date across them
    assert _stage_config(load_config(path, ["data.min_chars=5"]), "curate") != base


class _FakeRay:
    """Just enough of ray for RayExecutor's start and close: init installs a SIGTERM handler, as Ray does."""

    def __init__(self) -> None:
        self.up = False

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **options) -> None:
        self.up = True
        signal.signal(signal.SIGTERM, lambda *_: None)

    def cluster_resources(self) -> dict:
        return {"CPU": 2}

    def remote(self, fn):
        return type("Remote", (), {"options": lambda self, **kw: self})()

    def shutdown(self) -> None:
        self.up = False


def test_ray_executor_puts_the_drivers_signal_handlers_back(monkeypatch):
    import smelt.executors as executors

    monkeypatch.setattr(executors, "_import_ray", lambda key: _FakeRay())
    before = signal.getsignal(signal.SIGTERM)
    executor = executors.RayExecutor(2)
    assert signal.getsignal(signal.SIGTERM) is not before  # ray.init replaced it
    executor.close()
    assert signal.getsignal(signal.SIGTERM) is before


def _die_once(marker: str, value: int) -> int:
    """The first task to get here dies like an OOM-killed worker; the marker file says it happened."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return value * 2
    os.kill(os.getpid(), signal.SIGKILL)
    return -1


def _always_die(value: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return value


def test_pool_runs_again_the_tasks_of_a_killed_worker(tmp_path):
    marker = str(tmp_path / "killed-once")
    with make_executor("pool", 2, retries=1) as pool:
        results = dict(pool.run(_die_once, [(marker, i) for i in range(6)]))
        assert os.path.exists(marker)  # a worker did die
        assert results == {i: 2 * i for i in range(6)}  # every task's result once, none lost
        again = [pool.submit(_die_once, str(tmp_path / "second"), i) for i in range(4)]
        assert [f.result() for f in again] == [0, 2, 4, 6]  # submit's futures survive a broken pool


def test_pool_gives_up_on_a_task_that_keeps_killing_its_worker(tmp_path):
    with make_executor("pool", 2, retries=1, key="tokens.executor") as pool:
        future = pool.submit(_always_die, 3)
        with pytest.raises(WorkerDied) as info:
            future.result()
    assert str(info.value) == (
        "a worker process died while running this task, 2 times (killed, or out of memory?), and "
        "tokens.retries = 1. Lower the workers or the task size if memory ran out, or raise tokens.retries."
    )


def _kill_first_then_map(marker: str, shard, steps, map_dir):
    """The first map task to get here leaves a half-written output and dies like an OOM-killed worker."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return real_map_shard(shard, steps, map_dir)
    (Path(map_dir) / f"{shard.key}.parquet.tmp").write_bytes(b"half a parquet file")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_pool_curate_with_a_killed_worker_is_byte_identical(shared_data, tmp_path, monkeypatch):
    speeches = shared_data / "corpus/prose/nltk_inaugural"
    cfg = DataConfig(
        sources=[SourceConfig(name="inaugural", root=str(speeches), include=["18*.txt"])],
        min_chars=64,
        val_fraction=0.1,
        workers=2,
        shard_bytes=60_000,
        retries=1,
    )
    clean = curate(cfg, tmp_path / "clean")
    marker = tmp_path / "killed-once"
    monkeypatch.setattr("smelt.data.executor.map_shard", functools.partial(_kill_first_then_map, str(marker)))
    killed = curate(cfg, tmp_path / "killed")
    assert marker.exists()  # a worker did die mid-task

    def tree(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    assert tree(tmp_path / "killed") == tree(tmp_path / "clean")  # no document lost or duplicated
    assert killed == clean
    assert killed["documents_in"] == killed["documents_kept"] + sum(killed["dropped"].values()) + sum(
        killed["quarantined"].values()
    )


@pytest.mark.slow
def test_pool_futures_honour_a_timeout():
    import time
    from concurrent.futures import TimeoutError as FutureTimeout

    with make_executor("pool", 2) as pool:
        future = pool.submit(time.sleep, 0.3)
        with pytest.raises(FutureTimeout):
            future.result(timeout=0.01)
        assert future.result() is None and future.exception(timeout=0) is None
