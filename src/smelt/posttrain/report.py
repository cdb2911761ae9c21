"""RUN/posttrain_report.html: a post-training stage's curves from its metrics.jsonl alone, with the
lineage (parent run and checkpoint) and the summary. SFT: train and validation loss; DPO/SimPO: loss,
chosen and rejected log-probs, reward margin and accuracy, held-out preference accuracy; GRPO: reward,
reply length, KL, held-out reward. `smelt report RUN` draws the general training sections too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smelt.metric_records import METRICS, read_records
from smelt.report.page import note, page, row, section, table
from smelt.report.svg import Chart, Series, chart_svg

SMALL = {"width": 440, "height": 230}
CURVES = {
    "sft": [("loss", ["loss"]), ("learning rate", ["lr"])],
    "dpo": [("loss", ["loss"]), ("mean token log-prob", ["logp_chosen", "logp_rejected"]),
            ("reward", ["chosen_reward", "rejected_reward", "reward_margin"]), ("batch accuracy", ["reward_accuracy"])],
    "grpo": [("mean reward", ["reward"]), ("reply tokens", ["reply_tokens"]), ("KL to the reference", ["kl"]),
             ("groups with signal", ["groups_with_signal"])],
}  # fmt: skip


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return read_records(run_dir / "train" / METRICS)


def _chart(title: str, kind: str, keys: list[str], records: list[dict[str, Any]]) -> str:
    rows = [r for r in records if r.get("kind") == kind]
    series = [Series(key, [r["step"] for r in rows if isinstance(r.get(key), (int, float))],
                     [r[key] for r in rows if isinstance(r.get(key), (int, float))], dots=kind == "eval")
              for key in keys]  # fmt: skip
    series = [s for s in series if s.xs]
    if not series:
        return ""
    return chart_svg(Chart(title, "step", title, series, x_format="plain", **SMALL))


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    records = _records(run_dir)
    start = next((r for r in records if r.get("event") == "start"), {})
    stage = str(start.get("stage", "sft"))
    parent = start.get("parent") or {}
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    train_charts = [_chart(title, "train", keys, records) for title, keys in CURVES.get(stage, [])]
    eval_keys = sorted(
        {k for r in records if r.get("kind") == "eval" for k in r if k not in ("kind", "step", "tokens")}
    )
    eval_charts = [_chart(key.replace("_", " "), "eval", [key], records) for key in eval_keys]
    figures = [
        (k, v) for k, v in summary.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)
    ]
    sections = [
        section(
            "lineage",
            "Lineage",
            table(
                ["", ""],
                [
                    ("stage", stage),
                    ("parent run", parent.get("run_dir")),
                    ("parent checkpoint", parent.get("checkpoint")),
                    ("parent step", parent.get("step")),
                    ("tokens before this stage", parent.get("cumulative_tokens")),
                ],
            ),
        ),  # fmt: skip
        section(
            "curves", "Training curves", row(*[c for c in train_charts if c]) or note("no train records")
        ),
        section(
            "heldout", "Held-out evaluation", row(*[c for c in eval_charts if c]) or note("no eval records")
        ),
        section("summary", "Summary", table(["figure", "value"], figures)),
    ]
    out = run_dir / "posttrain_report.html"
    out.write_text(
        page(f"{stage}: {run_dir.name}", f"post-training stage from {parent.get('checkpoint')}", sections)
    )
    return out
