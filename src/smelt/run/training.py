"""The train stage's summary: the trainer's, with where its wall time went (goodput, read after the
fact from its metrics files by report/goodput.py) and the checkpoint-interval hint printed at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smelt.config import Config
from smelt.manifest import write_json
from smelt.report.goodput import run_goodput, say_interval_hint


def with_goodput(cfg: Config, train_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The trainer's `summary` with "goodput" (rank 0's; None on the other ranks), written back to
    RUN/train/summary.json by rank 0, which also prints the checkpoint-interval hint."""
    if summary.get("rank") != 0:
        return {**summary, "goodput": None}
    figures = run_goodput(train_dir, cfg.checkpoint.mtbf_hours, cfg.checkpoint.every_steps)
    summary = {**summary, "goodput": figures}
    write_json(Path(train_dir) / "summary.json", summary)
    say_interval_hint(figures)
    return summary
