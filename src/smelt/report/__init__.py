"""Run reports and comparisons: self-contained HTML pages made from a run's artifacts, decision records,
and TensorBoard / W&B views of metrics.jsonl."""
