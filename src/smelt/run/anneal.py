"""Anneal forks: from one stable-phase checkpoint, N short runs that each decay the learning rate to
zero on a candidate mixture, evaluated side by side at equal tokens (OLMo 2's mid-training workflow).

Each variant is a fork (`train.init_from`) in a sibling run directory `<parent>-anneal-<name>` with
the parent's weights and optimizer moments, a WSD schedule that starts decaying at once (the peak LR
for the first two steps, then linear towards zero, which it would reach one step after the last, so
the last step trains at peak / (steps - 1)), and the variant's own overrides (usually
`tokens.mixture`). Like every fork it reads on from where the parent's data stream stood at the
checkpoint (`train.fork_data = "continue"`), so no variant trains on batches the stable run has
already seen. Each variant writes RUN/summary.json as `smelt run` does. The stable checkpoint itself
is evaluated as the baseline; the comparison report and a decision record go to `<parent>/anneals/`;
`soup = True` averages the endpoints into `<parent>-anneal-soup` (with its own summary.json) and
evaluates it too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt import layout
from smelt.config import load_config
from smelt.errors import UserError
from smelt.layout import checkpoints_dir
from smelt.manifest import write_json
from smelt.progress import log
from smelt.run.pipeline import STAGES, run_pipeline
from smelt.run.summary import summarize


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]


def parse_variants(raw: list[list[str]] | None) -> list[Variant]:
    """`--variant NAME KEY=VALUE ...` groups -> variants (names unique, usable in a directory name)."""
    variants = []
    for group in raw or []:
        name, *overrides = group
        if not name.replace("-", "").replace("_", "").isalnum() or "=" in name:
            raise UserError(
                f"--variant {name!r}: the first word is the variant's name (letters, digits, - and _), "
                f'then its KEY=VALUE overrides, e.g. --variant code "tokens.mixture={{code=0.6, prose=0.4}}".'
            )
        variants.append(Variant(name, tuple(overrides)))
    if not variants:
        raise UserError("name at least one variant: --variant NAME KEY=VALUE ... (e.g. a tokens.mixture).")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise UserError(f"variant names must differ: {', '.join(names)}.")
    return variants


def anneal_overrides(parent_spec: str, decay_tokens: int, batch_tokens: int) -> list[str]:
    """The keys that make a fork an anneal: parent weights and moments, decay from the peak to zero."""
    return [
        f"train.init_from={json.dumps(parent_spec)}",
        "train.init_optimizer=true",
        f"train.tokens={decay_tokens}",
        "train.schedule='wsd'",
        "train.decay_fraction=1.0",
        "train.decay_shape='linear'",
        "train.min_lr_ratio=0.0",
        f"train.warmup_tokens={batch_tokens}",  # one step at the peak: the stable phase goes on from here
    ]


def _heldout_row(label: str, run_dir: Path, result: dict[str, Any], tokens: int) -> dict[str, Any]:
    heldout = result.get("heldout") or {}
    return {
        "run": label,
        "run_dir": str(run_dir),
        "cumulative_tokens": tokens,
        "bits_per_byte": (heldout.get("overall") or {}).get("bits_per_byte"),
        "bits_per_byte_by_source": {
            source: figures.get("bits_per_byte")
            for source, figures in (heldout.get("per_source") or {}).items()
        },
    }


def run_anneals(
    config: str | Path,
    overrides: list[str],
    parent_spec: str,
    decay_tokens: int,
    variants: list[Variant],
    soup: bool = False,
    restart: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """Train, evaluate and compare the anneal variants; return the comparison (also written as JSON)."""
    from smelt.checkpoint.lineage import resolve_parent
    from smelt.eval.run import evaluate_checkpoints

    parent = resolve_parent(parent_spec)
    base = load_config(config, overrides)
    if decay_tokens < base.train.batch_tokens:
        raise UserError(
            f"--decay-tokens {decay_tokens} is less than one batch ({base.train.batch_tokens} tokens, "
            f"train.batch_tokens); an anneal needs at least a few steps."
        )
    spec = f"{parent.run_dir}:{parent.step}"
    fixed = anneal_overrides(spec, decay_tokens, base.train.batch_tokens)
    out_dir = parent.run_dir / "anneals"
    started = time.time()
    rows: list[dict[str, Any]] = []
    runs: list[Path] = []
    # The stable checkpoint is the baseline every variant must beat, scored by the same eval.
    baseline_cfg = load_config(config, [*overrides, f"run.dir={json.dumps(str(parent.run_dir.parent))}",
                                        f"run.name={json.dumps(parent.run_dir.name)}"])  # fmt: skip
    (stable,) = evaluate_checkpoints(baseline_cfg, parent.run_dir, str(parent.step), tasks=[])
    rows.append(_heldout_row(f"stable@{parent.step}", parent.run_dir, stable, parent.cumulative_tokens))
    for variant in variants:
        name = f"{parent.run_dir.name}-anneal-{variant.name}"
        cfg = load_config(
            config,
            [*overrides, *variant.overrides, *fixed, f"run.dir={json.dumps(str(parent.run_dir.parent))}",
             f"run.name={json.dumps(name)}"],
        )  # fmt: skip
        log(f"[anneal] {variant.name}: {decay_tokens:,} tokens from {spec} -> {cfg.run_dir}")
        variant_started = time.time()
        outcomes = run_pipeline(cfg, STAGES, force=force, restart=restart)
        write_json(cfg.run_dir / "summary.json", summarize(cfg, outcomes, time.time() - variant_started))
        runs.append(cfg.run_dir)
        rows.append(
            _heldout_row(
                variant.name, cfg.run_dir, outcomes["eval"].result, parent.cumulative_tokens + decay_tokens
            )
        )
    if soup:
        rows.append(_soup(config, overrides, parent, runs, decay_tokens))
    comparison = {
        "parent": parent.record(),
        "decay_tokens": decay_tokens,
        "variants": [{"name": v.name, "overrides": list(v.overrides)} for v in variants],
        "rows": rows,
        "wall_time_s": round(time.time() - started, 1),
    }
    write_json(out_dir / f"anneal-step_{parent.step:07d}.json", comparison)
    comparison["report"] = str(_report_and_decision(parent, runs, out_dir))
    return comparison


def _soup(
    config: str | Path, overrides: list[str], parent: Any, runs: list[Path], decay_tokens: int
) -> dict[str, Any]:
    """Average the anneal endpoints into a run-shaped directory (sharing the parent's inputs), score it
    and write its summary.json."""
    from smelt.checkpoint.store import latest_checkpoint, read_meta
    from smelt.checkpoint.tools import average_checkpoints
    from smelt.eval.run import evaluate_checkpoints

    soup_dir = parent.run_dir.parent / f"{parent.run_dir.name}-anneal-soup"
    ends = [latest_checkpoint(checkpoints_dir(run)) for run in runs]
    step = int(read_meta(ends[0], verify=False)["step"])
    target = layout.checkpoints_dir(soup_dir) / layout.step_dir_name(step)
    for stage in ("documents", "tokenizer", "tokens"):
        link = soup_dir / stage
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((runs[0] / stage).resolve(), target_is_directory=True)
    started = time.time()
    average_checkpoints([e for e in ends if e is not None], target, force=True)
    cfg = load_config(config, [*overrides, f"run.dir={json.dumps(str(soup_dir.parent))}",
                               f"run.name={json.dumps(soup_dir.name)}"])  # fmt: skip
    (result,) = evaluate_checkpoints(cfg, soup_dir, "latest", tasks=[])
    row = _heldout_row("soup", soup_dir, result, parent.cumulative_tokens + decay_tokens)
    write_json(soup_dir / "summary.json", {
        "run_dir": str(soup_dir), "kind": "soup", "wall_time_s": round(time.time() - started, 2),
        "averaged": [str(e) for e in ends if e is not None], "checkpoint": str(target),
        "cumulative_tokens": row["cumulative_tokens"], "val_bits_per_byte": row["bits_per_byte"],
        "val_bits_per_byte_by_source": row["bits_per_byte_by_source"],
    })  # fmt: skip
    return row


def _report_and_decision(parent: Any, runs: list[Path], out_dir: Path) -> Path:
    from smelt.report.compare import write_comparison
    from smelt.report.decisions import decide

    report = write_comparison([parent.run_dir, *runs], out=out_dir / f"anneal-step_{parent.step:07d}.html")
    if len(runs) > 1:
        try:
            decide(
                f"Which anneal mixture from {parent.run_dir.name} step {parent.step}?",
                runs, "heldout_bits_per_byte", log=out_dir / "decisions.jsonl",
            )  # fmt: skip
        except UserError as exc:  # a run without its eval stage has no held-out figure
            log(f"[anneal] no decision record: {exc}")
    return report


def table(comparison: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for the terminal: held-out bits per byte per run, overall and per source, and the change
    against the stable checkpoint."""
    rows = comparison["rows"]
    base = rows[0]
    out = []
    for row in rows:
        parts = [f"{row['bits_per_byte']:.4f}" if row["bits_per_byte"] is not None else "-"]
        if row is not base and row["bits_per_byte"] is not None and base["bits_per_byte"] is not None:
            parts.append(f"({row['bits_per_byte'] - base['bits_per_byte']:+.4f})")
        by_source = ", ".join(
            f"{s} {v:.3f}" for s, v in sorted(row["bits_per_byte_by_source"].items()) if v is not None
        )
        out.append((f"{row['run']} @ {row['cumulative_tokens']:,} tok", " ".join(parts) + f"  [{by_source}]"))
    return out
