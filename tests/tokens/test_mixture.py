"""Data plans: mixtures, epoch multipliers, curricula, their checks, and the mixture monitor."""

from __future__ import annotations

import pytest

from smelt.config import StageConfig, TokensConfig, config_from_dict
from smelt.errors import ConfigError, UserError
from smelt.tokens.mixture import MixtureMonitor, build_plan

SIZES = {"web": 100_001, "code": 50_001, "wiki": 10_001}  # 10,000 / 5,000 / 1,000 sequences of 10 tokens


def plan(steps=100, batch=20, seq_len=10, **tokens):
    return build_plan(TokensConfig(**tokens), SIZES, seq_len, batch, steps, seed=0)


def test_natural_proportions_by_default():
    p = plan()
    assert p.sequences == {"code": 5000, "web": 10000, "wiki": 1000}
    (stage,) = p.stages
    assert (stage.name, stage.first_step, stage.last_step) == ("main", 1, 100)
    assert stage.weights == pytest.approx({"code": 5 / 16, "web": 10 / 16, "wiki": 1 / 16})
    assert sum(stage.counts.values()) == 2000 and stage.counts["web"] == 1250
    assert p.stage_at(1) is stage and p.stage_at(100) is stage
    assert "no padding" in p.table() and not p.warnings


def test_weights_are_normalized_and_unnamed_sources_get_none():
    p = plan(mixture={"web": 3, "code": 1})
    assert p.stages[0].weights == {"code": 0.25, "web": 0.75, "wiki": 0.0}
    assert p.stages[0].counts == {"code": 500, "web": 1500, "wiki": 0}
    assert p.epochs("web") == pytest.approx(0.15) and p.consumed("wiki") == 0


def test_epoch_multipliers_become_proportions_and_warn_past_four_epochs():
    p = plan(steps=500, epochs={"wiki": 6.0, "web": 1.0, "code": 1.0}, allow_repeat=True)
    # 6 x 1,000 : 10,000 : 5,000 sequences -> the run's 10,000 sequences split 6 : 10 : 5
    assert p.stages[0].counts == {"code": 2381, "web": 4762, "wiki": 2857}
    assert p.epochs("wiki") == pytest.approx(2.857)
    assert not p.warnings
    heavy = plan(steps=2000, epochs={"wiki": 6.0, "web": 1.0, "code": 1.0}, allow_repeat=True)
    assert heavy.epochs("wiki") > 4 and "'wiki' is repeated 11.4 times" in heavy.warnings[0]
    assert "warning: source 'wiki'" in heavy.table()


def test_curriculum_stages_on_whole_steps():
    stages = [
        StageConfig(name="broad", fraction=0.7),
        StageConfig(name="math", tokens=5_000, mixture={"wiki": 1, "web": 1}),
        StageConfig(name="anneal", fraction=0.05, mixture={"code": 1}),
    ]
    p = build_plan(TokensConfig(stages=stages), SIZES, 10, 20, 100, seed=0, train_tokens=20_000)
    # 20,000 train tokens = 100 steps of 200 tokens: 70% = 70 steps, 5,000 tokens = 25 steps, 5% = 5 steps
    assert [(s.name, s.first_step, s.last_step) for s in p.stages] == [
        ("broad", 1, 70),
        ("math", 71, 95),
        ("anneal", 96, 100),
    ]
    assert (
        p.stage_at(70).name == "broad" and p.stage_at(71).name == "math" and p.stage_at(96).name == "anneal"
    )
    math_stage = p.stages[1]
    assert math_stage.counts == {"code": 0, "web": 250, "wiki": 250}
    assert math_stage.offsets == p.stages[0].counts  # sources continue where the previous stage stopped
    assert p.stages[2].offsets["web"] == p.stages[0].counts["web"] + 250
    table = p.table()
    assert "broad" in table and "71-95" in table and "anneal" in table


def test_unknown_sources_name_the_key_and_the_sources_present():
    with pytest.raises(
        UserError, match=r"tokens.mixture names source\(s\) 'wikipedia'.*present are code, web, wiki"
    ):
        plan(mixture={"wikipedia": 1.0, "web": 1.0})
    with pytest.raises(UserError, match=r"tokens.epochs names source\(s\) 'books'"):
        plan(epochs={"books": 2.0})
    with pytest.raises(UserError, match=r"tokens.stages\[1\].mixture names source\(s\) 'math'"):
        plan(stages=[StageConfig(fraction=0.5), StageConfig(fraction=0.5, mixture={"math": 1})])


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"mixture": {"web": 1}, "epochs": {"web": 1}}, "tokens.mixture and tokens.epochs are both set"),
        (
            {"mixture": {"web": -1, "code": 2}},
            r"tokens.mixture.web = -1 is negative; weights and epochs must be >= 0",
        ),
        ({"mixture": {"web": "a lot"}}, r"tokens.mixture.web = 'a lot' must be a number"),
        ({"mixture": {"web": 0}}, "tokens.mixture gives every source weight 0"),
        (
            {"stages": [StageConfig(tokens=10_000, fraction=0.5)]},
            r"tokens.stages\[0\].*exactly one of tokens and",
        ),
        ({"stages": [StageConfig(name="a")]}, r"tokens.stages\[0\] \(a\) must set exactly one"),
        (
            {"stages": [StageConfig(fraction=0.5), StageConfig(fraction=0.4)]},
            r"tokens.stages budgets add up to 18,000 tokens, 0.9000 of train.tokens = 20,000; make the fractions",
        ),
        (
            {"stages": [StageConfig(name="tiny", fraction=0.001), StageConfig(fraction=0.999)]},
            r"tokens.stages\[0\] \(tiny\) gets no optimizer step",
        ),
        (
            {"stages": [StageConfig(name="x", fraction=0.5), StageConfig(name="x", fraction=0.5)]},
            "tokens.stages names repeat",
        ),
    ],
)
def test_config_errors_name_the_key(tokens, message):
    with pytest.raises(ConfigError, match=message):
        plan(**tokens)


def test_running_out_is_an_error_unless_repetition_is_allowed():
    stages = [
        StageConfig(name="broad", fraction=0.5),
        StageConfig(name="wiki-heavy", fraction=0.5, mixture={"wiki": 1}),
    ]
    with pytest.raises(
        UserError,
        match=r"source 'wiki' runs out in stage 'wiki-heavy'.*1.06 epochs.*tokens.allow_repeat = true",
    ):
        plan(stages=stages)
    repeated = plan(stages=stages, allow_repeat=True)
    assert repeated.epochs("wiki") == pytest.approx(1.062)  # 62 of 1,000 in stage 1, all 1,000 in stage 2


def test_sources_too_small_for_a_sequence():
    with pytest.raises(UserError, match=r"source 'tiny' has 5 tokens, fewer than one sequence"):
        build_plan(TokensConfig(mixture={"tiny": 1, "web": 1}), {"tiny": 5, "web": 1000}, 10, 2, 3, seed=0)
    with pytest.raises(UserError, match="too few for one sequence of train.seq_len"):
        build_plan(TokensConfig(), {"tiny": 5}, 10, 2, 3, seed=0)


def test_stages_from_toml_config():
    cfg = config_from_dict(
        {
            "tokens": {
                "mixture": {"web": 2, "code": 1},
                "stages": [
                    {"name": "broad", "fraction": 0.8},
                    {"name": "anneal", "fraction": 0.2, "mixture": {"code": 1}},
                ],
            }
        }
    )
    assert cfg.tokens.stages[1].mixture == {"code": 1} and cfg.tokens.stages[0].name == "broad"
    assert "stages" in cfg.tokens.loader_settings() and "shard_tokens" not in cfg.tokens.loader_settings()
    assert cfg.tokens.shard_settings() == {"shard_tokens": 100_000_000, "bos": False}
    with pytest.raises(
        ConfigError, match=r"unknown key tokens.stages\[0\].weight.*name, tokens, fraction, mixture"
    ):
        config_from_dict({"tokens": {"stages": [{"weight": {"web": 1}}]}})


def test_monitor_reports_windows_and_alerts_on_drift():
    p = plan(steps=100, batch=20, mixture={"web": 0.5, "code": 0.5})
    monitor = MixtureMonitor(p, window=100, tolerance=0.015)
    events = []
    for step in range(1, 11):
        events += monitor.update(step, {"web": 10, "code": 10})
    windows = [e for e in events if e["event"] == "mixture"]
    assert [(e["first_step"], e["step"]) for e in windows] == [(1, 5), (6, 10)]
    assert windows[0]["realized"] == {"code": 0.5, "web": 0.5, "wiki": 0.0} and windows[0]["max_drift"] == 0
    assert not [e for e in events if e["event"] == "alert"]
    drifted = []
    for step in range(11, 16):
        drifted += monitor.update(step, {"web": 12, "code": 7, "wiki": 1})
    (alert,) = [e for e in drifted if e["event"] == "alert"]
    assert alert["alert"] == "mixture_drift" and alert["step"] == 15 and alert["source"] == "code"
    assert alert["realized"] == 0.35 and alert["target"] == 0.5 and "steps 11..15" in alert["message"]
    assert [e["max_drift"] for e in drifted if e["event"] == "mixture"] == [0.15]
    assert monitor.window_start(13) == 11 and monitor.window_start(11) == 11 and monitor.window_start(3) == 1
    resumed = MixtureMonitor(p, window=100, tolerance=0.015)
    # steps 11..13 were consumed before the checkpoint
    resumed.resume(14, lambda step: {"web": 12, "code": 7, "wiki": 1})
    assert resumed.update(14, {"web": 12, "code": 7, "wiki": 1}) == []
    assert resumed.update(15, {"web": 12, "code": 7, "wiki": 1}) == drifted
