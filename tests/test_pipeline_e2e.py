"""End to end on a tiny slice of the built-in corpus: every stage real, caching, determinism."""

import json

import pytest

from smelt.cli import QUICKSTART_CONFIG, main
from smelt.manifest import read_manifest

TINY = [
    "data.sources.0.max_files=80",
    "tokenizer.vocab_size=512",
    "tokenizer.sample_bytes=1000000",
    "model.preset='tiny-1m'",
    "model.max_seq_len=128",
    "train.seq_len=128",
    "train.micro_batch=8",
    "train.batch_tokens=2048",
    "train.tokens=40960",
    "train.warmup_tokens=4096",
    "train.eval_every=10",
    "train.eval_tokens=4096",
    "eval.max_new_tokens=8",
    "eval.max_bytes=40000",
]
STAGE_DIRS = ("documents", "tokenizer", "tokens", "train", "eval")


def quickstart(tmp_path, *extra):
    args = ["quickstart", "--run-dir", str(tmp_path)]
    for item in [*TINY, *extra]:
        args += ["--set", item]
    assert main(args) == 0
    return json.loads((tmp_path / "quickstart" / "summary.json").read_text())


@pytest.mark.slow
def test_quickstart_tiny_end_to_end_caching_and_determinism(tmp_path, capsys):
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    summary = quickstart(first_dir)
    run = first_dir / "quickstart"
    for name in STAGE_DIRS:
        assert read_manifest(run / name) is not None, name
    assert summary["documents_kept"] > 0 and summary["documents_in"] >= summary["documents_kept"]
    assert summary["params_total"] > 0 and summary["train_tokens_per_s"] > 0
    assert 0 < summary["val_bits_per_byte"] < 8
    assert 0 < summary["val_gzip_bits_per_byte"] < 8 and 0 < summary["val_xz_bits_per_byte"] < 8
    assert len(summary["samples"]) == 3
    assert (run / "train" / "metrics.jsonl").is_file()
    report = (run / "report.html").read_text()  # the quickstart ends by writing its report
    assert (
        "http://" not in report
        and "https://" not in report
        and str(run / "report.html") in capsys.readouterr().out
    )
    checkpoint = run / "train" / "checkpoints"
    assert any((p / "COMMITTED").is_file() for p in checkpoint.iterdir())
    assert not any(s["skipped"] for s in summary["stages"].values())
    first_outputs = {
        name: read_manifest(run / name)["outputs"] for name in ("documents", "tokenizer", "tokens")
    }
    first_tokenizer = (run / "tokenizer" / "tokenizer.json").read_bytes()

    assert main(["eval", str(run), "--force"]) == 0
    step = summary["train_steps"]
    assert main(["eval", str(run), "--checkpoint", str(step)]) == 0
    result = json.loads((run / "eval" / f"step_{step:07d}.json").read_text())
    assert result["heldout"]["overall"]["bits_per_byte"] == summary["val_bits_per_byte"]
    assert main(["eval", str(run), "--checkpoint", "999999"]) == 2

    overrides = [arg for item in TINY for arg in ("--set", item)]
    config = ["--set", f"run.dir='{first_dir}'", *overrides]
    assert main(["tokenizer", "eval", str(QUICKSTART_CONFIG), *config]) == 0
    assert (run / "tokenizer_eval" / "tokenizer_eval.svg").is_file()
    assert main(["export", "hf", str(run)]) == 0
    assert (run / "export" / "hf" / "model.safetensors").is_file()
    assert main(["export", "hf", str(run), "--checkpoint", "12345"]) == 2
    assert main(["inspect", "shards", str(run / "tokens"), "--source", "stdlib", "--length", "32"]) == 0
    capsys.readouterr()
    assert main(["inspect", "batches", str(QUICKSTART_CONFIG), *config, "--step", "3", "--rows", "2"]) == 0
    assert "stdlib" in capsys.readouterr().out

    # An interrupted tokenize (its attempt marker, no manifest yet) resumes from its finished shards;
    # an interrupted attempt with another config starts over.
    manifest = read_manifest(run / "tokens")
    (run / "tokens" / "manifest.json").unlink()
    attempt = {"config_hash": "another config", "inputs": manifest["inputs"]}
    (run / "tokens" / "attempt.json").write_text(json.dumps(attempt))
    assert main(["tokenize", str(QUICKSTART_CONFIG), *config]) == 0
    assert read_manifest(run / "tokens")["result"]["resumed_shards"] == 0
    (run / "tokens" / "manifest.json").unlink()
    attempt["config_hash"] = manifest["config_hash"]
    (run / "tokens" / "attempt.json").write_text(json.dumps(attempt))
    assert main(["tokenize", str(QUICKSTART_CONFIG), *config]) == 0
    assert not (run / "tokens" / "attempt.json").exists()
    assert read_manifest(run / "tokens")["result"]["resumed_shards"] >= 1
    assert read_manifest(run / "tokens")["outputs"] == first_outputs["tokens"]

    again = quickstart(first_dir)
    assert all(s["skipped"] for s in again["stages"].values())
    assert again["final_val_loss"] == summary["final_val_loss"]

    # A tokenizer change would retrain over committed checkpoints: it stops (exit 2) before any stage
    # runs; --restart reruns the chain from the tokenizer on and keeps the old train/ aside.
    vocab = ["--set", "tokenizer.vocab_size=640"]
    assert main(["quickstart", "--run-dir", str(first_dir), *overrides, *vocab]) == 2
    assert read_manifest(run / "tokenizer")["outputs"] == first_outputs["tokenizer"]
    assert main(["run", str(QUICKSTART_CONFIG), *config, *vocab, "--restart"]) == 0
    # The old train/ and what its checkpoints were trained with (tokenizer/, tokens/) are kept aside.
    # (The tokenize rerun above, while train/ held checkpoints, had already kept one tokens/ aside.)
    assert {p.name.split("-")[0] for p in (run / "superseded").iterdir()} == {"tokenizer", "tokens", "train"}
    changed = json.loads((run / "summary.json").read_text())
    skipped = {name: s["skipped"] for name, s in changed["stages"].items()}
    assert skipped == {"curate": True, "tokenizer": False, "tokenize": False, "train": False, "eval": False}
    assert changed["vocab_size"] == 640

    twin = quickstart(second_dir)
    twin_run = second_dir / "quickstart"
    for name in ("documents", "tokenizer", "tokens"):
        assert read_manifest(twin_run / name)["outputs"] == first_outputs[name], name
    assert (twin_run / "tokenizer" / "tokenizer.json").read_bytes() == first_tokenizer
    assert twin["final_train_loss"] == summary["final_train_loss"]
    assert twin["final_val_loss"] == summary["final_val_loss"]
    assert twin["val_bits_per_byte"] == summary["val_bits_per_byte"]
