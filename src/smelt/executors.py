"""Where a stage's independent tasks run: a local process pool (the default) or Ray tasks on a cluster.

Curation (the map over work shards, the MinHash signatures of the near-dedup plan) and tokenization (the
encoding batches) hand their tasks to a `TaskExecutor`. A task is a module-level function and its
arguments; its result comes back to the driving process, which merges counts, writes in canonical order
and drives the progress bar. Nothing about the output depends on where a task ran, so the bytes out are
the same for the pool, for Ray, and for any number of workers.

* `ProcessPool`: today's local behaviour. One worker runs tasks in this process; more start a
  `ProcessPoolExecutor`. A worker that dies (killed, out of memory) breaks that pool: a fresh pool
  starts and runs again every task the broken one had not finished, and each task that was running
  when it broke is charged an attempt; one charged more than `retries` times fails the run (the stage's
  completion markers then make the rerun skip what was finished). The pool cannot tell which of the
  tasks running at that moment killed its worker, so a task running beside it is charged too.
* `RayExecutor` (`data.executor = "ray"`, `tokens.executor = "ray"`; the `ray` extra): every task is a Ray
  task with `max_retries` (`data.retries`, `tokens.retries`), so a task whose worker process or node died
  is run again by Ray; tasks write their outputs atomically and deterministically, so a task run twice
  leaves the same bytes. `address` empty starts a local Ray on this machine (`workers` CPUs, 0: all);
  `auto` or `ray://host:10001` joins an existing cluster (all its CPUs), whose nodes need smelt
  installed and must reach the stage's input and output paths (a shared filesystem; inputs may be URLs).
  A Ray this process had initialized already is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
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


class WorkerDied(BrokenProcessPool):
    """A pool task whose worker process died more often than the retries allow."""


_POOL_WORKER: dict[str, str] = {}  # in a pool worker: "starts", the directory of running-task files


def _pool_worker_init(starts: str, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    _POOL_WORKER["starts"] = starts
    if initializer is not None:
        initializer(*initargs)


def _pool_call(number: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one pool task with a file saying it is running: a file left behind by a worker that died
    names the task that was running on it."""
    running = os.path.join(_POOL_WORKER["starts"], str(number))
    with open(running, "w"):
        pass
    try:
        return fn(*args)
    finally:
        os.unlink(running)


class _PoolTask(Future):
    """A task's future as the caller holds it: when the pool breaks under the task, the task runs again
    in a fresh pool and this future gets the result of that attempt."""

    def __init__(self, pool: ProcessPool, number: int, fn: Callable[..., Any], args: tuple):
        super().__init__()
        self.pool, self.number, self.fn, self.args = pool, number, fn, args
        self.attempts = 0  # runs that ended with the pool broken under them
        self.attempt: Future | None = None

    def result(self, timeout: float | None = None) -> Any:
        self.pool.wait_until(self.done, timeout)
        return super().result(0 if timeout is not None else None)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.pool.wait_until(self.done, timeout)
        return super().exception(0 if timeout is not None else None)

    def cancel(self) -> bool:
        if self.attempt is not None:
            self.attempt.cancel()
        return super().cancel()


class ProcessPool(TaskExecutor):
    """Tasks in local processes; with one worker, in this process (no start-up cost, easy to debug).
    With more, a task whose worker process dies is run again, up to `retries` times."""

    name = "pool"

    def __init__(
        self,
        workers: int,
        start: str | None = None,
        initializer: Callable[..., None] | None = None,
        initargs: tuple = (),
        retries: int = 0,
        key: str = "executor",
    ):
        self.workers = max(1, workers)
        self.retries = retries
        self._key = key
        self._start = start or start_method()
        self._initializer, self._initargs = initializer, initargs
        self._pool: ProcessPoolExecutor | None = None
        self._starts: str | None = None  # where workers note the task they are running
        self._numbers = itertools.count()
        self._changed = threading.Condition()
        self._broken: list[_PoolTask] = []  # tasks the broken pool did not finish, to run again
        self._cause: BaseException | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self.workers == 1:
            future: Future = Future()
            try:
                _initialize_once(self._initializer, self._initargs)
                future.set_result(fn(*args))
            except Exception as exc:
                future.set_exception(exc)
            return future
        task = _PoolTask(self, next(self._numbers), fn, args)
        self._begin(task)
        return task

    def _begin(self, task: _PoolTask) -> None:
        if self._pool is None:
            self._starts = self._starts or tempfile.mkdtemp(prefix="smelt-pool-")
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context(self._start),
                initializer=_pool_worker_init,
                initargs=(self._starts, self._initializer, self._initargs),
            )
        try:
            task.attempt = self._pool.submit(_pool_call, task.number, task.fn, *task.args)
        except BrokenProcessPool as exc:  # broke before this task was handed over: it never ran
            self._settle(task, exc)
            return
        task.attempt.add_done_callback(lambda attempt: self._settled(task, attempt))

    def _settled(self, task: _PoolTask, attempt: Future) -> None:
        """Runs in the pool's management thread when an attempt ends."""
        if attempt.cancelled():
            task.cancel()
            with self._changed:
                self._changed.notify_all()
            return
        exc = attempt.exception()
        self._settle(task, exc, None if exc is not None else attempt.result())

    def _settle(self, task: _PoolTask, exc: BaseException | None, result: Any = None) -> None:
        if isinstance(exc, BrokenProcessPool) and not isinstance(exc, WorkerDied):
            with self._changed:
                self._broken.append(task)
                self._cause = exc
                self._changed.notify_all()
            return
        task.args = ()  # settled for good: it runs no more, and its arguments (text batches) can go
        if task.set_running_or_notify_cancel():  # False: the caller stopped waiting for it
            if exc is None:
                task.set_result(result)
            else:
                task.set_exception(exc)
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, ready: Callable[[], bool], timeout: float | None = None) -> None:
        """Block until `ready()` (or `timeout` seconds: the future's result() then raises TimeoutError);
        start a fresh pool for the tasks of a broken one meanwhile (in the calling thread, so that no
        process is forked from the pool's management thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._changed:
                while not ready() and not self._broken:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return
                    self._changed.wait(left)
                if ready():
                    return
            self._restart()

    def _restart(self) -> None:
        # shutdown waits for the broken pool's management thread: every task it had not finished is
        # in self._broken once it returns
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._changed:
            broken, self._broken = sorted(self._broken, key=lambda t: t.number), []
        ran = [t for t in broken if os.path.exists(os.path.join(self._starts or "", str(t.number)))]
        for task in ran or broken:  # none had started: the pool itself failed (its initializer), charge all
            task.attempts += 1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._starts or "", str(task.number)))
        for task in broken:
            if task.attempts > self.retries:
                retries_key = self._key.rsplit(".", 1)[0] + ".retries"
                died = WorkerDied(
                    f"a worker process died while running this task, {task.attempts} times (killed, or out "
                    f"of memory?), and {retries_key} = {self.retries}. Lower the workers or the task size if "
                    f"memory ran out, or raise {retries_key}."
                )
                died.__cause__ = self._cause
                self._settle(task, died)
            elif not task.cancelled():
                self._begin(task)

    def share(self, value: Any) -> Any:
        return value

    def run(
        self, fn: Callable[..., Any], tasks: Sequence[tuple], shared: tuple = ()
    ) -> Iterator[tuple[int, Any]]:
        if self.workers > 1:
            return super().run(fn, tasks, shared)
        return self._inline(fn, tasks, shared)  # one task at a time as the caller iterates: a live bar

    def _completed(self, futures: dict[Future, int]) -> Iterator[tuple[int, Any]]:
        finished: deque[Future] = deque()
        for future in futures:
            future.add_done_callback(finished.append)
        try:
            for _ in range(len(futures)):
                self.wait_until(lambda: bool(finished))
                future = finished.popleft()
                yield futures[future], future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise

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
        if self._starts is not None:
            shutil.rmtree(self._starts, ignore_errors=True)
            self._starts = None


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
        return ProcessPool(resolve_workers(workers), start, initializer, initargs, retries, key)
    if kind == "ray":
        return RayExecutor(workers, address, retries, initializer, initargs, key)
    raise UserError(f"{key} = {kind!r} is not an executor. Use one of: {', '.join(EXECUTORS)}.")
