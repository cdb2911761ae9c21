"""The trainer scores benchmark subsets in the loop and mirrors metrics.jsonl to TensorBoard."""

import copy
import json

import pytest

from smelt.train.trainer import train


@pytest.mark.slow
def test_training_logs_inloop_task_scores_and_tensorboard_scalars(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    root, cfg = tiny_run
    cfg = copy.deepcopy(cfg)
    cfg.train.micro_batch, cfg.train.tokens, cfg.train.log_every, cfg.train.eval_every = 2, 64 * 2 * 4, 1, 0
    cfg.train.precision, cfg.train.threads = "fp32", 1
    cfg.checkpoint.every_steps = 0
    cfg.eval.every_steps, cfg.eval.inloop_items = 2, 4
    cfg.eval.inloop_tasks = ["copa", "lambada"]
    cfg.train.tensorboard = True
    out = tmp_path / "train"
    train(cfg, root / "tokens", root / "tokenizer", out)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    inloop = [r for r in lines if r.get("inloop")]
    assert [r["step"] for r in inloop] == [2, 4]
    assert all(0 <= r["copa/acc"] <= 1 and r["lambada/perplexity"] > 1 for r in inloop)

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert any("loss" in t for t in tags) and any("copa/acc" in t for t in tags), sorted(tags)


@pytest.mark.slow
def test_inloop_scores_at_the_training_precision(tiny_run, tmp_path, monkeypatch):
    import torch

    from smelt.eval.inloop import InLoopEval

    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    seen: list[tuple[bool, torch.dtype]] = []
    scored = InLoopEval.__call__

    def spy(self, model, step):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return scored(self, model, step)

    monkeypatch.setattr(InLoopEval, "__call__", spy)
    root, cfg = tiny_run
    cfg = copy.deepcopy(cfg)
    cfg.train.micro_batch, cfg.train.tokens, cfg.train.eval_every = 2, 64 * 2 * 2, 0
    cfg.train.precision, cfg.train.threads = "bf16", 1
    cfg.checkpoint.every_steps = 0
    cfg.eval.every_steps, cfg.eval.inloop_items, cfg.eval.inloop_tasks = 1, 2, ["copa"]
    train(cfg, root / "tokens", root / "tokenizer", tmp_path / "train")
    assert seen == [(True, torch.bfloat16), (True, torch.bfloat16)]
