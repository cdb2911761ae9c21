"""Progress bars with rate and ETA for anything that takes more than a few seconds."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def quiet() -> bool:
    return os.environ.get("SMELT_QUIET", "") not in ("", "0")


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    unit_scale: bool = False,
) -> tqdm:
    """A progress bar on stderr; silent when SMELT_QUIET is set (tests) so logs stay readable."""
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        file=sys.stderr,
        disable=quiet(),
        mininterval=1.0,
        dynamic_ncols=True,
        leave=False,
    )


def iterate(iterable: Iterable[T], **kwargs) -> Iterator[T]:
    yield from progress(iterable, **kwargs)


def log(message: str) -> None:
    """A line of status for the person at the terminal (stderr keeps stdout for summaries)."""
    if not quiet():
        print(message, file=sys.stderr, flush=True)
