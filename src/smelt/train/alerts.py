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


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


@dataclass
class Decision:
    """What one step's update becomes: "apply", "skip", "rollback" (after the alerts that chose it),
    or an fp16 overflow, which the grad scaler skips on its own and lowers its scale."""

    action: str
    overflow: bool
    alerts: list[Alert]


class AlertDispatch:
    """The trainer's reaction to a step's alerts: write them, then skip, roll back, stop, or let the
    update through. Counts what it skipped and rolled back over the run; `fail(step, message)` writes
    the run's failed end record and returns the error to raise."""

    def __init__(self, spikes: SpikeMonitor, checkpointer: Any, metrics: Any, scaler: Any, fail: Any) -> None:
        self.spikes, self.checkpointer, self.metrics, self.scaler, self.fail = (
            spikes, checkpointer, metrics, scaler, fail
        )  # fmt: skip
        self.skipped_total = 0
        self.rollbacks = 0

    def decide(self, step: int, tokens: int, loss: float, norm: float) -> Decision:
        """Check the step, write its alerts; a rollback without a checkpoint becomes a skip, "stop" raises."""
        from smelt.checkpoint.store import latest_checkpoint

        overflow = self.scaler is not None and math.isfinite(loss) and not math.isfinite(norm)
        alerts = [] if overflow else self.spikes.check(loss, norm)
        action = SpikeMonitor.action(alerts)
        for alert in alerts:
            self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "alert",
                                "alert": alert.kind, "action": alert.action, "message": alert.message,
                                "value": _finite_or_text(alert.value), "threshold": alert.threshold})  # fmt: skip
        if action == "rollback":
            for event in self.checkpointer.wait():  # the newest checkpoint may still be writing
                self.metrics.write(event)
        if action == "rollback" and latest_checkpoint(self.checkpointer.dir) is None:
            self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "note",
                                "message": "rollback requested but no checkpoint to roll back to: skipping"})  # fmt: skip
            action = "skip"
        if action == "stop":
            raise self.fail(step, f"training stopped by alert at step {step}: {alerts[-1].message}")
        return Decision(action, overflow, alerts)

    def overflow(self, step: int, tokens: int, optimizer: Any) -> None:
        self.scaler.step(optimizer)  # sees the inf gradients and skips the update
        self.scaler.update()
        self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "overflow",
                            "loss_scale": self.scaler.get_scale()})  # fmt: skip

    def rollback(self, step: int, tokens: int, model: Any, optimizer: Any) -> None:
        from smelt.checkpoint.store import latest_checkpoint, load_training_state

        target = latest_checkpoint(self.checkpointer.dir)
        assert target is not None
        back_meta, _ = load_training_state(target, model, optimizer)
        if self.scaler is not None and back_meta.get("scaler"):
            self.scaler.load_state_dict(back_meta["scaler"])
        self.rollbacks += 1
        # The loader is not rewound: the steps between the checkpoint and this one are the data
        # window that is skipped (the PaLM recipe). The LR schedule keeps following the step.
        self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "rollback",
                            "to_step": int(back_meta["step"]), "path": str(target),
                            "skipped_steps": [int(back_meta["step"]) + 1, step]})  # fmt: skip

    def count_skip(
        self, step: int, tokens: int, decision: Decision, loss: float, norm: float, hint: str
    ) -> None:
        """A skipped or rolled-back step: record it, and stop the run after too many in a row."""
        self.skipped_total += 1
        if decision.action == "skip":
            self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "skip",
                                "loss": _finite_or_text(loss), "grad_norm": _finite_or_text(norm)})  # fmt: skip
        if self.spikes.skipped():
            raise self.fail(step, (
                f"training stopped: {self.spikes.consecutive_skips} consecutive steps skipped or rolled back "
                f"(train.max_consecutive_skips); the last at step {step}: {decision.alerts[-1].message} "
                f"{hint}"
            ))  # fmt: skip
