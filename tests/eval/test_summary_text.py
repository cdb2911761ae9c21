"""The end-of-run summary says which text each figure by source scored: the trainer's validation loss
(the first train.eval_tokens of each source) and the eval stage's loss and bits per byte (its own
bytes, up to eval.max_bytes) are labelled, and the eval stage's loss sits beside its bits per byte,
both on the same text, so no row compares sources across two texts."""

from __future__ import annotations

import re
from pathlib import Path

from smelt.config import config_from_dict
from smelt.run.pipeline import StageOutcome
from smelt.run.summary import print_summary, summarize

TRAIN = {
    "params_total": 1, "params_non_embedding": 1, "steps": 2, "tokens": 4096, "tokens_per_s": 10.0,
    "mfu": 0.25, "mfu_model": 0.2, "final_train_loss": 6.5, "final_val_loss": 6.43,
    "val_loss_weighting": "mixture", "val_loss_by_source": {"code": 6.33, "prose": 6.47},
    "peak_flops": 4e10, "peak_flops_source": "cached 2025-11-28", "checkpoint": "ckpt",
}  # fmt: skip


def outcomes(tmp_path: Path) -> dict[str, StageOutcome]:
    def outcome(stage: str, result: dict) -> StageOutcome:
        return StageOutcome(stage, tmp_path / stage, False, 1.0, result)

    def figures(loss: float, bits: float, per_token: float, n_bytes: int) -> dict:
        return {"loss": loss, "bits_per_byte": bits, "bytes_per_token": per_token, "bytes": n_bytes,
                "gzip_bits_per_byte": 3.0, "xz_bits_per_byte": 2.8}  # fmt: skip

    # Figures shaped like the case the summary once showed: the trainer's loss (its own text) ranks
    # prose harder, the eval stage's bits per byte (other text) code. On one text, loss and bits per
    # byte can rank sources differently only through bytes per token, which the row shows beside them.
    per_source = {"code": figures(6.87, 4.07, 2.39, 40_000), "prose": figures(6.49, 2.36, 3.97, 10_000)}
    return {
        "curate": outcome("curate", {"documents_in": 10, "documents_kept": 9}),
        "tokenizer": outcome("tokenizer", {"padded_vocab_size": 512}),
        "tokenize": outcome("tokenize", {"splits": {"train": {"tokens": 1000}, "val": {"tokens": 100}}}),
        "train": outcome("train", TRAIN),
        "eval": outcome(
            "eval",
            {"heldout": {"per_source": per_source, "overall": figures(6.6, 3.7, 2.6, 50_000)}, "samples": []},
        ),
    }


def test_each_figure_by_source_names_the_text_it_scored(tmp_path, capsys):
    cfg = config_from_dict(
        {"train": {"eval_tokens": 4096}, "eval": {"max_bytes": 100_000}, "run": {"dir": str(tmp_path)}}
    )
    summary = summarize(cfg, outcomes(tmp_path), 3.0)
    assert summary["val_loss_text"] == (
        "the first 2,048 tokens of each validation source (train.eval_tokens = 4,096)"
    )
    assert summary["val_bits_per_byte_text"] == (
        "the first 50,000 bytes of each validation source (50,000 bytes; eval.max_bytes = 100,000)"
    )
    assert summary["eval_loss_by_source"] == {"code": 6.87, "prose": 6.49}
    assert summary["train_peak_flops_source"] == "cached 2025-11-28"
    print_summary(summary)
    table = capsys.readouterr().out
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in table.splitlines() if "  " in line)
    assert rows["val loss by source"] == "code 6.3300, prose 6.4700"
    assert rows["held-out loss / bits/byte by source"] == (
        "code 6.8700 / 4.0700, 2.39 bytes/token; prose 6.4900 / 2.3600, 3.97 bytes/token"
    )
    scored = [line.split("scored on", 1)[1].strip() for line in table.splitlines() if "scored on" in line]
    assert scored == [summary["val_loss_text"], summary["val_bits_per_byte_text"]]
    assert "val bits/byte by source" not in rows
    assert "of 40.0 GFLOP/s (cached 2025-11-28)" in rows["MFU"]


def test_a_run_scored_in_full_says_so(tmp_path):
    cfg = config_from_dict({"train": {"eval_tokens": 0}, "run": {"dir": str(tmp_path)}})
    summary = summarize(cfg, outcomes(tmp_path), 3.0)
    assert summary["val_loss_text"] == "every token of the validation split"
    assert summary["val_bits_per_byte_text"] == "every document of the validation split (50,000 bytes)"
