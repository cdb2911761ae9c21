"""Run-health alerts: the slow troubles that a single step's loss and gradient norm do not show.

alerts.py reacts to one step before its update; these watch the run's records as metrics.jsonl
receives them (MetricsLog hands every record to `HealthAlerts.observe`, on rank 0) and log an `alert`
event, printed as a warning, when

| alert | fires when | key (default; 0 turns it off) |
|---|---|---|
| `val_regression` | the validation loss is more than the key's nats above its best so far | `train.alert_val_regression` (0.01) |
| `domain_regression` | one source's validation loss rose by more than the key's nats since the last evaluation while the total fell | `train.alert_domain_rise` (0.005) |
| `loader_wait` | the last `train.alert_window` steps spent more than the key's share of their time waiting for data | `train.alert_loader_wait` (0.03) |
| `clip_rate` | more than the key's share of the last `train.alert_window` steps after warmup were clipped | `train.alert_clip_rate` (0.02) |
| `update_ratio_high` / `update_ratio_low` | a parameter's update ratio ||dW|| / ||W|| after warmup is above / below the key | `train.alert_update_ratio_max` (1e-2) / `train.alert_update_ratio_min` (1e-5) |
| `throughput_drop` | a log window's tokens/s is more than the key's fraction below the median of the windows of the `train.alert_window` steps before it | `train.alert_throughput_drop` (0.2) |
| `moe_imbalance` | an MoE layer's busiest expert got more than the key times the mean load over a log window after warmup | `train.alert_moe_load` (1.3) |

Their action is always "log": they never change the run. A condition that lasts (a regression, a
steady wait, a clip rate, a slow window, imbalance, a ratio out of band) alerts when it starts and
again only after it has cleared, not at every record; a domain's rise is one comparison, each time.
Loader wait, clip rate and throughput are judged over `train.alert_window` (100) steps, once that many
have passed: one slow window (a collection pause, a checkpoint) is no steady level. The first log
window after a start or resume (start-up, compilation) counts for neither loader wait nor throughput. A resumed run replays the records kept in metrics.jsonl through `observe` without
alerting, so its baselines (the best validation loss, the recent windows) are the uninterrupted run's.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smelt.metric_records import finite

# (alert, the config key that sets its threshold)
KEYS = {
    "val_regression": "alert_val_regression",
    "domain_regression": "alert_domain_rise",
    "loader_wait": "alert_loader_wait",
    "clip_rate": "alert_clip_rate",
    "update_ratio_high": "alert_update_ratio_max",
    "update_ratio_low": "alert_update_ratio_min",
    "throughput_drop": "alert_throughput_drop",
    "moe_imbalance": "alert_moe_load",
}


@dataclass(frozen=True)
class HealthPolicy:
    val_regression: float = 0.01
    domain_rise: float = 0.005
    loader_wait: float = 0.03
    clip_rate: float = 0.02
    window: int = 100  # steps: the span of the loader-wait, clip-rate and throughput figures
    update_ratio_max: float = 1e-2
    update_ratio_min: float = 1e-5
    throughput_drop: float = 0.2
    moe_load: float = 1.3

    @classmethod
    def from_config(cls, tc: Any) -> HealthPolicy:
        return cls(
            val_regression=tc.alert_val_regression, domain_rise=tc.alert_domain_rise,
            loader_wait=tc.alert_loader_wait, clip_rate=tc.alert_clip_rate, window=tc.alert_window,
            update_ratio_max=tc.alert_update_ratio_max, update_ratio_min=tc.alert_update_ratio_min,
            throughput_drop=tc.alert_throughput_drop, moe_load=tc.alert_moe_load,
        )  # fmt: skip

    def threshold(self, kind: str) -> float:
        return {
            "val_regression": self.val_regression, "domain_regression": self.domain_rise,
            "loader_wait": self.loader_wait, "clip_rate": self.clip_rate,
            "update_ratio_high": self.update_ratio_max, "update_ratio_low": self.update_ratio_min,
            "throughput_drop": self.throughput_drop, "moe_imbalance": self.moe_load,
        }[kind]  # fmt: skip


class HealthAlerts:
    """Watches metrics records (module docstring); `observe` returns the alert events to write.
    `say` prints a warning line (rank 0)."""

    def __init__(self, policy: HealthPolicy, say: Callable[[str], None] | None = None) -> None:
        self.policy = policy
        self.say = say
        self.best_val: float | None = None
        self.last_eval: dict[str, Any] | None = None
        self.warmup = 0
        self.last_step = 0  # the step of the last train record (or the start)
        self.first_window = True
        # (steps, figure) of the recent log windows: clipped steps, loader wait share, tokens/s.
        self.clips: deque[tuple[int, int]] = deque()
        self.waits: deque[tuple[int, float]] = deque()
        self.speeds: deque[tuple[int, float]] = deque()
        self.firing: set[str] = set()

    def observe(self, record: dict[str, Any], quiet: bool = False) -> list[dict[str, Any]]:
        """The alert events `record` raises (none when `quiet`: a resume replaying its history)."""
        kind, event = record.get("kind"), record.get("event")
        found: list[tuple[str, str, float, str | None]] = []  # (alert, message, value, latch or None)
        if kind == "event" and event in ("start", "resume"):
            self.warmup = int(record.get("warmup_steps") or 0)
            self.last_step = int(record.get("step") or 0)
            self.first_window = True
            self.speeds.clear()
            self.waits.clear()
        elif kind == "train":
            found = self._window(record)
        elif kind == "eval" and not record.get("inloop") and finite(record.get("val_loss")):
            found = self._evaluation(record)
        elif kind == "layers" and int(record.get("step") or 0) > self.warmup:
            found = self._ratios(record)
        elif kind == "moe" and int(record.get("step") or 0) > self.warmup:
            found = self._experts(record)
        alerts = []
        for alert, message, value, latch in found:
            if latch is not None:
                if latch in self.firing:
                    continue
                self.firing.add(latch)
            if quiet:
                continue
            key = KEYS[alert]
            threshold = self.policy.threshold(alert)
            alerts.append({"kind": "event", "step": record.get("step"), "tokens": record.get("tokens"),
                           "event": "alert", "alert": alert, "action": "log", "message": message,
                           "value": value, "threshold": threshold, "key": f"train.{key}"})  # fmt: skip
            if self.say is not None:
                self.say(f"warning: step {record.get('step')}: {message} (train.{key} = {threshold:g})")
        return alerts

    def _clear(self, latch: str) -> None:
        self.firing.discard(latch)

    def _level(self, bad: bool, latch: str, alert: tuple[str, str, float]) -> list[tuple]:
        """A lasting condition: reported when it starts (the latch), forgotten once it clears."""
        if not bad:
            self._clear(latch)
            return []
        return [(*alert, latch)]

    def _window(self, r: dict[str, Any]) -> list[tuple]:
        p, step = self.policy, int(r.get("step") or 0)
        steps, self.last_step = max(step - self.last_step, 1), step
        first, self.first_window = self.first_window, False
        found: list[tuple] = []
        wait = r.get("loader_wait_share")
        if p.loader_wait > 0 and finite(wait) and not first:
            waits = _trailing(self.waits, (steps, float(wait)), p.window)
            if waits is not None:
                share = sum(n * w for n, w in waits) / sum(n for n, _ in waits)
                found += self._level(share > p.loader_wait, "loader_wait", ("loader_wait", (
                    f"the loader wait took {100 * share:.1f}% of the step time over the last "
                    f"{sum(n for n, _ in waits)} steps"), share))  # fmt: skip
        clip = r.get("clip_fraction")
        if p.clip_rate > 0 and finite(clip) and step - steps >= self.warmup:
            clips = _trailing(self.clips, (steps, round(clip * steps)), p.window)
            if clips is not None:
                total, clipped = sum(n for n, _ in clips), sum(c for _, c in clips)
                found += self._level(clipped / total > p.clip_rate, "clip_rate", ("clip_rate", (
                    f"{clipped} of the last {total} steps ({100 * clipped / total:.1f}%) had their gradient "
                    f"clipped"), clipped / total))  # fmt: skip
        speed = r.get("tokens_per_s")
        if p.throughput_drop > 0 and finite(speed) and not first:
            if sum(n for n, _ in self.speeds) >= p.window:
                median = statistics.median(x for _, x in self.speeds)
                slow = speed < (1 - p.throughput_drop) * median
                found += self._level(slow, "throughput_drop", ("throughput_drop", (
                    f"throughput {speed:,.0f} tokens/s is {100 * (1 - speed / median):.0f}% below the median "
                    f"{median:,.0f} of the log windows of the last {sum(n for n, _ in self.speeds)} steps"),
                    speed))  # fmt: skip
            _trailing(self.speeds, (steps, float(speed)), p.window)
        return found

    def _evaluation(self, r: dict[str, Any]) -> list[tuple]:
        p, loss = self.policy, float(r["val_loss"])
        found: list[tuple] = []
        if p.val_regression > 0 and self.best_val is not None:
            rise = loss - self.best_val
            found += self._level(rise > p.val_regression, "val_regression", ("val_regression", (
                f"validation loss {loss:.4f} is {rise:.4f} nats above its best {self.best_val:.4f}"), rise))  # fmt: skip
        self.best_val = loss if self.best_val is None else min(self.best_val, loss)
        previous, self.last_eval = self.last_eval, r
        if p.domain_rise > 0 and previous is not None and loss < float(previous["val_loss"]):
            before = previous.get("val_loss_by_source") or {}
            now = r.get("val_loss_by_source") or {}
            rises = {s: now[s] - before[s] for s in now if finite(now[s]) and finite(before.get(s))}
            worst = max(rises, key=rises.get, default=None)  # type: ignore[arg-type]
            if worst is not None and rises[worst] > p.domain_rise:
                found.append(("domain_regression", (
                    f"validation loss on {worst} rose {rises[worst]:.4f} nats (to {now[worst]:.4f}) since step "
                    f"{previous.get('step')} while the total fell {float(previous['val_loss']) - loss:.4f}"),
                    rises[worst], None))  # fmt: skip
        return found

    def _ratios(self, r: dict[str, Any]) -> list[tuple]:
        p = self.policy
        ratios = {n: v["update_ratio"] for n, v in (r.get("layers") or {}).items()
                  if isinstance(v, dict) and finite(v.get("update_ratio"))}  # fmt: skip
        if not ratios:
            return []
        found: list[tuple] = []
        for alert, bad, word in (
            ("update_ratio_high", {n: x for n, x in ratios.items() if x > p.update_ratio_max} if p.update_ratio_max > 0 else {}, "above"),
            ("update_ratio_low", {n: x for n, x in ratios.items() if x < p.update_ratio_min} if p.update_ratio_min > 0 else {}, "below"),
        ):  # fmt: skip
            ranked = sorted(bad.items(), key=lambda kv: kv[1], reverse=word == "above")
            shown = ", ".join(f"{n} {x:.3g}" for n, x in ranked[:3]) + (", ..." if len(ranked) > 3 else "")
            worst = ranked[0][1] if ranked else 0.0
            found += self._level(bool(bad), alert, (alert, (
                f"{len(bad)} of {len(ratios)} parameters have an update ratio {word} "
                f"{p.threshold(alert):g}: {shown}"), worst))  # fmt: skip
        return found

    def _experts(self, r: dict[str, Any]) -> list[tuple]:
        p = self.policy
        if p.moe_load <= 0:
            return []
        layers = r.get("moe_layers") or []
        loads = {layer: x for layer, x in zip(layers, r.get("moe_max_mean") or [], strict=False) if finite(x)}
        bad = {layer: x for layer, x in loads.items() if x > p.moe_load}
        worst = max(bad, key=bad.get, default=None)  # type: ignore[arg-type]
        shown = ", ".join(f"layer {layer} {x:.2f}x" for layer, x in sorted(bad.items()))
        return self._level(bool(bad), "moe_imbalance", ("moe_imbalance", (
            f"MoE busiest expert over mean load above {p.moe_load:g} ({shown})"), bad.get(worst, 0.0)))  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"best_val": self.best_val, "firing": sorted(self.firing)}


def health_alerts(tc: Any, say: Callable[[str], None] | None) -> HealthAlerts | None:
    """The run's HealthAlerts (None when every threshold is 0)."""
    policy = HealthPolicy.from_config(tc)
    used = [policy.threshold(kind) for kind in KEYS]
    return HealthAlerts(policy, say) if any(t > 0 for t in used) else None


def _trailing(windows: deque, window: tuple[int, Any], span: int) -> deque | None:
    """Add a log window's (steps, figure) and drop the oldest ones while the rest still cover `span`
    steps; the windows when they cover `span` steps, else None (too early to judge a steady level)."""
    windows.append(window)
    while sum(n for n, _ in windows) - windows[0][0] >= span:
        windows.popleft()
    return windows if sum(n for n, _ in windows) >= span else None
