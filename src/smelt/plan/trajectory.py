"""A pre-registered loss trajectory: the validation-loss curve a target run should follow, from a ladder.

`smelt scaling fit LADDER --target N,D` reads every validation of every finished run of the ladder (the
periodic ones from metrics.jsonl and the final one), from `--min-fraction` of each run on: early losses
are dominated by warmup and initialization, not by N and D. It fits L(N, t) = E + A/N^alpha + B/t^beta
on them, with t the tokens seen at the evaluation, and writes the curve of the target run (N parameters,
D tokens) into fit.json under "trajectory":

- **centre**: L(N, t) x exp(m(f)), where f = t / D is how far through its schedule the run is and m(f)
  the median log-residual of the proxies' evaluations near f. A run's loss part-way through a cosine
  schedule sits above the loss of a run that ends there (its learning rate has not decayed yet); the
  proxies follow the same schedule shape, so their residuals at the same fraction carry that offset.
- **band**: the 2.5th and 97.5th percentiles of L(N, t) over bootstrap fits that resample whole runs
  (the parameters' uncertainty, which grows as the target moves past the proxies), widened by a 95%
  prediction interval of the proxies' residuals near f (how far one more run's curve may stray from the
  law there: Student's t on their spread, never narrower than their own range).

The band assumes the target trains as the proxies did: same data, schedule shape (warmup as a share of
the run, decay), and learning rate tuned the same way. `smelt train` with `train.expect = fit.json`
checks the run against it (smelt/train/trajectory.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smelt.errors import UserError
from smelt.metric_records import METRICS, validations
from smelt.plan.fit import LawFit, fit_law, grid_starts
from smelt.plan.points import Points, find_runs, no_runs_error, run_point

GRID = 48  # points of the predicted curve, evenly spaced in tokens from the first fraction to the end
WINDOW = 0.1  # proxies' residuals within this distance in run fraction set the band at a fraction
MIN_NEIGHBOURS = 3  # ... or at least the nearest this many


@dataclass
class CurvePoints:
    """Every evaluation of the ladder's runs used in the fit: the points, where each sits in its run
    (fraction of the run's tokens) and which run it came from (an index into `runs`)."""

    points: Points
    fraction: np.ndarray
    run: np.ndarray
    runs: list[str]
    min_fraction: float
    params: str = "non_embedding"  # which parameter count N is
    target: tuple[float, float] | None = None  # (N, D) of the run to predict


def read_curves(paths: list[Path], params: str = "non_embedding", min_fraction: float = 0.2) -> CurvePoints:
    """The evaluations of every finished run under `paths` at or after `min_fraction` of the run, and
    each run's final loss (its last evaluation, or the final train loss of a run without validation)."""
    if not 0.0 <= min_fraction < 1.0:
        raise UserError(f"--min-fraction must be in [0, 1), got {min_fraction}.")
    n, d, loss, fraction, run, labels, runs, skipped = [], [], [], [], [], [], [], []
    for directory in find_runs(paths):
        final = run_point(directory, params)
        if final is None:
            skipped.append(directory.name)
            continue
        size, total, last = final
        # {tokens: loss}; a resumed run's later record of the same point replaces the earlier one
        seen = {t: v for _, t, v in validations(directory / "train" / METRICS) if t > 0}
        seen[total] = last  # the final loss as the manifest records it
        for tokens, value in sorted(seen.items()):
            if tokens / total >= min_fraction and tokens <= total:
                n.append(size)
                d.append(tokens)
                loss.append(value)
                fraction.append(tokens / total)
                run.append(len(runs))
                labels.append(f"{directory.name}@{tokens:.0f}")
        runs.append(directory.name)
    if not runs:
        raise no_runs_error(paths)
    notes = [
        f"N = {params.replace('_', '-')} parameters; D = tokens at each validation from {min_fraction:.0%} "
        f"of each run on ({len(n)} evaluations of {len(runs)} runs)"
    ]
    if skipped:
        notes.append(f"skipped unfinished runs: {', '.join(skipped)}")
    source = ", ".join(map(str, paths))
    points = Points(np.array(n), np.array(d), np.array(loss), labels, None, source, notes)
    run_index = np.array(run, dtype=np.int64)
    return CurvePoints(points, np.array(fraction), run_index, runs, min_fraction, params)


def student_t975(df: int) -> float:
    """The 97.5th percentile of Student's t with `df` degrees of freedom (exact for 1-3, else the
    Cornish-Fisher expansion, within 0.01)."""
    if df <= 3:
        return (12.706, 4.303, 3.182)[max(df, 1) - 1]
    z = 1.959964
    return (
        z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )  # fmt: skip


def _residual_band(curves: CurvePoints, residuals: np.ndarray, at: float) -> tuple[float, float, float]:
    """(centre, low, high) log-residual at fraction `at`, from the proxies' evaluations near it: their
    median, and a 95% prediction interval for one more run's residual there (Student's t on their
    spread), so that a handful of proxies does not make the band as narrow as their own range."""
    gap = np.abs(curves.fraction - at)
    near = gap <= WINDOW
    if near.sum() < MIN_NEIGHBOURS:
        near = gap <= np.sort(gap)[min(MIN_NEIGHBOURS, gap.size) - 1]
    chosen = residuals[near]
    k = chosen.size
    half = student_t975(k - 1) * float(np.std(chosen, ddof=1)) * math.sqrt(1 + 1 / k) if k > 1 else 0.0
    centre = float(np.median(chosen))
    return centre, min(centre - half, float(chosen.min())), max(centre + half, float(chosen.max()))


def fit_curves(curves: CurvePoints, rounds: int = 4) -> tuple[LawFit, np.ndarray]:
    """L(N, t) and the schedule's offset m(f) fitted together by backfitting: fit the law on the losses
    with the current offset taken out, set the offset of each evaluation to the median residual near its
    fraction (less the median at the end of the runs, so that the law alone describes final losses, as a
    fit of final losses does), and again. Returns the last fit and each evaluation's offset (log-loss)."""
    p = curves.points
    offset = np.zeros(p.n.size)
    fit: LawFit | None = None
    for _ in range(rounds):
        fit = fit_law(p.n, p.d, p.loss * np.exp(-offset), starts=None if fit is None else fit.endpoints)
        residuals = np.log(p.loss) - np.log(_law_at(fit, p.n, p.d))
        end = _residual_band(curves, residuals, 1.0)[0]  # anchored at the end: the law is final losses'
        offset = np.array([_residual_band(curves, residuals, f)[0] for f in curves.fraction]) - end
    assert fit is not None
    fit.starts = grid_starts().shape[0]  # the first round's; later rounds start from its endpoints
    return fit, offset


def _law_at(fit: LawFit, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    law = fit.law
    return law.E + law.A / n**law.alpha + law.B / d**law.beta


def predict_trajectory(fit: LawFit, curves: CurvePoints, target: tuple[float, float]) -> dict[str, Any]:
    """The target's predicted validation-loss curve with its band, as fit.json's "trajectory"."""
    size, total = (float(v) for v in target)
    if not (math.isfinite(size) and math.isfinite(total) and size > 0 and total > 0):
        raise UserError(f"--target needs positive N,D (parameters, tokens), got {size:g},{total:g}.")
    law, p = fit.law, curves.points
    residuals = np.log(p.loss) - np.log(_law_at(fit, p.n, p.d))
    min_fraction = curves.min_fraction
    fractions = np.linspace(max(min_fraction, 1.0 / GRID), 1.0, GRID)
    tokens = fractions * total
    centre_law = np.array([law.loss(size, t) for t in tokens])
    draws = fit.bootstrap_draws
    if draws is not None and len(draws) >= 2:
        with np.errstate(over="ignore", invalid="ignore"):
            grid = (
                draws[:, :1] + draws[:, 1:2] / size ** draws[:, 3:4] + draws[:, 2:3] / tokens ** draws[:, 4:5]
            )
        low = np.minimum(np.nanpercentile(grid, 2.5, axis=0), centre_law)
        high = np.maximum(np.nanpercentile(grid, 97.5, axis=0), centre_law)
    else:
        low = high = centre_law
    bands = np.array([_residual_band(curves, residuals, f) for f in fractions])
    warnings = []
    if size > 10 * p.n.max() or total > 10 * p.d.max():
        warnings.append(
            f"the target (N {size:.3g}, D {total:.3g}) is more than 10x past the largest proxy (N "
            f"{p.n.max():.3g}, D {p.d.max():.3g}): the band is an extrapolation; add larger rungs."
        )
    if (curves.fraction < 0.999).sum() < MIN_NEIGHBOURS:
        warnings.append(
            "the runs logged (almost) no validations before their end, so the curve's shape is the law's "
            "alone, without the schedule's offset. Set train.eval_every in the ladder's config (each rung "
            "gets the same number of validations) and train.eval_budget = 0, then train the ladder again."
        )
    return {
        "target": {"params": size, "tokens": total, "params_kind": curves.params},
        "min_fraction": min_fraction,
        "tokens": [float(t) for t in tokens],
        "loss": [float(v) for v in centre_law * np.exp(bands[:, 0])],
        "lo": [float(v) for v in low * np.exp(bands[:, 1])],
        "hi": [float(v) for v in high * np.exp(bands[:, 2])],
        "band": f"95% bootstrap over runs ({fit.bootstrap_samples} fits) x 95% prediction interval of the "
        f"proxies' residuals within {WINDOW:g} of the same run fraction",
        "proxies": {
            "runs": curves.runs,
            "evaluations": int(p.n.size),
            "max_params": float(p.n.max()),
            "max_tokens": float(p.d.max()),
            "residual_rms": float(np.sqrt(np.mean(residuals**2))),
        },
        "warnings": warnings,
    }


def trajectory_text(trajectory: dict[str, Any]) -> list[str]:
    """The lines `smelt scaling fit --target` prints: the curve at a few fractions of the run."""
    target = trajectory["target"]
    n, d = target["params"], target["tokens"]
    lines = [
        "",
        f"predicted validation loss of the target run (N {n:.4g}, D {d:.4g}; band: {trajectory['band']}):",
        f"{'tokens':>12} {'fraction':>8} {'loss':>8} {'band':>19}",
    ]
    count = len(trajectory["tokens"])
    for i in sorted({0, count // 4, count // 2, (3 * count) // 4, count - 1}):
        t = trajectory["tokens"][i]
        lo, hi = trajectory["lo"][i], trajectory["hi"][i]
        lines.append(f"{t:12.4g} {t / d:8.2f} {trajectory['loss'][i]:8.4f} {f'[{lo:.4f}, {hi:.4f}]':>19}")
    return lines


def target_curves(args: Any) -> CurvePoints:
    """The evaluations `smelt scaling fit --target` fits on: smelt run or ladder directories only."""
    paths = [Path(p) for p in args.inputs]
    files = [str(p) for p in paths if p.is_file()]
    if files:
        raise UserError(
            f"--target predicts a run's loss curve from the validations that smelt runs log, so it needs run "
            f"or ladder directories, not {', '.join(files)}. Pass the ladder directory (RUN/ladder)."
        )
    if args.isoflop:
        raise UserError(
            "--isoflop groups runs by their compute, but with --target every evaluation of a run is a point; "
            "fit the IsoFLOP profiles in a run without --target."
        )
    if args.drop_highest:
        raise UserError(
            "--drop-highest drops single points, but with --target every evaluation of a run is a point; "
            "leave --drop-highest out (or move the runs to drop out of the ladder directory)."
        )
    params = args.params.replace("-", "_")
    curves = read_curves(paths, params, args.min_fraction)
    curves.target = parse_target(args.target, params)
    return curves


def parse_target(text: str, params: str = "non_embedding") -> tuple[float, float]:
    """`--target N,D`, or a pipeline config: its model's parameters (with the base run's vocabulary)
    and its train.tokens."""
    from smelt.numbers import number_pair

    if Path(text).is_file():
        from smelt.config import load_config
        from smelt.model.flops import count_params
        from smelt.plan.ladder import ladder_vocab

        cfg = load_config(text)
        return float(count_params(cfg.model, ladder_vocab(cfg))[params]), float(cfg.train.tokens)
    try:
        return number_pair(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UserError(
            f"--target {text!r} is neither N,D (parameters and tokens, e.g. 1.1e5,4e5) nor a pipeline config "
            f"file; pass one of them."
        ) from exc
