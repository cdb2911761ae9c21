"""(N, D, loss) points for scaling-law fits, from a CSV file or from smelt run directories.

Published tables name their columns in many ways (`Model Size`, `params`, `N`; `Training FLOP`, `C`), and
some give compute instead of tokens; D = C / (6 N) then, as Besiroglu et al. did for Chinchilla's points.
A smelt run contributes its non-embedding parameters (as Kaplan et al.: cleaner laws at small sizes),
its trained tokens, and its final validation loss (training loss when it had no validation split).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smelt.errors import UserError
from smelt.manifest import read_manifest

COLUMN_NAMES = {
    "n": ("n", "params", "parameters", "model size", "model_size", "n_params", "num_params"),
    "d": ("d", "tokens", "training tokens", "train_tokens", "training_tokens", "n_tokens"),
    "c": ("c", "flops", "training flop", "training flops", "training_flops", "compute", "c_6nd"),
    "loss": ("loss", "final_loss", "val_loss", "eval_loss"),
    "group": ("group", "compute_group", "isoflop", "budget"),
}


@dataclass
class Points:
    """Runs as arrays; `labels` name them in tables, `groups` (optional) are IsoFLOP groups."""

    n: np.ndarray
    d: np.ndarray
    loss: np.ndarray
    labels: list[str]
    groups: list[str] | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def compute(self) -> np.ndarray:
        return 6.0 * self.n * self.d

    def subset(self, keep: np.ndarray) -> Points:
        idx = np.flatnonzero(keep)
        return Points(
            self.n[idx],
            self.d[idx],
            self.loss[idx],
            [self.labels[i] for i in idx],
            [self.groups[i] for i in idx] if self.groups is not None else None,
            self.source,
            list(self.notes),
        )

    def drop_highest(self, k: int) -> Points:
        """Drop the k highest-loss points (Besiroglu et al.'s rule for Chinchilla's Figure 4: keep the
        points whose loss is below the k-th highest loss)."""
        if k <= 0:
            return self
        if k >= self.loss.size:
            raise UserError(f"--drop-highest {k} would drop every one of the {self.loss.size} points.")
        threshold = np.sort(self.loss)[-k]
        kept = self.subset(self.loss < threshold)
        kept.notes.append(
            f"dropped the {self.loss.size - kept.loss.size} highest-loss points (loss >= {threshold:.4f})"
        )
        return kept


def _find_column(header: list[str], kind: str, override: str | None, path: Path) -> str | None:
    lowered = {h.strip().lower(): h for h in header}
    if override:
        if override in header:
            return override
        if override.lower() in lowered:
            return lowered[override.lower()]
        raise UserError(f"{path}: no column {override!r}. Its columns are: {', '.join(header)}.")
    for name in COLUMN_NAMES[kind]:
        if name in lowered:
            return lowered[name]
    return None


def read_csv(
    path: Path,
    *,
    n_column: str | None = None,
    d_column: str | None = None,
    c_column: str | None = None,
    loss_column: str | None = None,
    group_column: str | None = None,
) -> Points:
    """Read N, D (or C) and loss columns; every bad row is an error naming its line."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        if not header:
            raise UserError(f"{path} is empty; a scaling CSV needs a header row and one row per run.")
        cols = {
            "n": _find_column(header, "n", n_column, path),
            "d": _find_column(header, "d", d_column, path),
            "c": _find_column(header, "c", c_column, path),
            "loss": _find_column(header, "loss", loss_column, path),
            "group": _find_column(header, "group", group_column, path),
        }
        missing = [
            what
            for what, ok in (
                ("parameters (N, params, Model Size)", cols["n"]),
                ("loss", cols["loss"]),
                ("tokens (D, tokens) or compute (C, flops, Training FLOP)", cols["d"] or cols["c"]),
            )
            if not ok
        ]
        if missing:
            raise UserError(
                f"{path}: no column for {'; '.join(missing)}. Its columns are: {', '.join(header)}. Rename "
                f"them, or name them with --n-column, --d-column, --c-column and --loss-column."
            )
        n, d, loss, labels, groups = [], [], [], [], []
        for line, row in enumerate(reader, start=2):
            try:
                n_value = float(row[cols["n"]])
                loss_value = float(row[cols["loss"]])
                d_value = float(row[cols["d"]]) if cols["d"] else float(row[cols["c"]]) / (6.0 * n_value)
            except (TypeError, ValueError, ZeroDivisionError) as exc:
                raise UserError(
                    f"{path}, line {line}: not a number in {dict(row)} ({exc}). Fix or remove the row."
                ) from exc
            if not all(math.isfinite(v) and v > 0 for v in (n_value, d_value, loss_value)):
                raise UserError(
                    f"{path}, line {line}: N, D and loss must be positive, got N={n_value}, D={d_value}, "
                    f"loss={loss_value}. Fix or remove the row."
                )
            n.append(n_value)
            d.append(d_value)
            loss.append(loss_value)
            labels.append(f"line {line}")
            if cols["group"]:
                groups.append(str(row[cols["group"]]))
    if not n:
        raise UserError(f"{path} has a header but no rows.")
    notes = [] if cols["d"] else [f"tokens D = C / (6 N) from column {cols['c']!r}"]
    return Points(
        np.array(n), np.array(d), np.array(loss), labels, groups or None, source=str(path), notes=notes
    )


def run_point(run_dir: Path, params: str = "non_embedding") -> tuple[float, float, float] | None:
    """(N, D, loss) of one smelt run directory, or None when its train stage has not finished."""
    manifest = read_manifest(Path(run_dir) / "train")
    if manifest is None:
        return None
    result = manifest.get("result", {})
    loss = result.get("final_val_loss")
    if loss is None:
        loss = result.get("final_train_loss")
    key = "params_non_embedding" if params == "non_embedding" else "params_total"
    if loss is None or key not in result or "tokens" not in result:
        return None
    return float(result[key]), float(result["tokens"]), float(loss)


def find_runs(paths: list[Path]) -> list[Path]:
    """The run directories named, or held by the directories named (a ladder's current rungs, a sweep)."""
    runs: list[Path] = []
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise UserError(
                f"{path} is not a directory; pass run directories, a ladder directory or a CSV file."
            )
        if (path / "train").is_dir():
            runs.append(path)
        elif (path / "ladder.json").is_file():  # a ladder: the rungs of its current plan
            plan = json.loads((path / "ladder.json").read_text())
            runs += [path / rung["name"] for rung in plan.get("rungs", [])]
        else:
            runs += sorted(p.parent for p in path.glob("*/train") if p.is_dir())
    return runs


def no_runs_error(paths: list[Path]) -> UserError:
    return UserError(
        f"no finished smelt runs under {', '.join(map(str, paths))} (a run has train/manifest.json "
        f"with a final loss). Train them first (`smelt ladder ... --run`), or pass a CSV file."
    )


def read_runs(paths: list[Path], params: str = "non_embedding") -> Points:
    """Points from run directories, or from directories holding runs (a ladder, a sweep)."""
    n, d, loss, labels, skipped = [], [], [], [], []
    for run in find_runs(paths):
        point = run_point(run, params)
        if point is None:
            skipped.append(run.name)
            continue
        n.append(point[0])
        d.append(point[1])
        loss.append(point[2])
        labels.append(run.name)
    if not n:
        raise no_runs_error(paths)
    notes = [f"N = {params.replace('_', '-')} parameters; loss = final validation loss"]
    if skipped:
        notes.append(f"skipped unfinished runs: {', '.join(skipped)}")
    return Points(np.array(n), np.array(d), np.array(loss), labels, None, ", ".join(map(str, paths)), notes)


def read_points(paths: list[Path], params: str = "non_embedding", **columns: str | None) -> Points:
    """A CSV file, or smelt run directories."""
    if len(paths) == 1 and Path(paths[0]).is_file():
        return read_csv(Path(paths[0]), **columns)
    for path in paths:
        if not Path(path).exists():
            raise UserError(f"{path} does not exist. Pass a CSV file or smelt run directories.")
        if Path(path).is_file():
            raise UserError(f"{path}: pass one CSV file on its own, or only run directories.")
    return read_runs([Path(p) for p in paths], params)
