"""The report's spikes section: each loss or gradient spike, how its replay labelled it and the
highest-loss documents of its batch (from metrics.jsonl alone: the spike alerts and the `spike_triage`
events the trainer writes; docs/observability.md)."""

from __future__ import annotations

from typing import Any

from smelt.metric_records import finite
from smelt.report.page import missing, note, table
from smelt.report.run import Run

SPIKE_ALERTS = ("loss_spike", "grad_spike")


def spikes_section(run: Run) -> str:
    alerts: dict[int, list[str]] = {}
    for r in run.events("alert"):
        if r.get("alert") in SPIKE_ALERTS:
            alerts.setdefault(int(r["step"]), []).append(str(r["alert"]))
    triaged = {int(r["spike_step"]): r for r in run.events("spike_triage")}
    if not alerts and not triaged:
        return missing("no loss or gradient spike in this run.")
    rows = []
    for step in sorted(set(alerts) | set(triaged)):
        t = triaged.get(step, {})
        if t.get("label"):
            label, bitwise = t["label"], "yes" if t.get("bitwise") else "no"
        else:
            label, bitwise = f"not triaged{': ' + t['error'] if t.get('error') else ''}", "-"
        kinds = ", ".join(alerts.get(step) or t.get("alerts") or [])
        rows.append(
            [step, kinds, label, bitwise, ", ".join(t.get("suspects") or []) or "-", _top(t.get("top") or [])]
        )
    return "\n".join([
        table(["step", "alerts", "label", "bitwise", "suspects", "highest-loss documents: loss (vs the rest of the batch)"], rows),
        note(
            "Each spike is replayed from the checkpoint before it in a side process: 'data' when the replay gives "
            "the logged figures bit for bit (the batch did it), 'nondeterministic or hardware' when not. "
            "`smelt train triage RUN --step STEP` lists the whole batch; `smelt data drop RUN --spike STEP` puts "
            "the suspects on the drop list that the next tokenize honours."
        ),
    ])  # fmt: skip


def _top(documents: list[dict[str, Any]]) -> str:
    shown = []
    for d in documents:
        figures = (
            f"{d['loss']:.3f} ({d['excess']:+.3f})"
            if finite(d.get("loss")) and finite(d.get("excess"))
            else "-"
        )
        shown.append(f"{d.get('id') or d.get('source')}: {figures}")
    return "; ".join(shown) or "-"
