"""`smelt tokenizer eval --data PATH`: a tokenizer measured on any text set, without a curation config;
one group per file, read as `smelt eval --data` reads a set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smelt.cli import main
from smelt.config import TokenizerConfig
from smelt.eval.text_sets import text_set_groups
from smelt.tokenizer.evaluate import evaluate_tokenizers
from smelt.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, synthetic_documents) -> Path:
    out = tmp_path_factory.mktemp("data_tokenizer")
    train_tokenizer(TokenizerConfig(vocab_size=400, sample_bytes=100_000), synthetic_documents, out, seed=0)
    return out


def lingua_layout(root: Path, shared_data: Path) -> Path:
    """Three of lingua's test-sentence files, one language per file, as a held-out set."""
    folder = root / "sentences"
    folder.mkdir(parents=True)
    source = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    for lang in ("de", "pl", "zh"):
        lines = (source / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:40]
        (folder / f"{lang}.txt").write_text("\n".join(lines), encoding="utf-8")
    return folder


def test_a_plain_text_set_is_scored_per_file_without_a_config(tmp_path, tokenizer_dir, shared_data, capsys):
    folder = lingua_layout(tmp_path, shared_data)
    out = tmp_path / "out"
    args = [
        "tokenizer",
        "eval",
        "--data",
        str(folder),
        "--tokenizer",
        f"small={tokenizer_dir}",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    table = capsys.readouterr().out
    for lang in ("de", "pl", "zh"):
        assert f"| small | sentences/{lang} |" in table
    report = json.loads((out / "tokenizer_eval.json").read_text())
    rows = report["results"]["small"]["groups"]
    assert set(rows) == {"sentences/de", "sentences/pl", "sentences/zh"}
    direct = evaluate_tokenizers({"small": tokenizer_dir}, text_set_groups([str(folder)]))
    assert direct["results"]["small"]["groups"] == rows  # the same figures as on the texts themselves
    assert (out / "tokenizer_eval.svg").is_file()


def test_jsonl_sets_and_their_field(tmp_path, tokenizer_dir, capsys):
    held = tmp_path / "held.jsonl.gz"
    import gzip

    with gzip.open(held, "wt", encoding="utf-8") as handle:
        for i in range(5):
            handle.write(json.dumps({"body": f"Document {i}: the quick brown fox."}) + "\n")
    args = ["tokenizer", "eval", "--data", str(held), "--tokenizer", f"t={tokenizer_dir}"]
    assert main([*args, "--data-field", "body"]) == 0
    assert "| t | held |" in capsys.readouterr().out
    assert main(args) == 2  # no `text` field: named, with the flag that fixes it
    err = capsys.readouterr().err
    assert "has no string `text` field" in err and "--data-field" in err


def test_groups_keep_subfolders_and_cap_their_bytes(tmp_path):
    (tmp_path / "set" / "web").mkdir(parents=True)
    (tmp_path / "set" / "a.txt").write_text("x" * 10)
    (tmp_path / "set" / "web" / "b.jsonl").write_text(
        "".join(json.dumps({"text": "y" * 10}) + "\n" for _ in range(5))
    )
    groups = text_set_groups([str(tmp_path / "set")], max_bytes_per_group=25)
    assert groups == {"set/a": ["x" * 10], "set/web/b": ["y" * 10, "y" * 10]}


def test_without_a_tokenizer_or_config_the_error_says_what_to_pass(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text")
    assert main(["tokenizer", "eval", "--data", str(tmp_path / "a.txt")]) == 2
    assert "--tokenizer NAME=DIR" in capsys.readouterr().err
    assert main(["tokenizer", "eval"]) == 2
    assert "or --data PATH" in capsys.readouterr().err
    assert main(["tokenizer", "eval", "--data", str(tmp_path / "a.txt"), "--vocab-sizes", "300"]) == 2
    assert "--vocab-sizes trains one tokenizer per size" in capsys.readouterr().err
