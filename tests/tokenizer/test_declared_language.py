"""Per-language tokenizer figures group by the source's declared language where there is one, with the
language id labels beside it: lingua's 75 test-sentence files give 75 rows, not the 73 that language
id's labels make (Malay falls under Indonesian, and two more pairs merge)."""

from __future__ import annotations

import json

from smelt.config import DataConfig, SourceConfig
from smelt.data.curate import curate
from smelt.tokenizer.evaluate import document_groups, evaluate_tokenizers


def _curate(shared_data, out, declared: str, part_chars: int = 200_000):
    root = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    source = SourceConfig(
        name="langs",
        root=str(root),
        include=["*.txt"],
        filters=[],
        declared_language=declared,
        part_chars=part_chars,
    )
    curate(DataConfig(sources=[source], val_fraction=0.0, workers=1), out)
    return out


def test_groups_follow_the_declared_language(shared_data, tmp_path, real_tokenizer):
    by_label = document_groups(_curate(shared_data, tmp_path / "label", ""), "train")
    assert len(by_label) == 73 and "langs/ms" not in by_label and not by_label.declared
    assert by_label.language_id["langs/id"] == {"id": 2}  # Indonesian and Malay in one row

    # files cut into parts of about 3,000 characters; one part per language is measured
    groups = document_groups(_curate(shared_data, tmp_path / "declared", "file", 3000), "train", 1000)
    assert len(groups) == 75 and groups.declared == set(groups)
    assert all(len(texts) == 1 for texts in groups.values())
    assert groups.language_id["langs/ms"] == {"id": 1} and groups.language_id["langs/id"] == {"id": 1}

    report = evaluate_tokenizers({"run": real_tokenizer[0]}, groups, tmp_path / "eval")
    rows = report["results"]["run"]["groups"]
    assert len(rows) == 75
    assert rows["langs/ms"]["language_id"] == {"id": 1} and rows["langs/ms"]["declared"] is True
    table = report["table"].splitlines()
    assert table[0].startswith("| tokenizer | group | language id | bytes/token |")
    assert any(line.startswith("| run | langs/ms | id 100% | ") for line in table)
    assert any(line.startswith("| run | langs/pl | pl 100% | ") for line in table)
    on_disk = json.loads((tmp_path / "eval" / "tokenizer_eval.json").read_text())
    assert on_disk["results"]["run"]["groups"]["langs/ms"]["language_id"] == {"id": 1}
