"""Approach 2: IsoFLOP profiles on a synthetic grid, on Chinchilla's points and on Gadre et al.'s runs."""

import json

import numpy as np
import pytest

from smelt.plan.isoflop import fit_isoflop, group_by_compute
from smelt.plan.laws import LossLaw
from smelt.plan.points import Points, read_csv

# Hoffmann et al. (2022), Table 2: Approach 2 gives N* ~ C^0.49 with 0.462-0.534 as its interval.
HOFFMANN_APPROACH2 = (0.462, 0.534)


def isoflop_grid(law: LossLaw, computes: list[float], sizes: int = 7) -> Points:
    n, d = [], []
    for c in computes:
        center = law.optimal(c)[0]
        for k in np.geomspace(center / 6, center * 6, sizes):
            n.append(k)
            d.append(c / (6 * k))
    n, d = np.array(n), np.array(d)
    loss = np.array([law.loss(a, b) for a, b in zip(n, d, strict=True)])
    return Points(n, d, loss, [f"run {i}" for i in range(n.size)])


def test_synthetic_isoflop_recovers_the_exponent():
    law = LossLaw(E=1.8, A=480.0, B=2100.0, alpha=0.34, beta=0.37)
    computes = [1e18, 3e18, 1e19, 3e19, 1e20, 3e20]
    fit = fit_isoflop(isoflop_grid(law, computes))
    assert len(fit.used) == len(computes)
    assert fit.a == pytest.approx(law.a, abs=0.015)
    assert fit.b == pytest.approx(1 - law.a, abs=0.015)
    for group in fit.used:
        assert group.n_opt == pytest.approx(law.optimal(group.compute)[0], rel=0.15)
    assert fit.d_opt(1e21) == pytest.approx(1e21 / (6 * fit.n_opt(1e21)))


def test_groups_skip_what_cannot_give_an_optimum():
    law = LossLaw(E=1.8, A=480.0, B=2100.0, alpha=0.34, beta=0.37)
    points = isoflop_grid(law, [1e19], sizes=9)
    # Keep only sizes above the optimum: the vertex of their parabola is an extrapolation.
    big = points.subset(points.n > 1.5 * law.optimal(1e19)[0])
    assert big.n.size >= 3
    fit = fit_isoflop(big)
    assert fit.groups[0].status == "minimum outside the sampled sizes" and fit.a is None
    assert "at least two" in fit.notes[0]
    two = points.subset(points.n >= np.sort(points.n)[-2])
    assert fit_isoflop(two).groups[0].status.startswith("only 2 size")


def test_explicit_group_column(tmp_path):
    law = LossLaw(E=1.8, A=480.0, B=2100.0, alpha=0.34, beta=0.37)
    points = isoflop_grid(law, [1e19, 1e20, 1e21], sizes=5)
    csv = tmp_path / "runs.csv"
    lines = ["params,tokens,loss,group"]
    for i, (n, d, loss) in enumerate(zip(points.n, points.d, points.loss, strict=True)):
        lines.append(f"{n},{d},{loss},budget{i // 5}")
    csv.write_text("\n".join(lines) + "\n")
    read = read_csv(csv)
    assert read.groups is not None
    groups = group_by_compute(read)
    assert [label for label, _ in groups] == ["budget0", "budget1", "budget2"]
    assert fit_isoflop(read).a == pytest.approx(law.a, abs=0.02)


def test_chinchilla_points_give_hoffmanns_approach_2_exponent(shared_data):
    points = read_csv(shared_data / "scaling/chinchilla_epoch_replication/svg_extracted_data.csv")
    fit = fit_isoflop(points.drop_highest(5))
    assert len(fit.used) >= 8
    lo, hi = HOFFMANN_APPROACH2
    assert lo < fit.a < hi
    # Chinchilla itself: 70B parameters for 5.76e23 FLOPs.
    assert 50e9 < fit.n_opt(5.76e23) < 100e9


def gadre_points(shared_data, dataset: str, val: str = "c4_val") -> Points:
    n, d, loss = [], [], []
    for path in sorted((shared_data / "scaling/gadre2024_overtraining/models").glob("*.json")):
        run = json.loads(path.read_text())
        if run["dataset_name"] != dataset:
            continue
        losses = {r["val_data"][0].split("/")[-2]: r["loss"] for r in run["results"]}
        n.append(run["hyperparameters"]["params"])
        d.append(run["hyperparameters"]["tokens"])
        loss.append(losses[val])
    return Points(np.array(n, float), np.array(d, float), np.array(loss), [str(i) for i in range(len(n))])


@pytest.mark.parametrize("dataset", ["c4_original", "rpj", "rw_original"])
def test_gadre_runs_have_chinchilla_like_optima(shared_data, dataset):
    """Gadre et al. trained 6 sizes at token multipliers 0.25-32x; three compute levels (~5.6e18, 1.1e19,
    2.2e19) have three sizes each around the optimum. Their minima sit at 10-80 tokens per parameter
    (Chinchilla: ~20) and grow with compute."""
    points = gadre_points(shared_data, dataset)
    assert points.n.size in (34, 35)
    fit = fit_isoflop(points)
    used = fit.used
    assert len(used) == 3
    assert [round(np.log10(g.compute), 1) for g in used] == [18.7, 19.0, 19.3]
    for group in used:
        assert group.n.min() < group.n_opt < group.n.max()
        tokens_per_param = group.compute / (6 * group.n_opt**2)
        assert 10 < tokens_per_param < 80
    assert used[-1].n_opt > used[0].n_opt
    assert fit.a is not None and 0 < fit.a < 1
