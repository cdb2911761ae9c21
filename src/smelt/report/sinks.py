"""A finished run as TensorBoard event files (`smelt report RUN --tensorboard`): its metrics.jsonl and the
results `smelt eval` wrote, through the same TensorBoard sink the trainer logs to live (train/sinks.py)."""

from __future__ import annotations

from pathlib import Path

from smelt.train.sinks import TensorBoardSink


def export_tensorboard(run_dir: str | Path, logdir: str | Path) -> tuple[Path, int]:
    """Write a run's metrics.jsonl and its `smelt eval` results (eval/step_*.json, at the tokens each
    checkpoint had seen) as TensorBoard event files under `logdir`; (logdir, records and results written)."""
    from smelt.report.eval_sections import tokens_of
    from smelt.report.run import load_run

    run = load_run(run_dir)
    sink = TensorBoardSink(logdir)
    try:
        for record in run.records:
            sink.log(record)
        for result in run.evals:
            sink.log_eval_result(result, tokens_of(run, result))
    finally:
        sink.close()
    return Path(logdir), len(run.records) + len(run.evals)
