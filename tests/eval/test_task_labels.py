"""A task file's `labels` (and `shots_labels`) resolve like `path`: against the tasks directory, or
the task file's folder for a task named by its path (docs/evaluation.md). A label file written
relative to the questions instead is named in the error, with the value to write."""

from __future__ import annotations

from pathlib import Path

import pytest

from smelt.errors import UserError
from smelt.eval.tasks import get_spec, load_task

from .conftest import write_jsonl

TASK = """\
path = "piqa/valid.jsonl"
labels = "{labels}"
reader = "jsonl"
formulation = "cloze"

[fields]
query = "goal"
choices = ["sol1", "sol2"]
gold = "label"
"""


def write_piqa(root: Path, labels: str) -> Path:
    items = [{"goal": f"goal {i}", "sol1": "one", "sol2": "two"} for i in range(4)]
    write_jsonl(root / "piqa" / "valid.jsonl", items)
    (root / "piqa" / "valid-labels.lst").write_text("0\n1\n1\n0\n")
    task_file = root / "piqa.toml"
    task_file.write_text(TASK.format(labels=labels))
    return task_file


def test_labels_resolve_against_the_tasks_directory_like_path(tmp_path):
    write_piqa(tmp_path, "piqa/valid-labels.lst")
    task = load_task(get_spec("piqa", tmp_path), tmp_path)
    assert [r["gold"] for r in task.records] == [0, 1, 1, 0]


def test_a_task_named_by_its_path_resolves_labels_against_its_folder(tmp_path):
    task_file = write_piqa(tmp_path / "mine", "piqa/valid-labels.lst")
    task = load_task(get_spec(str(task_file)), None)
    assert [r["gold"] for r in task.records] == [0, 1, 1, 0]


def test_a_label_file_named_relative_to_the_questions_gets_the_value_to_write(tmp_path):
    write_piqa(tmp_path, "valid-labels.lst")
    with pytest.raises(UserError) as caught:
        load_task(get_spec("piqa", tmp_path), tmp_path)
    message = str(caught.value)
    assert (
        f"label file {tmp_path / 'valid-labels.lst'} (labels = 'valid-labels.lst') does not exist" in message
    )
    assert "`labels` is relative to the tasks directory" in message and "like `path`" in message
    assert "write labels = 'piqa/valid-labels.lst'" in message
    task_file = write_piqa(tmp_path / "mine", "valid-labels.lst")
    with pytest.raises(UserError, match=r"relative to the task file's folder .*write labels = 'piqa/valid"):
        load_task(get_spec(str(task_file)), None)
