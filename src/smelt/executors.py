"""Where a stage's independent tasks run: a local process pool (the default) or Ray tasks on a cluster.

Curation (the map over work shards, the MinHash signatures of the near-dedup plan) and tokenization (the
encoding batches) hand their tasks to a `TaskExecutor`. A task is a module-level function and its
arguments; its result comes back to the driving process, which merges counts, writes in canonical order
and drives the progress bar. Nothing about the output depends on where a task ran, so the bytes out are
the same for the pool, for Ray, and for any number of workers.

* `ProcessPool`: today's local behaviour. One worker runs tasks in this process; more start a
  `ProcessPoolExecutor`. A worker that dies fails the run; the stage's completion markers make the
  rerun skip what was finished.
* `RayExecutor` (`data.executor = "ray"`, `tokens.executor = "ray"`; the `ray` extra): every task is a Ray
  task with `max_retries` (`data.retries`, `tokens.retries`), so a task whose worker process or node died
  is run again by Ray; tasks write their outputs atomically and deterministically, so a task run twice
  leaves the same bytes. `address` empty starts a local Ray on this machine (`workers` CPUs, 0: all);
  `auto` or `ray://host:10001` joins an existing cluster (all its CPUs), whose nodes need smelt
  installed and must reach the stage's input and output paths (a shared filesystem; inputs may be URLs).
  A Ray this process had initialized already is used as it is and left running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any

from smelt.errors import UserError

EXECUTORS = ("pool", "ray")
RAY_HINT = 'install the ray extra (pip install "smelt[ray]"), or set {key} = "pool"'


def start_method() -> str:
    """fork on Linux: works from any script, no `if __name__ == "__main__"` guard needed, and workers
    touch no lock the parent may hold (no tqdm, no logging, no torch); spawn elsewhere."""
    return "fork" if sys.platform == "linux" else "spawn"


def resolve_workers(workers: int) -> int:
    return (os.cpu_count() or 1) if workers == 0 else workers


class TaskExecutor(ABC):
    """Runs tasks `fn(*args)` somewhere and hands their results back to this process."""

    name: str
    workers: int  # how many tasks run at once (the pool's processes, or the Ray CPUs it was given)

    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start one task; its future holds the result (or the task's exception)."""

    @abstractmethod
    def share(self, value: Any) -> Any:
        """A handle to pass `value` to many tasks at the cost of sending it once (Ray puts it in the
        object store; the pool passes the value itself)."""

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple], shared: tuple = ()
    ) -> Iterator[tuple[int, Any]]:
        """Start `fn(*task, *shared)` for every task now, before returning; iterate to get
        `(task index, result)` as each task completes, in completion order."""
        handles = tuple(self.share(value) for value in shared)
        futures = {self.submit(fn, *task, *handles): i for i, task in enumerate(tasks)}
        return self._completed(futures)

    def _completed(self, futures: dict[Future, int]) -> Iterator[tuple[int, Any]]:
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def close(self) -> None:  # noqa: B027 - executors without resources to release keep this one
        """Release the workers."""

    def __enter__(self) -> TaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_INITIALIZED: dict[tuple, bool] = {}


def _initialize_once(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """Run a worker initializer once per process and arguments (Ray reuses its worker processes)."""
    if initializer is None:
        return
    key = (initializer.__module__, initializer.__qualname__, initargs)
    if key not in _INITIALIZED:
        initializer(*initargs)
        _INITIALIZED[key] = True


class ProcessPool(TaskExecutor):
    """Tasks in local processes; with one worker, in this process (no start-up cost, easy to debug)."""

    name = "pool"

    def __init__(
        self,
        workers: int,
        start: str | None = None,
        initializer: Callable[..., None] | None = None,
        initargs: tuple = (),
    ):
        self.workers = max(1, workers)
        self._start = start or start_method()
        self._initializer, self._initargs = initializer, initargs
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self.workers == 1:
            future: Future = Future()
            try:
                _initialize_once(self._initializer, self._initargs)
                future.set_result(fn(*args))
            except Exception as exc:
                future.set_exception(exc)
            return future
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context(self._start),
                initializer=self._initializer,
                initargs=self._initargs,
            )
        return self._pool.submit(fn, *args)

    def share(self, value: Any) -> Any:
        return value

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple], shared: tuple = ()
    ) -> Iterator[tuple[int, Any]]:
        if self.workers > 1:
            return super().run(fn, tasks, shared)
        return self._inline(fn, tasks, shared)  # one task at a time as the caller iterates: a live bar

    def _inline(
        self, fn: Callable[..., Any], tasks: Sequence[tuple], shared: tuple
    ) -> Iterator[tuple[int, Any]]:
        _initialize_once(self._initializer, self._initargs)
        for index, task in enumerate(tasks):
            yield index, fn(*task, *shared)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _ray_call(initializer: Callable[..., None] | None, initargs: tuple, fn: Callable[..., Any], *args: Any):
    _initialize_once(initializer, initargs)
    return fn(*args)


def _import_ray(key: str):
    try:
        import ray
    except ImportError as exc:
        raise UserError(
            f'{key} = "ray" needs Ray, which is not installed: {RAY_HINT.format(key=key)}.'
        ) from exc
    return ray


class RayExecutor(TaskExecutor):
    """Tasks as Ray tasks; joins the Ray already initialized in this process, else starts or joins one."""

    name = "ray"

    def __init__(
        self,
        workers: int,
        address: str = "",
        retries: int = 3,
        initializer: Callable[..., None] | None = None,
        initargs: tuple = (),
        key: str = "executor",
    ):
        ray = self._ray = _import_ray(key)
        self._started = False
        # ray.init installs its own SIGTERM/SIGINT handlers in this process; they are put back on close,
        # so a supervisor's or the trainer's handlers installed later in the same process still work.
        self._handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        if not ray.is_initialized():
            # "local" starts a Ray of its own even where `ray start` left a cluster running
            options: dict[str, Any] = {"include_dashboard": False, "address": address or "local"}
            if not address:  # as many CPUs as the stage's workers
                options["num_cpus"] = resolve_workers(workers)
            try:
                ray.init(**options)
            except ConnectionError as exc:
                raise UserError(
                    f"cannot reach the Ray cluster at {key.rsplit('.', 1)[0]}.ray_address = {address!r} "
                    f"({exc}). Start it (`ray start --head`), fix the address (auto, or ray://HOST:10001), "
                    f"or leave ray_address empty for a local Ray."
                ) from exc
            self._started = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._initializer, self._initargs = initializer, initargs
        self._remote = ray.remote(_ray_call).options(num_cpus=1, max_retries=retries)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        ref = self._remote.remote(self._initializer, self._initargs, fn, *args)
        future: Future = Future()
        ref.future().add_done_callback(lambda done: self._settle(done, future))
        return future

    def _settle(self, done: Future, future: Future) -> None:
        if not future.set_running_or_notify_cancel():  # the stage stopped waiting (another task failed)
            return
        exc = done.exception()
        if exc is None:
            future.set_result(done.result())
            return
        # Ray's error is an instance of the task's exception class too, and carries the remote traceback;
        # a UserError is passed on bare, so the message the user sees is the one it was raised with.
        cause = getattr(exc, "cause", None)
        future.set_exception(cause if isinstance(cause, UserError) else exc)

    def share(self, value: Any) -> Any:
        return self._ray.put(value)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)


def make_executor(
    kind: str,
    workers: int,
    *,
    address: str = "",
    retries: int = 3,
    key: str = "executor",
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
    start: str | None = None,
) -> TaskExecutor:
    """The executor a stage's config names (`kind` is the value of the config `key`, for messages)."""
    if kind == "pool":
        return ProcessPool(resolve_workers(workers), start, initializer, initargs)
    if kind == "ray":
        return RayExecutor(workers, address, retries, initializer, initargs, key)
    raise UserError(f"{key} = {kind!r} is not an executor. Use one of: {', '.join(EXECUTORS)}.")
