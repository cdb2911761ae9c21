"""The headline held-out loss over several sources: weighted by the training mixture, identical in the
eval stage, the trainer, the end-of-run table and the report; bits per byte over all bytes."""

import math
from pathlib import Path

import pytest

from helpers import write_split
from smelt.config import config_from_dict
from smelt.eval.heldout import heldout_bits_per_byte, token_shares, training_mixture, weighted_loss
from smelt.report.run import Run
from smelt.report.train_sections import loss_section
from smelt.run.summary import by_source_row, eval_rows, eval_time, val_weighting
from smelt.tokenizer.load import Tokenizer
from smelt.tokens.shards import ShardSet

from .test_heldout import run, tiny_model  # noqa: F401 - the module's run fixture


def config(**tokens):
    return config_from_dict({"train": {"seq_len": 32, "tokens": 32_000}, "tokens": tokens})


@pytest.mark.slow
def test_overall_loss_is_weighted_by_the_mixture_and_bits_per_byte_by_bytes(run):  # noqa: F811
    tokenizer = Tokenizer.load(run / "tokenizer")
    model = tiny_model(tokenizer.vocab_size)
    weights = training_mixture(config(mixture={"prose": 7, "code": 3}), run / "tokens")
    assert weights == pytest.approx({"code": 0.3, "prose": 0.7})
    result = heldout_bits_per_byte(
        model, run / "tokens", run / "documents", tokenizer.eos_id, 32, 8, weights=weights
    )
    per, overall = result["per_source"], result["overall"]
    assert overall["loss_weighting"] == "mixture"
    assert overall["loss_weights"] == pytest.approx({"code": 0.3, "prose": 0.7})
    assert overall["loss"] == pytest.approx(0.7 * per["prose"]["loss"] + 0.3 * per["code"]["loss"], rel=1e-12)
    # Not the loss of the first source, nor the mean over every token scored (which the larger split rules).
    by_tokens = sum(f["loss"] * f["tokens"] for f in per.values()) / sum(f["tokens"] for f in per.values())
    assert abs(overall["loss"] - per["code"]["loss"]) > 1e-6 and abs(overall["loss"] - by_tokens) > 1e-6
    bits = sum(f["loss"] * f["tokens"] for f in per.values()) / math.log(2)
    assert overall["bits_per_byte"] == pytest.approx(bits / sum(f["bytes"] for f in per.values()), rel=1e-9)


@pytest.mark.slow
def test_without_weights_the_overall_loss_weighs_the_sources_by_training_tokens(run):  # noqa: F811
    tokenizer = Tokenizer.load(run / "tokenizer")
    result = heldout_bits_per_byte(
        tiny_model(tokenizer.vocab_size), run / "tokens", run / "documents", tokenizer.eos_id, 32, 8
    )
    sizes = {s: ShardSet(run / "tokens", "train", s).total_tokens for s in ("code", "prose")}
    shares = {s: n / sum(sizes.values()) for s, n in sizes.items()}
    assert token_shares(run / "tokens") == pytest.approx(shares)
    per = result["per_source"]
    assert result["overall"]["loss"] == pytest.approx(sum(shares[s] * per[s]["loss"] for s in per), rel=1e-12)


@pytest.mark.slow
def test_training_mixture_follows_the_data_plan(run):  # noqa: F811
    tokens = run / "tokens"
    sizes = {s: ShardSet(tokens, "train", s).total_tokens for s in ("code", "prose")}
    natural = training_mixture(config(), tokens)
    sequences = {s: (n - 1) // 32 for s, n in sizes.items()}
    assert natural == pytest.approx({s: q / sum(sequences.values()) for s, q in sequences.items()})
    staged = config(
        stages=[{"name": "a", "fraction": 0.5}, {"name": "b", "fraction": 0.5, "mixture": {"code": 1}}]
    )
    halves = training_mixture(staged, tokens)
    assert halves["code"] == pytest.approx(0.5 * natural["code"] + 0.5, abs=1e-3)
    assert training_mixture(config(), Path(run) / "nowhere") == {}


def test_weighted_loss_edge_cases():
    # A source with no validation tokens does not dilute the others; the weights are renormalized.
    loss, kind, used = weighted_loss({"a": 2.0, "b": 4.0}, {"a": 10, "b": 0}, {"a": 0.5, "b": 0.5})
    assert (loss, kind, used) == (2.0, "mixture", {"a": 1.0})
    # A validation-only source (no training weight) falls back to tokens scored, and says so.
    loss, kind, used = weighted_loss({"x": 1.0, "y": 3.0}, {"x": 30, "y": 10}, {"a": 1.0})
    assert kind == "tokens" and used == {"x": 0.75, "y": 0.25} and loss == pytest.approx(1.5)
    # A diverged source with weight 0 does not make the headline NaN; one with weight does.
    assert weighted_loss({"a": 2.0, "b": math.nan}, {"a": 1, "b": 1}, {"a": 1.0})[0] == 2.0
    assert math.isnan(weighted_loss({"a": 2.0, "b": math.nan}, {"a": 1, "b": 1}, {"a": 1.0, "b": 1.0})[0])
    assert math.isnan(weighted_loss({}, {}, {"a": 1.0})[0])


def test_end_of_run_table_says_how_the_headline_is_weighted():
    summary = {
        "final_val_loss": 3.1,
        "val_loss_weighting": "mixture",
        "val_loss_by_source": {"prose": 3.4, "code": 2.4},
        "eval_time_s": 4.25,
        "eval_share": 0.083,
        "evals_skipped": 2,
    }
    assert val_weighting(summary) == " (val: 2 sources weighted by the training mixture)"
    assert by_source_row("val loss by source", summary["val_loss_by_source"]) == [
        ("val loss by source", "code 2.4000, prose 3.4000")
    ]
    assert eval_time(summary) == "4.2s (8.3% of training); 2 evaluation(s) skipped for train.eval_budget"
    assert (
        val_weighting({"val_loss_by_source": {"only": 1.0}}) == "" and by_source_row("x", {"only": 1.0}) == []
    )
    figures = {"loss": 3.0, "bits_per_byte": 1.2, "gzip_bits_per_byte": 2.0, "xz_bits_per_byte": 1.9}
    result = {
        "checkpoint": "ckpt",
        "heldout": {"per_source": {"code": figures}, "overall": {**figures, "loss_weighting": "mixture"}},
    }
    assert [name for name, _ in eval_rows(result)][-1] == "all (mixture-weighted loss): loss / bits-per-byte"


def test_report_names_the_weighting_and_the_skipped_evaluations(tmp_path):
    records = [
        {"kind": "train", "step": 10, "tokens": 100, "loss": 4.0},
        {"kind": "event", "step": 20, "tokens": 200, "event": "eval_skipped", "eval_budget": 0.1},
        {"kind": "eval", "step": 40, "tokens": 400, "val_loss": 3.1, "val_loss_weighting": "mixture",
         "val_loss_by_source": {"code": 2.4, "prose": 3.4}, "val_loss_weights": {"code": 0.3, "prose": 0.7}},
    ]  # fmt: skip
    html = loss_section(Run(tmp_path, tmp_path / "metrics.jsonl", records))
    assert "validation loss (mixture-weighted)" in html
    assert "weighted by the training mixture (code 0.300, prose 0.700)" in html
    assert "1 periodic validation(s) skipped to keep evaluation within train.eval_budget = 0.1" in html


def test_a_second_source_changes_the_trainers_weights_like_the_eval_stage(tmp_path):
    """The trainer and `smelt eval` compute the same weights from the same config and shards."""
    from helpers import write_token_data

    tokens, _ = write_token_data(tmp_path)
    write_split(tokens, "train", 100, seed=5, source="other")
    cfg = config_from_dict({"train": {"seq_len": 32, "tokens": 256 * 12}})
    weights = training_mixture(cfg, tokens)
    sizes = {s: ShardSet(tokens, "train", s).total_tokens for s in ("other", "synth")}
    sequences = {s: (n - 1) // 32 for s, n in sizes.items()}
    assert weights == pytest.approx({s: q / sum(sequences.values()) for s, q in sequences.items()})
