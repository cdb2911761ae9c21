"""The run layout: stage directories, step directory names, the commit marker, and the one resolver
of a `--checkpoint latest|all|STEP|DIR` argument."""

import pytest

from smelt import layout
from smelt.cli import main
from smelt.errors import UserError


def checkpoints(tmp_path, committed=(2, 4), uncommitted=(6,)):
    folder = layout.checkpoints_dir(tmp_path / "run")
    for step in (*committed, *uncommitted):
        (folder / layout.step_dir_name(step)).mkdir(parents=True)
    for step in committed:
        (folder / layout.step_dir_name(step) / layout.MARKER).write_text("{}")
    return folder


def test_stage_and_step_names():
    assert layout.stage_dir("RUN", "curate").as_posix() == "RUN/documents"
    assert layout.checkpoints_dir("RUN").as_posix() == "RUN/train/checkpoints"
    assert layout.step_dir_name(42) == "step_0000042" and layout.step_of("x/step_0000042") == 42


def test_resolver_latest_all_step_and_directory(tmp_path):
    folder = checkpoints(tmp_path)
    names = lambda which: [p.name for p in layout.resolve_checkpoints(folder, which)]  # noqa: E731
    assert names("latest") == ["step_0000004"]  # step 6 never committed: it does not exist
    assert names("all") == ["step_0000002", "step_0000004"]
    assert names("2") == ["step_0000002"]
    averaged = tmp_path / "averaged"
    averaged.mkdir()
    (averaged / layout.MARKER).write_text("{}")
    assert layout.resolve_checkpoints(folder, str(averaged)) == [averaged]


def test_resolver_errors_name_what_exists(tmp_path):
    folder = checkpoints(tmp_path)
    with pytest.raises(UserError, match="Retained: step_0000002, step_0000004"):
        layout.resolve_checkpoints(folder, "6")
    with pytest.raises(UserError, match="must be `latest`, `all`, a step number or a checkpoint directory"):
        layout.resolve_checkpoints(folder, "newest")
    with pytest.raises(UserError, match="must be `latest`, a step number or a checkpoint directory"):
        layout.resolve_checkpoints(folder, "all", allow_all=False)
    with pytest.raises(UserError, match="no committed checkpoint under"):
        layout.resolve_checkpoints(tmp_path / "empty", "latest")


def test_export_names_the_retained_steps(tmp_path, capsys):
    checkpoints(tmp_path)
    assert main(["export", "hf", str(tmp_path / "run"), "--checkpoint", "6"]) == 2
    err = capsys.readouterr().err
    assert "step_0000006 does not exist or is incomplete" in err and "Retained: step_0000002" in err
