"""`smelt scaling fit`: fit a scaling law to (N, D, loss) points and say what it implies.

Writes fit.json (parameters, 95% bootstrap intervals, N*(C) and D*(C) at the requested budgets, predicted
losses of planned runs, and the IsoFLOP fit when asked) and the SVG figures next to it; returns the text
the command prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smelt.manifest import write_json
from smelt.plan.fit import LawFit, bootstrap, fit_law
from smelt.plan.isoflop import IsoFlopFit, fit_isoflop
from smelt.plan.plots import fit_svg, isoflop_svg
from smelt.plan.points import Points
from smelt.plan.trajectory import CurvePoints, fit_curves, predict_trajectory, trajectory_text


@dataclass
class ScalingReport:
    points: Points
    fit: LawFit | None
    isoflop: IsoFlopFit | None
    computes: list[float]
    predictions: list[tuple[float, float]]
    paths: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    trajectory: dict[str, Any] | None = None  # the target run's predicted curve (plan/trajectory.py)

    def optimal_rows(self) -> list[dict[str, float | None]]:
        rows = []
        for c in self.computes:
            row: dict[str, float | None] = {"compute": c}
            if self.fit is not None:
                n, d = self.fit.law.optimal(c)
                row.update(n_opt=n, d_opt=d, loss=self.fit.law.loss(n, d))
                draws = self.fit.bootstrap_draws
                if draws is not None:
                    n_draws = np.array([_optimal_n(row_, c) for row_ in draws])
                    n_draws = n_draws[np.isfinite(n_draws)]
                    if n_draws.size >= 2:
                        row.update(
                            n_opt_lo=float(np.percentile(n_draws, 2.5)),
                            n_opt_hi=float(np.percentile(n_draws, 97.5)),
                        )
            if self.isoflop is not None and self.isoflop.a is not None:
                row.update(isoflop_n_opt=self.isoflop.n_opt(c), isoflop_d_opt=self.isoflop.d_opt(c))
            rows.append(row)
        return rows

    def prediction_rows(self) -> list[dict[str, float | None]]:
        """Expected final loss of each planned (N, D), with a 95% interval from the bootstrap fits."""
        rows = []
        for n, d in self.predictions:
            row: dict[str, float | None] = {"params": n, "tokens": d, "loss": None}
            if self.fit is not None:
                row["loss"] = self.fit.law.loss(n, d)
                draws = self.fit.bootstrap_draws
                if draws is not None:
                    losses = draws[:, 0] + draws[:, 1] / n ** draws[:, 3] + draws[:, 2] / d ** draws[:, 4]
                    row["loss_lo"] = float(np.percentile(losses, 2.5))
                    row["loss_hi"] = float(np.percentile(losses, 97.5))
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.points.source,
            "n_points": int(self.points.n.size),
            "notes": self.points.notes,
            "warnings": self.warnings,
            "compute_optimal": self.optimal_rows(),
            "predictions": self.prediction_rows(),
            "paths": {k: str(v) for k, v in self.paths.items()},
        }
        if self.fit is not None:
            out.update(self.fit.to_dict())
        if self.isoflop is not None:
            out["isoflop"] = self.isoflop.to_dict()
        if self.trajectory is not None:
            out["trajectory"] = self.trajectory
        return out


def _optimal_n(draw: np.ndarray, compute: float) -> float:
    """N*(C) of one bootstrap fit; NaN when that fit has no interior optimum (an exponent <= 0)."""
    e, a, b, alpha, beta = draw
    if alpha <= 0 or beta <= 0:
        return math.nan
    with np.errstate(over="ignore"):
        g = (alpha * a / (beta * b)) ** (1.0 / (alpha + beta))
        return float(g * (compute / 6.0) ** (beta / (alpha + beta)))


def scaling_fit(
    points: Points,
    out_dir: Path,
    *,
    bootstrap_samples: int = 200,
    seed: int = 0,
    isoflop: bool = False,
    isoflop_tolerance: float = 0.1,
    min_sizes: int = 3,
    computes: list[float] | None = None,
    predictions: list[tuple[float, float]] | None = None,
    curves: CurvePoints | None = None,
    target: tuple[float, float] | None = None,
) -> ScalingReport:
    """Approach 3 (and Approach 2 when `isoflop`), written under out_dir. With `curves` (every evaluation
    of the runs, whose bootstrap then resamples runs) and a `target` (N, D), also the target run's
    predicted loss curve."""
    warnings = []
    ratios = points.d / points.n
    if ratios.max() / ratios.min() < 1.5:
        warnings.append(
            "every point has about the same tokens per parameter, so the N and D terms cannot be told "
            "apart: A, B, alpha and beta are not identified separately (only their sum along this ratio "
            "is). Add runs at other token budgets (smelt ladder --token-multipliers) or an IsoFLOP grid."
        )
    if curves is not None:  # every evaluation: the law and the schedule's offset (plan/trajectory.py)
        fit, offset = fit_curves(curves)
        losses, groups = points.loss * np.exp(-offset), curves.run  # a bootstrap resamples runs
    else:
        fit, losses, groups = fit_law(points.n, points.d, points.loss), points.loss, None
    fit = bootstrap(fit, points.n, points.d, losses, samples=bootstrap_samples, seed=seed, groups=groups)
    floor = fit.law.E
    if floor < 0.05 * float(points.loss.min()):
        warnings.append(
            f"E came out at {floor:.3g}, far below every loss: the runs are too far above the irreducible "
            "loss to pin it down, so extrapolations beyond them are unreliable. Add larger or longer runs."
        )
    iso = fit_isoflop(points, isoflop_tolerance, min_sizes) if isoflop else None
    if computes is None:
        top = float(points.compute.max())
        computes = [top, 10 * top, 100 * top]
    report = ScalingReport(points, fit, iso, computes, predictions or [], warnings=warnings)
    if curves is not None and target is not None:
        report.trajectory = predict_trajectory(fit, curves, target)
        warnings.extend(report.trajectory["warnings"])
    out_dir.mkdir(parents=True, exist_ok=True)
    report.paths["fit_svg"] = out_dir / "fit.svg"
    report.paths["fit_svg"].write_text(fit_svg(points, fit.law))
    if iso is not None:
        report.paths["isoflop_svg"] = out_dir / "isoflop.svg"
        report.paths["isoflop_svg"].write_text(isoflop_svg(iso))
        warnings.extend(iso.notes)
        if iso.a is not None:
            gap = abs(iso.a - fit.law.a)
            if gap > 0.1:
                warnings.append(
                    f"the IsoFLOP exponent a = {iso.a:.3f} and the parametric fit's beta/(alpha+beta) = "
                    f"{fit.law.a:.3f} disagree by {gap:.2f}: too few compute groups or sizes, or runs not at "
                    f"their optimal hyper-parameters."
                )
    report.paths["json"] = out_dir / "fit.json"
    write_json(report.paths["json"], report.to_dict())
    return report


def _interval(fit: LawFit, key: str, fmt: str) -> str:
    if key not in fit.intervals:
        return ""
    lo, hi = fit.intervals[key]
    return f"  [{format(lo, fmt)}, {format(hi, fmt)}]"


def report_text(report: ScalingReport) -> str:
    """The tables `smelt scaling fit` prints."""
    lines = [f"points: {report.points.n.size} from {report.points.source}"]
    lines += [f"  {note}" for note in report.points.notes]
    fit = report.fit
    if fit is not None:
        law = fit.law
        ci = f" (95% intervals from {fit.bootstrap_samples} bootstrap fits)" if fit.bootstrap_samples else ""
        lines += [
            "",
            "L(N, D) = E + A / N^alpha + B / D^beta, Huber (delta 1e-3) on log-loss, "
            f"L-BFGS from {fit.starts} starts{ci}",
            f"  E      {law.E:12.4f}{_interval(fit, 'E', '.4f')}",
            f"  A      {law.A:12.4g}{_interval(fit, 'A', '.4g')}",
            f"  B      {law.B:12.4g}{_interval(fit, 'B', '.4g')}",
            f"  alpha  {law.alpha:12.4f}{_interval(fit, 'alpha', '.4f')}",
            f"  beta   {law.beta:12.4f}{_interval(fit, 'beta', '.4f')}",
            f"  a = beta / (alpha + beta) = {law.a:.4f}{_interval(fit, 'a', '.4f')}"
            "  (N* ~ C^a, D* ~ C^(1-a))",
            f"  objective {fit.objective:.6g} over {fit.n_points} points",
        ]
    if report.isoflop is not None:
        iso = report.isoflop
        used = len(iso.used)
        lines += ["", f"IsoFLOP (Approach 2): {used} usable group(s) of {len(iso.groups)}"]
        for g in iso.groups:
            if g.n.size < 2:
                continue
            n_opt = f"N* {g.n_opt:.3g}, loss {g.loss_opt:.4f}" if g.n_opt is not None else "-"
            lines.append(f"  C {g.compute:10.3e}: {g.n.size} runs, {n_opt} ({g.status})")
        if iso.a is not None:
            se = f" +- {iso.a_stderr:.3f}" if iso.a_stderr is not None else ""
            lines.append(f"  N* ~ C^{iso.a:.3f}{se}, D* ~ C^{iso.b:.3f}")
    rows = report.optimal_rows()
    if rows:
        lines += [
            "",
            f"{'compute C':>12} {'N* (law)':>11} {'95% interval':>23} {'D* (law)':>11} {'loss':>7} "
            f"{'N* (IsoFLOP)':>13}",
        ]
        for row in rows:
            interval = (
                f"[{row['n_opt_lo']:.3g}, {row['n_opt_hi']:.3g}]" if row.get("n_opt_lo") is not None else "-"
            )
            iso_n = f"{row['isoflop_n_opt']:.3g}" if row.get("isoflop_n_opt") is not None else "-"
            lines.append(
                f"{row['compute']:12.3e} {row.get('n_opt', float('nan')):11.3g} {interval:>23} "
                f"{row.get('d_opt', float('nan')):11.3g} {row.get('loss', float('nan')):7.4f} {iso_n:>13}"
            )
    if report.predictions and fit is not None:
        lines += ["", "predicted loss of planned runs:"]
        for row in report.prediction_rows():
            n, d = row["params"], row["tokens"]
            interval = f" [{row['loss_lo']:.4f}, {row['loss_hi']:.4f}]" if "loss_lo" in row else ""
            lines.append(
                f"  N {n:.3g}, D {d:.3g} ({d / n:.1f} tokens/param): loss {row['loss']:.4f}{interval}"
            )
    if report.trajectory is not None:
        lines += trajectory_text(report.trajectory)
    for warning in report.warnings:
        lines.append(f"\nwarning: {warning}")
    lines += ["", "written:"] + [f"  {name:<12} {path}" for name, path in report.paths.items()]
    return "\n".join(lines)
