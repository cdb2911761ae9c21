"""Spike alerts and their policies: log, skip, rollback (PaLM), stop, and the cap on skips."""

import math
import random

import pytest

from smelt.checkpoint import latest_checkpoint
from smelt.model.transformer import Transformer
from smelt.train.alerts import AlertPolicy, SpikeMonitor, TrainingStopped
from smelt.train.trainer import train

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture


def warm(monitor: SpikeMonitor, n: int = 30) -> None:
    for i in range(n):
        monitor.applied(3.0 + 0.01 * (i % 3), 1.0 + 0.1 * (i % 2))


def test_spike_monitor_thresholds():
    monitor = SpikeMonitor(AlertPolicy(min_history=20))
    assert monitor.check(100.0, 100.0) == []  # no history yet: warmup is noisy
    warm(monitor)
    assert monitor.check(3.01, 1.05) == []
    loss_spike = monitor.check(3.5, 1.0)
    assert [a.kind for a in loss_spike] == ["loss_spike"] and SpikeMonitor.action(loss_spike) == "apply"
    assert [a.kind for a in monitor.check(3.0, 4.0)] == ["grad_alert"]  # > 3x the median: log only
    grad_spike = monitor.check(3.0, 6.0)  # > 5x: the configured action, skip by default
    assert [a.kind for a in grad_spike] == ["grad_spike"] and SpikeMonitor.action(grad_spike) == "skip"
    nan = monitor.check(float("nan"), 1.0)
    assert nan[0].kind == "nonfinite" and SpikeMonitor.action(nan) == "skip"
    assert SpikeMonitor.action(monitor.check(3.0, math.inf)) == "skip"


def test_skip_cap_and_state_round_trip():
    monitor = SpikeMonitor(AlertPolicy(max_consecutive_skips=2))
    warm(monitor)
    assert monitor.skipped() is False and monitor.skipped() is True
    monitor.applied(3.0, 1.0)
    assert monitor.consecutive_skips == 0
    other = SpikeMonitor(AlertPolicy())
    other.load_state_dict(monitor.state_dict())
    assert other.state_dict() == monitor.state_dict()
    with pytest.raises(ValueError, match="on_grad_spike"):
        SpikeMonitor(AlertPolicy(on_grad_spike="panic"))


def test_a_slow_climb_is_caught_against_the_statistics_from_before_it():
    """A loss that climbs by less than its noise per step, its update applied each time ("log"): a
    rolling mean and standard deviation rose with the climb and never flagged it; the trailing median
    and MAD stay where the loss was before it began."""
    monitor, noise = SpikeMonitor(AlertPolicy(window=100, min_history=20)), random.Random(0)
    for _ in range(100):
        monitor.applied(6.9 + noise.gauss(0, 0.05), 1.0)
    flagged, messages = [], []
    for k in range(1, 101):
        loss = 6.9 + noise.gauss(0, 0.05) + 0.02 * k  # 6.9 -> 8.9 over 100 steps
        alerts = [a for a in monitor.check(loss, 1.0) if a.kind == "loss_spike"]
        flagged += [k] * len(alerts)
        messages += [a.message for a in alerts]
        monitor.applied(loss, 1.0)
    assert flagged and flagged[0] <= 15  # within 0.3 of the climb's start (5 robust std of its noise)
    assert len(flagged) >= 20
    assert "robust std above its trailing median 6.89" in messages[0]


def test_a_steep_climb_is_flagged_at_every_step():
    monitor = SpikeMonitor(AlertPolicy(window=100, min_history=20))
    for i in range(100):
        monitor.applied(6.9 + 0.01 * (i % 5), 1.0)
    losses = [6.9 * 1.1**k for k in range(1, 86)]  # to 22,000
    flagged = []
    for k, loss in enumerate(losses, 1):
        flagged += [k for a in monitor.check(loss, 1.0) if a.kind == "loss_spike"]
        monitor.applied(loss, 1.0)
    assert flagged == list(range(1, 86))  # a mean and standard deviation stopped after 25


def test_non_finite_figures_never_join_the_baseline():
    monitor = SpikeMonitor(AlertPolicy(min_history=20))
    warm(monitor)
    monitor.consecutive_skips = 2
    monitor.applied(float("nan"), float("inf"))  # an update applied under on_nonfinite = "log"
    assert monitor.consecutive_skips == 0 and all(math.isfinite(v) for v in monitor.losses)
    assert [a.kind for a in monitor.check(3.5, 1.0)] == ["loss_spike"]


# The spikes below are planted by patching this process's forward, which a replay in a side process would
# not see: their triage (tests/train/test_spike_triage*.py) is off.
def spike_at(monkeypatch, steps: set[int], micro_per_step: int, factor: float = 100.0) -> None:
    """Multiply the loss by `factor` during the given optimizer steps (counted through forward calls)."""
    real_forward = Transformer.forward
    calls = {"n": 0}

    def spiky(self, idx, targets=None, **kw):
        logits, loss = real_forward(self, idx, targets, **kw)
        if self.training and targets is not None:
            calls["n"] += 1
            if (calls["n"] - 1) // micro_per_step + 1 in steps:
                loss = {k: v * factor for k, v in loss.items()} if isinstance(loss, dict) else loss * factor
        return logits, loss

    monkeypatch.setattr(Transformer, "forward", spiky)


@pytest.mark.slow
def test_grad_spike_is_skipped(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    tokens, tokenizer = data
    spike_at(monkeypatch, {7}, micro_per_step=2)
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    summary = train(
        tiny_config(alert_min_history=3, eval_every=0, spike_triage="off"),
        tokens,
        tokenizer,
        tmp_path / "run",
    )
    err = capsys.readouterr().err
    assert "warning: step 7 skipped (its update was dropped): grad norm" in err
    assert (
        'train.on_grad_spike = "skip"); 1 in a row, the run stops at 5 (train.max_consecutive_skips)' in err
    )
    lines = read_metrics(tmp_path / "run")
    alerts = [r for r in lines if r.get("event") == "alert" and r["alert"] != "checkpoint_backlog"]
    assert {a["alert"] for a in alerts} == {"loss_spike", "grad_spike"} and {a["step"] for a in alerts} == {7}
    assert [r["step"] for r in lines if r.get("event") == "skip"] == [7]
    assert summary["skipped_steps"] == 1 and summary["rollbacks"] == 0


@pytest.mark.slow
def test_loss_spike_rolls_back_and_skips_the_window(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    tokens, tokenizer = data
    spike_at(monkeypatch, {6}, micro_per_step=2)
    cfg = tiny_config(alert_min_history=3, eval_every=0, on_loss_spike="rollback", spike_triage="off")
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    summary = train(cfg, tokens, tokenizer, tmp_path / "run")
    err = capsys.readouterr().err
    assert "warning: step 6 rolled back to checkpoint step_0000004: loss" in err
    assert '(train.on_loss_spike = "rollback")' in err and "; the data of steps 5-6 is skipped" in err
    lines = read_metrics(tmp_path / "run")
    rollback = [r for r in lines if r.get("event") == "rollback"]
    assert len(rollback) == 1 and rollback[0]["to_step"] == 4 and rollback[0]["skipped_steps"] == [5, 6]
    assert summary["rollbacks"] == 1 and summary["steps"] == 12
    end = lines[-1]
    assert end["event"] == "end" and end["status"] == "ok" and end["rollbacks"] == 1


@pytest.mark.slow
def test_rollback_without_a_checkpoint_falls_back_to_skip(data, tmp_path, monkeypatch):  # noqa: F811
    tokens, tokenizer = data
    spike_at(monkeypatch, {3}, micro_per_step=2)
    cfg = tiny_config(
        alert_min_history=1, eval_every=0, on_loss_spike="rollback", tokens=256 * 4, spike_triage="off"
    )
    summary = train(cfg, tokens, tokenizer, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    assert any("no checkpoint to roll back to" in r.get("message", "") for r in lines)
    assert [r["step"] for r in lines if r.get("event") == "skip"] == [3] and summary["rollbacks"] == 0


@pytest.mark.slow
def test_a_non_finite_update_applied_under_log_stops_the_run(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    """on_nonfinite = "log" applies a NaN update; the weights are then NaN, and the run stops at that
    step (it used to train on to "done", exit 0, with NaN in most tensors of the final checkpoint)."""
    tokens, tokenizer = data
    spike_at(monkeypatch, {6}, micro_per_step=2, factor=float("nan"))
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    out = tmp_path / "run"
    with pytest.raises(
        TrainingStopped, match="at step 6: the weights hold NaN or Inf after a non-finite"
    ) as info:
        train(tiny_config(eval_every=0, on_nonfinite="log"), tokens, tokenizer, out)
    assert info.value.reason == "nonfinite_weights"
    assert 'warning: step 6: loss is nan (train.on_nonfinite = "log"): the update was applied anyway' in (
        capsys.readouterr().err
    )
    (end,) = [
        r for r in read_metrics(out) if r.get("event") == "end"
    ]  # the save of step 4 may commit after it
    assert end == {**end, "event": "end", "status": "failed", "step": 6, "reason": "nonfinite_weights",
                   "deterministic": True}  # fmt: skip
    assert latest_checkpoint(out / "checkpoints").name == "step_0000004"  # nothing saved after the NaN


@pytest.mark.slow
def test_non_finite_weights_at_the_end_stop_before_the_final_checkpoint(data, tmp_path, monkeypatch):  # noqa: F811
    from smelt.train import trainer

    calls = {"n": 0}

    def poison_after_last_update(model):  # called after every applied optimizer step
        calls["n"] += 1
        if calls["n"] == 12:
            model.tok_emb.weight.data[0, 0] = float("inf")

    monkeypatch.setattr(trainer, "update_expert_bias", poison_after_last_update)
    tokens, tokenizer = data
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped, match=r"step 12: the weights hold NaN or Inf at the end of training, in 1 "
                       r"parameter tensor \(tok_emb.weight\)"):  # fmt: skip
        train(tiny_config(eval_every=0), tokens, tokenizer, out)
    records = read_metrics(out)
    (end,) = [r for r in records if r.get("event") == "end"]
    assert end["status"] == "failed" and end["reason"] == "nonfinite_weights" and end["deterministic"]
    assert not [r for r in records if r.get("kind") == "eval"]  # no final validation of broken weights
    assert latest_checkpoint(out / "checkpoints").name == "step_0000008"


def test_spike_statistics_start_after_warmup():
    from smelt.config import TrainConfig
    from smelt.train.setup import alert_policy as _alert_policy

    tc = TrainConfig(alert_min_history=20)
    assert _alert_policy(tc, 25).min_history == 45  # grad norms swing while the LR ramps


@pytest.mark.slow
def test_fp16_overflow_skips_the_update_and_halves_the_loss_scale(data, tmp_path, monkeypatch):  # noqa: F811
    # fp16 is refused on CPU by configuration; the loss-scaling path itself runs on CPU autocast.
    from smelt.train import build
    from smelt.train.precision import Precision

    monkeypatch.setattr(build, "resolve_precision", lambda name, device: Precision("fp16", "cpu"))
    real_forward = Transformer.forward
    calls = {"n": 0}

    def overflowing(self, idx, targets=None, **kw):
        logits, loss = real_forward(self, idx, targets, **kw)
        if self.training and targets is not None:
            calls["n"] += 1
            if (calls["n"] - 1) // 2 + 1 == 4:  # optimizer step 4 (2 micro steps each)
                loss = {k: v * 1e30 for k, v in loss.items()}  # scaled gradients overflow to inf
        return logits, loss

    monkeypatch.setattr(Transformer, "forward", overflowing)
    tokens, tokenizer = data
    summary = train(tiny_config(eval_every=0, log_every=1), tokens, tokenizer, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    overflows = [r for r in lines if r.get("event") == "overflow"]
    assert [r["step"] for r in overflows] == [4]
    scales = {r["step"]: r["loss_scale"] for r in lines if r["kind"] == "train"}
    assert scales[3] == 65536.0 and scales[4] == overflows[0]["loss_scale"] == 32768.0
    assert not [r for r in lines if r.get("event") in ("skip", "rollback")]  # an overflow is not a spike
    assert summary["skipped_steps"] == 0 and math.isfinite(summary["final_train_loss"])
