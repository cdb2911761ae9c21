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
    assert "EXTRAS=dev,eval-check" in capsys.readouterr().err
    assert recorded.read_bytes() == before
