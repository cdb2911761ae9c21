"""IsoFLOP profiles (Hoffmann et al. 2022, Approach 2): at each fixed compute, the model size with the
lowest loss; across computes, N*(C) = k C^a and D*(C) = C / (6 N*(C)).

Each group of runs with (nearly) the same compute gets a parabola of loss in log N; its vertex is that
compute's optimal size. A vertex outside the sizes a group sampled is an extrapolation, so such groups
are reported and left out of the power-law fit, as are groups with fewer than three sizes or a parabola
that opens downward. The exponent a should agree with Approach 3's beta / (alpha + beta); when it does
not, one of the two is being misled by the data (too few groups, sizes too narrow, schedules untuned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smelt.errors import UserError
from smelt.plan.points import Points


@dataclass
class IsoGroup:
    label: str
    compute: float  # geometric mean of the group's 6 N D
    n: np.ndarray
    loss: np.ndarray
    coefficients: tuple[float, float, float] | None = None  # loss = c0 + c1 u + c2 u^2, u = ln N
    n_opt: float | None = None
    loss_opt: float | None = None
    status: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "compute": self.compute,
            "sizes": self.n.tolist(),
            "losses": self.loss.tolist(),
            "n_opt": self.n_opt,
            "loss_opt": self.loss_opt,
            "status": self.status,
        }


@dataclass
class IsoFlopFit:
    groups: list[IsoGroup]
    a: float | None = None  # N* ~ C^a
    log_k: float | None = None  # ln N* = log_k + a ln C
    a_stderr: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def used(self) -> list[IsoGroup]:
        return [g for g in self.groups if g.status == "ok"]

    @property
    def b(self) -> float | None:
        """D* ~ C^b with b = 1 - a (from C = 6 N D)."""
        return None if self.a is None else 1.0 - self.a

    def n_opt(self, compute: float) -> float:
        if self.a is None or self.log_k is None:
            raise UserError(
                "the IsoFLOP fit has fewer than two usable compute groups; it cannot predict N*(C)."
            )
        return math.exp(self.log_k + self.a * math.log(compute))

    def d_opt(self, compute: float) -> float:
        return compute / (6.0 * self.n_opt(compute))

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "log_k": self.log_k,
            "a_stderr": self.a_stderr,
            "groups": [g.to_dict() for g in self.groups],
            "notes": self.notes,
        }


def group_by_compute(points: Points, tolerance_dex: float = 0.1) -> list[tuple[str, np.ndarray]]:
    """Groups of point indices with about the same compute.

    With a group column, its values. Otherwise sort by log10 C and start a new group where the gap to
    the previous run exceeds `tolerance_dex`, or the group would span more than twice that.
    """
    if points.groups is not None:
        labels = sorted(
            set(points.groups), key=lambda g: float(np.mean(points.compute[[x == g for x in points.groups]]))
        )
        return [(g, np.flatnonzero([x == g for x in points.groups])) for g in labels]
    logc = np.log10(points.compute)
    order = np.argsort(logc)
    groups: list[list[int]] = []
    for i in order:
        if (
            groups
            and logc[i] - logc[groups[-1][-1]] <= tolerance_dex
            and logc[i] - logc[groups[-1][0]] <= 2 * tolerance_dex
        ):
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return [(f"{10 ** float(np.mean(logc[g])):.2e}", np.array(g)) for g in groups]


def _profile(label: str, compute: float, n: np.ndarray, loss: np.ndarray, min_sizes: int) -> IsoGroup:
    group = IsoGroup(label, compute, n, loss)
    sizes = np.unique(n)
    if sizes.size < min_sizes:
        group.status = f"only {sizes.size} size(s); needs {min_sizes}"
        return group
    u = np.log(n)
    c2, c1, c0 = np.polyfit(u, loss, 2)
    group.coefficients = (float(c0), float(c1), float(c2))
    if c2 <= 0:
        group.status = "loss is not convex in log N"
        return group
    vertex = -c1 / (2 * c2)
    group.n_opt = float(math.exp(vertex))
    group.loss_opt = float(c0 + c1 * vertex + c2 * vertex * vertex)
    if not u.min() <= vertex <= u.max():
        group.status = "minimum outside the sampled sizes"
    return group


def fit_isoflop(points: Points, tolerance_dex: float = 0.1, min_sizes: int = 3) -> IsoFlopFit:
    """Approach 2: a parabola per compute group, then ln N* = ln k + a ln C over the usable groups."""
    groups = []
    for label, idx in group_by_compute(points, tolerance_dex):
        compute = float(np.exp(np.mean(np.log(points.compute[idx]))))
        groups.append(_profile(label, compute, points.n[idx], points.loss[idx], min_sizes))
    fit = IsoFlopFit(groups)
    used = fit.used
    if len(used) < 2:
        fit.notes.append(
            f"{len(used)} usable IsoFLOP group(s) of {len(groups)}: N*(C) needs at least two. Runs of one "
            f"compute need >= {min_sizes} sizes around the optimum (e.g. `smelt ladder --isoflop`)."
        )
        return fit
    x = np.log([g.compute for g in used])
    y = np.log([g.n_opt for g in used])
    a, log_k = np.polyfit(x, y, 1)
    fit.a, fit.log_k = float(a), float(log_k)
    if len(used) > 2:
        residuals = y - (log_k + a * x)
        fit.a_stderr = float(
            math.sqrt(residuals @ residuals / (len(used) - 2) / ((x - x.mean()) @ (x - x.mean())))
        )
    return fit
