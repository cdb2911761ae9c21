"""bench/effects_context.py at tiny size (trained at 64 tokens instead of 256, extended to 256 instead of
1024): its passkey documents never contain a scored key and stay within their lengths, and a model
trained at 64 tokens on them, extended to 256 with YaRN x4 through `smelt train --from`, has a lower
held-out loss at positions 64-255 than the same base with its RoPE table merely widened: the sign of a
figure the benchmark records (its passkey accuracy takes minutes of training, too long for a test);
and the per-digit passkey figure has five shares that bound exact match from above."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from smelt.cli import main

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import effects_context  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = """\
[run]
name = "base"
dir = "{runs}"
seed = 0

[data]
min_chars = 100
val_fraction = 0.1

[[data.sources]]
name = "passkey"
format = "jsonl"
root = "{data}"
include = ["passkey-*.jsonl"]
id_field = "id"
filters = []

[tokenizer]
vocab_size = 512
sample_bytes = 200_000
pattern = {pattern}

[tokens]
workers = 1

[model]
d_model = 64
n_layers = 2
n_heads = 2
max_seq_len = 64
# The slowest RoPE pair's wavelength (about 470 tokens at theta 100 for 32-dim heads) a few times the
# trained length, as for a real model at 4x its length: past 64 the unextended model meets angles it
# never saw (at theta 10,000 they barely turn by 256 and nothing needs extending).
rope_theta = 100.0

[train]
seq_len = 64
micro_batch = 8
tokens = 40_960
lr = 5e-3
warmup_tokens = 2_048
threads = 1
compile = false
spike_triage = "off"
eval_every = 0
eval_tokens = 4_096

[eval]
tasks = []
prompts = []
"""


def test_passkey_documents_hold_no_scored_key_and_extension_lowers_the_loss_past_the_trained_length(
    tmp_path, monkeypatch
):
    # One question per document, so that the short ones fit in 64 tokens (the benchmark's ask up to 8).
    settings = {"TRAINED": 64, "EXTENDED": 256, "SHORT_DOCS": 1200, "LONG_DOCS": 150, "MAX_QUERIES": 1}
    for name, value in settings.items():
        monkeypatch.setattr(effects_context, name, value)
    data = tmp_path / "data"
    disjoint = effects_context.write_passkey_docs(data)
    assert disjoint["scored_keys_found_in_training_text"] == 0
    assert disjoint["training_keys"] == sum(disjoint["training_documents"].values()) == 1350
    _, held = effects_context.scored_items()
    texts = {n: [json.loads(line)["text"] for line in (data / f"passkey-{n}.jsonl").read_text().splitlines()]
             for n in ("short", "long")}  # fmt: skip
    assert not any(key in text for docs in texts.values() for text in docs for key in held)
    # Every document asks for its key at least once, and the answers are the key of its needle.
    for text in texts["short"][:50]:
        key = text.split("The pass key is ")[1][:5]
        assert text.count("What is the pass key? The pass key is " + key) >= 1
    # The long documents are longer than the short ones (in characters; ~4 per token).
    assert min(map(len, texts["long"])) > max(map(len, texts["short"])) / 2

    runs = tmp_path / "runs"
    config = tmp_path / "base.toml"
    config.write_text(CONFIG.format(runs=runs, data=data, pattern=json.dumps(effects_context.PATTERN)))
    assert main(["run", str(config)]) == 0
    extend = ["train.seq_len=256", "model.max_seq_len=256", "model.rope_scaling='yarn'", "model.rope_factor=4.0",
              "model.rope_original_max_seq_len=64", "train.micro_batch=4", "train.tokens=30_720",
              "train.lr=2e-3", "train.warmup_tokens=2_048", "train.fork_data='restart'", "run.name='extended'"]  # fmt: skip
    argv = ["train", str(config), "--from", str(runs / "base")]
    assert main([*argv, *[a for item in extend for a in ("--set", item)]]) == 0
    meta = json.loads(
        next((runs / "extended" / "train" / "checkpoints").glob("step_*/meta.json")).read_text()
    )
    assert meta["config"]["model"]["rope_scaling"] == "yarn"

    base = effects_context.loss_by_position(runs / "base", runs / "base", trained=64, extended=256)
    extended = effects_context.loss_by_position(runs / "extended", runs / "base", trained=64, extended=256)
    assert base["tokens_64_255"] > 1000
    assert extended["64-255"] < base["64-255"], (base, extended)

    # The per-digit figure: five shares, and no item is an exact match unless each of its digits is right.
    from smelt.layout import latest_checkpoint

    monkeypatch.setattr(effects_context, "TRAINED", 128)  # the prompt without filler takes about 80 tokens
    scored = effects_context.passkey_accuracy(
        latest_checkpoint(runs / "extended" / "train" / "checkpoints"), runs / "base" / "tokenizer"
    )
    for length in ("256", "1024"):
        digits = scored[f"digits_at_{length}"]
        assert len(digits) == 5 and all(0.0 <= x <= 1.0 for x in digits), digits
        assert scored[f"exact_at_{length}"] <= min(digits) + 1e-9, scored
