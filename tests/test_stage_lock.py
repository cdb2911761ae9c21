"""A stage's lock (run/lifecycle.stage_lock): one writer per stage, and nothing left behind on any way out."""

import pytest

from smelt.errors import UserError
from smelt.run.lifecycle import stage_lock


def test_the_lock_goes_with_its_holder_and_a_second_writer_is_refused(tmp_path):
    run = tmp_path / "runs" / "fork"
    with stage_lock(run, "train"):
        assert (run / ".locks" / "train.lock").is_file()
        with (
            pytest.raises(UserError, match="being written by another smelt command"),
            stage_lock(run, "train"),
        ):
            pass
        (run / "train").mkdir()  # what the stage wrote stays
    assert not (run / ".locks").exists()
    assert (run / "train").is_dir()


def test_a_stage_that_fails_leaves_no_lock_and_no_stub(tmp_path):
    run = tmp_path / "runs" / "fork"
    with pytest.raises(UserError), stage_lock(run, "train"):
        raise UserError("the parent checkpoint does not fit")
    assert not run.exists()  # made by this command and left empty: gone
    existing = tmp_path / "runs" / "kept"
    existing.mkdir()
    with pytest.raises(RuntimeError), stage_lock(existing, "train"):
        raise RuntimeError("boom")
    assert existing.is_dir() and not (existing / ".locks").exists()  # not ours to remove


def test_a_lock_taken_again_right_after_release_works(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for _ in range(3):
        with stage_lock(run, "tokenize"):
            assert (run / ".locks" / "tokenize.lock").is_file()
    assert not (run / ".locks").exists()
