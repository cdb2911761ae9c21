"""`smelt plan budget` and `smelt plan batch`: the worked example, laws, inference-aware sizing, warnings."""

import json
import math

import pytest

from smelt.errors import UserError
from smelt.plan.batch import critical_batch_tokens, scale_lr
from smelt.plan.budget import chinchilla_split, plan_budget, resolve_compute
from smelt.plan.laws import CHINCHILLA, EPOCH, LossLaw, load_law

WORKED = ["--dollars", "500000", "--price-per-gpu-hour", "3", "--peak-tflops", "1000", "--mfu", "0.35"]


def test_worked_example_500k_dollars():
    compute = resolve_compute(dollars=500_000, price_per_gpu_hour=3, peak_flops=1000e12, mfu=0.35)
    assert compute.gpu_hours == pytest.approx(500_000 / 3)
    assert compute.flops == pytest.approx(500_000 / 3 * 3600 * 1000e12 * 0.35)  # 2.1e23
    plan = plan_budget(compute, gpus=128)
    assert plan.params == pytest.approx(41.8e9, rel=0.01)  # "about 42B parameters"
    assert plan.tokens == pytest.approx(837e9, rel=0.01)  # "about 840B tokens"
    assert plan.tokens / plan.params == pytest.approx(20.0)
    assert 6 * plan.params * plan.tokens == pytest.approx(compute.flops)
    assert plan.days == pytest.approx(54.25, abs=0.05)  # "about 54 days on 128 GPUs"


def test_worked_example_through_the_cli(cli, capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert cli(["plan", "budget", *WORKED, "--gpus", "128", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "41.8B" in text and "837B" in text and "54.3 days" in text and "2.100e+23" in text
    saved = json.loads(out.read_text())
    assert saved["params"] == pytest.approx(41.8e9, rel=0.01) and saved["days"] == pytest.approx(
        54.25, abs=0.05
    )


def test_gpu_hours_and_flops_budgets_agree():
    by_hours = resolve_compute(gpu_hours=1e5, peak_flops=989e12, mfu=0.4)
    by_flops = resolve_compute(flops=by_hours.flops, peak_flops=989e12, mfu=0.4)
    assert by_flops.gpu_hours == pytest.approx(1e5)
    n, d = chinchilla_split(by_flops.flops)
    assert 6 * n * d == pytest.approx(by_flops.flops) and d == pytest.approx(20 * n)
    # FLOPs alone size the model; without a throughput there is no calendar.
    bare = plan_budget(resolve_compute(flops=by_hours.flops), gpus=64)
    assert bare.params == pytest.approx(n) and bare.days is None


def test_law_optimum_is_the_minimum_on_the_compute_line():
    for law in (EPOCH, CHINCHILLA):
        compute = 1e22
        n, d = law.optimal(compute)
        assert 6 * n * d == pytest.approx(compute)
        best = law.loss(n, d)
        for f in (0.7, 0.9, 1.1, 1.4):
            assert law.loss(n * f, compute / (6 * n * f)) > best
    # The refit of Chinchilla's data keeps Chinchilla's ~20 tokens per parameter near 1e23 FLOPs.
    n, d = EPOCH.optimal(2.1e23)
    assert 15 < d / n < 25


def test_inference_aware_options_keep_the_loss_and_trade_training_for_serving():
    compute = resolve_compute(dollars=500_000, price_per_gpu_hour=3, peak_flops=1000e12, mfu=0.35)
    plan = plan_budget(compute, gpus=128, inference_tokens=2e13)
    target = plan.options[0].loss
    assert all(o.loss == pytest.approx(target, abs=1e-9) for o in plan.options)
    sizes = [o.params for o in plan.options]
    assert sizes[0] == plan.params and all(s < plan.params for s in sizes[1:])
    # Smaller models need more training compute for the same loss ...
    assert all(o.train_flops > plan.options[0].train_flops for o in plan.options[1:])
    # ... and with 20T tokens to serve, the cheapest over the model's life is one of them.
    best = plan.options[plan.best]
    assert best.params < plan.params
    assert best.total_flops < plan.options[0].total_flops
    assert best.total_flops == min(o.total_flops for o in plan.options)
    # Nothing to serve: the compute-optimal plan is the cheapest.
    assert plan_budget(compute, gpus=128).best == 0


def test_law_split_and_fitted_law_file(tmp_path):
    compute = resolve_compute(flops=1e21)
    plan = plan_budget(compute, law=EPOCH, law_for_split=True)
    assert (plan.params, plan.tokens) == pytest.approx(EPOCH.optimal(1e21))
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"law": {"E": 1.5, "A": 400.0, "B": 1000.0, "alpha": 0.3, "beta": 0.3}}))
    law = load_law(str(path))
    assert law == LossLaw(1.5, 400.0, 1000.0, 0.3, 0.3, name="fit.json")
    assert load_law("chinchilla") is CHINCHILLA


def test_tokens_for_loss_inverts_the_law():
    n = 1e9
    d = EPOCH.tokens_for_loss(n, 2.5)
    assert EPOCH.loss(n, d) == pytest.approx(2.5)
    assert EPOCH.tokens_for_loss(1e6, EPOCH.E + 0.01) is None  # a tiny model never gets there


def test_warnings_for_epochs_and_batch(cli, capsys):
    compute = resolve_compute(flops=1e22)
    plan = plan_budget(compute, unique_tokens=1e10, batch_tokens=1e9)
    text = " ".join(plan.warnings)
    assert "epochs" in text and "critical batch" in text
    quiet = plan_budget(compute, unique_tokens=1e13, batch_tokens=2e6)
    assert quiet.warnings == []
    assert cli(["plan", "budget", "--flops", "1e22", "--unique-tokens", "1e10"]) == 0
    assert "warning:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "exactly one budget"),
        (["--dollars", "1e5", "--flops", "1e20"], "exactly one budget"),
        (["--dollars", "1e5", "--peak-tflops", "989", "--mfu", "0.4"], "--price-per-gpu-hour"),
        (["--gpu-hours", "1000"], "--mfu"),
        (["--gpu-hours", "1000", "--gpu", "h100", "--mfu", "35"], "fraction"),
        (["--flops", "-5"], "--flops must be a positive number"),
        (["--flops", "1e21", "--law", "nope.json"], "--law"),
    ],
)
def test_budget_user_errors(cli, capsys, argv, needle):
    assert cli(["plan", "budget", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_lr_rescaled_by_sqrt_of_batch_growth(cli, capsys):
    assert scale_lr(3e-4, 0.5e6, 2e6) == pytest.approx(6e-4)
    assert scale_lr(3e-4, 2e6, 0.5e6) == pytest.approx(1.5e-4)
    with pytest.raises(UserError, match="--new-batch-tokens"):
        scale_lr(3e-4, 1e6, 0)
    assert cli(["plan", "batch", "--batch-tokens", "0.5M", "--new-batch-tokens", "2M", "--lr", "3e-4"]) == 0
    assert "0.0003 -> 0.0006" in capsys.readouterr().out


def test_critical_batch_falls_with_loss_and_flags_big_batches(cli, capsys):
    assert critical_batch_tokens(2.0) > critical_batch_tokens(3.0)
    assert critical_batch_tokens(1.0) == pytest.approx(2e8)
    assert critical_batch_tokens(2.0) == pytest.approx(2e8 / 2 ** (1 / 0.21))
    assert math.isclose(critical_batch_tokens(2.5) * 2.5 ** (1 / 0.21), 2e8)
    assert cli(["plan", "batch", "--batch-tokens", "64M", "--loss", "2.5"]) == 0
    assert "critical batch" in capsys.readouterr().out
