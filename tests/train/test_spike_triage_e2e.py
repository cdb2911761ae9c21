"""Spikes triaged by replay, end to end: a planted poison document (a long run of one repeated token)
spikes; the run's own triage replays the spike bit for bit, labels it "data" and names the document;
`smelt data drop` puts it on the drop list; the next tokenize leaves it out and the retrained run has
no spike. A log that disagrees with the replay is labelled "nondeterministic or hardware".

The corpus is 20 files of the shared CPython standard library (fixed bytes) and the poison; with
run.seed 8 the poison's first windows land in one batch after the alerts start (two of its four rows)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from smelt.cli import main

POISON = "poison-zq"


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]


def _spikes(run: Path) -> list[dict]:
    return [r for r in _records(run) if r.get("alert") in ("loss_spike", "grad_spike")]


def _config(root: Path, shared: Path) -> Path:
    records = [json.loads(line) for line in (shared / "corpus" / "code" / "cpython_stdlib_lib.jsonl").open()]
    chosen = [r for r in records if 3000 < len(r["text"]) < 20000][:20]
    raw = root / "raw"
    raw.mkdir()
    with open(raw / "code.jsonl", "w", encoding="utf-8") as out:
        for i, record in enumerate(chosen):
            out.write(json.dumps({"id": record["path"], "text": record["text"]}) + "\n")
            if i == 10:
                out.write(json.dumps({"id": POISON, "text": "zq" + " zq" * 600 + "\n"}) + "\n")
    path = root / "spiky.toml"
    path.write_text(f"""
[run]
name = "spiky"
dir = "{root / "runs"}"
seed = 8
[data]
min_chars = 100
val_fraction = 0.0
[[data.sources]]
name = "code"
format = "jsonl"
root = "{raw}"
include = ["*.jsonl"]
id_field = "id"
code = true
filters = []
[tokenizer]
vocab_size = 512
sample_bytes = 1000000
[tokens]
workers = 1
[model]
preset = "tiny-1m"
max_seq_len = 64
[train]
seq_len = 64
micro_batch = 4
batch_tokens = 256
tokens = 12800
lr = 3e-3
warmup_tokens = 2560
log_every = 10
eval_every = 0
eval_tokens = 0
threads = 1
alert_min_history = 10
[checkpoint]
every_steps = 10
keep_last = 10
""")
    return path


@pytest.mark.slow
def test_a_poison_document_spikes_is_named_by_triage_and_dropping_it_removes_the_spike(
    tmp_path, shared_data, capsys
):
    config = str(_config(tmp_path, shared_data))
    run = tmp_path / "runs" / "spiky"
    for command in (["curate"], ["tokenizer", "train"], ["tokenize"], ["train"]):
        assert main([*command, config]) == 0
    spikes = _spikes(run)
    assert spikes, "the poison document made no spike"
    step = spikes[0]["step"]
    # The run triaged its first spike in a side process: a bitwise replay, so "data", naming the poison.
    triaged = {r["spike_step"]: r for r in _records(run) if r.get("event") == "spike_triage"}
    assert triaged[step]["label"] == "data" and triaged[step]["bitwise"] is True
    assert triaged[step]["suspects"] == [POISON]
    assert triaged[step]["top"][0]["id"] == POISON and "suspects: poison-zq" in triaged[step]["message"]
    result = json.loads((run / "train" / "spikes" / f"step_{step:07d}.json").read_text())
    assert result["documents"][0]["id"] == POISON and "zq zq zq" in result["documents"][0]["snippet"]
    assert all(not d["suspect"] for d in result["documents"][1:])

    # A log the replay does not reproduce (one part in 10^7) is not the data's doing.
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, symlinks=True)
    records = _records(copy)
    for record in records:
        if record.get("event") == "alert" and record["step"] == step:
            record["value"] *= 1 + 1e-7
    (copy / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    assert main(["train", "triage", str(copy), "--step", str(step)]) == 0
    out = capsys.readouterr().out
    assert "label: nondeterministic or hardware" in out
    assert main(["data", "drop", str(copy), "--spike", str(step)]) == 2  # nothing to drop for that label

    assert main(["data", "drop", str(run), "--spike", str(step)]) == 0
    drops = [json.loads(line) for line in (run / "drops.jsonl").read_text().splitlines()]
    assert [(d["source"], d["id"], d["spike_step"]) for d in drops] == [("code", POISON, step)]
    assert f"spike at step {step}" in drops[0]["reason"]
    assert main(["train", config]) == 2  # the token shards are stale until tokenize runs again
    assert main(["tokenize", config]) == 0
    dropped = [json.loads(line) for line in (run / "tokens" / "dropped.jsonl").read_text().splitlines()]
    assert [d["id"] for d in dropped] == [POISON]
    assert main(["train", config, "--restart"]) == 0
    assert _spikes(run) == []
