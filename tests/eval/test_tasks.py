"""Task specs and readers: every built-in task reads its real file; bad files are user errors."""

from __future__ import annotations

import gzip
import json

import pytest

from smelt.benchmark_files import read_mmlu
from smelt.errors import UserError
from smelt.eval.tasks import available_tasks, builtin_specs, get_spec, load_task, resolve_tasks_dir


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# Record counts of the full files (shared data README, section 2).
FULL_COUNTS = {
    "arc_easy": 2376, "arc_easy_val": 570, "hellaswag": 1000, "boolq": 3270, "copa": 100, "openbookqa": 500,
    "sciq": 1000, "siqa": 1954, "commonsense_qa": 1221, "winogrande": 1267, "winograd_wsc": 273,
    "lambada": 5153, "mmlu": 14042, "gsm8k": 1319,
}  # fmt: skip


@pytest.mark.slow
def test_every_registered_task_reads_its_shared_file(shared_data):
    tasks_dir = shared_data / "eval"
    assert set(available_tasks(tasks_dir)) == set(builtin_specs())
    for name, count in FULL_COUNTS.items():
        task = load_task(get_spec(name), tasks_dir, limit=5, shots=0)
        assert task.total == count, name
        assert len(task.records) == 5
    wino = load_task(get_spec("winogrande"), tasks_dir, limit=0, shots=0).records[0]
    assert wino["contexts"] == [
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    ]
    assert wino["continuation"] == "always got the easier cases." and wino["gold"] == 1
    hendrycks = read_mmlu(tasks_dir / "mmlu_original_format_2020-09-08" / "dev")
    assert len(hendrycks) == 285 and all(0 <= r["gold"] < 4 for r in hendrycks)


def test_olmes_docs_match_the_mosaic_items(shared_data):
    tasks_dir = shared_data / "eval"
    val = load_task(get_spec("arc_easy_val"), tasks_dir).records
    assert val[0]["id"] == "MCAS_2000_4_6" and val[0]["choices"][0] == "cellular telephone"
    wino = load_task(get_spec("winogrande"), tasks_dir).records
    spec = get_spec("winogrande").__class__(
        "w", "winogrande/olmes_winogrande_val_rc_0shot/requests.jsonl.gz", "olmes", "schema"
    )
    olmes = load_task(spec, tasks_dir).records
    assert [(r["contexts"], r["gold"]) for r in olmes] == [(r["contexts"], r["gold"]) for r in wino]


def test_subsets_and_shots_are_seeded_fixed_and_disjoint(shared_data):
    spec = get_spec("copa")
    spec = spec.__class__(**{**spec.__dict__, "shots": 3})
    a = load_task(spec, shared_data / "eval", limit=20)
    b = load_task(spec, shared_data / "eval", limit=20)
    assert a.records == b.records and a.shots == b.shots and len(a.shots) == 3
    assert [r["id"] for r in a.records] == sorted(r["id"] for r in a.records)  # file order kept
    assert not {r["id"] for r in a.shots} & {r["id"] for r in a.records}
    assert load_task(spec, shared_data / "eval", limit=0).total == 100


def test_mmlu_shots_come_from_the_questions_subject(shared_data):
    task = load_task(get_spec("mmlu"), shared_data / "eval", limit=30)
    for record in task.records:
        shots = task.shots_for(record)
        assert len(shots) == 5 and {s["subject"] for s in shots} == {record["subject"]}


def test_missing_and_malformed_task_files(tmp_path):
    with pytest.raises(UserError, match="copa.*does not exist.*eval.tasks_dir"):
        load_task(get_spec("copa"), tmp_path)
    path = tmp_path / "copa" / "mosaic_copa_validation.jsonl"
    path.parent.mkdir()
    path.write_text('{"query": "q", "choices": ["a", "b"], "gold": 0}\n{not json\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        load_task(get_spec("copa"), tmp_path)
    write_jsonl(path, [{"query": "q", "choices": ["a", "b"]}])
    with pytest.raises(UserError, match="lacks gold"):
        load_task(get_spec("copa"), tmp_path)
    write_jsonl(path, [{"query": "q", "choices": ["a", "b"], "gold": 2}])
    with pytest.raises(UserError, match="not an index"):
        load_task(get_spec("copa"), tmp_path)
    path.write_text("")
    with pytest.raises(UserError, match="no records"):
        load_task(get_spec("copa"), tmp_path)
    mmlu = tmp_path / "mmlu" / "test"
    mmlu.mkdir(parents=True)
    (mmlu / "anatomy_test.csv").write_text("question,choice0,choice1,choice2,choice3,answer\nq,a,b,c,d,7\n")
    with pytest.raises(UserError, match="anatomy_test.csv row 2"):
        load_task(get_spec("mmlu"), tmp_path, shots=0)
    olmes = tmp_path / "hellaswag" / "olmes_hellaswag_val1000_rc_5shot" / "requests.jsonl.gz"
    olmes.parent.mkdir(parents=True)
    olmes.write_bytes(b"not gzip")
    with pytest.raises(UserError, match="cannot be read"):
        load_task(get_spec("hellaswag"), tmp_path)
    with gzip.open(olmes, "wt") as handle:
        handle.write(json.dumps({"doc_id": 0}) + "\n")
    with pytest.raises(UserError, match="lacks doc"):
        load_task(get_spec("hellaswag"), tmp_path)


def test_unknown_task_and_tasks_dir(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="unknown task 'hellaswagg'.*hellaswag"):
        get_spec("hellaswagg")
    with pytest.raises(UserError, match="eval.tasks_dir"):
        resolve_tasks_dir(str(tmp_path / "nowhere"))
    monkeypatch.setenv("SMELT_SHARED_DATA", str(tmp_path))
    (tmp_path / "eval").mkdir()
    assert resolve_tasks_dir() == tmp_path / "eval"


def test_fingerprints_change_with_the_spec():
    spec = get_spec("arc_easy")
    other = spec.__class__(**{**spec.__dict__, "template": "{query}\nA:"})
    assert (
        spec.fingerprint() != other.fingerprint() and spec.fingerprint() == get_spec("arc_easy").fingerprint()
    )
