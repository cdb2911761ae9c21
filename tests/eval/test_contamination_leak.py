"""The contamination meter on real runs: a tiny model trained with COPA leaked into its training data
flags COPA and not OpenBookQA; the same run without the leak flags nothing. Real text (Paul Graham's
essays) and the real benchmark files of the shared data; one tokenizer, trained on the clean text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import tiny_model_config, write_documents
from smelt.benchmark_files import item_text
from smelt.config import Config, TokenizerConfig, TokensConfig
from smelt.eval.tasks import configured_tasks_dir, get_spec, load_task

LEAK_COPIES = 6
TASKS = ["copa", "openbookqa"]


def essay_chunks(shared: Path, lines_per_doc: int = 12) -> list[str]:
    lines = (shared / "corpus" / "prose" / "paulgraham" / "input.txt").read_text().splitlines()
    lines = [line for line in lines if line.strip()]
    return [" ".join(lines[i : i + lines_per_doc]) for i in range(0, len(lines), lines_per_doc)]


def run_config(root: Path, tasks_dir: Path) -> Config:
    cfg = Config()
    cfg.run.dir, cfg.run.name = str(root.parent), root.name
    cfg.model = tiny_model_config(d_model=96, max_seq_len=128)
    cfg.train.seq_len, cfg.train.micro_batch, cfg.train.batch_tokens = 128, 8, 1024
    cfg.train.tokens, cfg.train.lr, cfg.train.warmup_tokens = 1024 * 300, 3e-3, 1024 * 20
    cfg.train.precision, cfg.train.threads, cfg.train.eval_every, cfg.train.log_every = "fp32", 1, 0, 100
    cfg.checkpoint.every_steps = 0
    cfg.tokens.allow_repeat = True
    cfg.eval.tasks, cfg.eval.tasks_dir, cfg.eval.batch_size = TASKS, str(tasks_dir), 16
    cfg.eval.contamination_items = 100
    return cfg


def make_run(base: Path, name: str, shared: Path, leak: list[str], tokenizer: Path | None) -> Path:
    from smelt.tokenizer.train import train_tokenizer
    from smelt.tokens.tokenize import tokenize
    from smelt.train.trainer import train

    root = base / name
    documents = root / "documents"
    chunks = essay_chunks(shared)
    write_documents(documents, "train", "prose", chunks[10:] + leak)
    write_documents(documents, "val", "prose", chunks[:10])
    if tokenizer is None:
        train_tokenizer(
            TokenizerConfig(vocab_size=512, sample_bytes=200_000), documents, root / "tokenizer", 0
        )
    else:
        (root / "tokenizer").symlink_to(tokenizer)
    tokenize(
        TokensConfig(shard_tokens=50_000, allow_repeat=True), documents, root / "tokenizer", root / "tokens"
    )
    cfg = run_config(root, shared / "eval")
    train(cfg, root / "tokens", root / "tokenizer", root / "train")
    (root / "config.json").write_text(json.dumps(cfg.to_dict()))
    return root


@pytest.fixture(scope="module")
def leaked_and_clean(tmp_path_factory, shared_data):
    base = tmp_path_factory.mktemp("contamination")
    tasks_dir = configured_tasks_dir(str(shared_data / "eval"))
    copa = load_task(get_spec("copa", tasks_dir), tasks_dir, 100, shots=0).records
    leak = [item_text(r) for r in copa] * LEAK_COPIES
    clean = make_run(base, "clean", shared_data, [], None)
    leaked = make_run(base, "leaked", shared_data, leak, clean / "tokenizer")
    return leaked, clean


@pytest.mark.slow
def test_a_leaked_benchmark_is_flagged_and_a_clean_run_flags_nothing(leaked_and_clean, capsys):
    from smelt.cli import main

    leaked, clean = leaked_and_clean
    assert main(["eval", str(leaked), "--contamination"]) == 0
    out = capsys.readouterr().out
    assert "copa: contamination" in out and "FLAGGED" in out, out
    (result_file,) = (leaked / "eval" / "contamination").glob("step_*.json")
    result = json.loads(result_file.read_text())
    assert result["flagged"] == ["copa"], result["tasks"]
    assert result["tasks"]["copa"]["t"] < -result["k"] and result["tasks"]["copa"]["items"] == 100
    assert result["tasks"]["openbookqa"]["t"] > -result["k"]

    assert main(["eval", str(clean), "--contamination"]) == 0
    out = capsys.readouterr().out
    assert "FLAGGED" not in out and "copa: contamination" in out, out
    (result_file,) = (clean / "eval" / "contamination").glob("step_*.json")
    assert json.loads(result_file.read_text())["flagged"] == []

    (result_file,) = (leaked / "eval" / "contamination").glob("step_*.json")
    written = result_file.stat().st_mtime_ns
    assert main(["eval", str(leaked), "--contamination"]) == 0  # the same checkpoint and key: reused
    assert result_file.stat().st_mtime_ns == written and "FLAGGED" in capsys.readouterr().out
