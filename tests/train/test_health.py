"""Run-health alerts (train/health.py): each one trips on the trouble it names, with the key that sets
its threshold; a healthy run trips none; a resume keeps the baselines without alerting twice."""

import pytest

from smelt.config import config_from_dict
from smelt.errors import ConfigError
from smelt.train.health import KEYS, HealthAlerts, HealthPolicy, health_alerts
from smelt.train.monitors import MetricsLog
from smelt.train.trainer import train

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture


def start(warmup=0):
    return {"kind": "event", "event": "start", "step": 0, "tokens": 0, "warmup_steps": warmup}


def window(step, tps=1000.0, wait=0.01, clip=0.0):
    return {"kind": "train", "step": step, "tokens": step * 100, "loss": 3.0, "tokens_per_s": tps,
            "loader_wait_share": wait, "clip_fraction": clip}  # fmt: skip


def evaluation(step, loss, **by_source):
    return {"kind": "eval", "step": step, "tokens": step * 100, "val_loss": loss,
            **({"val_loss_by_source": by_source} if by_source else {})}  # fmt: skip


def layers(step, **ratios):
    return {"kind": "layers", "step": step, "tokens": step * 100,
            "layers": {name: {"update_ratio": r, "weight_norm": 1.0} for name, r in ratios.items()}}  # fmt: skip


def moe(step, *max_mean):
    return {"kind": "moe", "step": step, "tokens": step * 100, "moe_layers": list(range(len(max_mean))),
            "moe_max_mean": list(max_mean)}  # fmt: skip


def healthy_run(steps=400, every=10):
    """A run's records as smelt writes them, with nothing wrong: falling losses, steady speed, a few
    clipped steps early, ratios near 1e-3, balanced experts."""
    records = [start(warmup=20)]
    loss = 4.0
    for step in range(every, steps + 1, every):
        records.append(window(step, tps=1000.0 + (step % 30), wait=0.01, clip=0.1 if step == 10 else 0.0))
        records.append(layers(step, **{"blocks.0.attn.wq.weight": 2e-3, "blocks.0.attn_norm.weight": 3e-4}))
        records.append(moe(step, 1.1, 1.2))
        if step % 50 == 0:
            loss -= 0.05
            records.append(evaluation(step, loss, web=loss + 0.1, code=loss - 0.1))
    return records


def fired(records, **policy):
    alerts = HealthAlerts(HealthPolicy(**policy))
    return [a for r in records for a in alerts.observe(r)]


def test_a_healthy_run_trips_nothing():
    assert fired(healthy_run()) == []


def test_validation_regression_trips_once_per_episode():
    records = [start(), evaluation(100, 3.0), evaluation(200, 3.005), evaluation(300, 3.02),
               evaluation(400, 3.03), evaluation(500, 2.99), evaluation(600, 3.02)]  # fmt: skip
    alerts = fired(records)
    assert [(a["step"], a["alert"]) for a in alerts] == [(300, "val_regression"), (600, "val_regression")]
    assert alerts[0]["key"] == "train.alert_val_regression" and alerts[0]["threshold"] == 0.01
    assert alerts[0]["value"] == pytest.approx(0.02) and "above its best 3.0000" in alerts[0]["message"]
    assert fired(records, val_regression=0.05) == []


def test_one_domain_rising_while_the_total_falls():
    records = [start(), evaluation(100, 3.0, web=3.1, code=2.9), evaluation(200, 2.98, web=3.107, code=2.85)]
    (alert,) = fired(records)
    assert alert["alert"] == "domain_regression" and alert["key"] == "train.alert_domain_rise"
    assert "on web rose 0.0070" in alert["message"] and alert["value"] == pytest.approx(0.007)
    assert fired(records, domain_rise=0.01) == []
    # Both rising with the total is a validation regression's business, not this one's.
    assert fired([start(), evaluation(100, 3.0, web=3.1), evaluation(200, 3.005, web=3.11)]) == []


def test_a_steady_loader_wait_over_the_alert_window():
    # Windows of 10 steps judged over the last 20 (train.alert_window); the first is start-up.
    waits = [0.5, 0.01, 0.01, 0.08, 0.06, 0.01, 0.01, 0.07]
    records = [start()] + [window(10 * (i + 1), wait=w) for i, w in enumerate(waits)]
    alerts = fired(records, window=20)
    assert [(a["step"], a["alert"]) for a in alerts] == [(40, "loader_wait"), (80, "loader_wait")]
    assert alerts[0]["key"] == "train.alert_loader_wait"
    assert "4.5% of the step time over the last 20 steps" in alerts[0]["message"]
    assert fired(records) == []  # 80 steps do not fill the default window of 100: too early to judge


def test_a_steady_clip_rate_after_warmup():
    # 3 of every 100 steps clipped, as windows of 10 steps; nothing counted during the 20 warmup steps.
    records = [start(warmup=20)] + [window(s, clip=0.1 if s % 100 in (30, 60, 90) else 0.0)
                                    for s in range(10, 400, 10)]  # fmt: skip
    alerts = fired(records)
    assert [a["alert"] for a in alerts] == ["clip_rate"] and alerts[0]["key"] == "train.alert_clip_rate"
    assert alerts[0]["step"] == 120 and alerts[0]["value"] == pytest.approx(0.03)
    assert fired(records, clip_rate=0.05) == []
    # A burst of clipping inside the warmup is not a steady rate.
    assert (
        fired([start(warmup=100)] + [window(s, clip=1.0 if s <= 100 else 0.0) for s in range(10, 400, 10)])
        == []
    )


def test_update_ratios_out_of_band_after_warmup():
    records = [start(warmup=10), layers(10, **{"blocks.0.mlp.up.weight": 0.5}),  # warmup: not judged
               layers(20, **{"blocks.0.mlp.up.weight": 0.03, "blocks.1.mlp.up.weight": 2e-3}),
               layers(30, **{"blocks.0.mlp.up.weight": 0.04, "blocks.1.mlp.up.weight": 2e-6})]  # fmt: skip
    alerts = fired(records)
    assert [(a["step"], a["alert"], a["key"]) for a in alerts] == [
        (20, "update_ratio_high", "train.alert_update_ratio_max"),
        (30, "update_ratio_low", "train.alert_update_ratio_min"),
    ]
    assert (
        "1 of 2 parameters have an update ratio above 0.01: blocks.0.mlp.up.weight 0.03"
        in alerts[0]["message"]
    )
    assert fired(records, update_ratio_max=0.1, update_ratio_min=1e-6) == []


def test_a_throughput_drop_against_the_windows_before():
    speeds = [900.0, 1000, 1010, 990, 1005, 700, 720, 1000, 500]  # the first window is start-up
    records = [start()] + [window(10 * (i + 1), tps=s) for i, s in enumerate(speeds)]
    alerts = fired(records, window=30)
    assert [(a["step"], a["alert"]) for a in alerts] == [(60, "throughput_drop"), (90, "throughput_drop")]
    assert (
        alerts[0]["key"] == "train.alert_throughput_drop" and "30% below the median" in alerts[0]["message"]
    )
    assert fired(records, window=30, throughput_drop=0.6) == []


def test_moe_load_above_its_ratio():
    records = [start(warmup=5), moe(5, 3.0), moe(10, 1.1, 1.2), moe(20, 1.1, 1.45), moe(30, 1.1, 1.5)]
    alerts = fired(records)
    assert [(a["step"], a["alert"]) for a in alerts] == [(20, "moe_imbalance")]
    assert alerts[0]["key"] == "train.alert_moe_load" and "layer 1 1.45x" in alerts[0]["message"]
    assert fired(records, moe_load=2.0) == []


def test_every_alert_has_its_key_and_zero_turns_it_off():
    cfg = config_from_dict({"train": {}}).train
    assert all(hasattr(cfg, key) for key in KEYS.values())
    off = config_from_dict({"train": {key: 0 for key in KEYS.values()}}).train
    assert health_alerts(off, None) is None
    with pytest.raises(ConfigError, match="alert_loader_wait"):
        config_from_dict({"train": {"alert_loader_wait": 2}})


def test_a_resume_replays_the_kept_records_without_alerting(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = MetricsLog(path, watch=HealthAlerts(HealthPolicy()))
    for record in [start(), evaluation(100, 3.0), evaluation(200, 3.02)]:
        first.write(record)
    first.close()
    assert [r.get("alert") for r in read_metrics(tmp_path)] == [None, None, None, "val_regression"]
    resumed = MetricsLog(path, append=True, watch=HealthAlerts(HealthPolicy()))
    resumed.write(evaluation(300, 3.03))  # the same regression: already reported
    resumed.write(evaluation(400, 3.015))  # still above the best 3.0 of before the resume
    resumed.close()
    assert [r.get("alert") for r in read_metrics(tmp_path)].count("val_regression") == 1


def test_a_real_run_logs_its_alerts_with_their_keys(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    out = tmp_path / "run"
    # A tiny model at lr 3e-3 moves its matrices by more than 1% a step: the update-ratio ceiling
    # trips (and names its key); a run whose thresholds suit its scale trips nothing. The alerts on
    # timings (loader wait, throughput) are off: a test must not depend on how loaded the machine is.
    timing = {"alert_loader_wait": 0, "alert_throughput_drop": 0}
    train(tiny_config(telemetry_every=4, **timing), tokens, tokenizer, out)
    alerts = [r for r in read_metrics(out) if r.get("event") == "alert" and r.get("key")]
    assert alerts and {a["alert"] for a in alerts} == {"update_ratio_high"}
    assert all(a["key"] == "train.alert_update_ratio_max" and a["action"] == "log" for a in alerts)
    train(
        tiny_config(telemetry_every=4, alert_update_ratio_max=0.5, **timing),
        tokens,
        tokenizer,
        tmp_path / "b",
    )
    assert not [r for r in read_metrics(tmp_path / "b") if r.get("event") == "alert" and r.get("key")]
