"""Evaluating checkpoints of a run: step files, skipping, curves, gallery, contamination, bad input, CLI."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from smelt.cli import main
from smelt.errors import UserError
from smelt.eval.inloop import InLoopEval
from smelt.eval.results import task_set_version
from smelt.eval.run import evaluate_checkpoints
from smelt.manifest import hash_file, write_json


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the tiny run, so tests can write into it."""
    root, cfg = tiny_run
    copy_root = tmp_path / "run"
    shutil.copytree(root, copy_root)
    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    return copy_root, cfg


@pytest.mark.slow
def test_all_checkpoints_get_step_files_curves_and_gallery_then_are_skipped(run):
    root, cfg = run
    results = evaluate_checkpoints(cfg, root, "all")
    assert [r["step"] for r in results] == [1, 2]
    step = json.loads((root / "eval" / "step_0000002.json").read_text())
    assert step["task_set_version"] == task_set_version(step["keys"])
    assert set(step["keys"]["tasks"]) == {"copa", "winogrande", "lambada"}
    assert step["heldout"]["overall"]["bits_per_byte"] > 0 and step["samples"]
    assert set(step["tasks"]) == {"copa", "winogrande", "lambada"}
    copa = step["tasks"]["copa"]
    assert (
        copa["items"] == 12
        and 0 <= copa["acc"] <= 1
        and copa["chance"] == 0.5
        and "contamination" not in copa
    )
    assert step["tasks"]["lambada"]["perplexity"] > 1
    curves = [json.loads(line) for line in (root / "eval" / "curves.jsonl").read_text().splitlines()]
    assert [c["step"] for c in curves] == [1, 2] and all(c["kind"] == "eval" for c in curves)
    assert curves[1]["tasks"]["copa"]["acc"] == copa["acc"] and curves[1]["bits_per_byte"] > 0
    gallery = json.loads((root / "eval" / "gallery.json").read_text())
    assert gallery["steps"] == [1, 2] and [p["prompt"] for p in gallery["prompts"]] == cfg.eval.prompts
    assert set(gallery["prompts"][0]["completions"]) == {"1", "2"}
    # Different weights, so the gallery shows two different answers side by side.
    assert step["tasks"]["lambada"]["perplexity"] != results[0]["tasks"]["lambada"]["perplexity"]

    before = (root / "eval" / "step_0000001.json").stat().st_mtime_ns
    again = evaluate_checkpoints(cfg, root, "all")
    assert "wall_time_s" not in again[0]  # read back, not recomputed
    assert (root / "eval" / "step_0000001.json").stat().st_mtime_ns == before
    fewer = evaluate_checkpoints(cfg, root, "1", tasks=["copa"], limit=4)
    assert fewer[0]["tasks"]["copa"]["items"] == 4 and "wall_time_s" in fewer[0]
    # Re-scoring a checkpoint is deterministic: the same bytes.
    first = (root / "eval" / "step_0000001.json").read_bytes()
    (root / "eval" / "step_0000001.json").unlink()
    evaluate_checkpoints(cfg, root, "1")
    evaluate_checkpoints(cfg, root, "1", tasks=["copa"], limit=4)
    assert (root / "eval" / "step_0000001.json").read_bytes() == first


@pytest.mark.slow
def test_contamination_is_reported_next_to_the_score(run):
    root, cfg = run
    from smelt.config import EvalSetConfig

    tasks_dir = cfg.eval.tasks_dir
    cfg.data.decontam.evals = [EvalSetConfig(name="copa_check", path=f"{tasks_dir}/copa", format="mosaic")]
    report = {"copa_check": {"items": 12, "items_too_short": 12, "items_matched": 0, "documents": 0,
                             "action": "remove"}}  # fmt: skip
    write_json(root / "documents" / "decontamination.json", report)
    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=["copa", "lambada"])
    assert result["tasks"]["copa"]["contamination"]["benchmark"] == "copa_check"
    assert result["tasks"]["copa"]["contamination"]["items_too_short"] == 12
    assert "contamination" not in result["tasks"]["lambada"]


def test_checkpoint_with_another_tokenizer_is_refused(run):
    root, cfg = run
    meta_path = root / "train" / "checkpoints" / "step_0000002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    write_json(meta_path, {**meta, "tokenizer_hash": "0" * 64})
    with pytest.raises(UserError, match="trained with tokenizer 000000000000"):
        evaluate_checkpoints(cfg, root, "2")
    write_json(meta_path, {**meta, "vocab_size": meta["vocab_size"] + 128})
    with pytest.raises(UserError, match="not the tokenizer the model was trained with"):
        evaluate_checkpoints(cfg, root, "2")


@pytest.mark.slow
def test_bad_checkpoint_and_task_arguments(run):
    root, cfg = run
    with pytest.raises(UserError, match="step_0000009 does not exist.*step_0000001, step_0000002"):
        evaluate_checkpoints(cfg, root, "9")
    with pytest.raises(UserError, match="must be `latest`, `all`, a step number or a checkpoint directory"):
        evaluate_checkpoints(cfg, root, "best")
    with pytest.raises(UserError, match="unknown task 'nope'"):
        evaluate_checkpoints(cfg, root, "2", tasks=["nope"])
    with pytest.raises(UserError, match="hellaswag.*does not exist"):
        evaluate_checkpoints(cfg, root, "2", tasks=["hellaswag"])
    cfg.eval.overlong = "error"  # what the task cache checks against comes from the checkpoint
    meta_path = root / "train" / "checkpoints" / "step_0000001" / "meta.json"
    meta = json.loads(meta_path.read_text())
    write_json(meta_path, {**meta, "model_config": {**meta["model_config"], "max_seq_len": 16}})
    # meta.json is checksummed by the commit marker: re-stamp it, as a checkpoint saved this way would be.
    write_json(meta_path.parent / "COMMITTED", {"step": 1, "meta_sha256": hash_file(meta_path)})
    # Held-out loss is scored in windows of train.seq_len: longer than the checkpoint's context is a user
    # error naming the key and the fix (it was a bare ValueError from the model's forward).
    with pytest.raises(
        UserError, match=r"train.seq_len = 64 is longer than .*step_0000001 \(16 tokens.*seq_len=16"
    ):
        evaluate_checkpoints(cfg, root, "1", tasks=["lambada"])
    cfg.train.seq_len = 16
    with pytest.raises(UserError, match="context is 16"):
        evaluate_checkpoints(cfg, root, "1", tasks=["lambada"])
    cfg.eval.overlong = "skip"
    (result,) = evaluate_checkpoints(cfg, root, "1", tasks=["lambada"])
    lambada = result["tasks"]["lambada"]
    assert lambada["skipped"] >= 6 and lambada["skipped"] + lambada["items"] == 8
    cfg.model.max_seq_len = 16
    with pytest.raises(UserError, match="context is 16"):  # the in-loop evaluator checks the config's
        cfg.eval.overlong, cfg.eval.every_steps = "error", 1
        InLoopEval(cfg, root / "tokenizer", torch.device("cpu"))


@pytest.mark.slow
def test_without_benchmark_files_only_heldout_is_scored(run, monkeypatch):
    import smelt.eval.run
    import smelt.eval.tasks

    root, cfg = run
    shared = Path(cfg.eval.tasks_dir)
    cfg.eval.tasks_dir = ""
    monkeypatch.setattr(smelt.eval.tasks, "find_tasks_dir", lambda: None)
    monkeypatch.setattr(smelt.eval.run, "find_tasks_dir", lambda: None)
    (result,) = evaluate_checkpoints(cfg, root, "2")
    assert result["tasks"] == {} and result["heldout"]["overall"]["bits_per_byte"] > 0
    # A task named by its task file brings its own files along.
    tasks = root.parent / "own"
    (tasks / "copa").mkdir(parents=True)
    shutil.copy(shared / "copa" / "mosaic_copa_validation.jsonl", tasks / "copa")
    (tasks / "mine.toml").write_text(
        'path = "copa/mosaic_copa_validation.jsonl"\nreader = "mosaic"\nformulation = "cloze"\n'
    )
    cfg.eval.tasks = ["copa", str(tasks / "mine.toml")]
    (result,) = evaluate_checkpoints(cfg, root, "2")
    assert set(result["tasks"]) == {"mine"} and result["tasks"]["mine"]["items"] == 12


@pytest.mark.slow
def test_cli_eval_all_with_tasks_and_limit(run, capsys):
    root, cfg = run
    write_json(root / "config.json", cfg.to_dict())
    assert main(["eval", str(root), "--checkpoint", "all", "--tasks", "copa,winogrande", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "copa: acc" in out and "(3 items, 0-shot, chance 0.500)" in out
    step = json.loads((root / "eval" / "step_0000001.json").read_text())
    assert set(step["tasks"]) == {"copa", "winogrande"}
    assert main(["eval", str(root), "--checkpoint", "last"]) == 2
    assert "must be `latest`, `all`, a step number or a checkpoint directory" in capsys.readouterr().err
    assert main(["eval", str(root), "--tasks", "copa", "--limit", "-1"]) == 2


@pytest.mark.slow
def test_inloop_eval_scores_a_plain_module(run):
    root, cfg = run
    from smelt.checkpoint.store import load_model

    cfg.eval.every_steps = 10
    cfg.eval.inloop_items = 5
    inloop = InLoopEval(cfg, root / "tokenizer", torch.device("cpu"))
    assert inloop.due(20) and not inloop.due(15)
    model, _ = load_model(root / "train" / "checkpoints" / "step_0000002")
    model.train()
    metrics = inloop(model, 20)
    assert {"copa/acc", "copa/acc_per_char", "winogrande/acc", "lambada/perplexity"} <= set(metrics)
    assert model.training
    step = evaluate_checkpoints(cfg, root, "2", limit=5)[0]
    assert metrics["copa/acc"] == step["tasks"]["copa"]["acc"]  # the same subset as `--limit 5`
    cfg.eval.every_steps = 0
    off = InLoopEval(cfg, root / "tokenizer", torch.device("cpu"))
    assert not off.due(10) and off(model, 10) == {}


@pytest.mark.slow
def test_a_checkpoint_directory_such_as_an_average_is_scored_under_its_own_name(run):
    from smelt.checkpoint.store import load_model, save_checkpoint

    root, cfg = run
    shutil.rmtree(root / "eval", ignore_errors=True)
    model, meta = load_model(root / "train" / "checkpoints" / "step_0000002")
    meta = {**meta, "weights_only": True}
    saved = save_checkpoint(root / "averaged", 2, model, None, meta)
    average = saved.rename(saved.with_name("step_0000002-avg2"))
    (result,) = evaluate_checkpoints(cfg, root, str(average), limit=3)
    assert result["step"] == 2
    assert (root / "eval" / "weights_only-step_0000002-avg2.json").is_file()
    assert not (root / "eval" / "step_0000002.json").exists()  # the real step's file is left alone
    with pytest.raises(UserError, match="a step number or a checkpoint directory"):
        evaluate_checkpoints(cfg, root, str(root / "nowhere"))
