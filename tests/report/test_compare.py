"""`smelt report RUN1 RUN2 ...`: tokens and FLOPs axes, config diff, noise bands over seed sets."""

from __future__ import annotations

import re

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.report.compare import seed_groups, write_comparison
from smelt.report.run import load_run


@pytest.fixture
def three_runs(run_factory):
    return [run_factory("seed1", seed=1), run_factory("seed2", seed=2), run_factory("hot", seed=1, lr=1e-2)]


def _x_labels(html: str) -> set[str]:
    # Axis titles are the centred texts just above each chart's bottom edge.
    return set(
        re.findall(r'<text x="[\d.]+" y="\d+" text-anchor="middle">([^<]+)</text>\n<text x="14"', html)
    )


def test_comparison_uses_tokens_and_flops_never_steps(three_runs):
    path = write_comparison(three_runs)
    assert path.parent == three_runs[0].parent and path.name.startswith("compare-")
    html = path.read_text()
    labels = _x_labels(html)
    assert labels and labels <= {"tokens", "training FLOPs"}, labels
    assert "training FLOPs" in labels and "tokens" in labels
    assert "validation loss against training FLOPs" in html and "train loss against tokens" in html
    assert "task hellaswag/acc against tokens" in html
    for needle in ("http://", "https://", "<script", "<link", "src="):
        assert needle not in html


def test_config_diff_and_noise_bands(three_runs):
    runs = [load_run(p) for p in three_runs]
    assert seed_groups(runs) == [[0, 1]]  # same config but run.seed; "hot" differs in train.lr
    html = write_comparison(three_runs, three_runs[0].parent / "cmp.html").read_text()
    diff = re.search(r'<section id="config">(.*?)</section>', html, re.S).group(1)
    assert "train.lr" in diff and "run.seed" in diff and "model.preset" not in diff
    final = re.search(r'<section id="final">(.*?)</section>', html, re.S).group(1)
    assert "seed group 1: seed1 (seed 1), seed2 (seed 2)" in final
    # final_train_loss of the seed runs is base + 0.01 * seed: the band is their mean ± std (min–max).
    row = re.search(r"<tr><td>final_train_loss</td>(.*?)</tr>", final).group(1)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    values = [float(c) for c in cells[:3]]
    assert values[1] - values[0] == pytest.approx(0.01, abs=1e-4)
    mean = (values[0] + values[1]) / 2
    assert cells[3].startswith(f"{mean:.5g} ± 0.0071 (") and cells[3].endswith("n=2)")
    assert "seed group 1: min–max" in html  # the band drawn on the curves


def test_comparison_bad_input(three_runs, tmp_path, capsys):
    with pytest.raises(UserError, match="two or more"):
        write_comparison(three_runs[:1])
    with pytest.raises(UserError, match="named twice"):
        write_comparison([three_runs[0], three_runs[0]])
    missing = tmp_path / "missing-run"
    assert main(["report", str(three_runs[0]), str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_cli_comparison_out(three_runs, tmp_path, capsys):
    out = tmp_path / "c.html"
    assert main(["report", *map(str, three_runs), "--out", str(out)]) == 0
    assert out.is_file() and f"report: {out}" in capsys.readouterr().out
