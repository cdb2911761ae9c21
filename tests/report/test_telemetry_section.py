"""The report's Telemetry section: a heat map per per-layer figure, the logit chart, the health alerts."""

from __future__ import annotations

from pathlib import Path

from smelt.report.run import Run
from smelt.report.telemetry_section import MAPS, MAX_COLUMNS, heatmap_svg, telemetry_section
from smelt.train.health import HealthAlerts, HealthPolicy


def records(steps: int = 6, layers: int = 3) -> list[dict]:
    out: list[dict] = [{"kind": "event", "event": "start", "step": 0, "tokens": 0, "warmup_steps": 0,
                        "telemetry": "every 10 steps"}]  # fmt: skip
    for i in range(1, steps + 1):
        step = 10 * i
        out.append({"kind": "telemetry", "step": step, "tokens": step * 100, "sample_tokens": 4096,
                    "act_rms": [0.5 * (layer + 1) * i for layer in range(layers)],
                    "act_kurtosis": [0.1 * layer for layer in range(layers)],
                    "attn_logit_max": [5.0 + i + layer for layer in range(layers)], "logit_max": 10.0 + i})  # fmt: skip
        out.append({"kind": "layers", "step": step, "tokens": step * 100,
                    "layers": {"blocks.0.attn.wq.weight": {"update_ratio": 0.02, "weight_norm": 1.0}},
                    "by_layer": {"update_ratio": [0.02, 1e-3, None], "adam_m_rms": [1e-4] * layers,
                                 "adam_v_rms": [1e-8 * i] * layers}})  # fmt: skip
    return out


def test_every_figure_is_drawn_and_the_alerts_listed(tmp_path: Path):
    recs = records()
    alerts = HealthAlerts(HealthPolicy())
    recs += [a for r in list(recs) for a in alerts.observe(r)]  # the update ratio of 0.02 trips
    html = telemetry_section(Run(tmp_path, tmp_path / "metrics.jsonl", recs))
    for _, _, title, _, _ in MAPS:
        assert title in html, title
    assert html.count("<svg") == len(MAPS) + 1  # six heat maps and the logit chart
    assert "step 30, layer 2: 0.2" in html  # a cell's hover: the kurtosis of layer 2 at step 30
    assert "step 10, layer 2: -" in html  # the update ratio missing for layer 2 is a grey cell
    assert "largest output logit" in html and "first 4.1k tokens" in html
    assert "update_ratio_high" in html and "train.alert_update_ratio_max = 0.01" in html


def test_no_telemetry_says_why(tmp_path: Path):
    start = {
        "kind": "event",
        "event": "start",
        "step": 0,
        "tokens": 0,
        "telemetry": "off: pipeline parallelism",
    }
    html = telemetry_section(Run(tmp_path, tmp_path / "metrics.jsonl", [start]))
    assert "no telemetry records" in html and "off: pipeline parallelism" in html


def test_a_long_run_is_thinned_and_log_scales_skip_zeros():
    steps = list(range(MAX_COLUMNS * 3))
    svg = heatmap_svg("t", steps, [[float(s + 1), 0.0] for s in steps], log=True)
    assert svg.count("<rect") == 2 * len(steps) and "(log scale)" in svg and "#dddddd" in svg
    html = telemetry_section(Run(Path("."), Path("m"), records(steps=MAX_COLUMNS + 30)))
    assert html.count("<title>step") == len(MAPS) * MAX_COLUMNS * 3  # 3 layers, 120 of 150 steps


def test_telemetry_goes_to_the_live_sinks_per_layer():
    from smelt.train.sinks import scalars

    tel, layers = records(steps=1)[1:3]
    tags = dict(scalars(tel))
    assert tags["telemetry/act_rms/layer_2"] == 1.5 and tags["telemetry/logit_max"] == 11.0
    assert "telemetry/attn_logit_max/layer_0" in tags and "telemetry/act_kurtosis/layer_1" in tags
    tags = dict(scalars(layers))
    assert tags["layers/update_ratio/layer_0"] == 0.02 and "layers/update_ratio/layer_2" not in tags  # None
    assert tags["layers/adam_v_rms/layer_1"] == 1e-8 and tags["layers/update_ratio_max"] == 0.02
