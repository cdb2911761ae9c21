"""Training alerts and what to do about them: loss spikes, grad-norm spikes, NaN/Inf.

A run that lasts weeks must react to trouble without a human watching. Each check here looks at the
step's loss and pre-clip gradient norm *before* the optimizer step, so the reaction can still be to
not apply the update. The thresholds are the field's defaults (design.md section 5): loss more than
5 rolling standard deviations above its rolling mean, grad norm more than k times its trailing
median, any non-finite value. Each alert maps to a configured action:

- "log": write the event to metrics.jsonl and apply the update anyway;
- "skip": drop this update (the gradients are discarded, the data window is not replayed);
- "rollback": restore the last checkpoint and continue with the data *after* the offending step,
  i.e. skip the window between the checkpoint and the spike (the PaLM recipe);
- "stop": end the run with a clear message.

A cap on consecutive skipped steps turns a persistent problem (a diverged model skipping forever)
into a stopped run. The statistics only ever see the steps that were applied, so a spike does not
inflate the baseline that the next spike is measured against.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

ACTIONS = ("log", "skip", "rollback", "stop")
# A skipped or rolled-back step is worse than a logged one; when several alerts fire, the most
# severe action wins.
_SEVERITY = {"log": 0, "skip": 1, "rollback": 2, "stop": 3}


@dataclass(frozen=True)
class Alert:
    kind: str  # "nonfinite", "loss_spike", "grad_spike", "grad_alert"
    action: str
    message: str
    value: float
    threshold: float | None


@dataclass(frozen=True)
class AlertPolicy:
    window: int = 100  # steps of history for the rolling statistics
    min_history: int = 20  # no spike alerts before this many applied steps (warmup is noisy)
    loss_std: float = 5.0
    grad_alert_factor: float = 3.0  # log only
    grad_spike_factor: float = 5.0  # the configured action
    on_nonfinite: str = "skip"
    on_loss_spike: str = "log"
    on_grad_spike: str = "skip"
    max_consecutive_skips: int = 5


class SpikeMonitor:
    """Rolling loss mean/std and trailing grad-norm median; `check` returns the alerts of one step."""

    def __init__(self, policy: AlertPolicy) -> None:
        for name in ("on_nonfinite", "on_loss_spike", "on_grad_spike"):
            if getattr(policy, name) not in ACTIONS:
                raise ValueError(f"{name} = {getattr(policy, name)!r} is not one of {', '.join(ACTIONS)}")
        self.policy = policy
        self.losses: deque[float] = deque(maxlen=policy.window)
        self.norms: deque[float] = deque(maxlen=policy.window)
        self.consecutive_skips = 0

    def check(self, loss: float, grad_norm: float) -> list[Alert]:
        p = self.policy
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            what = f"loss is {loss}" if not math.isfinite(loss) else f"grad norm is {grad_norm}"
            return [
                Alert("nonfinite", p.on_nonfinite, what, loss if not math.isfinite(loss) else grad_norm, None)
            ]
        alerts = []
        if len(self.losses) >= p.min_history:
            mean = statistics.fmean(self.losses)
            std = statistics.pstdev(self.losses, mean)
            threshold = mean + p.loss_std * std
            if std > 0 and loss > threshold:
                alerts.append(
                    Alert(
                        "loss_spike",
                        p.on_loss_spike,
                        f"loss {loss:.4g} is {(loss - mean) / std:.1f} rolling std above its mean {mean:.4g}",
                        loss,
                        threshold,
                    )
                )
        if len(self.norms) >= p.min_history:
            median = statistics.median(self.norms)
            if median > 0 and grad_norm > p.grad_spike_factor * median:
                alerts.append(
                    Alert(
                        "grad_spike",
                        p.on_grad_spike,
                        f"grad norm {grad_norm:.4g} is {grad_norm / median:.1f}x its trailing median {median:.4g}",
                        grad_norm,
                        p.grad_spike_factor * median,
                    )
                )
            elif median > 0 and grad_norm > p.grad_alert_factor * median:
                alerts.append(
                    Alert(
                        "grad_alert",
                        "log",
                        f"grad norm {grad_norm:.4g} is {grad_norm / median:.1f}x its trailing median {median:.4g}",
                        grad_norm,
                        p.grad_alert_factor * median,
                    )
                )
        return alerts

    @staticmethod
    def action(alerts: list[Alert]) -> str:
        """The most severe action among the alerts ("apply" when there are none or all are "log")."""
        if not alerts:
            return "apply"
        worst = max(alerts, key=lambda a: _SEVERITY[a.action]).action
        return "apply" if worst == "log" else worst

    def applied(self, loss: float, grad_norm: float) -> None:
        """Record a step whose update was applied: it joins the baseline and resets the skip streak."""
        self.losses.append(loss)
        self.norms.append(grad_norm)
        self.consecutive_skips = 0

    def skipped(self) -> bool:
        """Count a skipped step; True when the streak has reached the cap and the run must stop."""
        self.consecutive_skips += 1
        return self.consecutive_skips >= self.policy.max_consecutive_skips

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "norms": list(self.norms), "skips": self.consecutive_skips}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses.clear()
        self.losses.extend(state["losses"])
        self.norms.clear()
        self.norms.extend(state["norms"])
        self.consecutive_skips = int(state["skips"])
