"""A synthetic run directory with every artifact the reports read, in the layouts the stages write.

Building it by hand (instead of training) keeps the report tests fast, and lets one run hold every
kind of record at once: two sources, alerts, a skip, a rollback, a resume, a stage change, mixture
windows, per-layer update ratios, task scores and a gallery file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

SOURCES = ("code", "web")
BATCH_TOKENS = 2048
STEPS = 40
FLOPS_PER_TOKEN = 5.0e6


def _write(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))


def _manifest(
    stage: str, inputs: dict, outputs_hash: str, seed: int, config: dict, result: dict | None = None
):
    return {
        "stage": stage,
        "config": config,
        "config_hash": f"{stage}-config-{seed}",
        "inputs": inputs,
        "outputs": {"x": "y"},
        "outputs_hash": outputs_hash,
        "seed": seed,
        "code": {"package": "0.1.0", "commit": "abcdef1234567890", "dirty": False},
        "libraries": {"python": "3.11", "torch": "2.x"},
        "started": "2026-01-01T00:00:00+0000",
        "wall_time_s": 1.5,
        "result": result or {},
    }


def _stats() -> dict:
    steps = []
    counts = {"read": 50, "length_filter": 45, "exact_dedup": 40}
    for step, out in counts.items():
        steps.append(
            {
                "step": step,
                "in": 100 if step == "read" else 90,
                "out": 2 * out,
                "chars_in": None if step == "read" else 9000,
                "chars_out": 180 * out,
                "sources": {
                    s: {"in": 50, "out": out, "chars_in": 9000, "chars_out": 90 * out} for s in SOURCES
                },
            }
        )
    source = {
        "documents_in": 50,
        "documents_kept": 40,
        "dropped": {"too_short": 5, "exact_duplicate": 5},
        "quarantined": {},
        "splits": {},
    }
    return {
        "documents_in": 100,
        "documents_kept": 80,
        "dropped": {"too_short": 10, "exact_duplicate": 10},
        "quarantined": {},
        "sources": dict.fromkeys(SOURCES, source),
        "steps": steps,
    }


def metrics_records(seed: int = 1, lr: float = 3e-3, resume: bool = True, tasks: bool = True) -> list[dict]:
    """A 40-step run on two sources with a stage change at step 21 and every kind of event."""
    t = lambda step: step * BATCH_TOKENS  # noqa: E731
    shift = 0.01 * seed
    start = {
        "kind": "event", "step": 0, "tokens": 0, "event": "start", "steps": STEPS, "batch_tokens": BATCH_TOKENS,
        "grad_accum": 1, "warmup_steps": 4, "schedule": "cosine", "precision": "fp32", "device": "cpu",
        "params_total": 1000, "params_non_embedding": 800, "flops_per_token": FLOPS_PER_TOKEN,
        "peak_flops": 1e12, "world_size": 1, "parallel": None, "config_hash": f"hash-{lr}", "doc_masking": True,
    }  # fmt: skip
    records = [
        start,
        {"kind": "event", "step": 0, "tokens": 0, "event": "data_plan", "seq_len": 128, "batch_size": 16,
         "steps": STEPS, "sources": {s: {"tokens": 50000, "sequences": 390, "consumed": 320, "epochs": 0.82}
                                     for s in SOURCES},
         "stages": [{"name": "main", "first_step": 1, "last_step": 20, "tokens": 40960, "weights": {"code": 0.5, "web": 0.5}},
                    {"name": "anneal", "first_step": 21, "last_step": 40, "tokens": 40960, "weights": {"code": 0.8, "web": 0.2}}]},
        {"kind": "event", "step": 0, "tokens": 0, "event": "stage", "stage": "main", "index": 0, "first_step": 1,
         "last_step": 20, "weights": {"code": 0.5, "web": 0.5}},
    ]  # fmt: skip
    for step in range(1, STEPS + 1):
        if step == 21:
            records.append({"kind": "event", "step": 20, "tokens": t(20), "event": "stage", "stage": "anneal",
                            "index": 1, "first_step": 21, "last_step": 40, "weights": {"code": 0.8, "web": 0.2}})  # fmt: skip
        if step == 13:
            records.append({"kind": "event", "step": 13, "tokens": t(13), "event": "alert", "alert": "loss_spike",
                            "action": "skip", "message": "loss 9.1 is 6.2 std above its mean", "value": 9.1,
                            "threshold": 7.0})  # fmt: skip
            records.append(
                {"kind": "event", "step": 13, "tokens": t(13), "event": "skip", "loss": 9.1, "grad_norm": 4.0}
            )
        if step == 17:
            records.append({"kind": "event", "step": 17, "tokens": t(17), "event": "rollback", "to_step": 15,
                            "path": "ckpt/step_0000015", "skipped_steps": [16, 17]})  # fmt: skip
        if step == 25 and resume:
            records.append(
                {**start, "step": 24, "tokens": t(24), "event": "resume", "from": "ckpt/step_0000024"}
            )
        if step % 2 == 0:
            loss = 6.0 * math.exp(-step / 30) + 2.0 + shift
            records.append({
                "kind": "train", "step": step, "tokens": t(step), "loss": loss, "lr": lr * min(1, step / 4),
                "grad_norm": 1.5 / math.sqrt(step), "grad_norm_clipped": min(1.0, 1.5 / math.sqrt(step)),
                "clipped": step < 3, "clip_fraction": 0.5 if step < 4 else 0.0, "skipped": int(step == 14),
                "tokens_per_s": 5000.0 + step, "mfu": 0.05, "stage": "main" if step <= 20 else "anneal",
                "loader_wait_s": 0.001, "loader_wait_share": 0.01, "memory_mb": 500.0, "elapsed_s": step * 0.5,
            })  # fmt: skip
        if step % 10 == 0:
            val = 6.0 * math.exp(-step / 30) + 2.1 + shift
            records.append({"kind": "eval", "step": step, "tokens": t(step), "val_loss": val, "val_tokens": 4096,
                            "val_loss_by_source": {"code": val - 0.2, "web": val + 0.2}})  # fmt: skip
            records.append({"kind": "event", "step": step, "tokens": t(step), "event": "mixture", "stage": "main",
                            "first_step": step - 9, "window_sequences": 160,
                            "realized": {"code": 0.52, "web": 0.48}, "target": {"code": 0.5, "web": 0.5},
                            "max_drift": 0.02})  # fmt: skip
            records.append({"kind": "event", "step": step, "tokens": t(step), "event": "checkpoint",
                            "path": f"ckpt/step_{step:07d}"})  # fmt: skip
        if step == 30 and tasks:  # an in-loop task evaluation: flat "task/metric" keys
            records.append({"kind": "eval", "step": step, "tokens": t(step), "piqa/acc": 0.55})
        if step % 20 == 0:
            records.append({"kind": "layers", "step": step, "tokens": t(step),
                            "layers": {"embed.weight": {"update_ratio": 1e-3, "weight_norm": 10.0},
                                       "layers.0.attn.wq.weight": {"update_ratio": 2e-3, "weight_norm": 3.0}}})  # fmt: skip
    records.append({"kind": "event", "step": STEPS, "tokens": t(STEPS), "event": "end", "status": "ok",
                    "wall_time_s": 20.0, "skipped_steps": 3, "rollbacks": 1})  # fmt: skip
    return records


def make_run(root: Path, name: str = "tiny", seed: int = 1, lr: float = 3e-3, full: bool = True) -> Path:
    """Write a run directory; `full=False` writes metrics.jsonl alone (a bare trainer output)."""
    run = root / name
    train_dir = run / "train"
    train_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in metrics_records(seed, lr, tasks=full)]
    (train_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if not full:
        return run
    config = {"run": {"name": name, "dir": str(root), "seed": seed}, "train": {"lr": lr, "tokens": 81920},
              "model": {"preset": "tiny-1m"}}  # fmt: skip
    _write(run / "config.json", config)
    stats = _stats()
    _write(run / "documents" / "stats.json", stats)
    _write(
        run / "documents" / "manifest.json",
        _manifest("curate", {"raw:code": "r1", "raw:web": "r2"}, "docs-h", seed, {}, stats),
    )
    tok_result = {"padded_vocab_size": 512, "trained_vocab_size": 448, "val_bytes_per_token": 2.05}
    _write(
        run / "tokenizer" / "manifest.json",
        _manifest("tokenizer", {"curate": "docs-h"}, "tok-h", seed, {}, tok_result),
    )
    _write(run / "tokenizer" / "smelt.json", {"vocab_size": 512, "eos_id": 1})
    shards = {"splits": {"train": {"sources": {s: {"documents": 40, "tokens": 50000, "bytes": 100000,
                                                   "bytes_per_token": 2.0} for s in SOURCES}}}}  # fmt: skip
    _write(run / "tokens" / "stats.json", shards)
    _write(
        run / "tokens" / "manifest.json",
        _manifest("tokenize", {"curate": "docs-h", "tokenizer": "tok-h"}, "shards-h", seed, {}),
    )
    # The train manifest read an older tokens output: the report must flag it as stale.
    _write(
        run / "train" / "manifest.json",
        _manifest("train", {"tokenize": "OLD", "tokenizer": "tok-h"}, "train-h", seed, {}),
    )
    _write(run / "tokenizer_eval" / "tokenizer_eval.json", {"results": {"run": {
        "groups": {s: {"bytes_per_token": 2.0, "fertility": 1.5, "continued_word_rate": 0.3} for s in SOURCES},
        "never_produced": 12, "never_produced_share": 0.02}}})  # fmt: skip
    for step in (20, 40):
        bpb = 3.0 - step / 40 + 0.01 * seed
        overall = {"bits_per_byte": bpb, "loss": 2.5, "gzip_bits_per_byte": 1.8, "xz_bits_per_byte": 1.7,
                   "documents": 5, "bytes": 1000, "tokens": 500}  # fmt: skip
        _write(run / "eval" / f"step_{step:07d}.json", {
            "step": step, "tokens_seen": step * BATCH_TOKENS, "checkpoint": f"ckpt/step_{step:07d}",
            "checkpoint_hash": "c", "task_set_version": "tasks-v1",
            "heldout": {"overall": overall, "per_source": {s: overall for s in SOURCES}},
            "tasks": {"hellaswag": {"formulation": "cloze", "metric": "acc", "items": 500, "skipped": 0, "shots": 0,
                                    "acc": 0.25 + step / 400, "acc_per_char": 0.26 + step / 400, "chance": 0.25,
                                    "score": 0.25 + step / 400, "stderr": 0.02,
                                    "contamination": {"benchmark": "hellaswag", "items": 500, "items_matched": 3,
                                                      "documents": 2, "action": "remove"}},
                      "arc_easy": 0.3 + step / 1000},
            "samples": [{"prompt": "def ", "completion": f"foo_{step}():"}],
            "gallery": [{"prompt": "import os\n", "completion": "import sys" if step == 20 else "import re"}],
        })  # fmt: skip
    _write(run / "eval" / "gallery.json", {"steps": [20, 40], "prompts": [
        {"prompt": "import os\n", "completions": {"20": "import sys", "40": "import re"}},
        {"prompt": "class ", "completions": {"20": "A:", "40": "Parser:"}}]})  # fmt: skip
    return run


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def tiny_run(runs_dir: Path) -> Path:
    return make_run(runs_dir)


@pytest.fixture
def run_factory(runs_dir: Path):
    def factory(name: str, **kwargs) -> Path:
        return make_run(runs_dir, name, **kwargs)

    return factory


@pytest.fixture(name="metrics_records")
def metrics_records_fixture():
    return metrics_records
