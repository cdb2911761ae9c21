"""Loss laws L(N, D) = E + A / N^alpha + B / D^beta and what follows from one: the compute-optimal split
of a FLOP budget, the loss expected from a run, and the tokens a smaller model needs to reach that loss.

A law is what turns "we have C FLOPs" into "train N parameters on D tokens and expect loss L". The two
published ones below are built in so that a plan can be made before any proxy run; `smelt scaling fit`
writes the same fields to JSON, and `load_law` reads either.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smelt.errors import UserError


@dataclass(frozen=True)
class LossLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta, with N parameters and D training tokens (C = 6 N D)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    name: str = "fitted"

    def loss(self, n: float, d: float) -> float:
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    @property
    def a(self) -> float:
        """N* grows as C^a with a = beta / (alpha + beta); D* grows as C^(1 - a)."""
        return self.beta / (self.alpha + self.beta)

    def optimal(self, compute: float) -> tuple[float, float]:
        """(N*, D*) minimizing L(N, D) under 6 N D = C (Hoffmann et al. 2022, eq. 4)."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n = g * (compute / 6.0) ** self.a
        return n, compute / (6.0 * n)

    def tokens_for_loss(self, n: float, target: float) -> float | None:
        """Tokens a model of n parameters needs to reach `target` loss; None when it never can
        (its parameter term alone is already at or above the target)."""
        gap = target - self.E - self.A / n**self.alpha
        if gap <= 0:
            return None
        return (self.B / gap) ** (1.0 / self.beta)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Hoffmann et al. (2022), eq. 10: the published Approach-3 fit.
CHINCHILLA = LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, name="Hoffmann et al. 2022 (published)")
# Besiroglu et al. (2024), "Chinchilla Scaling: A replication attempt": the refit on the points of
# Hoffmann et al.'s Figure 4, whose tokens-per-parameter ratio agrees with Chinchilla's own ~20.
EPOCH = LossLaw(
    E=1.817, A=482.006, B=2085.434, alpha=0.348, beta=0.366, name="Besiroglu et al. 2024 (Chinchilla refit)"
)
KNOWN_LAWS = {"epoch": EPOCH, "chinchilla": CHINCHILLA}


def load_law(spec: str) -> LossLaw:
    """A built-in law by name (epoch, chinchilla) or the JSON written by `smelt scaling fit`."""
    if spec in KNOWN_LAWS:
        return KNOWN_LAWS[spec]
    path = Path(spec)
    if not path.is_file():
        raise UserError(
            f"--law {spec!r} is neither a built-in law ({', '.join(KNOWN_LAWS)}) nor a file. Pass one of "
            f"those names or the fit.json written by `smelt scaling fit`."
        )
    try:
        raw = json.loads(path.read_text())
        params = raw.get("law", raw)
        return LossLaw(
            E=float(params["E"]),
            A=float(params["A"]),
            B=float(params["B"]),
            alpha=float(params["alpha"]),
            beta=float(params["beta"]),
            name=str(params.get("name", path.name)),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(
            f"--law {path}: not a scaling-law JSON ({exc!r}). It needs E, A, B, alpha and beta, as in the "
            f"fit.json that `smelt scaling fit` writes."
        ) from exc
