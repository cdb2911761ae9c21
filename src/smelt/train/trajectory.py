"""The pre-registered loss trajectory of a run, and the alert when the run leaves it.

`train.expect = FIT_FILE` names a fit.json that `smelt scaling fit LADDER --target N,D` wrote: a predicted
validation-loss curve for a run of N parameters on D tokens, with a band (smelt/plan/trajectory.py).
Before step 0 the trainer checks that this run is that target (its parameter count and train.tokens, to
1%), stores the curve in the run's manifest (train/run.json, "expected_trajectory") and logs it as an
`expected_trajectory` event, which the report draws behind the actual curve.

At each validation the loss is compared with the curve at the same token count, as a log-ratio to the
curve's centre, smoothed by the median of the last SMOOTH validations (one noisy evaluation neither
raises nor clears an alert). When the smoothed loss stays outside the band for
`train.expect_tolerance_tokens` (0: 5% of train.tokens), an `alert` event `off_trajectory` is logged and
printed; it fires once per excursion and re-arms when the loss is back inside. Its action is always
"log": the monitor never changes the run, which is why train.expect and its tolerance never invalidate
a stage. A resumed run replays the validations metrics.jsonl kept, so an excursion spans the restart.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import METRICS, validations
from smelt.train.alerts import Alert
from smelt.train.evaluation import say

SMOOTH = 3  # validations in the running median
MATCH = 0.01  # the run's parameters and tokens must be within 1% of the fit's target
DEFAULT_TOLERANCE = 0.05  # of the run's tokens, when train.expect_tolerance_tokens is 0
FIX = "`smelt scaling fit LADDER --target {n},{d} --out DIR` (N = this run's {kind} parameters, D = train.tokens)"


def read_curve(path: str, params: dict[str, int], tokens: int) -> dict[str, Any]:
    """The trajectory of a fit file, checked against this run; UserError (exit 2) naming the key."""
    key = f"train.expect = {path!r}"
    file = Path(path)
    kind = "non-embedding"
    fix = FIX.format(n=params["non_embedding"], d=tokens, kind=kind)
    if not file.is_file():
        raise UserError(f"{key}: no such file. Point it at the fit.json written by {fix}, or set "
                        f'train.expect = "" to train without an expected trajectory.')  # fmt: skip
    try:
        curve = json.loads(file.read_text(encoding="utf-8"))["trajectory"]
        target = curve["target"]
        columns = [[float(v) for v in curve[name]] for name in ("tokens", "loss", "lo", "hi")]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{key}: not a fit file with a predicted trajectory ({type(exc).__name__}: {exc}); "
                        f"it is written by `smelt scaling fit` with --target: {fix}.") from exc  # fmt: skip
    if len({len(c) for c in columns}) != 1 or len(columns[0]) < 2 or columns[0] != sorted(columns[0]):
        raise UserError(f"{key}: its trajectory's tokens, loss, lo and hi are not one increasing curve; "
                        f"write it again with {fix}.")  # fmt: skip
    kind = str(target.get("params_kind", "non_embedding"))
    n = params["total" if kind == "total" else "non_embedding"]
    fix = FIX.format(n=n, d=tokens, kind=kind.replace("_", "-"))
    want_n, want_d = float(target["params"]), float(target["tokens"])
    if abs(n - want_n) > MATCH * want_n or abs(tokens - want_d) > MATCH * want_d:
        raise UserError(
            f"{key} predicts a run of {want_n:,.0f} {kind.replace('_', '-')} parameters on {want_d:,.0f} "
            f"tokens, but this run has {n:,} on {tokens:,} (train.tokens): a curve is pre-registered for "
            f"one run. Predict this one with {fix}, or fix [model] / train.tokens."
        )
    return curve


def band_at(curve: dict[str, Any], tokens: float) -> tuple[float, float, float] | None:
    """(centre, lo, hi) of a trajectory at `tokens`, linear between its points, its end held for the
    last whole step (1% past it at most); None outside."""
    xs = curve["tokens"]
    if not xs or tokens < xs[0] or tokens > xs[-1] * (1 + MATCH):
        return None
    tokens = min(tokens, xs[-1])
    i = min(max(bisect.bisect_left(xs, tokens), 1), len(xs) - 1)
    w = (tokens - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
    centre, lo, hi = ((1 - w) * curve[k][i - 1] + w * curve[k][i] for k in ("loss", "lo", "hi"))
    return centre, lo, hi


class Expectation:
    """The curve, the running state of the comparison, and the records it adds to metrics.jsonl."""

    def __init__(self, curve: dict[str, Any] | None, path: str, tolerance: int, metrics: Path) -> None:
        self.curve, self.path, self.tolerance, self.metrics = curve, path, tolerance, metrics
        self.residuals: deque[float] = deque(maxlen=SMOOTH)
        self.outside_since: float | None = None
        self.alerted = False
        self.replayed = False

    @classmethod
    def load(cls, t: Any) -> Expectation:
        """From the trainer's config (off when train.expect is empty); UserError before step 0."""
        tc = t.tc
        if not tc.expect:
            return cls(None, "", 0, t.out_dir / METRICS)
        curve = read_curve(tc.expect, t.params, tc.tokens)
        tolerance = tc.expect_tolerance_tokens or round(DEFAULT_TOLERANCE * tc.tokens)
        return cls(curve, tc.expect, tolerance, t.out_dir / METRICS)

    def manifest(self) -> dict[str, Any] | None:
        """What run.json records before step 0."""
        if self.curve is None:
            return None
        return {"file": self.path, "tolerance_tokens": self.tolerance, **self.curve}

    def announce(self, metrics: Any, step: int, tokens: int) -> None:
        """The `expected_trajectory` event (the report's band) and a line saying what is expected."""
        if self.curve is None:
            return
        c = self.curve
        metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "expected_trajectory",
                       "file": self.path, "tolerance_tokens": self.tolerance, "target": c["target"],
                       "curve": {k: c[k] for k in ("tokens", "loss", "lo", "hi")}, "band": c.get("band")})  # fmt: skip
        say(f"expected trajectory ({self.path}): validation loss {c['loss'][-1]:.4f} "
            f"[{c['lo'][-1]:.4f}, {c['hi'][-1]:.4f}] at {c['tokens'][-1]:,.0f} tokens; an alert when it "
            f"stays outside the band for {self.tolerance:,} tokens")  # fmt: skip

    def observed(self, metrics: Any, step: int, tokens: float, loss: float | None) -> float | None:
        """Compare a validation loss, write its alert (if any) to `metrics`, and hand the loss back (the
        trainer's evaluate returns it)."""
        for record in self.observe(step, tokens, loss):
            metrics.write(record)
        return loss

    def observe(self, step: int, tokens: float, loss: float | None) -> list[dict[str, Any]]:
        """A validation loss at `tokens`; the alert events to write (none, or one per excursion)."""
        if self.curve is None or loss is None:
            return []
        if not self.replayed:
            self.replayed = True
            for earlier in validations(self.metrics):
                if earlier[0] < step:
                    self.check(*earlier)
        return self.check(step, tokens, loss, announce=True)

    def check(self, step: int, tokens: float, loss: float, announce: bool = False) -> list[dict[str, Any]]:
        band = band_at(self.curve, tokens)
        if band is None or not (math.isfinite(loss) and loss > 0):
            return []
        centre, lo, hi = band
        self.residuals.append(math.log(loss / centre))
        smoothed = centre * math.exp(statistics.median(self.residuals))
        if lo <= smoothed <= hi:
            self.outside_since, self.alerted = None, False
            return []
        if self.outside_since is None:
            self.outside_since = tokens
        if self.alerted or tokens - self.outside_since < self.tolerance:
            return []
        self.alerted = True
        side, edge = ("above", hi) if smoothed > hi else ("below", lo)
        message = (
            f"validation loss {smoothed:.4f} (median of the last {len(self.residuals)}) has been {side} the "
            f"expected band [{lo:.4f}, {hi:.4f}] (centre {centre:.4f}) since {self.outside_since:,.0f} tokens "
            f"(train.expect = {self.path!r}, train.expect_tolerance_tokens = {self.tolerance:,})"
        )
        alert = Alert("off_trajectory", "log", message, smoothed, edge)
        if announce:
            say(f"warning: step {step}: {message}")
        return [{"kind": "event", "step": step, "tokens": tokens, "event": "alert", "alert": alert.kind,
                 "action": alert.action, "message": alert.message, "value": alert.value,
                 "threshold": alert.threshold, "expected": centre, "lo": lo, "hi": hi,
                 "outside_since_tokens": self.outside_since}]  # fmt: skip
