"""Canaries planted at curation, the meter in the training loop at every checkpoint, and the report's
contamination section, on real text (US inaugural addresses) and the shared COPA file."""

from __future__ import annotations

import json

import pytest

from smelt.config import Config, DataConfig, SourceConfig, TokenizerConfig, TokensConfig


@pytest.mark.slow
def test_inloop_meter_draws_canary_memorisation_against_exposure(tmp_path, shared_data):
    from helpers import tiny_model_config
    from smelt.data.curate import curate
    from smelt.report.eval_sections import contamination_section
    from smelt.report.run import load_run
    from smelt.report.single import build_run_report
    from smelt.tokenizer.train import train_tokenizer
    from smelt.tokens.tokenize import tokenize
    from smelt.train.trainer import train

    root = tmp_path / "run"
    speeches = shared_data / "corpus" / "prose" / "nltk_inaugural"
    data = DataConfig(
        sources=[SourceConfig(name="speeches", root=str(speeches), include=["19[0-4]*.txt"], filters=[])],
        canaries=12,
        workers=1,
        val_fraction=0.1,
    )
    data.langid.enabled = False
    curate(data, root / "documents")
    train_tokenizer(
        TokenizerConfig(vocab_size=512, sample_bytes=200_000), root / "documents", root / "tokenizer", 0
    )
    tokenize(TokensConfig(shard_tokens=50_000), root / "documents", root / "tokenizer", root / "tokens")

    cfg = Config()
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    cfg.data = data
    cfg.model = tiny_model_config(d_model=96, max_seq_len=128)
    cfg.train.seq_len, cfg.train.micro_batch, cfg.train.batch_tokens = 128, 8, 1024
    cfg.train.tokens, cfg.train.warmup_tokens = 1024 * 240, 1024 * 20
    cfg.train.precision, cfg.train.threads, cfg.train.eval_every = "fp32", 1, 0
    cfg.tokens.allow_repeat = True
    cfg.checkpoint.every_steps = 80
    cfg.eval.tasks, cfg.eval.tasks_dir, cfg.eval.batch_size = ["copa"], str(shared_data / "eval"), 16
    cfg.eval.contamination_inloop, cfg.eval.contamination_items = True, 40
    train(cfg, root / "tokens", root / "tokenizer", root / "train")

    records = [json.loads(line) for line in (root / "train" / "metrics.jsonl").read_text().splitlines()]
    metered = [r for r in records if "contamination" in r]
    assert [r["step"] for r in metered] == [80, 160, 240]  # every checkpoint, the last one included
    assert all(r["contamination_s"] > 0 for r in metered)  # what the meter cost
    first, last = metered[0]["contamination"], metered[-1]["contamination"]
    assert last["tasks"]["copa"]["items"] == 40 and last["flagged"] == []
    levels = {level["copies"]: level for level in last["canaries"]["levels"]}
    assert sorted(levels) == [1, 2, 4, 8, 16, 32] and all(v["strings"] == 2 for v in levels.values())
    # Memorisation grows with exposure and with training: the strings seen 32 times sit far below the
    # unseen controls by the end, those seen once hardly at all.
    assert levels[32]["memorisation"] > levels[1]["memorisation"] + 0.5, levels
    assert levels[32]["z"] > 3, levels
    assert levels[32]["memorisation"] > first["canaries"]["levels"][-1]["memorisation"]

    run = load_run(root)
    section = contamination_section(run)
    assert "canary memorisation against exposure" in section and "paired t of each benchmark" in section
    assert section.count("<svg") == 2 and "FLAGGED" not in section
    assert 'id="contamination"' in build_run_report(run)
