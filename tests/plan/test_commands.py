"""`smelt scaling fit` end to end, and the hook contract cli.py relies on."""

import argparse
import json
import xml.dom.minidom

import pytest

from smelt.cli import plan as commands

CHINCHILLA_CSV = "scaling/chinchilla_epoch_replication/svg_extracted_data.csv"


@pytest.mark.slow
def test_scaling_fit_on_chinchilla_csv(shared_data, tmp_path, cli, capsys):
    out = tmp_path / "fit"
    argv = ["scaling", "fit", str(shared_data / CHINCHILLA_CSV), "--drop-highest", "5", "--bootstrap", "50",
            "--isoflop", "--compute", "5.76e23", "--predict", "70e9,1.4e12", "--out", str(out)]  # fmt: skip
    assert cli(argv) == 0
    text = capsys.readouterr().out
    assert "points: 240" in text and "IsoFLOP (Approach 2)" in text and "predicted loss" in text
    fit = json.loads((out / "fit.json").read_text())
    assert fit["n_points"] == 240 and fit["starts"] == 4500 and fit["bootstrap_samples"] == 50
    assert 0.317 < fit["law"]["alpha"] < 0.373 and 0.331 < fit["law"]["beta"] < 0.415
    lo, hi = fit["intervals_95"]["alpha"]
    assert lo < fit["law"]["alpha"] < hi
    (row,) = fit["compute_optimal"]
    assert row["compute"] == 5.76e23
    assert row["n_opt_lo"] < row["n_opt"] < row["n_opt_hi"]
    assert 0.5 < row["isoflop_n_opt"] / row["n_opt"] < 2  # the two approaches agree at Chinchilla's budget
    (prediction,) = fit["predictions"]
    assert 1.9 < prediction["loss"] < 2.1  # Chinchilla 70B on 1.4T tokens
    assert fit["isoflop"]["a"] == pytest.approx(0.5, abs=0.04)
    svgs = {
        name: xml.dom.minidom.parse(str(out / name)) for name in ("fit.svg", "isoflop.svg")
    }  # well-formed
    assert all(svg.documentElement.tagName == "svg" for svg in svgs.values())
    assert len(svgs["fit.svg"].getElementsByTagName("circle")) == 2 * 240  # each point in both panels
    # The fit JSON is a law `smelt plan budget --law` accepts.
    assert cli(["plan", "budget", "--flops", "1e22", "--law", str(out / "fit.json"), "--law-split"]) == 0
    assert "compute-optimal under fitted" in capsys.readouterr().out


@pytest.mark.slow
def test_single_ratio_points_warn_that_n_and_d_are_confounded(tmp_path, cli, capsys):
    rows = ["N,D,loss"] + [f"{n},{20 * n},{1.8 + 400 / n**0.34 + 2000 / (20 * n) ** 0.37}" for n in
                           (1e7, 3e7, 1e8, 3e8, 1e9, 3e9)]  # fmt: skip
    csv = tmp_path / "ladder.csv"
    csv.write_text("\n".join(rows) + "\n")
    assert cli(["scaling", "fit", str(csv), "--bootstrap", "0", "--out", str(tmp_path / "o")]) == 0
    assert "cannot be told apart" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["scaling", "fit", "missing.csv"], "does not exist"),
        (["scaling", "fit", "{csv}", "--bootstrap", "-1"], "--bootstrap must be >= 0"),
        (["scaling", "fit", "{csv}", "--loss-column", "ce"], "no column 'ce'"),
    ],
)
def test_scaling_fit_user_errors(tmp_path, cli, capsys, argv, needle):
    csv = tmp_path / "a.csv"
    csv.write_text(
        "N,D,loss\n"
        + "\n".join(f"{n},{n * 10},{3 - i / 10}" for i, n in enumerate((1e6, 2e6, 4e6, 8e6, 16e6)))
    )
    assert cli([a.replace("{csv}", str(csv)) for a in argv]) == 2
    assert needle in capsys.readouterr().err


def test_number_parser_accepts_suffixes():
    assert (
        commands.number("2T") == 2e12
        and commands.number("500_000") == 5e5
        and commands.number("1.5B") == 1.5e9
    )
    with pytest.raises(argparse.ArgumentTypeError):
        commands.number("lots")
