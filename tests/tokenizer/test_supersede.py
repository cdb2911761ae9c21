"""A tokenizer or token shards that a run's checkpoints were trained with are moved aside, not
overwritten, when `smelt tokenizer train` or `smelt tokenize` remakes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smelt.cli import QUICKSTART_CONFIG, main
from smelt.layout import MARKER, checkpoints_dir, step_dir_name
from smelt.run.lifecycle import costly_work

MOVED = "previous output (what the 1 committed checkpoint in train/ was trained with) moved to"
TINY = ["data.sources.0.max_files=40", "tokenizer.vocab_size=512", "tokenizer.sample_bytes=300000"]


def _args(root: Path, *extra: str) -> list[str]:
    out = [str(QUICKSTART_CONFIG)]
    for item in [*TINY, f"run.dir='{root}'", "run.name='r'", *extra]:
        out += ["--set", item]
    return out


def _commit_checkpoint(run: Path, step: int) -> None:
    """A committed step directory: all that makes train/ hold work that took compute."""
    path = checkpoints_dir(run) / step_dir_name(step)
    path.mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"step": step}))


def test_tokenizer_and_tokens_of_a_trained_run_are_costly(tmp_path):
    run = tmp_path / "r"
    for name in ("tokenizer", "tokens", "documents"):
        (run / name).mkdir(parents=True)
    assert costly_work(run / "tokenizer", {"wall_time_s": 1.0}, None) is None
    _commit_checkpoint(run, 5)
    assert "1 committed checkpoint in train/" in costly_work(run / "tokenizer", {"wall_time_s": 1.0}, None)
    assert "1 committed checkpoint in train/" in costly_work(run / "tokens", None, None)
    assert costly_work(run / "documents", {"wall_time_s": 1.0}, None) is None  # tokens/ can be remade from it


@pytest.mark.slow
def test_retraining_the_tokenizer_of_a_trained_run_moves_it_to_superseded(tmp_path, monkeypatch, capsys):
    for command in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        assert main([*command, *_args(tmp_path)]) == 0
    run = tmp_path / "r"
    _commit_checkpoint(run, 10)
    old_tokenizer = (run / "tokenizer" / "tokenizer.json").read_bytes()
    old_shards = (run / "tokens" / "shards.json").read_bytes()
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    capsys.readouterr()

    assert main(["tokenizer", "train", *_args(tmp_path, "tokenizer.vocab_size=640")]) == 0
    err = capsys.readouterr().err
    (kept,) = (run / "superseded").glob("tokenizer-*")
    assert (kept / "tokenizer.json").read_bytes() == old_tokenizer
    assert (run / "tokenizer" / "tokenizer.json").read_bytes() != old_tokenizer
    assert f"[tokenizer] {MOVED} {kept}, not deleted" in err

    assert main(["tokenize", *_args(tmp_path, "tokenizer.vocab_size=640")]) == 0
    err = capsys.readouterr().err
    (kept,) = (run / "superseded").glob("tokens-*")
    assert (kept / "shards.json").read_bytes() == old_shards
    assert f"[tokenize] {MOVED} {kept}, not deleted" in err
