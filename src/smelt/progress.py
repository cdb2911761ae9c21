"""Progress bars with rate and ETA for anything that takes more than a few seconds, and status lines.

Under `torchrun` every rank runs the same command; only rank 0 speaks to the terminal, so a run on
N processes prints one banner, one bar and one summary, not N interleaved copies.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def quiet() -> bool:
    return os.environ.get("SMELT_QUIET", "") not in ("", "0")


def launch_rank() -> int:
    """This process's rank under torchrun (its RANK variable); 0 for a plain single-process run."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def speaks() -> bool:
    """Whether this process prints status: rank 0, unless SMELT_QUIET is set."""
    return launch_rank() == 0 and not quiet()


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    unit_scale: bool = False,
) -> tqdm:
    """A progress bar on stderr; silent when SMELT_QUIET is set (tests) or on ranks other than 0."""
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        file=sys.stderr,
        disable=not speaks(),
        mininterval=1.0,
        dynamic_ncols=True,
        leave=False,
    )


def log(message: str) -> None:
    """A line of status for the person at the terminal (stderr keeps stdout for summaries); rank 0 only."""
    if speaks():
        print(message, file=sys.stderr, flush=True)
