"""Fault injection for pool tests: a task that kills its own worker process once.

A module on the tests' import path (pyproject's pythonpath), so that pool workers started with spawn,
which import a task's function by name, find it.
"""

from __future__ import annotations

import importlib
import os
import signal
from typing import Any


def die_once(marker: str, target: str, *args: Any) -> Any:
    """The first call to get here (across processes: `marker` is created exclusively) dies as an
    out-of-memory-killed worker does, by SIGKILL; every other call returns `module.function(*args)` for
    `target` "module:function", looked up in the worker (where a test's monkeypatch does not reach)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name)(*args)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the process was killed")
