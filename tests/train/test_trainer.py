import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from helpers import VOCAB, write_split, write_token_data
from smelt.checkpoint import latest_checkpoint, load_model, read_meta
from smelt.config import StageConfig, config_from_dict
from smelt.errors import UserError
from smelt.model.transformer import Transformer
from smelt.train.trainer import train


@pytest.fixture
def data(tmp_path):
    return write_token_data(tmp_path)


def tiny_config(**train):
    raw = {
        "run": {"seed": 3},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32,
            "micro_batch": 4,
            "batch_tokens": 256,
            "tokens": 256 * 12,
            "lr": 3e-3,
            "log_every": 4,
            "eval_every": 5,
            "eval_tokens": 1024,
            "eval_budget": 0.0,  # every evaluation runs, however fast the steps (the budget is timing)
            "precision": "fp32",
            **train,
        },
        "checkpoint": {"every_steps": 4, "keep_last": 1},
    }
    return config_from_dict(raw)


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


@pytest.mark.slow
def test_train_end_to_end(data, tmp_path):
    tokens, tokenizer = data
    out = tmp_path / "run"
    summary = train(tiny_config(), tokens, tokenizer, out)
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 256
    assert summary["precision"] == "fp32" and summary["device"] == "cpu" and summary["peak_flops"] == 1e12
    assert summary["final_train_loss"] < math.log(VOCAB) - 0.5  # it learned something
    assert summary["tokens_per_s"] > 0 and summary["mfu"] > 0
    json.dumps(summary)  # goes into the stage manifest

    lines = read_metrics(out)
    train_lines = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train_lines] == [1, 4, 8, 12]
    first = train_lines[0]
    assert set(first) == {
        "kind",
        "step",
        "tokens",
        "loss",
        "lr",
        "grad_norm",
        "grad_norm_clipped",
        "clip_fraction",
        "skipped",
        "memory_mb",
        "clipped",
        "tokens_per_s",
        "mfu",
        "mfu_model",
        "stage",
        "loader_wait_s",
        "loader_wait_share",
        "elapsed_s",
        "time",
        "step_time_s",
        "checkpoint_wait_s",
        "step_time_p50_s",
        "step_time_p99_s",
    }
    assert all(r["stage"] == "main" and 0 <= r["loader_wait_share"] < 1 for r in train_lines)
    assert abs(first["loss"] - math.log(VOCAB)) < 0.1  # step-0 loss
    assert train_lines[-1]["loss"] < first["loss"]
    evals = [r for r in lines if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [5, 10, 12] and all(r["val_loss"] > 0 for r in evals)
    # A backlog alert (the previous async save still writing) depends on timing, not on the run.
    events = [
        (r["event"], r["step"])
        for r in lines
        if r["kind"] == "event" and r["event"] != "mixture" and r.get("alert") != "checkpoint_backlog"
    ]
    assert events == [
        ("start", 0),
        ("data_plan", 0),
        ("stage", 0),
        ("checkpoint", 4),
        ("checkpoint", 8),
        ("checkpoint", 12),
        ("end", 12),
    ]
    plan = next(r for r in lines if r.get("event") == "data_plan")
    assert plan["sources"]["synth"]["consumed"] == 12 * 8 and plan["stages"][0]["tokens"] == 12 * 256
    windows = [
        r for r in lines if r.get("event") == "mixture"
    ]  # 8 sequences a step: every 125 steps, and the last
    assert [w["step"] for w in windows] == [12] and windows[0]["realized"] == {"synth": 1.0}
    assert summary["final_val_loss"] == evals[-1]["val_loss"]

    # keep_last=1 plus the final: step 8 and step 12 survive, step 4 is pruned
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_0000008", "step_0000012"]
    final = latest_checkpoint(out / "checkpoints")
    assert str(final) == summary["checkpoint"]
    meta = read_meta(final)
    assert meta["step"] == 12 and meta["tokens"] == 12 * 256 and meta["loader"]["cursors"] == {"synth": 96}
    assert meta["vocab_size"] == VOCAB and len(meta["config_hash"]) == 64
    assert {"rank_00000.json", ".metadata"} <= set(meta["checksums"])
    assert "tokenizer_hash" in meta and meta["milestone"] is False

    model, _ = load_model(final)
    torch.manual_seed(0)
    again = Transformer(model.cfg, VOCAB)
    x = torch.randint(0, 256, (2, 32))
    logits, _ = model(x)
    assert not torch.equal(logits, again(x)[0])  # really the trained weights
    run = json.loads((out / "run.json").read_text())
    assert (
        run["config_hash"] == meta["config_hash"]
        and run["seeds"]["run"] == 3
        and run["launch"]["from_step"] == 0
    )
    assert {"code", "devices", "host"} <= set(run["launch"]) and run["libraries"][
        "torch"
    ] == torch.__version__
    assert json.loads((out / "summary.json").read_text())["steps"] == 12
    rank_state = json.loads((final / "rank_00000.json").read_text())
    assert set(rank_state["rng"]) >= {"python", "numpy", "torch_cpu"}
    saves = [r for r in lines if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saves] == [4, 8, 12] and all(r["async"] for r in saves)
    assert all(0 <= r["stall_s"] <= r["write_s"] for r in saves)


@pytest.mark.slow
def test_bitwise_identical_runs(data, tmp_path):
    tokens, tokenizer = data
    cfg = tiny_config(tokens=256 * 6, log_every=1, eval_every=0, precision="bf16")
    a = train(cfg, tokens, tokenizer, tmp_path / "a")
    b = train(cfg, tokens, tokenizer, tmp_path / "b")
    losses = [[r["loss"] for r in read_metrics(tmp_path / d) if r["kind"] == "train"] for d in ("a", "b")]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    assert a["final_val_loss"] == b["final_val_loss"]


def test_missing_val_split_skips_validation(data, tmp_path):
    tokens, tokenizer = data
    for f in (tokens / "val" / "synth").iterdir():
        f.unlink()
    summary = train(tiny_config(tokens=256 * 2, grad_clip=0.0), tokens, tokenizer, tmp_path / "run")
    assert summary["final_val_loss"] is None
    lines = read_metrics(tmp_path / "run")
    assert not [r for r in lines if r["kind"] == "eval"]
    assert any(r.get("event") == "note" and "validation" in r["message"] for r in lines)
    assert all(r["clipped"] is False for r in lines if r["kind"] == "train")


@pytest.mark.slow
def test_nan_loss_stops_with_event(data, tmp_path, monkeypatch):
    tokens, tokenizer = data
    real_forward = Transformer.forward

    def poisoned(self, idx, targets=None, **kw):
        logits, loss = real_forward(self, idx, targets, **kw)
        if isinstance(loss, dict):
            return logits, {name: value * float("nan") for name, value in loss.items()}
        return logits, loss * float("nan") if loss is not None else loss

    monkeypatch.setattr(Transformer, "forward", poisoned)
    # The default policy skips non-finite steps; the cap on consecutive skips then stops the run.
    with pytest.raises(RuntimeError, match="3 consecutive steps skipped.*step 3: loss is nan"):
        train(tiny_config(max_consecutive_skips=3), tokens, tokenizer, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    assert [r["step"] for r in lines if r.get("event") == "skip"] == [1, 2, 3]
    assert [r["alert"] for r in lines if r.get("alert") not in (None, "checkpoint_backlog")] == [
        "nonfinite"
    ] * 3
    assert lines[-1]["event"] == "end" and lines[-1]["status"] == "failed"

    with pytest.raises(RuntimeError, match="stopped by alert at step 1: loss is nan"):
        train(tiny_config(on_nonfinite="stop"), tokens, tokenizer, tmp_path / "stop")


@pytest.mark.slow
def test_grad_accumulation_matches_one_big_batch(data, tmp_path):
    tokens, tokenizer = data
    # 2 micro batches of 4 vs 1 of 8 see the same 8 windows in the same order: same first loss.
    a = train(
        tiny_config(tokens=512, batch_tokens=512, micro_batch=4, eval_every=0),
        tokens,
        tokenizer,
        tmp_path / "a",
    )
    b = train(
        tiny_config(tokens=512, batch_tokens=512, micro_batch=8, eval_every=0),
        tokens,
        tokenizer,
        tmp_path / "b",
    )
    assert a["final_train_loss"] == pytest.approx(b["final_train_loss"], rel=1e-5)


@pytest.mark.slow
def test_z_loss_is_optimized_but_the_logged_loss_is_cross_entropy(data, tmp_path):
    tokens, tokenizer = data
    plain, with_z = tiny_config(), tiny_config()
    with_z.model.z_loss = 1.0  # large, so that the first update differs visibly
    train(plain, tokens, tokenizer, tmp_path / "plain")
    train(with_z, tokens, tokenizer, tmp_path / "z")
    first = [
        next(m for m in read_metrics(tmp_path / name) if m["kind"] == "train") for name in ("plain", "z")
    ]
    assert first[0]["step"] == first[1]["step"] == 1
    assert first[0]["loss"] == first[1]["loss"]  # same weights, same batch: the same cross-entropy
    last = [[m for m in read_metrics(tmp_path / name) if m["kind"] == "train"][-1] for name in ("plain", "z")]
    assert last[0]["loss"] != last[1]["loss"]  # the z term changed the updates


TIMING = ("tokens_per_s", "mfu", "mfu_model", "loader_wait_s", "loader_wait_share", "elapsed_s", "memory_mb",
          "time", "step_time_s", "checkpoint_wait_s", "step_time_p50_s", "step_time_p99_s")  # fmt: skip


def train_figures(records: list[dict], after: int) -> list[dict]:
    """Train lines after step `after`, without the timing figures (which differ run to run)."""
    return [
        {k: v for k, v in r.items() if k not in TIMING}
        for r in records
        if r["kind"] == "train" and r["step"] > after
    ]


@pytest.mark.slow
def test_resume_across_a_stage_boundary_replays_nothing(data, tmp_path):
    tokens, tokenizer = data
    write_split(tokens, "train", 300, seed=5, source="other")
    cfg = tiny_config(tokens=256 * 8, log_every=1, eval_every=0)
    cfg.checkpoint.every_steps, cfg.checkpoint.keep_last = 3, 5
    cfg.tokens.mixture_window = 16  # windows of 2 steps: steps 3..4 straddle the checkpoint at step 3
    cfg.tokens.stages = [
        StageConfig(name="broad", fraction=0.5),
        StageConfig(name="focus", fraction=0.5, mixture={"other": 3, "synth": 1}),
    ]
    full = train(cfg, tokens, tokenizer, tmp_path / "full")
    assert full["stages"] == ["broad", "focus"] and full["resumed_from_step"] is None
    reference = read_metrics(tmp_path / "full")
    stages = [(r["step"], r["stage"]) for r in reference if r.get("event") == "stage"]
    assert stages == [(0, "broad"), (4, "focus")]  # focus starts with step 5
    # Train loss per source: each step's token-weighted mix of the two is the logged loss.
    for r in (r for r in reference if r["kind"] == "train"):
        assert set(r["loss_by_source"]) <= {"other", "synth"} and r["loss_by_source"]
        assert (
            min(r["loss_by_source"].values()) - 1e-6 <= r["loss"] <= max(r["loss_by_source"].values()) + 1e-6
        )

    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_0000003", run / "checkpoints" / "step_0000003")
    resumed = train(cfg, tokens, tokenizer, run, resume="auto")
    assert resumed["resumed_from_step"] == 3 and resumed["final_train_loss"] == full["final_train_loss"]
    lines = read_metrics(run)
    assert (
        lines[0]["event"] == "resume" and lines[0]["step"] == 3 and lines[0]["from"].endswith("step_0000003")
    )
    assert len(train_figures(lines, 3)) == 5
    assert train_figures(lines, 3) == train_figures(reference, 3)  # the same batches: the same losses
    mixture = [r for r in reference if r.get("event") == "mixture" and r["step"] > 3]
    assert [r["step"] for r in mixture] == [4, 6, 8]
    assert [r for r in lines if r.get("event") == "mixture"] == mixture
    assert [r["stage"] for r in lines if r.get("event") == "stage"] == ["focus"]


@pytest.mark.slow
def test_resume_auto_without_checkpoint_starts_fresh_and_a_finished_run_only_finishes(data, tmp_path):
    tokens, tokenizer = data
    cfg = tiny_config(tokens=256 * 2, eval_every=0)
    first = train(cfg, tokens, tokenizer, tmp_path / "run", resume="auto")
    assert first["resumed_from_step"] is None
    # Killed after the final checkpoint, before the stage was recorded: auto finishes without training.
    again = train(cfg, tokens, tokenizer, tmp_path / "run", resume="auto")
    assert again["resumed_from_step"] == 2 and again["final_train_loss"] == first["final_train_loss"]
    assert again["final_val_loss"] == first["final_val_loss"]
    with pytest.raises(
        UserError,
        match=r"is at step 2, the end of this run \(2 steps\).*without resume or into another directory",
    ):
        train(
            cfg, tokens, tokenizer, tmp_path / "run", resume=tmp_path / "run" / "checkpoints" / "step_0000002"
        )
    with pytest.raises(UserError, match="no such checkpoint directory"):
        train(cfg, tokens, tokenizer, tmp_path / "run", resume=tmp_path / "nowhere")


@pytest.mark.parametrize("masking", [True, False])
@pytest.mark.slow
def test_doc_masking_feeds_document_boundaries(data, tmp_path, monkeypatch, masking):
    tokens, tokenizer = data
    seen = []
    real_forward = Transformer.forward

    def recording(self, idx, targets=None, **kw):
        if self.training:
            seen.append(kw.get("doc_ids"))
        return real_forward(self, idx, targets, **kw)

    monkeypatch.setattr(Transformer, "forward", recording)
    train(tiny_config(tokens=256 * 2, eval_every=0, doc_masking=masking), tokens, tokenizer, tmp_path / "run")
    assert len(seen) == 4  # 2 steps x 2 micro batches
    if masking:
        assert all(d is not None and d.shape == (4, 32) for d in seen)
        assert any(int(d.max()) > 0 for d in seen)  # documents of 20..120 tokens: several per row
    else:
        assert all(d is None for d in seen)


@pytest.mark.slow
def test_batch_ramp_run_logs_growing_batches_and_resumes_mid_ramp_exactly(data, tmp_path):
    tokens, tokenizer = data
    cfg = tiny_config(
        tokens=256 * 6, log_every=1, eval_every=0, batch_ramp_tokens=256 * 3, batch_ramp_start=128
    )
    cfg.checkpoint.every_steps, cfg.checkpoint.keep_last = 3, 5
    full = train(cfg, tokens, tokenizer, tmp_path / "full")
    lines = read_metrics(tmp_path / "full")
    start = lines[0]
    assert start["batch_ramp"]["start_tokens"] == 128
    batches = [r["batch_tokens"] for r in lines if r["kind"] == "train"]
    assert batches[0] == 128 and batches[-1] == 256 and batches == sorted(batches)
    assert sum(batches) == full["tokens"] == 256 * 6
    assert [r["tokens"] for r in lines if r["kind"] == "train"][-1] == 256 * 6

    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_0000003", run / "checkpoints" / "step_0000003")
    resumed = train(cfg, tokens, tokenizer, run, resume="auto")
    assert resumed["resumed_from_step"] == 3
    assert train_figures(read_metrics(run), 3) == train_figures(lines, 3)  # the same batches, the same losses
