import json

import pytest

from smelt.config import DecontamConfig, EvalSetConfig, load_config
from smelt.data.curate import curate
from smelt.data.dedup.benchmarks import read_items
from smelt.data.dedup.decontam import Decontaminate, EvalIndex
from smelt.data.ledger import Doc, Ledger
from smelt.errors import ConfigError, UserError

HELLASWAG = "eval/hellaswag/olmes_hellaswag_val1000_rc_5shot"

FILLER = (
    "The committee met on a rainy Tuesday to discuss the budget for the coming year, and after a "
    "long debate about roads and schools the members agreed to meet again next month. "
)


def _doc(text: str, id: str = "d") -> Doc:
    return Doc("s", 0, id, text, "f")


@pytest.mark.slow
def test_planted_hellaswag_item_is_flagged(shared_data):
    hellaswag = str(shared_data / HELLASWAG)
    items = read_items(EvalSetConfig("hellaswag", hellaswag, "olmes"), "k")
    assert len(items) == 1000
    planted = items[123]
    step = Decontaminate.from_config(
        DecontamConfig(evals=[EvalSetConfig("hellaswag", hellaswag, "olmes")], action="flag")
    )
    ledger = Ledger()
    docs = [_doc(FILLER * 3, "clean"), _doc(FILLER + planted.upper() + "\n" + FILLER, "dirty")]
    out = list(step.run(docs, ledger))
    assert [d.id for d in out] == ["clean", "dirty"]
    assert "contamination" not in out[0].meta
    assert out[1].meta["contamination"] == {"hellaswag": 1}
    report = step.report()["hellaswag"]
    assert report["items_matched"] == 1 and report["documents"] == 1 and report["items"] == 1000


def test_threshold_is_share_of_item_ngrams():
    item = " ".join(f"word{i}" for i in range(40))
    index = EvalIndex({"b": [item]}, 13)
    half = " ".join(f"word{i}" for i in range(20))
    assert index.matches(FILLER + half, 0.2) == [0]
    assert index.matches(FILLER + half, 0.5) == []
    assert index.matches(FILLER, 0.0) == []
    assert EvalIndex({"b": ["too short to check"]}, 13).too_short == {"b": 1}


def test_curate_removes_contaminated_and_reports(tmp_path, write, source, config):
    bench = write(
        tmp_path / "bench",
        {
            "mc.jsonl": json.dumps({"query": "Question: " + FILLER, "choices": ["yes", "no"], "gold": 0})
            + "\n"
        },
    )
    records = [
        {"id": "a", "text": "An unrelated page about gardening, soil, seeds and water in the spring."},
        {"id": "b", "text": "Leaked: question: " + FILLER + " yes"},
    ]
    root = write(tmp_path / "in", {"x.jsonl": "".join(json.dumps(r) + "\n" for r in records)})
    src = source("s", root, format="jsonl", include=["*.jsonl"], id_field="id")
    evals = [EvalSetConfig("mc", str(bench / "mc.jsonl"), "mosaic")]
    stats = curate(config(src, decontam=DecontamConfig(evals=evals)), tmp_path / "out")
    assert stats["documents_kept"] == 1 and stats["dropped"]["contaminated"] == 1
    assert stats["decontamination"]["mc"]["documents"] == 1
    report = json.loads((tmp_path / "out" / "decontamination.json").read_text())
    assert report["mc"]["items_matched"] == 1
    assert "decontaminate" in [s["step"] for s in stats["steps"]]


def test_missing_eval_file_names_the_key(tmp_path):
    cfg = DecontamConfig(evals=[EvalSetConfig("x", str(tmp_path / "nope.jsonl"), "mosaic")])
    with pytest.raises(UserError, match=r"data.decontam.evals\[0\].path = .*does not exist"):
        Decontaminate.from_config(cfg)


def test_wrong_format_names_the_key_and_fields(tmp_path, write):
    write(tmp_path, {"g.jsonl": json.dumps({"prompt": "p"}) + "\n", "bad.jsonl": "not json\n"})
    with pytest.raises(UserError, match=r"evals\[0\]: a record of .* lacks question, answer .*format"):
        Decontaminate.from_config(
            DecontamConfig(evals=[EvalSetConfig("g", str(tmp_path / "g.jsonl"), "gsm8k")])
        )
    with pytest.raises(UserError, match=r"line 1 is not JSON"):
        read_items(EvalSetConfig("b", str(tmp_path / "bad.jsonl"), "mosaic"), "k")
    with pytest.raises(UserError, match=r"fields is empty"):
        read_items(EvalSetConfig("g", str(tmp_path / "g.jsonl"), "jsonl"), "k")


@pytest.mark.parametrize(
    ("path", "fmt", "count"),
    [
        ("arc_easy/mosaic_arc_easy_test.jsonl", "mosaic", 2376),
        ("mmlu/test", "mmlu_csv", 14042),
        ("gsm8k/test.jsonl", "gsm8k", 1319),
        ("lambada/mosaic_lambada_openai_test.jsonl", "mosaic", 5153),
        ("boolq/mosaic_boolq_validation.jsonl", "mosaic", 3270),
        ("winogrande/olmes_winogrande_val_rc_0shot", "olmes", 1267),
        ("winogrande/mosaic_winogrande_dev.jsonl", "mosaic", 1267),
    ],
)
@pytest.mark.slow
def test_readers_on_original_files(shared_data, path, fmt, count):
    items = read_items(EvalSetConfig("b", str(shared_data / "eval" / path), fmt), "k")
    assert len(items) == count
    assert all(isinstance(t, str) and t.strip() for t in items)


def test_unknown_eval_format_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[data.decontam.evals]]\nname = "x"\npath = "x.jsonl"\nformat = "olmez"\n')
    with pytest.raises(ConfigError, match=r"data.decontam.evals\[0\].format = 'olmez'.*did you mean 'olmes'"):
        load_config(path)


def test_batched_matching_equals_one_document_at_a_time():
    items = [" ".join(f"item{k}word{i}" for i in range(30)) for k in range(5)]
    index = EvalIndex({"a": items[:3], "b": items[3:]}, 13)
    texts = [
        FILLER + items[0] + " " + items[4],
        "short text",
        "",
        FILLER + " ".join(items[1].split()[:14]),  # 2 of 18 n-grams: below the threshold
        items[2] + " " + items[2],  # repeated n-grams count once
        FILLER,
    ]
    one_by_one = [index.batch_matches([t], 0.5)[0] for t in texts]
    assert one_by_one == [[0, 4], [], [], [], [2], []]
    assert index.batch_matches(texts, 0.5) == one_by_one
    assert index.batch_matches(texts, 0.1)[3] == [1]
    # A text holding the batch separator word is checked on its own, with the same result.
    odd = [*texts, "the \x00smelt\x00 word " + items[3]]
    assert index.batch_matches(odd, 0.5) == [*one_by_one, [3]]
