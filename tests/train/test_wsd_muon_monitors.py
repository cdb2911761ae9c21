"""WSD and the other schedules, stage re-warmup, Muon, and per-layer update ratios."""

import math

import pytest
import torch

from smelt.errors import ConfigError
from smelt.train.muon import Muon, newton_schulz
from smelt.train.schedule import Schedule, decay_factor, lr_at
from smelt.train.trainer import train

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture


def test_wsd_is_flat_then_decays_to_the_floor():
    s = Schedule("wsd", lr=1.0, warmup=10, total_steps=100, min_lr_ratio=0.1, decay_fraction=0.2)
    assert s(0) == pytest.approx(0.1) and s(9) == 1.0
    assert all(s(k) == 1.0 for k in range(10, 80))
    assert s.wsd_decay_start == 80 and s(99) == pytest.approx(0.1)
    decay = [s(k) for k in range(80, 100)]
    assert all(a > b for a, b in zip(decay[:-1], decay[1:], strict=True))
    # 1-sqrt stays below linear: it drops fastest at the start of the tail.
    linear = Schedule("wsd", lr=1.0, warmup=10, total_steps=100, decay_shape="linear")
    assert s(85) < linear(85)


def test_wsd_branch_from_a_stable_checkpoint_only_changes_the_tail():
    main = Schedule("wsd", lr=1.0, warmup=10, total_steps=100)
    branch = Schedule("wsd", lr=1.0, warmup=10, total_steps=100, decay_start=50)
    assert [main(k) for k in range(50)] == [branch(k) for k in range(50)]
    assert branch(51) < 1.0 and branch(99) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="stable phase"):
        Schedule("wsd", lr=1.0, warmup=10, total_steps=100, decay_start=5)


def test_decay_shapes_and_other_schedules():
    for shape in ("linear", "cosine", "1-sqrt"):
        assert decay_factor(0.0, shape) == 1.0 and decay_factor(1.0, shape) == pytest.approx(0.0)
    assert decay_factor(0.25, "1-sqrt") == pytest.approx(0.5)
    cos = Schedule("cosine", lr=2.0, warmup=5, total_steps=50, min_lr_ratio=0.1)
    assert [cos(k) for k in range(50)] == [
        lr_at(k, lr=2.0, warmup=5, total_steps=50, min_lr_ratio=0.1) for k in range(50)
    ]
    const = Schedule("constant", lr=2.0, warmup=5, total_steps=50)
    assert const(49) == 2.0
    multi = Schedule("multistep", lr=1.0, warmup=1, total_steps=100, milestones=(0.5, 0.9), gamma=0.1)
    assert multi(49) == 1.0 and multi(50) == pytest.approx(0.1) and multi(95) == pytest.approx(0.01)


def test_rewarmup_at_stage_boundaries():
    s = Schedule("constant", lr=1.0, warmup=2, total_steps=40, rewarmup=4, stage_starts=(20,))
    assert s(19) == 1.0
    assert [s(k) for k in range(20, 25)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_newton_schulz_orthogonalises():
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    o = newton_schulz(g)
    singular = torch.linalg.svdvals(o)
    assert o.shape == g.shape and singular.min() > 0.5 and singular.max() < 1.3  # ~1, not g's spread
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 2


@pytest.mark.slow
def test_muon_trains_and_monitor_logs_update_ratios(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    cfg = tiny_config(optimizer="muon", muon_lr=0.02, monitor_every=4, eval_every=0, schedule="wsd")
    summary = train(cfg, tokens, tokenizer, tmp_path / "run")
    assert summary["final_train_loss"] < math.log(384) - 0.5
    lines = read_metrics(tmp_path / "run")
    layers = [r for r in lines if r["kind"] == "layers"]
    assert [r["step"] for r in layers] == [4, 8, 12]
    ratios = layers[0]["layers"]
    assert "blocks.0.attn.wq.weight" in ratios and "tok_emb.weight" in ratios
    assert all(0 < v["update_ratio"] < 1 and v["weight_norm"] > 0 for v in ratios.values())
    assert start_event(lines)["schedule"] == "wsd"


def start_event(lines):
    return next(r for r in lines if r.get("event") == "start")


def test_muon_groups_hidden_matrices_only():
    from smelt.model.transformer import Transformer
    from smelt.train.optim import build_optimizer, set_lr

    cfg = tiny_config(optimizer="muon", muon_lr=0.02, lr=1e-3)
    model = Transformer(cfg.model, 384)
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    assert isinstance(opt, Muon)
    muon = [g for g in opt.param_groups if g["muon"]]
    assert len(muon) == 1 and all(p.ndim == 2 for p in muon[0]["params"])
    assert all(p is not model.tok_emb.weight for p in muon[0]["params"])
    set_lr(opt, 5e-4)
    assert muon[0]["lr"] == pytest.approx(0.01) and opt.param_groups[1]["lr"] == pytest.approx(5e-4)


def test_bad_wsd_decay_start_is_a_config_error(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    with pytest.raises(ConfigError, match="decay_start_step"):
        train(tiny_config(schedule="wsd", decay_start_step=100), tokens, tokenizer, tmp_path / "run")


@pytest.mark.slow
def test_val_loss_per_source_and_rewarmup_at_a_stage_boundary(data, tmp_path):  # noqa: F811
    from smelt.config import StageConfig

    from .test_trainer import write_split

    tokens, tokenizer = data
    write_split(tokens, "train", 300, seed=5, source="other")
    write_split(tokens, "val", 20, seed=6, source="other")
    cfg = tiny_config(tokens=256 * 8, log_every=1, eval_every=0, schedule="constant", rewarmup_tokens=512)
    cfg.tokens.stages = [
        StageConfig(name="broad", fraction=0.5),
        StageConfig(name="focus", fraction=0.5, mixture={"other": 3, "synth": 1}),
    ]
    train(cfg, tokens, tokenizer, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    evals = [r for r in lines if r["kind"] == "eval"]
    assert set(evals[-1]["val_loss_by_source"]) == {"other", "synth"}
    lrs = {r["step"]: r["lr"] for r in lines if r["kind"] == "train"}
    focus = next(r["first_step"] for r in lines if r.get("event") == "stage" and r["stage"] == "focus")
    # Two re-warmup steps (512 tokens / 256 per step): 1/3, 2/3 of the peak, then the peak again.
    assert [lrs[focus + i] / 3e-3 for i in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert lrs[focus - 1] == pytest.approx(3e-3)
