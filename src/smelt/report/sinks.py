"""A finished run as TensorBoard event files (`smelt report RUN --tensorboard`): its metrics.jsonl and the
results `smelt eval` wrote, through the same TensorBoard sink the trainer logs to live (train/sinks.py),
with the text sets scored by `smelt eval --data` (`data_scalars`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from smelt.metric_records import finite
from smelt.train.sinks import TensorBoardSink

# The figures of one `--data` set (eval/step_*.json's `data`) that become curves: the model's, and the
# compressors' on the same bytes, whole set and per window.
DATA_FIGURES = (
    "loss",
    "bits_per_byte",
    "gzip_bits_per_byte",
    "xz_bits_per_byte",
    "gzip_window_bits_per_byte",
    "xz_window_bits_per_byte",
)


def data_tag(label: str) -> str:
    """A text set's path as given (`../shared/data/corpus/web/dolma-cc-sample`) as one tag segment
    (`shared_data_corpus_web_dolma-cc-sample`): TensorBoard groups tags by their slashes."""
    return re.sub(r"[^\w.\-]+", "_", label).strip("_.") or "set"


def data_scalars(result: dict[str, Any]) -> list[tuple[str, float]]:
    """The (tag, value) curves of the text sets one `smelt eval` result scored with `--data`, under
    checkpoint_eval/data/<set>/<figure>."""
    out: list[tuple[str, float]] = []
    for label, figures in sorted((result.get("data") or {}).items()):
        if not isinstance(figures, dict):
            continue
        for key in DATA_FIGURES:
            if finite(figures.get(key)):
                out.append((f"checkpoint_eval/data/{data_tag(label)}/{key}", float(figures[key])))
    return out


def export_tensorboard(run_dir: str | Path, logdir: str | Path) -> tuple[Path, int]:
    """Write a run's metrics.jsonl and its `smelt eval` results (eval/step_*.json, at the tokens each
    checkpoint had seen: held-out, tasks, `--data` sets) as TensorBoard event files under `logdir`;
    (logdir, records and results written)."""
    from smelt.report.eval_sections import tokens_of
    from smelt.report.run import load_run

    run = load_run(run_dir)
    sink = TensorBoardSink(logdir)
    try:
        for record in run.records:
            sink.log(record)
        for result in run.evals:
            tokens = tokens_of(run, result)
            sink.log_eval_result(result, tokens)
            for tag, value in data_scalars(result):
                sink.writer.add_scalar(tag, value, int(tokens))
    finally:
        sink.close()
    return Path(logdir), len(run.records) + len(run.evals)
