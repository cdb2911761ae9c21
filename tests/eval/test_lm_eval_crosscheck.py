"""bench/lm_eval_crosscheck.py on a task with items longer than the model's context: both sides get the
same items, the over-long ones left out of both and counted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.eval.harness import prepare
from smelt.eval.tasks import get_spec, load_task

BENCH = Path(__file__).resolve().parents[2] / "bench"
CPU = torch.device("cpu")
MAX_LEN = 32


@pytest.fixture
def crosscheck(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports bench/common.py
    spec = importlib.util.spec_from_file_location("lm_eval_crosscheck", BENCH / "lm_eval_crosscheck.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lm_eval_crosscheck", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def long_task(tmp_path):
    """A cloze task in a layout of its own (a task file in the tasks folder), a third of whose
    items are longer than MAX_LEN tokens."""
    records = []
    for i in range(12):
        words = " ".join(["the cat sat on the mat"] * (8 if i % 3 == 0 else 1))
        records.append(
            {"question": f"{words} and then {i}", "options": ["it slept.", "it ran."], "answer": i % 2}
        )
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "long.toml").write_text(
        'path = "long.jsonl"\nreader = "jsonl"\nformulation = "cloze"\ntemplate = "{question}\\nAnswer:"\n'
        '[fields]\nquery = "question"\nchoices = "options"\ngold = "answer"\n'
    )
    return load_task(get_spec("long", tmp_path), tmp_path)


def test_over_long_items_are_left_out_of_both_sides(crosscheck, long_task, tiny_run, tmp_path):
    from smelt.tokenizer.load import Tokenizer

    root, _ = tiny_run
    tokenizer = Tokenizer.load(root / "tokenizer")
    cut, skipped = crosscheck.comparable_items(long_task, tokenizer, MAX_LEN)
    assert skipped == 4 and len(cut.records) == 8
    assert all("and then" in r["query"] and r["query"].count("the cat") == 1 for r in cut.records)
    for convention in ("lm-eval", "eos"):  # every item left fits under both conventions
        assert prepare(cut, tokenizer, MAX_LEN, "error", convention).skipped == 0

    name = crosscheck.write_lm_eval_task(cut, tmp_path)
    written = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert [(r["query"], r["choices"], r["gold"]) for r in written] == [
        (r["query"], r["choices"], r["gold"]) for r in cut.records
    ]
    task_yaml = (tmp_path / f"{name}.yaml").read_text()
    assert "{{question}}" in task_yaml and "long.jsonl" in task_yaml

    model = build_model(tiny_model_config(max_seq_len=MAX_LEN), vocab=tokenizer.vocab_size).eval()
    ours = crosscheck.smelt_scores(model, tokenizer, cut, 4)
    assert ours["items"] == 8 and len(ours["loglikelihoods"]) == 8
    assert all(len(lls) == 2 for lls in ours["loglikelihoods"])


def test_without_lm_eval_nothing_is_compared_and_the_recorded_figures_stay(
    crosscheck, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(crosscheck, "lm_eval_available", lambda: "lm_eval cannot be imported (absent)")
    recorded = BENCH / "results" / "lm_eval_crosscheck.json"
    before = recorded.read_bytes()
    assert crosscheck.main([str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "-e '.[eval-check]'" in err and "EXTRAS=dev,langid-lingua,ray,eval-check" in err
    assert recorded.read_bytes() == before


def test_out_writes_the_figures_outside_the_checkout(crosscheck, long_task, tiny_run, tmp_path, monkeypatch):
    """--out PATH: the comparison's figures go to PATH (a file, or a folder), not bench/results."""
    import smelt.model.hf
    from smelt.tokenizer.load import Tokenizer

    root, _ = tiny_run
    tokenizer = Tokenizer.load(root / "tokenizer")
    model = build_model(tiny_model_config(max_seq_len=MAX_LEN), vocab=tokenizer.vocab_size)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    monkeypatch.setattr(crosscheck, "lm_eval_available", lambda: None)
    monkeypatch.setattr(smelt.model.hf, "import_hf", lambda directory: model)

    def lm_eval_side(hf_dir, task, workdir, batch_size):  # lm_eval is not installed here: smelt's scores
        return crosscheck.smelt_scores(model, tokenizer, task, batch_size)

    monkeypatch.setattr(crosscheck, "lm_eval_scores", lm_eval_side)
    recorded = BENCH / "results" / "lm_eval_crosscheck.json"
    before = recorded.read_bytes()
    args = [str(root), "--hf", str(hf), "--tasks", "long", "--tasks-dir", str(tmp_path), "--limit", "12"]
    assert crosscheck.main([*args, "--out", str(tmp_path / "out" / "cross.json")]) == 0
    figures = json.loads((tmp_path / "out" / "cross.json").read_text())
    assert figures["long_items"] == 8 and figures["long_skipped_overlong"] == 4
    assert figures["long_acc_diff_points"] == 0 and "machine" in figures
    assert crosscheck.main([*args, "--out", str(tmp_path / "folder")]) == 0
    assert json.loads((tmp_path / "folder" / "lm_eval_crosscheck.json").read_text())["long_items"] == 8
    assert recorded.read_bytes() == before
    (tmp_path / "file").write_text("")
    assert crosscheck.main([*args, "--out", str(tmp_path / "file" / "x.json")]) == 2  # before any work
