"""SFT: assistant-only loss, per-example masks in packed rows, the stage run from a parent checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from tests.helpers import build_model, tiny_model_config

from smelt.chat_template import ChatFormat
from smelt.model.transformer import IGNORE_INDEX
from smelt.posttrain.config import config_from_dict
from smelt.posttrain.sft import masked_loss, pack, run_sft
from smelt.tokenizer.load import Tokenizer


def _conversation(user: str, reply: str, follow_up: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": follow_up},
    ]


def _loss(model, chat, conversations, seq_len=96, reduction="mean"):
    packed = pack([chat.encode(c) for c in conversations], seq_len, chat.tokenizer.pad_id)
    assert len(packed) == 1  # every conversation shares one row
    batch = packed.rows([0], torch.device("cpu"))
    with torch.no_grad():
        return masked_loss(model, batch, reduction=reduction)["ce"], packed


def test_a_changed_user_turn_leaves_the_loss_unchanged(tokenizer_dir):
    chat = ChatFormat(Tokenizer.load(tokenizer_dir))
    model = build_model(tiny_model_config(max_seq_len=128)).eval()
    base, _ = _loss(model, chat, [_conversation("What is 1+2?", "3", "thanks")])
    # The user turn after the reply is context for nothing trained: were user tokens targets, this moved.
    changed, _ = _loss(model, chat, [_conversation("What is 1+2?", "3", "a much longer, different reply")])
    assert torch.equal(base, changed)
    # A changed assistant reply does change it (the loss is not blind).
    other, _ = _loss(model, chat, [_conversation("What is 1+2?", "4", "thanks")])
    assert not torch.equal(base, other)


def test_packed_neighbours_do_not_see_each_other(tokenizer_dir):
    chat = ChatFormat(Tokenizer.load(tokenizer_dir))
    model = build_model(tiny_model_config(max_seq_len=128)).eval()
    second = _conversation("And 5+5?", "10", "ok")
    a, packed = _loss(model, chat, [_conversation("What is 1+2?", "3", "x"), second], reduction="none")
    b, other = _loss(
        model, chat, [_conversation("Something else entirely", "3", "x"), second], reduction="none"
    )
    in_second = packed.doc_ids[0] == 2
    # The second conversation's per-token losses, wherever it sits in the row.
    assert torch.equal(a[0][in_second], b[0][other.doc_ids[0] == 2])
    assert packed.position_ids[0][in_second][0] == 0  # its RoPE positions restart
    trained = packed.targets[0] != IGNORE_INDEX
    assert (a[0][~trained] == 0).all() and (a[0][trained] > 0).all()


def test_pack_cuts_long_conversations_and_counts_them(tokenizer_dir):
    chat = ChatFormat(Tokenizer.load(tokenizer_dir))
    long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "12+34=46 " * 40}]
    packed = pack([chat.encode(long)], 32, chat.tokenizer.pad_id)
    assert packed.truncated == 1 and packed.inputs.shape == (1, 32)


def _sft_config(base_run, out, **optim):
    return config_from_dict({
        "stage": "sft",
        "run": {"init_from": str(base_run), "out": str(out), "seed": 0},
        "data": {"format": "addition", "addition_items": 200, "heldout": 20},
        "optim": {"lr": 3e-3, "steps": 30, "batch_size": 8, "seq_len": 64, "log_every": 5, **optim},
    })  # fmt: skip


@pytest.mark.slow
def test_sft_stage_lowers_validation_loss_and_records_the_parent(base_run, tmp_path):
    out = tmp_path / "sft"
    summary = run_sft(_sft_config(base_run, out))
    assert summary["val_loss"] < summary["val_loss_before"]
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    start = records[0]
    assert start["event"] == "start" and start["parent"]["step"] == 1
    assert start["parent"]["run_dir"] == str(base_run.resolve())
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 5, 10, 15, 20, 25, 30]
    run = json.loads((out / "train" / "run.json").read_text())
    assert run["stage"] == "sft" and run["parent"]["cumulative_tokens"] == 1000
    assert run["host_memory"].startswith("train.keep_host_memory")  # freed host memory reused on CPU
    assert (out / "train" / "checkpoints" / "step_0000030" / "COMMITTED").is_file()
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert json.loads((out / "summary.json").read_text())["tokens_per_s"] > 0


def test_an_interrupted_attempt_is_said_to_start_over(base_run, tmp_path, capsys, monkeypatch):
    """An attempt killed before its first checkpoint cannot resume: the next run says plainly that it starts
    over from step 0, and keeps the earlier records beside the new ones."""
    monkeypatch.delenv("SMELT_QUIET", raising=False)  # the status lines are what is tested
    out = tmp_path / "sft"
    (out / "train").mkdir(parents=True)
    earlier = [{"kind": "event", "event": "start", "step": 0}, {"kind": "train", "step": 10, "loss": 3.0}]
    (out / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    run_sft(_sft_config(base_run, out, steps=2, log_every=1))
    said = capsys.readouterr()
    assert "stopped after step 10, before its first checkpoint" in said.out + said.err
    assert "starts over from step 0" in said.out + said.err
    assert (out / "train" / "metrics.jsonl.1").read_text().count('"step": 10') == 1
