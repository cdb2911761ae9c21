"""In-loop validation: each source scored once, the mixture-weighted headline, progress, the time budget."""

import math

import numpy as np
import pytest
import torch

from helpers import write_split
from smelt.config import ModelConfig
from smelt.eval.heldout import training_mixture
from smelt.model.transformer import Transformer
from smelt.report.run import final_metrics, load_run
from smelt.train.evaluation import (
    FORWARD_SPEEDUP,
    EvalBudget,
    Validation,
    budget_note,
    score_sources,
    skip_note,
)
from smelt.train.precision import resolve_precision
from smelt.train.trainer import train

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture

CPU = torch.device("cpu")
FP32 = resolve_precision("fp32", CPU)


class CountingModel(torch.nn.Module):
    """A tiny transformer that records every row it is given, by the first token of the row."""

    def __init__(self, vocab: int = 300):
        super().__init__()
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, max_seq_len=64)
        self.inner = Transformer(cfg, vocab)
        self.calls = 0
        self.rows: list[int] = []

    def forward(self, idx, targets=None, **kwargs):
        self.calls += 1
        self.rows += idx[:, 0].tolist()
        return self.inner(idx, targets, **kwargs)


def test_each_source_is_scored_once_and_progress_is_reported():
    # Windows whose first tokens identify them: source a starts at 1, 2, 3; source b at 101, 102.
    windows = {
        "a": [np.array([k] * 9, dtype=np.int64) for k in (1, 2, 3)],
        "b": [np.array([k] * 9, dtype=np.int64) for k in (101, 102)],
    }
    model = CountingModel()
    seen: list[int] = []
    scores = score_sources(
        model, windows, seq_len=8, batch_size=2, precision=FP32, device=CPU, on_tokens=seen.append
    )
    # One forward per batch of a source (2 + 1 for a, 1 for b): no aggregate pass on top.
    assert model.calls == 3
    assert sorted(model.rows) == [1, 2, 3, 101, 102]
    assert {s: n for s, (_, n) in scores.items()} == {"a": 24, "b": 16}
    assert seen == [16, 8, 16] and sum(seen) == 40  # the progress callback, after each batch
    assert all(math.isfinite(loss) for loss, _ in scores.values())


def test_budget_with_no_share_allows_everything():
    budget = EvalBudget(0.0)
    assert budget.allows(predicted_s=1e9, train_s=0.0)


def test_budget_predicts_from_the_training_rate_then_from_measured_evaluations():
    budget = EvalBudget(0.1)
    # Before any evaluation: a forward pass is about three times as fast as a training step per token.
    assert budget.predict_s(tokens=3_000, train_tokens_per_s=1_000) == pytest.approx(
        3_000 / FORWARD_SPEEDUP / 1_000
    )
    budget.record(seconds=4.0, tokens=2_000)
    assert budget.predict_s(tokens=3_000, train_tokens_per_s=1_000) == pytest.approx(6.0)
    assert budget.runs == 1 and budget.share_of(40.0) == pytest.approx(0.1) and budget.share_of(0.0) is None


def test_budget_allows_an_evaluation_only_within_its_share_of_training_time():
    budget = EvalBudget(0.1)
    assert budget.allows(predicted_s=1.0, train_s=10.0)  # exactly 10%
    assert not budget.allows(predicted_s=1.01, train_s=10.0)
    budget.record(seconds=1.0, tokens=100)
    assert not budget.allows(predicted_s=1.0, train_s=15.0)  # 2 s of 15 s
    assert budget.allows(predicted_s=1.0, train_s=20.0)


def test_budget_reserves_the_final_evaluation_in_proportion_to_the_training_done():
    budget = EvalBudget(0.1)
    assert budget.allows(predicted_s=1.0, train_s=20.0, done=0.0)
    assert budget.allows(predicted_s=1.0, train_s=20.0, done=1.0)  # 1 s + 1 s reserved of 2 s allowed
    assert not budget.allows(predicted_s=1.0, train_s=15.0, done=1.0)
    assert budget.allows(predicted_s=1.0, train_s=15.0, done=0.5)


def test_with_the_final_evaluation_the_share_holds_at_the_end_of_the_run():
    """30 intervals of 10 s of training, evaluations of 3 s, then the final one (always run)."""
    budget = EvalBudget(0.1)
    train_s, ran = 0.0, []
    for interval in range(1, 30):
        train_s += 10.0
        if budget.allows(3.0, train_s, done=interval / 30):
            budget.record(seconds=3.0, tokens=1_000)
            ran.append(interval)
    train_s += 10.0
    budget.record(seconds=3.0, tokens=1_000)  # the final evaluation
    assert ran == [4, 7, 10, 14, 17, 20, 24, 27]  # spread over the run, not bunched at its start
    assert budget.eval_s == 27.0 and budget.eval_s <= 0.1 * train_s


def test_budget_spaces_evaluations_and_keeps_their_share_of_training_time():
    """Periodic evaluations costing 3 s after every 10 s of training, under a 10% budget: a third run.
    The first waits until its guess from the training rate (3.3 s) fits; later ones use the measured 3 s."""
    budget = EvalBudget(0.1)
    train_s, ran = 0.0, []
    for interval in range(1, 31):
        train_s += 10.0
        predicted = budget.predict_s(1_000, train_tokens_per_s=100.0)  # first guess: 1000/300 s
        if budget.allows(predicted, train_s):
            budget.record(seconds=3.0, tokens=1_000)
            ran.append(interval)
        else:
            budget.skipped += 1
        assert budget.eval_s <= 0.1 * train_s + 1e-9
    assert ran == [4, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert budget.skipped == 20 and budget.share_of(train_s) == pytest.approx(0.1)


def test_budget_messages_name_the_key():
    budget = EvalBudget(0.1, eval_s=2.0, runs=2, skipped=3)
    line = skip_note(500, predicted_s=3.0, budget=budget, train_s=20.0)
    assert line.startswith("validation at step 500 skipped: about 3.0 s more (after 2.0 s so far")
    assert "train.eval_budget = 0.1 of the 20 s trained" in line
    assert budget_note(budget, 40.0) == (
        "validation: 2 evaluation(s) in 2.0 s, 5.0% of the training time; train.eval_budget = 0.1, "
        "3 skipped to stay within it"
    )
    assert "no budget" in budget_note(EvalBudget(0.0, eval_s=1.0, runs=1), 10.0)


@pytest.fixture
def two_sources(data):  # noqa: F811 - the fixture from test_trainer
    tokens, tokenizer = data
    write_split(tokens, "train", 300, seed=5, source="other")
    write_split(tokens, "val", 20, seed=6, source="other")
    return tokens, tokenizer


def test_validation_headline_is_the_mixture_weighted_mean_of_the_sources(two_sources):
    tokens, _ = two_sources
    cfg = tiny_config()
    cfg.tokens.mixture = {"synth": 7, "other": 3}
    weights = training_mixture(cfg, tokens)
    assert weights == pytest.approx({"other": 0.3, "synth": 0.7})
    validation = Validation(tokens, ["other", "synth"], 32, 1024, 4, FP32, CPU, None, weights)
    assert validation.limits == {"other": 512, "synth": 512}  # eval_tokens split evenly
    model = CountingModel()
    result = validation.run(model, show=False)
    by_source = result.by_source
    assert result.weighting == "mixture" and result.tokens == 2 * 511 == validation.tokens
    assert result.loss == pytest.approx(0.3 * by_source["other"] + 0.7 * by_source["synth"], rel=1e-12)
    assert result.loss != by_source["other"]  # not the loss of the source that sorts first
    # 511 targets per source in windows of 32: 16 windows, 4 batches each, each scored once.
    assert model.calls == 8
    fields = result.fields()
    assert fields["val_loss_weights"] == pytest.approx({"other": 0.3, "synth": 0.7})
    assert fields["val_loss_by_source"] == by_source and fields["val_loss_weighting"] == "mixture"


@pytest.mark.slow
def test_trainer_logs_the_weighted_headline_and_skips_evaluations_over_budget(two_sources, tmp_path):
    tokens, tokenizer = two_sources
    # A budget no evaluation fits in: every periodic one is skipped, the final one still runs.
    cfg = tiny_config(eval_budget=1e-9, eval_every=3)
    cfg.tokens.mixture = {"synth": 1, "other": 3}
    summary = train(cfg, tokens, tokenizer, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    evals = [r for r in lines if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [12]
    final = evals[0]
    by_source = final["val_loss_by_source"]
    assert final["val_loss_weighting"] == "mixture" and final["val_loss_weights"] == {
        "other": 0.75,
        "synth": 0.25,
    }
    assert final["val_loss"] == pytest.approx(0.75 * by_source["other"] + 0.25 * by_source["synth"])
    assert final["val_loss"] != by_source["other"]
    assert final["val_tokens"] == 2 * 511 and final["eval_s"] >= 0
    skipped = [r for r in lines if r.get("event") == "eval_skipped"]
    assert [r["step"] for r in skipped] == [3, 6, 9] and skipped[0]["eval_budget"] == 1e-9
    end = next(r for r in lines if r.get("event") == "end")
    assert end["evals"] == 1 and end["evals_skipped"] == 3
    assert summary["final_val_loss"] == final["val_loss"] and summary["evals_skipped"] == 3
    assert summary["val_loss_weighting"] == "mixture" and summary["val_loss_by_source"] == by_source
    # The report's headline is the same figure, read back from metrics.jsonl.
    report = final_metrics(load_run(tmp_path / "run"))
    assert report["final_val_loss"] == summary["final_val_loss"]
    assert report["val_loss/other"] == by_source["other"] and report["val_loss/synth"] == by_source["synth"]


def test_notes_are_printed_above_the_progress_bars(monkeypatch, capsys):
    from smelt.train.evaluation import say

    monkeypatch.setenv("SMELT_QUIET", "0")
    say("validation: 1 evaluation(s)")
    assert capsys.readouterr().err == "validation: 1 evaluation(s)\n"
    monkeypatch.setenv("SMELT_QUIET", "1")
    say("hidden")
    assert capsys.readouterr().err == ""
