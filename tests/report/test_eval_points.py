"""Evaluation plots that stay readable: one evaluated checkpoint, perplexity beside accuracy, the
prompt convention, and `smelt eval` results in the TensorBoard export."""

from __future__ import annotations

import json
import re

import pytest

from smelt.report.eval_sections import evaluation_section
from smelt.report.run import load_run
from smelt.report.svg import Band, Chart, Series, chart_svg

LEFT, PLOT_WIDTH = 70, 440 - 70 - 20  # chart_svg's margins at width 440


def charts(html: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", html, flags=re.S)


def y_ticks(svg: str) -> list[float]:
    return [float(v) for v in re.findall(r'text-anchor="end">(-?[0-9.e-]+)</text>', svg)]


def test_one_point_is_a_labelled_marker_inside_a_proper_range():
    chart = Chart(
        "task copa", "tokens", "score",
        [Series("acc", [81920], [0.55], dots=True), Series("chance", [81920], [0.5], "#999999", "2 3")],
        bands=[Band("± 1 standard error", [81920], [0.5], [0.6])], width=440, height=230,
    )  # fmt: skip
    svg = chart_svg(chart)
    marker = re.search(r'<circle cx="([0-9.]+)" cy="([0-9.]+)" r="([0-9.]+)"', svg)
    assert marker and float(marker.group(3)) >= 4  # large enough to see
    assert LEFT < float(marker.group(1)) < LEFT + PLOT_WIDTH - 20  # inside the frame, not on its edge
    assert ">0.55</text>" in svg  # its value is written beside it
    # The dashed reference (chance) is a level across the whole plot, labelled with its value.
    assert f'x1="{LEFT}" x2="{LEFT + PLOT_WIDTH}"' in svg and "chance 0.5</text>" in svg
    assert svg.count("<line") - svg.count('stroke="#eee"') >= 4  # the error bar: a bar and two caps
    assert "<polygon" not in svg  # no zero-width band


def test_one_value_gets_an_axis_from_zero():
    svg = chart_svg(Chart("bits", "tokens", "bits/byte", [Series("model", [4096], [1.669], dots=True)]))
    ticks = y_ticks(svg)
    assert min(ticks) == 0 and 1.669 < max(ticks) <= 1.25 * 1.669 + 0.25
    marker = re.search(r'<circle cx="([0-9.]+)"', svg)
    assert float(marker.group(1)) < 900 - 20 - 40  # the x axis runs past the point: it is not on the edge
    assert ">1.669</text>" in svg


def run_with_lambada(tiny_run, steps=(20, 40)):
    for step in (20, 40):
        path = tiny_run / "eval" / f"step_{step:07d}.json"
        if step not in steps:
            path.unlink()
            continue
        result = json.loads(path.read_text())
        result["convention"] = "lm-eval"
        result["tasks"]["lambada"] = {"formulation": "lastword", "metric": "acc", "items": 100, "skipped": 0,
                                      "shots": 0, "acc": 0.02 * step / 20, "perplexity": 4000.0 / step,
                                      "score": 0.02 * step / 20, "stderr": 0.01, "convention": "lm-eval"}  # fmt: skip
        path.write_text(json.dumps(result))
    (tiny_run / "eval" / "gallery.json").unlink()
    return load_run(tiny_run)


def test_perplexity_gets_its_own_log_axis(tiny_run):
    html = evaluation_section(run_with_lambada(tiny_run))
    lambada = [svg for svg in charts(html) if "task lambada" in svg]
    assert len(lambada) == 2
    scores, perplexity = sorted(lambada, key=lambda svg: "perplexity" in svg)
    assert "perplexity" not in scores and "acc" in scores and "chance" not in scores
    assert "perplexity (lower is better)" in perplexity and "(log)" in perplexity
    assert max(y_ticks(scores)) < 1  # accuracy is not flattened against a perplexity of 200
    assert "prompt convention: lm-eval" in html


def test_one_evaluated_checkpoint_draws_labelled_points(tiny_run):
    html = evaluation_section(run_with_lambada(tiny_run, steps=(40,)))
    lambada = [svg for svg in charts(html) if "task lambada" in svg]
    assert all('r="5"' in svg for svg in lambada)
    assert any(">0.04</text>" in svg for svg in lambada) and any(">100</text>" in svg for svg in lambada)


def test_tensorboard_export_holds_smelt_eval_results(tiny_run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from smelt.report.sinks import export_tensorboard

    run_with_lambada(tiny_run)
    logdir, count = export_tensorboard(tiny_run, tmp_path / "tb")
    assert count == len(load_run(tiny_run).records) + 2
    events = EventAccumulator(str(logdir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"checkpoint_eval/bits_per_byte", "checkpoint_eval/loss", "checkpoint_eval/bits_per_byte/code",
                "checkpoint_eval/task/hellaswag/acc", "checkpoint_eval/task/lambada/perplexity",
                "checkpoint_eval/task/arc_easy"}  # fmt: skip
    assert expected <= tags
    bpb = events.Scalars("checkpoint_eval/bits_per_byte")
    assert [e.step for e in bpb] == [20 * 2048, 40 * 2048]  # at the tokens each checkpoint had seen
    assert [round(e.value, 4) for e in bpb] == [2.51, 2.01]
    assert "checkpoint_eval/gallery/text_summary" in events.Tags()["tensors"]
