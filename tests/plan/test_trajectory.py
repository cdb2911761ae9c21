"""`smelt scaling fit --target`: every evaluation of a ladder's runs in the fit, and the predicted loss
curve of a larger run with its band (smelt/plan/trajectory.py)."""

import json
import math

import numpy as np
import pytest

from smelt.config import config_from_dict, load_config
from smelt.model.flops import count_params
from smelt.plan.fit import bootstrap
from smelt.plan.ladder import Rung, rung_config
from smelt.plan.trajectory import fit_curves, parse_target, predict_trajectory, read_curves

TRUE = {"E": 1.8, "A": 60.0, "alpha": 0.34, "B": 300.0, "beta": 0.4}


def true_loss(n: float, t: float, fraction: float) -> float:
    """A law plus the bump of a schedule that has not decayed yet (zero at the end of the run)."""
    law = TRUE["E"] + TRUE["A"] / n ** TRUE["alpha"] + TRUE["B"] / t ** TRUE["beta"]
    return law + 0.08 * (1.0 - fraction) ** 2


def write_run(root, name, n, total, evals=8, noise=0.0, seed=0, finished=True):
    """A run directory as the trainer and the pipeline leave it: metrics.jsonl with its validations
    and, once finished, train/manifest.json with the final figures."""
    rng = np.random.default_rng(seed)
    train = root / name / "train"
    train.mkdir(parents=True)
    lines = [{"kind": "event", "event": "start", "step": 0, "tokens": 0}]
    for k in range(1, evals + 1):
        t = total * k / evals
        loss = true_loss(n, t, k / evals) * (1 + noise * rng.standard_normal())
        lines.append({"kind": "eval", "step": k * 10, "tokens": t, "val_loss": loss})
        lines.append({"kind": "eval", "step": k * 10, "tokens": t, "inloop": True, "task/x": 0.5})
    (train / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    if finished:
        result = {"params_non_embedding": n, "tokens": total, "final_val_loss": lines[-2]["val_loss"]}
        (train / "manifest.json").write_text(json.dumps({"stage": "train", "result": result}))


def ladder(root, noise=0.004):
    for i, n in enumerate((1e4, 3e4, 1e5)):
        for j, total in enumerate((2e5, 8e5)):
            write_run(root, f"r{i}{j}", n, total, noise=noise, seed=10 * i + j)
    return root


def test_every_validation_from_the_first_fraction_on_and_the_unfinished_runs_left_out(tmp_path):
    ladder(tmp_path)
    write_run(tmp_path, "running", 3e5, 1e6, finished=False)
    curves = read_curves([tmp_path], min_fraction=0.3)
    assert curves.runs == ["r00", "r01", "r10", "r11", "r20", "r21"]
    assert curves.points.n.size == 6 * 6  # evaluations 3/8 .. 8/8 of each run; in-loop scores left out
    assert curves.fraction.min() == pytest.approx(3 / 8) and curves.fraction.max() == 1.0
    assert list(np.bincount(curves.run)) == [6] * 6
    assert "skipped unfinished runs: running" in curves.points.notes


def test_the_band_holds_the_larger_runs_true_curve_and_not_a_shifted_one(tmp_path):
    curves = read_curves([ladder(tmp_path)], min_fraction=0.2)
    p = curves.points
    fit, offset = fit_curves(curves)
    fit = bootstrap(fit, p.n, p.d, p.loss * np.exp(-offset), samples=40, seed=0, groups=curves.run)
    target = (3e5, 2.4e6)  # 3x the largest proxy's parameters and tokens
    curve = predict_trajectory(fit, curves, target)
    tokens, centre, lo, hi = (np.array(curve[k]) for k in ("tokens", "loss", "lo", "hi"))
    truth = np.array([true_loss(target[0], t, t / target[1]) for t in tokens])
    assert tokens[0] == pytest.approx(0.2 * target[1]) and tokens[-1] == pytest.approx(target[1])
    assert np.all(lo <= truth) and np.all(truth <= hi)
    assert np.max(np.abs(centre / truth - 1)) < 0.02
    # The schedule's bump is in the centre: mid-run it sits above the law at the same tokens.
    law = fit.law
    assert centre[0] > law.loss(target[0], tokens[0]) + 0.03
    # A run 8% worse than predicted from 40% of its tokens on is outside the band (the sabotaged case).
    worse = truth * 1.08
    assert np.all(worse[tokens >= 0.4 * target[1]] > hi[tokens >= 0.4 * target[1]])
    assert curve["target"] == {"params": 3e5, "tokens": 2.4e6, "params_kind": "non_embedding"}
    assert curve["warnings"] == []
    assert math.isfinite(curve["proxies"]["residual_rms"]) and curve["proxies"]["evaluations"] == p.n.size


def test_cli_writes_the_trajectory_into_fit_json(tmp_path, cli, capsys):
    ladder(tmp_path / "ladder")
    out = tmp_path / "fit"
    argv = ["scaling", "fit", str(tmp_path / "ladder"), "--target", "3e5,2.4e6", "--bootstrap", "20"]
    assert cli([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted validation loss of the target run (N 3e+05, D 2.4e+06" in text
    assert "D = tokens at each validation from 20% of each run on (42 evaluations of 6 runs)" in text
    fit = json.loads((out / "fit.json").read_text())
    curve = fit["trajectory"]
    assert len(curve["tokens"]) == len(curve["loss"]) == len(curve["lo"]) == len(curve["hi"]) == 48
    assert all(lo <= c <= hi for c, lo, hi in zip(curve["loss"], curve["lo"], curve["hi"], strict=True))
    assert fit["n_points"] == 42 and fit["bootstrap_samples"] == 20


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--drop-highest", "2"], "leave --drop-highest out"),
        (["--min-fraction", "1.5"], "--min-fraction must be in [0, 1)"),
        (["--target", "big"], "--target 'big' is neither N,D (parameters and tokens"),
        (["--isoflop"], "fit the IsoFLOP profiles in a run without --target"),
    ],
)
def test_target_user_errors(tmp_path, cli, capsys, extra, needle):
    ladder(tmp_path / "ladder")
    assert cli(["scaling", "fit", str(tmp_path / "ladder"), "--target", "3e5,2e6", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_target_from_a_pipeline_config(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[tokenizer]\nvocab_size = 384\n[model]\nd_model = 64\nn_layers = 2\nn_heads = 4\n"
                      "max_seq_len = 64\n[train]\nseq_len = 64\ntokens = 400_000\n")  # fmt: skip
    params = count_params(load_config(config).model, 384)
    assert parse_target(str(config)) == (params["non_embedding"], 400_000)
    assert parse_target(str(config), "total") == (params["total"], 400_000)
    assert parse_target("1.1e5,4e5") == (1.1e5, 4e5)


def test_target_needs_run_directories_not_a_csv(tmp_path, cli, capsys):
    csv = tmp_path / "points.csv"
    csv.write_text("N,D,loss\n" + "\n".join(f"{1e4 * k},{2e5 * k},{3.0 - 0.1 * k}" for k in range(1, 7)))
    assert cli(["scaling", "fit", str(csv), "--target", "3e5,2e6"]) == 2
    err = capsys.readouterr().err
    assert "--target predicts a run's loss curve" in err and "points.csv" in err and "ladder directory" in err


def test_final_losses_alone_say_the_curve_has_no_schedule_shape(tmp_path):
    for i, n in enumerate((1e4, 3e4, 1e5)):
        for j, total in enumerate((2e5, 8e5)):
            write_run(tmp_path, f"r{i}{j}", n, total, evals=1)
    curves = read_curves([tmp_path])
    fit, _ = fit_curves(curves)
    curve = predict_trajectory(fit, curves, (3e5, 2.4e6))
    assert any("logged (almost) no validations before their end" in w for w in curve["warnings"])


def test_each_rung_keeps_the_base_runs_number_of_validations():
    base = config_from_dict({"train": {"tokens": 400_000, "eval_every": 40}})
    rung = Rung("r00", 16, 1, 1, 1, 4144, 17_408)
    assert rung_config(base, rung).train.eval_every == 2  # 40 x 17,408 / 400,000, rounded
    off = config_from_dict({"train": {"tokens": 400_000, "eval_every": 0}})
    assert rung_config(off, rung).train.eval_every == 0  # validation at the end only, as the base
