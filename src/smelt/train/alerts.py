"""Training alerts and what to do about them: loss spikes, grad-norm spikes, NaN/Inf.

A run that lasts weeks must react to trouble without a human watching. Each check here looks at the
step's loss and pre-clip gradient norm *before* the optimizer step, so the reaction can still be to
not apply the update. The thresholds are the field's defaults (design.md section 5): loss more than
5 standard deviations above its trailing median, grad norm more than k times its trailing median,
any non-finite value. The loss's spread is robust (1.4826 x the median absolute deviation of the
window): a mean and standard deviation over a window that holds the first steps of a climb rise
with it, so a slow climb never stood out against them; a median and MAD ignore it until it fills
half the window. Each alert maps to a configured action (docs/training.md):

- "log": write the event to metrics.jsonl and apply the update anyway;
- "skip": drop this update (the gradients are discarded, the data window is not replayed);
- "rollback": restore the last checkpoint and continue with the data *after* the offending step,
  i.e. skip the window between the checkpoint and the spike (the PaLM recipe);
- "stop": end the run with a clear message.

A cap on consecutive skipped steps turns a persistent problem (a diverged model skipping forever)
into a stopped run. The statistics only ever see the steps that were applied, with finite figures,
so a skipped spike does not inflate the baseline that the next spike is measured against. Skips and
rollbacks are printed as they happen. An update applied despite a non-finite loss or gradient
("log") that leaves NaN or Inf in the weights stops the run at that step, and so do non-finite
weights at the end: such a run never reports success. Every stop here is a `TrainingStopped`, whose
end record in metrics.jsonl says why and that a restart would stop the same way (`deterministic`),
which `smelt train --max-restarts` reads so as not to retry it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt.train.evaluation import say
from smelt.train.monitors import nonfinite_parameters

ACTIONS = ("log", "skip", "rollback", "stop")
# A skipped or rolled-back step is worse than a logged one; when several alerts fire, the most
# severe action wins.
_SEVERITY = {"log": 0, "skip": 1, "rollback": 2, "stop": 3}
# The config key that sets each alert's action.
_POLICY_KEY = {"nonfinite": "on_nonfinite", "loss_spike": "on_loss_spike", "grad_spike": "on_grad_spike"}
# The standard deviation of normal noise is 1.4826 times its median absolute deviation.
_MAD_TO_STD = 1.4826


class TrainingStopped(RuntimeError):
    """A stop that a restart from the last checkpoint would repeat: a "stop" alert, too many skipped
    steps in a row, non-finite weights. `reason` names which; the run's end record carries both."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


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


def median_and_spread(values: Iterable[float]) -> tuple[float, float]:
    """The median of `values` and their robust standard deviation, 1.4826 x the median absolute
    deviation: neither moves until outliers make up half of the values."""
    values = list(values)
    median = statistics.median(values)
    return median, _MAD_TO_STD * statistics.median(abs(v - median) for v in values)


class SpikeMonitor:
    """Trailing loss median and robust spread, trailing grad-norm median; `check` returns the alerts
    of one step, measured against the applied steps before it."""

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
            median, spread = median_and_spread(self.losses)
            threshold = median + p.loss_std * spread
            if spread > 0 and loss > threshold:
                alerts.append(
                    Alert(
                        "loss_spike",
                        p.on_loss_spike,
                        f"loss {loss:.4g} is {(loss - median) / spread:.1f} robust std above its trailing "
                        f"median {median:.4g}",
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
        """Record a step whose update was applied: it joins the baseline (unless a figure is not
        finite, which would make the statistics meaningless) and resets the skip streak."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
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


def _reasons(alerts: list[Alert]) -> str:
    """What made the action, with the key that set it: `loss is nan (train.on_nonfinite = "skip")`."""
    chosen = [a for a in alerts if a.action != "log"] or alerts
    return "; ".join(
        f'{a.message} (train.{_POLICY_KEY[a.kind]} = "{a.action}")' if a.kind in _POLICY_KEY else a.message
        for a in chosen
    )


@dataclass
class Decision:
    """What one step's update becomes: "apply", "skip", "rollback" (after the alerts that chose it),
    or an fp16 overflow, which the grad scaler skips on its own and lowers its scale."""

    action: str
    overflow: bool
    alerts: list[Alert]


class AlertDispatch:
    """The trainer's reaction to a step's alerts: write them, then skip, roll back, stop, or let the
    update through; print each skip and rollback (rank 0). Counts what it skipped and rolled back
    over the run. A stop writes the run's failed end record and raises TrainingStopped. `run_dir`
    names the run in the hints that say how to go on."""

    def __init__(
        self, spikes: SpikeMonitor, checkpointer: Any, metrics: Any, scaler: Any, run_dir: Path
    ) -> None:
        self.spikes, self.checkpointer, self.metrics, self.scaler, self.run_dir = (
            spikes, checkpointer, metrics, scaler, run_dir
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
            message = "rollback requested but no checkpoint to roll back to: skipping"
            self.metrics.write(
                {"kind": "event", "step": step, "tokens": tokens, "event": "note", "message": message}
            )
            say(f"note: step {step}: {message}")
            action = "skip"
        if action == "stop":
            raise self.stop(
                step, tokens, "alert", f"training stopped by alert at step {step}: {_reasons(alerts)}"
            )
        return Decision(action, overflow, alerts)

    def overflow(self, step: int, tokens: int, optimizer: Any) -> None:
        self.scaler.step(optimizer)  # sees the inf gradients and skips the update
        self.scaler.update()
        self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "overflow",
                            "loss_scale": self.scaler.get_scale()})  # fmt: skip

    def applied(
        self, step: int, tokens: int, decision: Decision, loss: float, norm: float, lr: float, model: Any
    ) -> None:
        """An update went through: it joins the spike baseline. One applied despite a non-finite loss
        or gradient (on_nonfinite = "log") is printed, and when it left NaN or Inf in the weights the
        run stops at this step: nothing after it can recover, and a checkpoint of them is worthless."""
        self.spikes.applied(loss, norm)
        if any(alert.kind == "nonfinite" for alert in decision.alerts):
            say(f"warning: step {step}: {_reasons(decision.alerts)}: the update was applied anyway")
            self.check_weights(step, tokens, model, "after a non-finite update was applied", lr)

    def check_weights(self, step: int, tokens: int, model: Any, when: str, lr: float | None = None) -> None:
        """Stop the run (TrainingStopped) when a parameter holds NaN or Inf. Every rank calls it."""
        count, names = nonfinite_parameters(model)
        if count:
            shown = f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else ""
            at_lr = f" (lr {lr:.3g})" if lr is not None else ""
            raise self.stop(step, tokens, "nonfinite_weights", (
                f"training stopped at step {step}: the weights hold NaN or Inf {when}, in {count} parameter "
                f"tensor{'s' if count != 1 else ''}{shown}; no checkpoint was written with them{at_lr}. {self.hint()}"
            ))  # fmt: skip

    def rollback(self, step: int, tokens: int, decision: Decision, model: Any, optimizer: Any) -> None:
        from smelt.checkpoint.store import latest_checkpoint, load_training_state

        target = latest_checkpoint(self.checkpointer.dir)
        assert target is not None
        back_meta, _ = load_training_state(target, model, optimizer)
        if self.scaler is not None and back_meta.get("scaler"):
            self.scaler.load_state_dict(back_meta["scaler"])
        self.rollbacks += 1
        # The loader is not rewound: the steps between the checkpoint and this one are the data
        # window that is skipped (the PaLM recipe). The LR schedule keeps following the step.
        to_step = int(back_meta["step"])
        self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "rollback",
                            "to_step": to_step, "path": str(target),
                            "skipped_steps": [to_step + 1, step]})  # fmt: skip
        say(
            f"warning: step {step} rolled back to checkpoint {target.name}: {_reasons(decision.alerts)}; "
            f"the data of steps {to_step + 1}-{step} is skipped"
        )

    def count_skip(
        self, step: int, tokens: int, decision: Decision, loss: float, norm: float, lr: float
    ) -> None:
        """A skipped or rolled-back step: record and print it, and stop the run after too many in a row."""
        self.skipped_total += 1
        cap = self.spikes.policy.max_consecutive_skips
        stopping = self.spikes.skipped()
        if decision.action == "skip":
            self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "skip",
                                "loss": _finite_or_text(loss), "grad_norm": _finite_or_text(norm)})  # fmt: skip
            say(
                f"warning: step {step} skipped (its update was dropped): {_reasons(decision.alerts)}; "
                f"{self.spikes.consecutive_skips} in a row, the run stops at {cap} (train.max_consecutive_skips)"
            )
        if stopping:
            raise self.stop(step, tokens, "max_consecutive_skips", (
                f"training stopped: {self.spikes.consecutive_skips} consecutive steps skipped or rolled back "
                f"(train.max_consecutive_skips); the last at step {step}: {decision.alerts[-1].message} "
                f"(lr {lr:.3g}). {self.hint()}"
            ))  # fmt: skip

    def hint(self) -> str:
        """How to go on after a stop: what to change, and how to continue without losing the run."""
        return (
            f"Lower train.lr, raise train.warmup_tokens or check the data; then continue from the last good "
            f"checkpoint as a fork (`smelt train CONFIG --from {self.run_dir} --set run.name=NEW_NAME`) or "
            f"start over with --restart (the old train/ is moved to superseded/, not deleted)."
        )

    def stop(self, step: int, tokens: int, reason: str, message: str) -> TrainingStopped:
        """The run's failed end record, marked as a stop that a restart would repeat; returns the
        error to raise."""
        self.metrics.write({"kind": "event", "step": step, "tokens": tokens, "event": "end", "status": "failed",
                            "reason": reason, "deterministic": True, "error": message, "time": time.time()})  # fmt: skip
        return TrainingStopped(message, reason)
