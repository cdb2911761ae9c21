"""A pre-registered loss trajectory end to end, on real text: a ladder of tiny runs predicts a larger
run's validation curve; the larger run stays inside the band, and the same run with a sabotaged
learning rate leaves it and alerts (docs/observability.md, "A pre-registered loss trajectory")."""

import json
from pathlib import Path

import numpy as np
import pytest

from smelt.config import config_from_dict
from smelt.model.flops import count_params
from smelt.report.run import load_run
from smelt.report.trajectory_section import trajectory_section
from smelt.train.trainer import train
from smelt.train.trajectory import band_at

VOCAB, EOS = 384, 257
# (d_model, tokens): two budgets per size, so that the N and D terms can be told apart.
RUNGS = [(16, 16_384), (16, 49_152), (32, 16_384), (32, 49_152), (48, 24_576), (48, 65_536)]
TARGET = (64, 98_304)  # twice the largest rung's parameters, 1.5x its tokens


def byte_tokens(root: Path, text: bytes) -> tuple[Path, Path]:
    """Shakespeare as bytes (tokens 0-255, EOS between 2 kB documents): no tokenizer to train."""
    tokens = root / "tokens"
    for split, blob in (("train", text[: len(text) * 9 // 10]), ("val", text[len(text) * 9 // 10 :])):
        out = tokens / split / "shakespeare"
        out.mkdir(parents=True)
        docs = [
            np.append(np.frombuffer(blob[i : i + 2000], np.uint8), EOS) for i in range(0, len(blob), 2000)
        ]
        np.concatenate(docs).astype("<u2").tofile(out / "00000.bin")
        np.cumsum([0] + [len(d) for d in docs[:-1]]).astype("<i8").tofile(out / "00000.idx")
    meta = {"dtype": "uint16", "vocab_size": VOCAB, "eos_id": EOS, "bos_id": 256, "pad_id": 258}
    (tokens / "meta.json").write_text(json.dumps(meta))
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "smelt.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "dtype"}))
    return tokens, tokenizer


def config(d_model: int, tokens: int, **train):
    return config_from_dict({
        "run": {"seed": 1},
        "model": {"d_model": d_model, "n_layers": 2, "n_heads": d_model // 16, "n_kv_heads": d_model // 16,
                  "max_seq_len": 64},
        "train": {"seq_len": 64, "micro_batch": 8, "batch_tokens": 512, "tokens": tokens, "lr": 3e-3,
                  "log_every": 1000, "eval_every": tokens // 512 // 8, "eval_tokens": 8192, "eval_budget": 0.0,
                  "precision": "fp32", "device": "cpu", "threads": 1, "compile": False, **train},
        "checkpoint": {"every_steps": 0},
    })  # fmt: skip


@pytest.mark.slow
def test_a_ladder_predicts_a_larger_run_and_a_sabotaged_one_leaves_the_band(
    tmp_path, shared_data, monkeypatch, capsys
):
    from smelt.cli import main

    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    data = byte_tokens(tmp_path, (shared_data / "corpus/prose/tinyshakespeare/input.txt").read_bytes())
    for d_model, tokens in RUNGS:
        out = tmp_path / "ladder" / f"d{d_model}-t{tokens}" / "train"
        summary = train(config(d_model, tokens), *data, out)
        # What the pipeline records when the stage finishes (the fit reads the final figures from it).
        (out / "manifest.json").write_text(json.dumps({"stage": "train", "result": summary}))

    n = count_params(config(*TARGET).model, VOCAB)["non_embedding"]
    fit_dir = tmp_path / "fit"
    argv = ["scaling", "fit", str(tmp_path / "ladder"), "--target", f"{n},{TARGET[1]}", "--bootstrap", "100"]
    assert main([*argv, "--out", str(fit_dir)]) == 0
    assert "predicted validation loss of the target run" in capsys.readouterr().out
    fit = str(fit_dir / "fit.json")
    curve = json.loads((fit_dir / "fit.json").read_text())["trajectory"]

    runs = {}
    for name, lr in (("good", 3e-3), ("sabotaged", 1e-4)):
        cfg = config(*TARGET, lr=lr, expect=fit, expect_tolerance_tokens=2 * 12_288)
        out = tmp_path / name / "train"
        train(cfg, *data, out)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        judged = [(r["val_loss"], band_at(curve, r["tokens"])) for r in records if r["kind"] == "eval"]
        runs[name] = {
            "alerts": [r for r in records if r.get("alert") == "off_trajectory"],
            "inside": [lo <= loss <= hi for loss, band in judged if band is not None for _, lo, hi in [band]],
            "registered": [r for r in records if r.get("event") == "expected_trajectory"],
            "manifest": json.loads((out / "run.json").read_text()),
        }
    good, bad = runs["good"], runs["sabotaged"]
    # The curve was stored before step 0: in run.json and as the first event after the start record.
    for run in (good, bad):
        assert run["manifest"]["expected_trajectory"]["loss"] == curve["loss"]
        assert run["registered"][0]["step"] == 0 and run["registered"][0]["curve"]["hi"] == curve["hi"]
    assert len(good["inside"]) >= 6 and all(good["inside"]) and good["alerts"] == []
    assert not any(bad["inside"]) and len(bad["alerts"]) == 1
    assert "above the expected band" in bad["alerts"][0]["message"]
    body = trajectory_section(load_run(tmp_path / "sabotaged"))
    assert f"0 of {len(bad['inside'])} validations inside the band; 1 off-trajectory alert(s)" in body
