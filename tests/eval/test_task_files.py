"""Tasks as data files in formats smelt never shipped, results cached per task by content and merged,
and bits per byte of any text set (`--data`)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.eval.compress import gzip_bits_per_byte, xz_bits_per_byte
from smelt.eval.run import evaluate_checkpoints
from smelt.eval.tasks import TaskSpec, get_spec, load_task, read_task_file
from smelt.eval.text_sets import read_text_set
from smelt.manifest import write_json

WORDS = ["cat", "dog", "bird", "tree", "park", "door", "mat", "water", "spout", "children"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def sentences(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS + ["the", "a", "sat", "on"]) for _ in range(rng.randint(8, 30))) + "."
        for _ in range(n)
    ]


# PIQA's original release: valid.jsonl without answers, and valid-labels.lst with one label a line.
PIQA_TOML = """\
# PIQA in its original format: the answers are in a label file beside the questions.
path = "piqa/valid.jsonl"
labels = "piqa/valid-labels.lst"
reader = "jsonl"
formulation = "cloze"
template = "Question: {goal}\\nAnswer:"

[fields]
query = "goal"
choices = ["sol1", "sol2"]
gold = "label"
"""


def write_piqa(tasks_dir: Path) -> list[dict]:
    """PIQA-layout files and their task file; returns the same items in the mosaic layout."""
    items = [
        {"goal": f"To keep the {w} dry,", "sol1": "put it under the tree.", "sol2": "put it in the water."}
        for w in WORDS[:10]
    ]
    labels = [(i * 7) % 2 for i in range(len(items))]
    write_jsonl(tasks_dir / "piqa" / "valid.jsonl", items)
    (tasks_dir / "piqa" / "valid-labels.lst").write_text("".join(f"{label}\n" for label in labels))
    (tasks_dir / "piqa.toml").write_text(PIQA_TOML)
    return [
        {"query": i["goal"], "choices": [i["sol1"], i["sol2"]], "gold": label}
        for i, label in zip(items, labels, strict=True)
    ]


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the tiny run and of its tasks directory, with a PIQA task file in it."""
    root, cfg = tiny_run
    copy_root = tmp_path / "run"
    shutil.copytree(root, copy_root)
    tasks_dir = tmp_path / "tasks"
    shutil.copytree(cfg.eval.tasks_dir, tasks_dir)
    write_piqa(tasks_dir)
    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    cfg.eval.tasks_dir = str(tasks_dir)
    return copy_root, cfg


@pytest.fixture
def counted(monkeypatch):
    """Counts what evaluation computes: held-out passes, and the tasks scored, by name."""
    import smelt.eval.heldout
    import smelt.eval.run

    calls: dict[str, list] = {"heldout": [], "tasks": []}
    heldout, score = smelt.eval.heldout.heldout_bits_per_byte, smelt.eval.run.score_prepared

    def count_heldout(*args, **kwargs):
        calls["heldout"].append(1)
        return heldout(*args, **kwargs)

    def count_score(model, tokenizer, prep, *args, **kwargs):
        calls["tasks"].append(prep.task.spec.name)
        return score(model, tokenizer, prep, *args, **kwargs)

    monkeypatch.setattr(smelt.eval.heldout, "heldout_bits_per_byte", count_heldout)
    monkeypatch.setattr(smelt.eval.run, "score_prepared", count_score)
    return calls


@pytest.mark.slow
def test_a_task_in_a_new_format_is_scored_from_its_task_file_alone(run, tmp_path):
    root, cfg = run
    tasks_dir = Path(cfg.eval.tasks_dir)
    mosaic = write_jsonl(tmp_path / "same" / "piqa_mosaic.jsonl", write_piqa(tasks_dir))
    task = load_task(get_spec("piqa", tasks_dir), tasks_dir)
    assert [{k: r[k] for k in ("query", "choices", "gold")} for r in task.records] == [
        json.loads(line) for line in mosaic.read_text().splitlines()
    ]
    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=["piqa", "copa"])
    piqa = result["tasks"]["piqa"]
    assert piqa["items"] == 10 and piqa["formulation"] == "cloze" and piqa["chance"] == 0.5
    # The same items in a layout smelt already read (mosaic), prompted alike, score the same.
    spec = TaskSpec("piqa_as_mosaic", "piqa_mosaic.jsonl", "mosaic", "cloze", "Question: {query}\nAnswer:")
    same = Path(tmp_path / "same" / "same.toml")
    same.write_text(
        'name = "piqa_as_mosaic"\npath = "piqa_mosaic.jsonl"\nreader = "mosaic"\nformulation = "cloze"\n'
        'template = "Question: {query}\\nAnswer:"\n'
    )
    assert read_task_file(same).template == spec.template
    (again,) = evaluate_checkpoints(cfg, root, "2", tasks=[str(same)])
    twin = again["tasks"]["piqa_as_mosaic"]
    assert {k: twin[k] for k in ("acc", "acc_per_char", "acc_per_token", "items")} == {
        k: piqa[k] for k in ("acc", "acc_per_char", "acc_per_token", "items")
    }
    assert set(again["tasks"]) == {"piqa", "copa", "piqa_as_mosaic"}  # merged into the step file


def test_arc_in_two_formats_and_csv_read_through_field_mappings(tmp_path):
    questions = [("Which is a gas?", ["rock", "steam", "wood"], "B"), ("Which melts?", ["ice", "sand"], "1")]
    original = [  # ARC's release: nested question, labelled choices, answerKey (letters or digits)
        {"id": f"q{i}", "question": {"stem": q, "choices": [{"text": c, "label": lab} for c, lab in
         zip(choices, "ABC" if key.isalpha() else "123", strict=False)]}, "answerKey": key}
        for i, (q, choices, key) in enumerate(questions)
    ]  # fmt: skip
    hub = [  # the Hugging Face layout: choices as parallel lists
        {"id": r["id"], "question": r["question"]["stem"], "answerKey": r["answerKey"],
         "choices": {"text": [c["text"] for c in r["question"]["choices"]],
                     "label": [c["label"] for c in r["question"]["choices"]]}}
        for r in original
    ]  # fmt: skip
    write_jsonl(tmp_path / "arc" / "ARC-Challenge-Test.jsonl", original)
    write_jsonl(tmp_path / "arc" / "hub.jsonl", hub)
    (tmp_path / "arc_original.toml").write_text(
        'path = "arc/ARC-Challenge-Test.jsonl"\nreader = "jsonl"\nformulation = "cloze"\n'
        'template = "Question: {query}\\nAnswer:"\n[fields]\nquery = "question.stem"\n'
        'choices = "question.choices.text"\nchoice_labels = "question.choices.label"\ngold = "answerKey"\n'
    )
    (tmp_path / "arc_hub.toml").write_text(
        'path = "arc/hub.jsonl"\nreader = "jsonl"\nformulation = "mc"\n[fields]\nquery = "question"\n'
        'choices = "choices.text"\nchoice_labels = "choices.label"\ngold = "answerKey"\n'
    )
    (tmp_path / "arc" / "test.csv").write_text("q,a,b,c,answer\nWhich is a gas?,rock,steam,wood,2\n")
    (tmp_path / "arc_csv.toml").write_text(
        'path = "arc/test.csv"\nreader = "csv"\nformulation = "cloze"\ngold_base = 1\n'
        '[fields]\nquery = "q"\nchoices = ["a", "b", "c"]\ngold = "answer"\n'
    )
    loaded = {name: load_task(get_spec(str(tmp_path / f"{name}.toml")), None) for name in
              ("arc_original", "arc_hub", "arc_csv")}  # fmt: skip
    expected = [(q, c, ["A", "B", "C", "1", "2", "3"].index(key) % 3) for q, c, key in questions]
    for name in ("arc_original", "arc_hub"):
        assert [(r["query"], r["choices"], r["gold"]) for r in loaded[name].records] == expected, name
    assert [(r["query"], r["choices"], r["gold"]) for r in loaded["arc_csv"].records] == expected[:1]
    assert loaded["arc_original"].records[0]["id"] == "q0"


def test_bad_task_files_say_which_key_and_how_to_fix_it(tmp_path):
    write_piqa(tmp_path)
    path = tmp_path / "piqa.toml"
    path.write_text(PIQA_TOML.replace("labels =", "label ="))
    with pytest.raises(UserError, match=r"piqa.toml: unknown key 'label' \(did you mean 'labels'\?\)"):
        read_task_file(path)
    path.write_text(PIQA_TOML.replace('formulation = "cloze"', 'formulation = "cloze"\nmetric = "f1"'))
    with pytest.raises(UserError, match="metric 'f1' is not reported by formulation 'cloze'.*acc_per_char"):
        read_task_file(path)
    path.write_text(PIQA_TOML.replace('choices = ["sol1", "sol2"]\n', ""))
    with pytest.raises(UserError, match=r"task 'piqa'.*has no choices.*\[fields\] table"):
        load_task(get_spec("piqa", tmp_path), tmp_path)
    path.write_text(PIQA_TOML.replace('"sol2"', '"sol3"'))
    with pytest.raises(UserError, match=r"valid.jsonl line 1: field 'sol3' \(mapped to 'choices'\)"):
        load_task(get_spec("piqa", tmp_path), tmp_path)
    path.write_text(PIQA_TOML)
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n1\n")
    with pytest.raises(UserError, match="valid-labels.lst has 2 labels but .*valid.jsonl has 10 records"):
        load_task(get_spec("piqa", tmp_path), tmp_path)
    with pytest.raises(UserError, match="unknown task 'piqaa'.*task file"):
        get_spec("piqaa", tmp_path)


@pytest.mark.slow
def test_a_changed_task_file_rescores_that_task_only_and_tasks_merge(run, counted):
    root, cfg = run
    tasks_dir = Path(cfg.eval.tasks_dir)
    evaluate_checkpoints(cfg, root, "2", tasks=["copa"])
    evaluate_checkpoints(cfg, root, "2", tasks=["piqa"])
    step = json.loads((root / "eval" / "step_0000002.json").read_text())
    assert set(step["tasks"]) == {"copa", "piqa"} and step["heldout"]["overall"]["bits_per_byte"] > 0
    assert counted == {"heldout": [1], "tasks": ["copa", "piqa"]}  # held-out loss computed once
    curves = (root / "eval" / "curves.jsonl").read_text().splitlines()
    assert set(json.loads(curves[-1])["tasks"]) == {"copa", "piqa"}

    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=["copa", "piqa"])
    assert "wall_time_s" not in result and counted["tasks"] == ["copa", "piqa"]  # all cached
    # A task file's bytes changed (even a comment): that task is scored again, the other is not.
    (tasks_dir / "piqa.toml").write_text(PIQA_TOML + "# the same task, another byte\n")
    evaluate_checkpoints(cfg, root, "2", tasks=["copa", "piqa"])
    assert counted["tasks"] == ["copa", "piqa", "piqa"]
    # So is one of its data files: other labels, another score under the same name.
    (tasks_dir / "piqa" / "valid-labels.lst").write_text("1\n" * 10)
    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=["copa", "piqa"])
    assert counted["tasks"] == ["copa", "piqa", "piqa", "piqa"] and counted["heldout"] == [1]
    assert result["keys"]["tasks"]["piqa"] != step["keys"]["tasks"]["piqa"]
    assert result["keys"]["tasks"]["copa"] == step["keys"]["tasks"]["copa"]
    assert result["tasks"]["copa"] == step["tasks"]["copa"]


@pytest.mark.slow
def test_cli_two_task_runs_keep_both_and_print_only_what_was_asked(run, capsys, counted, monkeypatch):
    monkeypatch.delenv("SMELT_QUIET", raising=False)  # the status lines say what was scored
    root, cfg = run
    write_json(root / "config.json", cfg.to_dict())
    assert main(["eval", str(root), "--tasks", "copa", "--limit", "4"]) == 0
    assert main(["eval", str(root), "--tasks", "piqa", "--limit", "4"]) == 0
    captured = capsys.readouterr()
    out = captured.out.split("written:")[1]
    assert "piqa: acc" in out and "copa: acc" not in out
    assert "step_0000002: scoring tasks piqa (up to date: held-out, samples)" in captured.err
    step = json.loads((root / "eval" / "step_0000002.json").read_text())
    assert {n: t["items"] for n, t in step["tasks"].items()} == {"copa": 4, "piqa": 4}
    assert counted["heldout"] == [1]


@pytest.mark.slow
def test_data_scores_bits_per_byte_of_a_jsonl_set_next_to_gzip_and_xz(run, tmp_path, capsys):
    root, cfg = run
    texts = sentences(40, 9)
    data = write_jsonl(tmp_path / "set" / "held.jsonl", [{"text": t, "n": i} for i, t in enumerate(texts)])
    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=[], data=[str(data)], heldout=False)
    figures = result["data"][str(data)]
    raw = "".join(texts).encode()
    assert figures["documents"] == 40 and figures["bytes"] == len(raw)
    assert figures["gzip_bits_per_byte"] == gzip_bits_per_byte(raw)
    assert figures["xz_bits_per_byte"] == xz_bits_per_byte(raw)
    assert figures["bits_per_byte"] > 0 and figures["windows"] == -(-figures["tokens"] // cfg.train.seq_len)
    # A compressor limited to one window at a time does worse than on the whole set.
    assert figures["gzip_window_bits_per_byte"] > figures["gzip_bits_per_byte"]
    assert figures["xz_window_bits_per_byte"] > figures["xz_bits_per_byte"]
    assert "heldout" not in result and result["keys"]["data"]
    curve = json.loads((root / "eval" / "curves.jsonl").read_text().splitlines()[-1])
    assert curve["data_bits_per_byte"] == {str(data): figures["bits_per_byte"]}
    (again,) = evaluate_checkpoints(cfg, root, "2", tasks=[], data=[str(data)], heldout=False)
    assert "wall_time_s" not in again and again["data"] == result["data"]

    write_json(root / "config.json", cfg.to_dict())
    assert main(["eval", str(root), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"{data}: gzip / xz bits-per-byte" in out and "per 64-token window" in out
    assert main(["eval", str(root), "--data", str(data), "--data-field", "body"]) == 2
    assert "has no string `body` field" in capsys.readouterr().err


def test_text_sets_read_text_jsonl_and_parquet_folders(tmp_path):
    (tmp_path / "a.txt").write_text("plain text file\n")
    write_jsonl(tmp_path / "b.jsonl", [{"text": "a json line"}])
    pq.write_table(pa.table({"text": ["a parquet row", ""]}), tmp_path / "c.parquet")
    assert read_text_set(tmp_path) == ["plain text file\n", "a json line", "a parquet row"]
    with pytest.raises(UserError, match="does not exist"):
        read_text_set(tmp_path / "nowhere")
    (tmp_path / "d.csv").write_text("x\n")
    with pytest.raises(UserError, match=r"d.csv: no text set to read there.*\.parquet"):
        read_text_set(tmp_path / "d.csv")


@pytest.mark.slow
def test_tasks_dir_pointed_at_other_files_rescores_under_the_same_name(run, tmp_path, counted):
    root, cfg = run
    evaluate_checkpoints(cfg, root, "2", tasks=["copa"])
    other = tmp_path / "other_tasks"
    shutil.copytree(cfg.eval.tasks_dir, other)
    copa = other / "copa" / "mosaic_copa_validation.jsonl"
    records = [json.loads(line) for line in copa.read_text().splitlines()][:5]
    write_jsonl(copa, records)
    cfg.eval.tasks_dir = str(other)
    (result,) = evaluate_checkpoints(cfg, root, "2", tasks=["copa"])
    assert counted["tasks"] == ["copa", "copa"] and result["tasks"]["copa"]["items"] == 5


def test_window_bytes_follow_the_tokens_and_scale_when_they_do_not_add_up():
    import numpy as np

    from smelt.eval.text_sets import window_byte_ends

    lengths = np.array([3, 0, 2, 2, 1, 4, 0])  # bytes of each predicted token (EOS: 0)
    assert window_byte_ends(lengths, 3, 3, 12) == [5, 12, 12]  # 3 + 0 + 2, then + 2 + 1 + 4, then + 0
    assert window_byte_ends(lengths, 3, 3, 24) == [10, 24, 24]  # text twice the tokens' bytes


@pytest.mark.slow
def test_plain_smelt_eval_rescores_a_changed_task_file_when_the_stage_is_up_to_date(
    run, counted, monkeypatch
):
    import smelt.run.pipeline

    root, cfg = run
    cfg.eval.tasks = ["copa", "piqa"]
    write_json(root / "config.json", cfg.to_dict())
    evaluate_checkpoints(cfg, root, "latest")  # what the pipeline's eval stage wrote
    stage = smelt.run.pipeline.StageOutcome("eval", root / "eval", True, 0.0, {})  # its manifest: up to date
    monkeypatch.setattr(smelt.run.pipeline, "run_stage", lambda *args, **kwargs: stage)
    (Path(cfg.eval.tasks_dir) / "piqa.toml").write_text(PIQA_TOML + "# edited\n")
    assert main(["eval", str(root)]) == 0
    assert counted["tasks"] == ["copa", "piqa", "piqa"] and counted["heldout"] == [1]
