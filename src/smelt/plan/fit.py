"""Fit L(N, D) = E + A / N^alpha + B / D^beta the way Hoffmann et al. (2022) did (their Approach 3).

In the parametrization a = log A, b = log B, e = log E the predicted log-loss is
LSE(a - alpha log N, b - beta log D, e); the fit minimizes the Huber loss (delta = 1e-3) of its residuals
against the observed log-loss with L-BFGS, started from every point of their grid of 4,500 starting
values, and keeps the best final objective. The objective has flat valleys and several local minima,
which is why the grid matters: single-start fits land in different places.

Every start is an independent problem, so the L-BFGS here is batched over numpy rows: each row keeps its
own curvature history and its own backtracking line search, and the whole grid costs about as much as a
few hundred sequential starts. Bootstrap intervals resample the points (as multinomial weights) and
refit each resample from the best endpoints of the full fit, again as one batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smelt.errors import UserError
from smelt.plan.laws import LossLaw

HUBER_DELTA = 1e-3
POLISH = 50  # best endpoints of the grid refined with tight tolerances
ROW_BLOCK = 96  # rows of starts evaluated together (a block of 96 x ~250 points stays in L2 cache)
# Hoffmann et al.'s grid of initial values (also used by Besiroglu et al.'s replication).
GRID = {
    "alpha": np.arange(0.0, 2.5, 0.5),
    "beta": np.arange(0.0, 2.5, 0.5),
    "e": np.arange(-1.0, 1.5, 0.5),
    "a": np.arange(0.0, 30.0, 5.0),
    "b": np.arange(0.0, 30.0, 5.0),
}
PARAMS = ("a", "b", "e", "alpha", "beta")


def grid_starts() -> np.ndarray:
    """The 4,500 starting points, as rows (a, b, e, alpha, beta)."""
    rows = [
        (a, b, e, alpha, beta)
        for alpha, beta, e, a, b in itertools.product(
            GRID["alpha"], GRID["beta"], GRID["e"], GRID["a"], GRID["b"]
        )
    ]
    return np.array(rows, dtype=np.float64)


def objective(
    theta: np.ndarray,
    log_n: np.ndarray,
    log_d: np.ndarray,
    log_loss: np.ndarray,
    weights: np.ndarray | None = None,
    delta: float = HUBER_DELTA,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row Huber objective and its gradient.

    theta (K, 5) rows of (a, b, e, alpha, beta); log_n, log_d, log_loss (n,); weights (K, n) or None
    (all ones). Evaluated in blocks of rows that stay in cache: the arithmetic is a few dozen passes over
    K x n numbers, so memory traffic, not FLOPs, is what costs.
    """
    k = theta.shape[0]
    f = np.empty(k)
    grad = np.empty((k, 5))
    for lo in range(0, k, ROW_BLOCK):
        hi = min(k, lo + ROW_BLOCK)
        w = None if weights is None else weights[lo:hi]
        f[lo:hi], grad[lo:hi] = _objective_block(theta[lo:hi], log_n, log_d, log_loss, w, delta)
    return f, grad


def _objective_block(
    theta: np.ndarray,
    log_n: np.ndarray,
    log_d: np.ndarray,
    log_loss: np.ndarray,
    weights: np.ndarray | None,
    delta: float,
) -> tuple[np.ndarray, np.ndarray]:
    a, b, e, alpha, beta = (theta[:, i : i + 1] for i in range(5))
    u1 = a - alpha * log_n
    u2 = b - beta * log_d
    top = np.maximum(np.maximum(u1, u2), e)
    e1 = np.exp(u1 - top)
    e2 = np.exp(u2 - top)
    e3 = np.exp(e - top)
    total = e1 + e2 + e3
    r = top + np.log(total) - log_loss
    absr = np.abs(r)
    inner = np.minimum(absr, delta)  # 0.5 r^2 inside delta, delta (|r| - delta / 2) outside; no overflow
    huber = 0.5 * inner * inner + delta * (absr - inner)
    psi = np.clip(r, -delta, delta) / total  # d huber / d r, divided by the softmax denominator
    if weights is not None:
        huber *= weights
        psi *= weights
    we1, we2, we3 = psi * e1, psi * e2, psi * e3
    grad = np.column_stack(
        [we1.sum(axis=1), we2.sum(axis=1), we3.sum(axis=1), -(we1 @ log_n), -(we2 @ log_d)]
    )
    return huber.sum(axis=1), grad


def batched_lbfgs(
    fun: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    x0: np.ndarray,
    *,
    history: int = 10,
    max_iter: int = 1000,
    ftol: float = 1e-15,
    gtol: float = 1e-14,
    f_scale: float = 0.0,
    c1: float = 1e-4,
    max_backtracks: int = 40,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimize K independent problems at once. `fun(x, rows)` returns (f, grad) for the given rows of x.

    Per row: the L-BFGS two-loop recursion over its last `history` curvature pairs, then an Armijo
    backtracking line search from the unit step. A row stops when its gradient or its decrease falls
    below tolerance, or its line search fails. Returns (x, f, iterations) per row.
    """
    x = x0.astype(np.float64).copy()
    k, dim = x.shape
    f, g = fun(x, np.arange(k))
    s_hist = np.zeros((k, history, dim))
    y_hist = np.zeros((k, history, dim))
    rho = np.zeros((k, history))
    active = np.isfinite(f)
    iters = np.zeros(k, dtype=np.int64)
    for _ in range(max_iter):
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        gr = g[rows]
        # Two-loop recursion, newest pair last; empty slots have rho = 0 and change nothing.
        q = gr.copy()
        alphas = np.zeros((rows.size, history))
        for j in range(history - 1, -1, -1):
            alphas[:, j] = rho[rows, j] * np.einsum("kd,kd->k", s_hist[rows, j], q)
            q -= alphas[:, j : j + 1] * y_hist[rows, j]
        sy = np.einsum("kd,kd->k", s_hist[rows, -1], y_hist[rows, -1])
        yy = np.einsum("kd,kd->k", y_hist[rows, -1], y_hist[rows, -1])
        gnorm = np.linalg.norm(gr, axis=1)
        gamma = np.where(
            (rho[rows, -1] > 0) & (yy > 0), sy / np.where(yy > 0, yy, 1.0), 1.0 / np.maximum(gnorm, 1e-300)
        )
        r = gamma[:, None] * q
        for j in range(history):
            beta = rho[rows, j] * np.einsum("kd,kd->k", y_hist[rows, j], r)
            r += s_hist[rows, j] * (alphas[:, j] - beta)[:, None]
        d = -r
        slope = np.einsum("kd,kd->k", gr, d)
        bad = ~(slope < 0) | ~np.isfinite(slope)
        if bad.any():  # not a descent direction: forget the history, follow the scaled gradient
            d[bad] = -gr[bad] / np.maximum(gnorm[bad], 1e-300)[:, None]
            slope[bad] = -gnorm[bad]
            rho[rows[bad]] = 0.0
        # Backtracking (Armijo) line search, per row.
        step = np.ones(rows.size)
        accepted = np.zeros(rows.size, dtype=bool)
        x_new = x[rows].copy()
        f_new = f[rows].copy()
        g_new = g[rows].copy()
        pending = np.arange(rows.size)
        for _ in range(max_backtracks):
            trial = x[rows[pending]] + step[pending, None] * d[pending]
            ft, gt = fun(trial, rows[pending])
            ok = np.isfinite(ft) & (ft <= f[rows[pending]] + c1 * step[pending] * slope[pending])
            done = pending[ok]
            x_new[done], f_new[done], g_new[done] = trial[ok], ft[ok], gt[ok]
            accepted[done] = True
            pending = pending[~ok]
            if pending.size == 0:
                break
            step[pending] *= 0.5
        iters[rows] += 1
        stalled = rows[~accepted]
        active[stalled] = False
        moved = rows[accepted]
        s = x_new[accepted] - x[moved]
        y = g_new[accepted] - g[moved]
        old_f = f[moved]
        decrease = old_f - f_new[accepted]
        x[moved], f[moved], g[moved] = x_new[accepted], f_new[accepted], g_new[accepted]
        curvature = np.einsum("kd,kd->k", s, y)
        s_hist[moved] = np.roll(s_hist[moved], -1, axis=1)
        y_hist[moved] = np.roll(y_hist[moved], -1, axis=1)
        rho[moved] = np.roll(rho[moved], -1, axis=1)
        good = curvature > 1e-300
        s_hist[moved, -1] = np.where(good[:, None], s, 0.0)
        y_hist[moved, -1] = np.where(good[:, None], y, 0.0)
        rho[moved, -1] = np.where(good, 1.0 / np.where(good, curvature, 1.0), 0.0)
        scale = np.maximum(np.maximum(np.abs(old_f), np.abs(f_new[accepted])), max(f_scale, 1e-300))
        converged = (decrease <= ftol * scale) | (np.abs(g[moved]).max(axis=1) <= gtol)
        active[moved[converged]] = False
    return x, f, iters


@dataclass
class LawFit:
    """The best fit, its objective, and (after `bootstrap`) percentile intervals."""

    law: LossLaw
    objective: float
    n_points: int
    starts: int
    theta: np.ndarray
    endpoints: np.ndarray  # (k, 5) distinct good endpoints of the grid, best first
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    bootstrap_samples: int = 0
    bootstrap_draws: np.ndarray | None = None  # (samples, 5) in (E, A, B, alpha, beta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law.to_dict(),
            "a_exponent": self.law.a,
            "objective": self.objective,
            "n_points": self.n_points,
            "starts": self.starts,
            "intervals_95": {k: list(v) for k, v in self.intervals.items()},
            "bootstrap_samples": self.bootstrap_samples,
        }


def _theta_to_law(theta: np.ndarray, name: str) -> LossLaw:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return LossLaw(
        E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha, beta=beta, name=name
    )


def _check_points(n: np.ndarray, d: np.ndarray, loss: np.ndarray) -> None:
    if not (len(n) == len(d) == len(loss)):
        raise ValueError("N, D and loss must have the same length")
    if len(n) < 5:
        raise UserError(
            f"a fit of L(N, D) = E + A/N^alpha + B/D^beta needs at least 5 points (it has 5 parameters); "
            f"got {len(n)}. Add runs, e.g. with `smelt ladder`."
        )
    for name, values in (("N (parameters)", n), ("D (tokens)", d), ("loss", loss)):
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise UserError(f"every {name} value must be a positive finite number; fix or drop the bad rows.")


def fit_law(
    n: np.ndarray,
    d: np.ndarray,
    loss: np.ndarray,
    *,
    starts: np.ndarray | None = None,
    delta: float = HUBER_DELTA,
    name: str = "fitted",
) -> LawFit:
    """Approach 3: Huber on log-loss, L-BFGS from every start (default: Hoffmann's grid), best objective."""
    n, d, loss = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    _check_points(n, d, loss)
    x0 = grid_starts() if starts is None else np.asarray(starts, dtype=np.float64)
    log_n, log_d, log_loss = np.log(n), np.log(d), np.log(loss)

    def fun(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return objective(x, log_n, log_d, log_loss, None, delta)

    # Every start with L-BFGS-B's default tolerances (the procedure of Hoffmann et al. and Besiroglu et
    # al.), then the 50 best endpoints again with tight ones: the valleys are flat enough that a loose
    # stop leaves the exponents off in the third digit.
    x, f, _ = batched_lbfgs(fun, x0, ftol=2.2e-9, gtol=1e-5, f_scale=1.0)
    finite = np.isfinite(f)
    if not finite.any():
        raise UserError("the scaling-law fit diverged from every start; check that the losses are in nats.")
    order = np.argsort(np.where(finite, f, np.inf))[:POLISH]
    x, f, _ = batched_lbfgs(fun, x[order])
    order = np.argsort(np.where(np.isfinite(f), f, np.inf))
    best = x[order[0]]
    return LawFit(
        law=_theta_to_law(best, name),
        objective=float(f[order[0]]),
        n_points=int(n.size),
        starts=int(x0.shape[0]),
        theta=best,
        endpoints=_distinct(x[order]),
    )


def _distinct(points: np.ndarray, keep: int = 8, tol: float = 1e-3) -> np.ndarray:
    out: list[np.ndarray] = []
    for p in points:
        if all(np.max(np.abs(p - q)) > tol for q in out):
            out.append(p)
        if len(out) == keep:
            break
    return np.array(out)


def bootstrap(
    fit: LawFit,
    n: np.ndarray,
    d: np.ndarray,
    loss: np.ndarray,
    *,
    samples: int = 200,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    groups: np.ndarray | None = None,
) -> LawFit:
    """Percentile 95% intervals from `samples` resamples of the points (with replacement).

    Each resample is refit from the full fit's distinct best endpoints (not the 4,500-point grid: the
    resamples move the optimum a little, not to another basin), all resamples in one batch. `groups`
    (one integer per point, 0..G-1) resamples whole groups instead: the evaluations of one run are not
    independent points, so a trajectory fit draws runs.
    """
    if samples < 2:
        return fit
    n, d, loss = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    rng = np.random.default_rng(seed)
    if groups is None:
        counts = rng.multinomial(n.size, np.full(n.size, 1.0 / n.size), size=samples).astype(np.float64)
    else:
        size = int(groups.max()) + 1
        counts = rng.multinomial(size, np.full(size, 1.0 / size), size=samples).astype(np.float64)[:, groups]
    starts = fit.endpoints
    per = starts.shape[0]
    x0 = np.tile(starts, (samples, 1))
    weights = np.repeat(counts, per, axis=0)
    log_n, log_d, log_loss = np.log(n), np.log(d), np.log(loss)

    def fun(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return objective(x, log_n, log_d, log_loss, weights[rows], delta)

    x, f, _ = batched_lbfgs(fun, x0)
    f = np.where(np.isfinite(f), f, np.inf).reshape(samples, per)
    best = x.reshape(samples, per, 5)[np.arange(samples), f.argmin(axis=1)]
    draws = np.column_stack(
        [np.exp(best[:, 2]), np.exp(best[:, 0]), np.exp(best[:, 1]), best[:, 3], best[:, 4]]
    )
    names = ("E", "A", "B", "alpha", "beta")
    intervals = {
        name: (float(np.percentile(draws[:, i], 2.5)), float(np.percentile(draws[:, i], 97.5)))
        for i, name in enumerate(names)
    }
    a_exp = draws[:, 4] / (draws[:, 3] + draws[:, 4])
    intervals["a"] = (float(np.percentile(a_exp, 2.5)), float(np.percentile(a_exp, 97.5)))
    fit.intervals = intervals
    fit.bootstrap_samples = samples
    fit.bootstrap_draws = draws
    return fit
