"""Task files are read and checked before anything is scored; a bad one is named and left out, and
the good tasks are scored (one bad file in the tasks directory used to stop every task)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.eval.run import TasksLeftOut, evaluate_checkpoints
from smelt.eval.tasks import get_spec
from smelt.manifest import write_json

from .conftest import write_jsonl

GOOD = 'path = "copa/mosaic_copa_validation.jsonl"\nreader = "mosaic"\nformulation = "cloze"\n'


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the tiny run and its tasks directory, with a bad task file and a task whose
    records lack what its formulation scores."""
    root, cfg = tiny_run
    copy_root = tmp_path / "run"
    shutil.copytree(root, copy_root)
    tasks_dir = tmp_path / "tasks"
    shutil.copytree(cfg.eval.tasks_dir, tasks_dir)
    (tasks_dir / "broken.toml").write_text(GOOD + 'label = "answers.lst"\n')  # unknown key
    write_jsonl(tasks_dir / "odd" / "items.jsonl", [{"question": "Where?", "answer": 0}])
    (tasks_dir / "odd.toml").write_text(
        'path = "odd/items.jsonl"\nreader = "jsonl"\nformulation = "cloze"\n[fields]\nquery = "question"\n'
    )
    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    cfg.eval.tasks_dir = str(tasks_dir)
    return copy_root, cfg


def test_one_bad_task_file_does_not_hide_the_others(tmp_path):
    (tmp_path / "mine.toml").write_text(GOOD)
    (tmp_path / "broken.toml").write_text(GOOD + "shots = 'two'\n")
    assert get_spec("mine", tmp_path).name == "mine"
    assert get_spec("copa", tmp_path).name == "copa"  # a built-in task, with a bad file beside it
    with pytest.raises(UserError, match=r"broken.toml: `shots` = 'two' should be int"):
        get_spec("broken", tmp_path)
    with pytest.raises(UserError, match=r"unknown task 'nope'.*could not be read: broken.toml"):
        get_spec("nope", tmp_path)


@pytest.mark.slow
def test_bad_tasks_are_named_before_scoring_and_the_good_ones_scored(run, monkeypatch):
    import smelt.eval.heldout
    import smelt.eval.run

    root, cfg = run
    events: list[str] = []
    heldout = smelt.eval.heldout.heldout_bits_per_byte

    def count_heldout(*args, **kwargs):
        events.append("held-out scored")
        return heldout(*args, **kwargs)

    monkeypatch.setattr(smelt.eval.heldout, "heldout_bits_per_byte", count_heldout)
    monkeypatch.setattr(smelt.eval.run, "log", events.append)
    with pytest.raises(TasksLeftOut) as caught:
        evaluate_checkpoints(cfg, root, "2", tasks=["copa", "broken", "odd"])
    assert set(caught.value.failed) == {"broken", "odd"}
    message = str(caught.value)
    assert "broken.toml: unknown key 'label' (did you mean 'labels'?)" in message
    assert "task 'odd'" in message and "has no choices" in message
    left_out = [i for i, e in enumerate(events) if "left out" in e]
    assert len(left_out) == 2 and max(left_out) < events.index("held-out scored")  # checked first
    step = json.loads((root / "eval" / "step_0000002.json").read_text())
    assert set(step["tasks"]) == {"copa"} and set(step["keys"]["tasks"]) == {"copa"}
    assert caught.value.results[0]["tasks"]["copa"]["items"] == 12


@pytest.mark.slow
def test_cli_prints_the_good_scores_and_exits_2_naming_the_bad_file(run, capsys):
    root, cfg = run
    write_json(root / "config.json", cfg.to_dict())
    code = main(["eval", str(root), "--tasks", "copa,broken", "--limit", "4"])
    captured = capsys.readouterr()
    assert code == 2
    assert "copa: acc" in captured.out and "written:" in captured.out
    assert "broken.toml: unknown key 'label'" in captured.err and "left out" in captured.err
    # Only bad tasks and nothing else asked for: stopped before any checkpoint is loaded.
    with pytest.raises(TasksLeftOut, match="nothing else was asked for, so nothing was scored"):
        evaluate_checkpoints(cfg, root, "1", tasks=["broken"], heldout=False)
    assert not (root / "eval" / "step_0000001.json").exists()


def test_tasks_dir_is_unchanged_by_the_fixture(tiny_run):
    _, cfg = tiny_run
    assert not (Path(cfg.eval.tasks_dir) / "broken.toml").exists()
