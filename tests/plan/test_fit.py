"""Approach 3: the Huber objective, the batched L-BFGS, and the fit on published data."""

import numpy as np
import pytest

from smelt.errors import UserError
from smelt.plan.fit import HUBER_DELTA, batched_lbfgs, bootstrap, fit_law, grid_starts, objective
from smelt.plan.laws import LossLaw
from smelt.plan.points import read_csv

CHINCHILLA_CSV = "scaling/chinchilla_epoch_replication/svg_extracted_data.csv"
# Besiroglu et al. (2024), data_analysis.ipynb: point estimates and 95% intervals of their refit.
EPOCH_ESTIMATES = {"A": 482.006, "B": 2085.434, "E": 1.817, "alpha": 0.348, "beta": 0.366}
EPOCH_CI = {
    "A": (285.214, 743.626),
    "B": (1042.357, 5810.344),
    "E": (1.769, 1.871),
    "alpha": (0.317, 0.373),
    "beta": (0.331, 0.415),
}
# Their "Replicate exactly" cell: the same Huber / L-BFGS procedure on the same 240 points.
EPOCH_REPLICATE = {"A": 477.8417, "B": 2143.8638, "E": 1.817236, "alpha": 0.347313, "beta": 0.367183}


def test_grid_is_hoffmanns():
    starts = grid_starts()
    assert starts.shape == (4500, 5)
    assert set(starts[:, 0]) == {0.0, 5.0, 10.0, 15.0, 20.0, 25.0}  # a = log A
    assert set(starts[:, 3]) == {0.0, 0.5, 1.0, 1.5, 2.0}  # alpha
    assert set(starts[:, 2]) == {-1.0, -0.5, 0.0, 0.5, 1.0}  # e = log E


def test_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    log_n, log_d = np.log(rng.uniform(1e7, 1e10, 40)), np.log(rng.uniform(1e8, 1e11, 40))
    log_loss = np.log(rng.uniform(2.0, 4.0, 40))
    theta = np.array([[6.0, 7.0, 0.5, 0.35, 0.37], [3.0, 9.0, 0.2, 0.2, 0.5]])
    weights = rng.integers(0, 3, size=(2, 40)).astype(float)
    for w in (None, weights):
        f, g = objective(theta, log_n, log_d, log_loss, w)
        for j in range(5):
            step = np.zeros_like(theta)
            step[:, j] = 1e-6
            fp, _ = objective(theta + step, log_n, log_d, log_loss, w)
            fm, _ = objective(theta - step, log_n, log_d, log_loss, w)
            assert g[:, j] == pytest.approx((fp - fm) / 2e-6, rel=1e-4, abs=1e-10)
        assert np.all(f > 0)


def test_batched_lbfgs_solves_independent_rosenbrocks():
    shifts = np.array([1.0, 2.0, -1.5])

    def fun(x, rows):
        c = shifts[rows]
        a, b = x[:, 0], x[:, 1]
        f = (c - a) ** 2 + 100 * (b - a * a) ** 2
        g = np.column_stack([-2 * (c - a) - 400 * a * (b - a * a), 200 * (b - a * a)])
        return f, g

    x, f, iters = batched_lbfgs(fun, np.array([[-1.2, 1.0], [0.0, 0.0], [2.0, 2.0]]))
    assert x[:, 0] == pytest.approx(shifts, abs=1e-5)
    assert x[:, 1] == pytest.approx(shifts**2, abs=1e-4)
    assert np.all(f < 1e-10) and np.all(iters < 1000)


@pytest.mark.slow
def test_synthetic_law_is_recovered():
    truth = LossLaw(E=1.9, A=300.0, B=900.0, alpha=0.32, beta=0.30)
    n = np.repeat(np.geomspace(3e7, 3e9, 8), 6)
    d = np.tile(np.geomspace(1e9, 3e11, 6), 8)
    rng = np.random.default_rng(1)
    loss = np.array([truth.loss(a, b) for a, b in zip(n, d, strict=True)]) * np.exp(
        rng.normal(0, 2e-4, n.size)
    )
    fit = fit_law(n, d, loss)
    assert abs(fit.law.E - truth.E) < 0.02 * truth.E
    assert fit.law.alpha == pytest.approx(truth.alpha, abs=0.01)
    assert fit.law.beta == pytest.approx(truth.beta, abs=0.01)
    assert fit.law.a == pytest.approx(truth.a, abs=0.01)


def test_too_few_points_is_a_user_error():
    with pytest.raises(UserError, match="at least 5 points"):
        fit_law(np.array([1e8, 1e9]), np.array([1e9, 1e10]), np.array([3.0, 2.5]))
    with pytest.raises(UserError, match="positive finite"):
        fit_law(np.array([1e8] * 5), np.array([1e9] * 5), np.array([3.0, 2.5, -1.0, 2.0, 2.0]))


@pytest.mark.slow
def test_chinchilla_refit_recovers_published_parameters(shared_data):
    points = read_csv(shared_data / CHINCHILLA_CSV).drop_highest(5)
    assert points.n.size == 240  # "Our sample size is 240"
    fit = fit_law(points.n, points.d, points.loss)
    law = fit.law
    got = {"A": law.A, "B": law.B, "E": law.E, "alpha": law.alpha, "beta": law.beta}
    for name, (lo, hi) in EPOCH_CI.items():
        assert lo < got[name] < hi, (name, got[name])
    for name, value in EPOCH_REPLICATE.items():  # the same procedure lands on the same optimum
        assert got[name] == pytest.approx(value, rel=0.005), name
    assert law.a == pytest.approx(0.513, abs=0.02)  # their a = beta / (alpha + beta): 0.513 (0.020)

    fit = bootstrap(fit, points.n, points.d, points.loss, samples=100, seed=0)
    for name in EPOCH_CI:
        lo, hi = fit.intervals[name]
        assert lo < got[name] < hi
        pub_lo, pub_hi = EPOCH_CI[name]
        assert lo < pub_hi and pub_lo < hi, name  # our interval overlaps theirs
    assert fit.intervals["alpha"][0] == pytest.approx(EPOCH_CI["alpha"][0], abs=0.01)
    assert fit.intervals["alpha"][1] == pytest.approx(EPOCH_CI["alpha"][1], abs=0.01)


@pytest.mark.slow
def test_all_245_points_fit_differently(shared_data):
    """The five outliers pull the fit far from the published one (README: B ~ 1.25e4, beta ~ 0.45)."""
    points = read_csv(shared_data / CHINCHILLA_CSV)
    fit = fit_law(points.n, points.d, points.loss)
    assert fit.law.beta > EPOCH_CI["beta"][1]
    assert EPOCH_CI["B"][1] < fit.law.B
    assert HUBER_DELTA == 1e-3
