"""train.expect: the pre-registered curve, the off-trajectory alert (smelt/train/trajectory.py), and the
keys' place among those that never invalidate a stage."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import write_token_data
from smelt.config import config_from_dict
from smelt.errors import UserError
from smelt.run.lifecycle import changed_keys
from smelt.train.trajectory import Expectation, band_at, read_curve

CURVE = {
    "target": {"params": 1000, "tokens": 10_000, "params_kind": "non_embedding"},
    "tokens": [1000.0, 4000.0, 10_000.0],
    "loss": [4.0, 3.0, 3.0],
    "lo": [3.6, 2.8, 2.8],
    "hi": [4.4, 3.2, 3.2],
    "band": "test",
}


def monitor(tmp_path: Path, tolerance: int = 2000) -> Expectation:
    return Expectation(CURVE, "fit.json", tolerance, tmp_path / "metrics.jsonl")


def alerts_of(expect: Expectation, losses: dict[int, float]) -> list[tuple[int, str]]:
    """Feed validations {tokens: loss} (step = tokens / 100); (tokens, message) of each alert."""
    out = []
    for tokens, loss in losses.items():
        out += [(r["tokens"], r["message"]) for r in expect.observe(tokens // 100, tokens, loss)]
    return out


def test_band_is_linear_between_points_and_none_outside_the_curve():
    assert band_at(CURVE, 2500) == pytest.approx((3.5, 3.2, 3.8))
    assert band_at(CURVE, 10_000) == pytest.approx((3.0, 2.8, 3.2))
    assert band_at(CURVE, 10_050) == pytest.approx((3.0, 2.8, 3.2))  # the last whole step, past the end
    assert band_at(CURVE, 999) is None and band_at(CURVE, 10_101) is None


def test_inside_and_one_noisy_validation_raise_nothing(tmp_path):
    expect = monitor(tmp_path)
    losses = {t: 3.0 for t in range(4000, 10_001, 1000)}
    losses[6000] = 3.9  # one bad evaluation: the median of the last three stays inside
    assert alerts_of(expect, losses) == []


def test_an_excursion_alerts_once_after_the_tolerance_and_again_after_it_clears(tmp_path):
    expect = monitor(tmp_path, tolerance=1000)
    first = alerts_of(expect, {4000: 3.0, 5000: 3.5, 6000: 3.5, 7000: 3.5, 8000: 3.6})
    # The median of the last validations is outside from 5000 (3.25 > 3.2); 1000 tokens later it alerts,
    # once for the whole excursion.
    assert [t for t, _ in first] == [6000]
    message = first[0][1]
    assert "above the expected band [2.8000, 3.2000]" in message and "since 5,000 tokens" in message
    assert "train.expect = 'fit.json', train.expect_tolerance_tokens = 1,000" in message
    # Back inside at 8300 (the median of 3.6, 3.0, 3.0), then below it from 8500.
    again = alerts_of(expect, {8200: 3.0, 8300: 3.0, 8400: 2.0, 8500: 2.0, 9000: 2.0, 9500: 2.0})
    assert [t for t, _ in again] == [9500] and "below the expected band" in again[0][1]


def test_zero_tolerance_alerts_at_the_first_smoothed_excursion(tmp_path):
    expect = monitor(tmp_path, tolerance=0)
    assert [t for t, _ in alerts_of(expect, {4000: 3.5, 5000: 3.5})] == [4000]


def test_a_resumed_run_replays_its_validations(tmp_path):
    """The excursion spans the restart: the kept validations go through the monitor first, silently."""
    records = [{"kind": "eval", "step": t // 100, "tokens": t, "val_loss": 3.5} for t in (5000, 6000)]
    records.append({"kind": "eval", "step": 60, "tokens": 6000, "inloop": True, "task/x": 0.3})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [t for t, _ in alerts_of(monitor(tmp_path), {7000: 3.5})] == [7000]  # outside since 5000
    records += [{"kind": "eval", "step": t // 100, "tokens": t, "val_loss": 3.5} for t in (7000, 8000)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert alerts_of(monitor(tmp_path), {9000: 3.5}) == []  # it alerted at 7000, before the restart


def test_no_expectation_is_a_no_op(tmp_path):
    t = SimpleNamespace(tc=SimpleNamespace(expect=""), out_dir=tmp_path)
    expect = Expectation.load(t)
    assert expect.manifest() is None and expect.observe(10, 5000, 9.9) == []


def write_fit(path: Path, **target) -> str:
    path.write_text(json.dumps({"law": {}, "trajectory": {**CURVE, "target": {**CURVE["target"], **target}}}))
    return str(path)


def test_the_fit_file_is_checked_against_the_run(tmp_path):
    params = {"non_embedding": 1000, "total": 5000}
    assert read_curve(write_fit(tmp_path / "fit.json"), params, 10_000)["tokens"] == CURVE["tokens"]
    assert read_curve(write_fit(tmp_path / "fit.json", params_kind="total", params=5000), params, 10_000)
    with pytest.raises(UserError, match="no such file") as missing:
        read_curve(str(tmp_path / "nope.json"), params, 10_000)
    assert "train.expect = " in str(missing.value) and "--target 1000,10000" in str(missing.value)
    (tmp_path / "plain.json").write_text(json.dumps({"law": {"E": 1.0}}))
    with pytest.raises(UserError, match="not a fit file with a predicted trajectory") as plain:
        read_curve(str(tmp_path / "plain.json"), params, 10_000)
    assert "smelt scaling fit LADDER --target 1000,10000" in str(plain.value)
    with pytest.raises(
        UserError, match="predicts a run of 1,000 non-embedding parameters on 10,000"
    ) as other:
        read_curve(write_fit(tmp_path / "fit.json"), {"non_embedding": 2000, "total": 6000}, 10_000)
    assert "this run has 2,000 on 10,000" in str(other.value) and "--target 2000,10000" in str(other.value)


def test_expect_keys_never_invalidate_a_stage():
    base = config_from_dict({}).to_dict()
    watched = config_from_dict({"train": {"expect": "fit.json", "expect_tolerance_tokens": 5}}).to_dict()
    assert changed_keys(base, watched) == []
    older = json.loads(json.dumps(base))  # a manifest recorded before the keys existed
    del older["train"]["expect"], older["train"]["expect_tolerance_tokens"]
    assert changed_keys(older, watched) == []


def test_smelt_train_with_a_bad_fit_file_exits_2_naming_the_key(tmp_path, monkeypatch, capsys):
    """Through the command line, before step 0: a missing file, then one for another run."""
    from smelt.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    write_token_data(run)
    # The upstream stages' manifests, as the pipeline leaves them (the token data above stands in).
    for stage, inputs, out in (("documents", {}, "c"), ("tokenizer", {"curate": "c"}, "a"),
                               ("tokens", {"curate": "c", "tokenizer": "a"}, "b")):  # fmt: skip
        (run / stage).mkdir(exist_ok=True)
        (run / stage / "manifest.json").write_text(json.dumps({"inputs": inputs, "outputs_hash": out}))
    (tmp_path / "c.toml").write_text(
        '[run]\ndir = "runs"\nname = "x"\n[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\n'
        "max_seq_len = 32\n[train]\nseq_len = 32\nmicro_batch = 4\nbatch_tokens = 128\ntokens = 1280\n"
        'precision = "fp32"\ndevice = "cpu"\nthreads = 1\n'
    )
    assert main(["train", "c.toml", "--set", 'train.expect="missing.json"']) == 2
    err = capsys.readouterr().err
    assert "train.expect = 'missing.json': no such file" in err and "--target 16480,1280" in err
    assert not (run / "train" / "run.json").exists()  # stopped before the run was registered
    write_fit(tmp_path / "fit.json")
    assert main(["train", "c.toml", "--set", 'train.expect="fit.json"']) == 2
    err = capsys.readouterr().err
    assert "predicts a run of 1,000 non-embedding parameters" in err and "this run has 16,480 on 1,280" in err


def test_run_json_keeps_the_curve_registered_first(tmp_path):
    """A fresh run stores the curve; a resume under another curve records that one in its launch entry
    and keeps the first, which is the one that was pre-registered."""
    import torch

    from smelt.train.setup import write_run_manifest

    cfg, cpu = config_from_dict({}), torch.device("cpu")
    first, other = {"file": "a.json", "loss": [3.0]}, {"file": "b.json", "loss": [2.0]}
    write_run_manifest(tmp_path, cfg, {}, None, 0, 1, cpu, "fp32", first)
    write_run_manifest(tmp_path, cfg, {}, tmp_path / "step_1", 1, 1, cpu, "fp32", first)
    write_run_manifest(tmp_path, cfg, {}, tmp_path / "step_2", 2, 1, cpu, "fp32", other)
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["expected_trajectory"] == first
    assert [r.get("expected_trajectory") for r in manifest["resumes"]] == [None, other]
