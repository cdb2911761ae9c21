"""The report of one run: RUN/report.html, one self-contained page."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smelt.metric_records import finite, task_entries
from smelt.report import data_sections, eval_sections, lineage, moe_section, telemetry_section, train_sections
from smelt.report.decisions import decisions_for
from smelt.report.page import missing, note, page, section, table
from smelt.report.run import Run, final_metrics, load_run
from smelt.report.spikes_section import spikes_section
from smelt.report.trajectory_section import trajectory_section

# (anchor, title, builder): the order of the page, after the summary and before the decisions: what
# people look at first (curves) comes first, provenance last. Tests check that every anchor is present.
SECTIONS: list[tuple[str, str, Callable[[Run], str]]] = [
    ("loss", "Loss", train_sections.loss_section),
    ("trajectory", "Expected trajectory", trajectory_section),  # train.expect's curve and band
    ("lr", "Learning rate", train_sections.lr_section),
    ("gradients", "Gradients", train_sections.gradients_section),
    ("telemetry", "Telemetry", telemetry_section.telemetry_section),
    ("throughput", "Throughput and MFU", train_sections.throughput_section),
    ("events", "Events", train_sections.events_section),
    ("spikes", "Spikes", spikes_section),  # each spike's replay label and suspects
    ("experts", "Experts", moe_section.experts_section),
    ("evaluation", "Evaluation", eval_sections.evaluation_section),
    ("contamination", "Contamination", eval_sections.contamination_section),
    ("gallery", "Gallery", eval_sections.gallery_section),
    ("lineage", "Lineage", lineage.lineage_section),
    ("mixture", "Mixture: target vs realized", data_sections.mixture_section),
    ("retention", "Data retention", data_sections.retention_section),
    ("tokenizer", "Tokenizer", data_sections.tokenizer_section),
    ("manifests", "Chain of manifests", data_sections.manifests_section),
]


def summary_rows(run: Run) -> list[tuple[str, Any]]:
    start, figures = run.start(), final_metrics(run)
    end = run.events("end")
    status = end[-1].get("status", "?") if end else "no end record (running, or stopped without one)"
    if end and end[-1].get("error"):
        status += f": {end[-1]['error']}"
    summary = run.summary or {}
    rows: list[tuple[str, Any]] = [
        ("run", str(run.path)),
        ("status", status),
        ("config hash", start.get("config_hash", "-")),
        (
            "parameters (non-embedding)",
            f"{start.get('params_total', 0) or 0:,} ({start.get('params_non_embedding', 0) or 0:,})",
        ),
        (
            "device / precision / world size",
            f"{start.get('device', '?')} / {start.get('precision', '?')} / {start.get('world_size', '?')}",
        ),
        ("steps planned", start.get("steps")),
        ("tokens trained", figures.get("tokens")),
        *([("cumulative tokens (lineage)", run.cumulative(figures.get("tokens")))] if run.parent else []),
        ("training FLOPs (6N + attention)", f"{figures['flops']:.3g}" if "flops" in figures else "-"),
        ("final train loss", figures.get("final_train_loss")),
        ("final validation loss", figures.get("final_val_loss")),
        ("held-out bits/byte", figures.get("heldout_bits_per_byte")),
    ]
    for key, name in (
        ("val_gzip_bits_per_byte", "gzip -9 bits/byte"),
        ("val_xz_bits_per_byte", "xz -9e bits/byte"),
    ):
        if finite(summary.get(key)):
            rows.append((name, summary[key]))
    rows += [
        # The figures the trainer's summary prints: tokens trained / time in training steps.
        ("training tokens/s", f"{figures['tokens_per_s']:,.0f}" if "tokens_per_s" in figures else "-"),
        ("MFU", f"{100 * figures['mfu']:.1f}%" if "mfu" in figures else "-"),
        (
            "skipped steps / rollbacks",
            f"{end[-1].get('skipped_steps', 0)} / {end[-1].get('rollbacks', 0)}" if end else "-",
        ),
        ("alerts", len(run.events("alert"))),
        ("resumes", len(run.events("resume"))),
        ("training wall time s", figures.get("train_wall_time_s")),
    ]
    return rows + _headline_tasks(run, figures)


def _headline_tasks(run: Run, figures: dict[str, float]) -> list[tuple[str, Any]]:
    """Each task's own metric at the last evaluated checkpoint (all task figures are in Evaluation)."""
    latest = next((e for e in reversed(run.evals) if task_entries(e)), None)
    if latest is None:
        return [(name, value) for name, value in figures.items() if name.startswith("task/")]
    rows: list[tuple[str, Any]] = []
    for name, value in task_entries(latest):
        if isinstance(value, dict) and finite(value.get(value.get("metric", "score"))):
            metric = value.get("metric", "score")
            rows.append((f"task {name} ({metric}, step {latest.get('step')})", float(value[metric])))
        elif finite(value):
            rows.append((f"task {name} (step {latest.get('step')})", float(value)))
    return rows


def summary_section(run: Run) -> str:
    text = table(["figure", "value"], summary_rows(run))
    for line in run.notes:
        text += note(line)
    return text


def decisions_section(run: Run, log: Path | None = None) -> str:
    records = decisions_for(run, log)
    if not records:
        where = log or run.path.resolve().parent / "decisions.jsonl"
        return missing(f"no decision in {where} names this run (`smelt decide TITLE --runs ... --metric M`).")
    rows = []
    for r in records:
        values = ", ".join(
            f"{e.get('name')}: {e.get('value'):.5g}" if finite(e.get("value")) else str(e.get("name"))
            for e in r.get("runs", [])
        )
        best = f"{r['best']} ({r.get('better')} is better)" if r.get("best") else "-"
        rows.append(
            [
                r.get("date", "-"),
                r.get("question", "-"),
                r.get("metric", "-"),
                values,
                best,
                r.get("outcome") or "-",
            ]
        )
    return table(["date", "question", "metric", "values", "best", "outcome"], rows)


def build_run_report(run: Run, decisions_log: Path | None = None) -> str:
    sections = [section("summary", "Summary", summary_section(run))]
    for anchor, title, builder in SECTIONS:
        try:
            body = builder(run)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # An artifact with an unexpected layout costs its own section, never the whole report.
            body = missing(
                f"this section could not be drawn from the run's files ({type(exc).__name__}: {exc})."
            )
        sections.append(section(anchor, title, body))
    sections.append(section("decisions", "Decisions", decisions_section(run, decisions_log)))
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(
        f"smelt run report: {run.name}",
        f"{run.path} - made {made} from {run.metrics_path.name} and the stage artifacts",
        sections,
    )


def write_run_report(
    run_dir: str | Path, out: str | Path | None = None, decisions_log: str | Path | None = None
) -> Path:
    """Write the report of one run (default RUN/report.html) and return its path."""
    run = load_run(run_dir)
    path = Path(out) if out else run.path / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_run_report(run, Path(decisions_log) if decisions_log else None), encoding="utf-8")
    return path
