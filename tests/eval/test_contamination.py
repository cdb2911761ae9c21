"""The contamination meter's statistic, its items and controls, and its command's user errors."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest

from smelt.eval.contamination import controls_of, memorisation, paired_test, probe, t_cdf


def test_t_distribution_matches_the_tables():
    assert t_cdf(-1.812461, 10) == pytest.approx(0.05, abs=1e-6)  # t(0.95, 10)
    assert t_cdf(-2.527977, 20) == pytest.approx(0.01, abs=1e-6)  # t(0.99, 20)
    assert t_cdf(-12.706205, 1) == pytest.approx(0.025, abs=1e-6)  # t(0.975, 1): Cauchy
    assert t_cdf(1.812461, 10) == pytest.approx(0.95, abs=1e-6) and t_cdf(0.0, 7) == 0.5
    assert t_cdf(-1.959964, 1e7) == pytest.approx(0.025, abs=1e-5)  # the normal limit


def test_paired_t_is_mean_difference_over_its_standard_error():
    gold, control = [1.0, 2.0, 3.0, 4.0], [1.5, 2.1, 3.9, 4.5]
    diffs = [-0.5, -0.1, -0.9, -0.5]
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    f = paired_test(gold, control, k=4.0)
    assert f["mean_difference"] == pytest.approx(mean) and f["sd_difference"] == pytest.approx(sd)
    assert f["t"] == pytest.approx(mean / (sd / 2)) and f["effect_size"] == pytest.approx(mean / sd)
    assert f["p_value"] == pytest.approx(t_cdf(f["t"], 3)) and f["below_share"] == 1.0
    assert f["t"] == pytest.approx(-3.0619, abs=1e-4) and not f["flagged"]  # not below -4
    assert paired_test(gold, control, k=2.5)["flagged"]


def test_the_flag_needs_items_that_sit_below_their_controls_beyond_chance():
    rng = random.Random(0)
    control = [rng.gauss(3.0, 0.5) for _ in range(100)]
    noise = [c + rng.gauss(0.0, 0.2) for c in control]  # no preference: gold as likely above as below
    leaked = [c - 0.3 + rng.gauss(0.0, 0.2) for c in control]
    assert not paired_test(noise, control, 4.0)["flagged"]
    assert abs(paired_test(noise, control, 4.0)["t"]) < 3
    assert paired_test(leaked, control, 4.0)["flagged"]
    assert paired_test(leaked, control, 4.0)["t"] < -10  # paired: the items' own spread cancels
    same_shift = paired_test([2.5, 3.0, 3.5], [3.0, 3.5, 4.0], 4.0)  # no spread to standardise by
    assert same_shift["t"] is None and same_shift["flagged"]
    assert not paired_test([1.0], [2.0], 4.0)["flagged"] and paired_test([], [], 4.0)["items"] == 0


def test_controls_swap_the_answer_in_each_record_shape():
    mc = [{"query": "Sky is", "choices": ["blue", "green", "red"], "gold": 0}]
    assert controls_of(mc, 0) == ["Sky is green", "Sky is red"]
    schema = [{"contexts": ["A cat", "A dog"], "continuation": "barks", "gold": 1}]
    assert controls_of(schema, 0) == ["A cat barks"]
    completion = [
        {"context": "one two", "continuation": "three"},
        {"context": "four", "continuation": "five"},
    ]
    assert controls_of(completion, 0) == ["one two five"] and controls_of(completion, 1) == ["four three"]
    same = [{"question": "q1", "answer": "7"}, {"question": "q2", "answer": "7"}]
    assert controls_of(same, 0) == []  # no other answer to swap in: the item is skipped
    p = probe(same + [{"question": "q3", "answer": "8"}])
    assert p.kind == "swapped answers" and p.skipped == 0 and p.controls[0] == ["q1 8"]
    assert probe(same).skipped == 2 and probe(mc).gold == ["Sky is blue"]


def test_memorisation_per_exposure_against_unseen_controls():
    canaries = [{"copies": 1}, {"copies": 1}, {"copies": 4}]
    figures = memorisation(canaries, [3.0, 3.2, 2.0], [3.0, 3.2, 3.4])
    assert figures["controls"]["bits_per_byte"] == pytest.approx(3.2)
    assert figures["controls"]["sd"] == pytest.approx(0.2)
    one, four = figures["levels"]
    assert (one["copies"], one["strings"], four["copies"]) == (1, 2, 4)
    assert one["memorisation"] == pytest.approx(0.1) and four["memorisation"] == pytest.approx(1.2)
    assert four["z"] == pytest.approx(6.0)


def test_meter_scores_every_task_shape_on_a_checkpoint(tiny_run):
    from smelt.eval.contamination_run import evaluate_contamination, read_results

    root, cfg = tiny_run
    cfg = copy.deepcopy(cfg)
    cfg.eval.contamination_tasks = ["copa", "winogrande", "lambada", "gsm8k"]
    (result,) = evaluate_contamination(cfg, "2", items=0)
    tasks = result["tasks"]
    assert {n: t["controls"] for n, t in tasks.items()} == {
        "copa": "distractors",
        "winogrande": "other contexts",
        "lambada": "swapped continuations",
        "gsm8k": "swapped answers",
    }
    assert tasks["copa"]["items"] == 12 and tasks["winogrande"]["items"] == 10
    assert all(t["t"] is not None and math.isfinite(t["gold_bits_per_byte"]) for t in tasks.values())
    assert result["step"] == 2 and read_results(root) == [json.loads(json.dumps(result))]


def _run_dir(tmp_path, tiny_run, **eval_keys):
    root, cfg = tiny_run
    run = tmp_path / "run"
    run.mkdir()
    for stage in ("documents", "tokenizer", "tokens", "train"):
        (run / stage).symlink_to(root / stage)
    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    for key, value in eval_keys.items():
        setattr(cfg.eval, key, value)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    return run


@pytest.mark.parametrize(
    ("args", "keys", "says"),
    [
        (["--tasks", "passkey"], {}, ["--tasks names 'passkey'", "Drop it from --tasks"]),
        ([], {"contamination_tasks": ["passkey"]}, ["eval.contamination_tasks names 'passkey'"]),
        ([], {"tasks": []}, ["eval.tasks is empty", "eval.contamination_tasks"]),
        (["--data", "x.txt"], {}, ["--contamination and --data"]),
        (["--limit", "-1"], {}, ["--limit -1 must be 0"]),
    ],
)
def test_user_errors_name_the_key_and_the_fix(tmp_path, tiny_run, capsys, args, keys, says):
    from smelt.cli import main

    run = _run_dir(tmp_path, tiny_run, **keys)
    assert main(["eval", str(run), "--contamination", *args]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in says), err
    assert "Traceback" not in err
