"""Held out means held out: the addition task's training and held-out problems are disjoint, every
held-out and evaluation item is decontaminated against the training data, `smelt posttrain eval`
scores the task the run trained on, and input that teaches nothing is dropped and counted."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
from pathlib import Path

import pytest

from smelt.data.dedup.decontam import overlapping_items
from smelt.errors import UserError
from smelt.posttrain.chat import addition_heldout, addition_items, heldout_addition_problems, write_jsonl
from smelt.posttrain.config import config_from_dict
from smelt.posttrain.data import conversation_split, pair_split
from smelt.posttrain.evaluate import (
    evaluate_run,
    lineage_configs,
    lineage_training_texts,
    trained_addition_digits,
)
from smelt.posttrain.sft import run_sft
from smelt.run.lifecycle import stage_lock

LONG = "Natalia sold clips to {n} of her friends in April, and then she sold half as many clips in May."


def _prompts(items: list[dict]) -> set[str]:
    return {item["messages"][0]["content"] for item in items}


def _chat(user: str, reply: str | None = "ok") -> dict:
    messages = [{"role": "user", "content": user}]
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    return {"messages": messages}


# --- the addition task -------------------------------------------------------------------------


@pytest.mark.parametrize("digits", [1, 2])
def test_addition_training_and_heldout_problems_are_disjoint(digits):
    # Before: 2,000 training items (seed 12345) covered all 100 1-digit problems, and the 40 evaluation
    # items (seed 999) were all among them.
    held_n = heldout_addition_problems(digits)
    cfg = config_from_dict({"data": {"format": "addition", "addition_digits": digits, "addition_items": 2000,
                                     "heldout": min(held_n, 64)}})  # fmt: skip
    split = conversation_split(cfg.data, 0, "sft")
    train = _prompts(split.train)
    held = _prompts(split.held)
    evaluated = _prompts(addition_items(min(held_n, 40), 999, digits, heldout=True))
    assert len(split.train) == 2000 and len(held) == len(split.held) == min(held_n, 64)
    assert not train & held and not train & evaluated
    # a+b and b+a fall on the same side: the commutative twin of a held-out problem is not trained on.
    assert not {"+".join(reversed(p.split("+"))) for p in held} & train
    assert split.contaminated == 0
    if digits == 1:  # 2,000 draws cover every training problem, and none of the 25 held out
        assert held_n == 25 and len(train) == 100 - 25
        assert all(not addition_heldout(*map(int, p.split("+"))) for p in train)


@pytest.mark.parametrize("name", ["sft_addition.toml", "grpo_addition.toml"])
def test_the_example_addition_configs_hold_out_every_held_out_problem(name):
    from smelt.posttrain.config import load_posttrain_config

    cfg = load_posttrain_config(Path(__file__).resolve().parents[2] / "configs" / "posttrain" / name)
    split = conversation_split(cfg.data, cfg.run.seed, cfg.stage)
    assert len(split.held) == 25 and not _prompts(split.train) & _prompts(split.held)
    assert cfg.eval.items in (25, 64)  # GRPO scores all 25 (SFT's eval.items is unused)


def test_asking_for_more_heldout_problems_than_exist_names_the_key_and_the_fix(tmp_path):
    cfg = config_from_dict({"data": {"format": "addition", "addition_digits": 1, "heldout": 200}})
    with pytest.raises(UserError, match=r"data.heldout = 200 asks for more held-out addition problems than "
                       r"exist: of the 100 problems with 1-digit operands, 25 are held out .*Set data.heldout "
                       r"to 25 or fewer, or raise data.addition_digits"):  # fmt: skip
        conversation_split(cfg.data, 0, "sft")
    run = _fake_run(tmp_path / "sft", {"format": "addition", "addition_digits": 1})
    with pytest.raises(UserError, match=r"--addition = 40 asks for more .*Pass --addition 25 or fewer"):
        evaluate_run(run, addition=40)


# --- decontamination --------------------------------------------------------------------------


def test_overlapping_items_uses_13_grams_and_exact_match_for_short_items():
    long_a, long_b = LONG.format(n=48), LONG.format(n=12)
    items = ["3+4", "3+4", "9+9", long_a, long_b, "   "]
    texts = ["3 + 4", f"Question: {long_a.upper()} Answer: 72", "9+9=18"]
    # "9+9=18" holds "9+9" but is not it: a short item is only compared whole (it occurs everywhere).
    # long_b differs from long_a in one word, which 5 of its 7 13-grams hold: 2 of 7 match, under half.
    assert overlapping_items(items, texts) == {0, 1, 3}
    assert overlapping_items(items, texts, threshold=0.2) == {0, 1, 3, 4}


def test_heldout_conversations_whose_prompt_is_in_training_are_dropped_and_counted(tmp_path):
    records = [_chat(LONG.format(n=n), str(n)) for n in range(30)]
    records += [
        _chat(LONG.format(n=n).replace(",", " ,").lower(), "again") for n in range(30)
    ]  # same prompts
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, records)
    cfg = config_from_dict({"data": {"format": "chat", "path": str(path), "heldout": 20}})
    split = conversation_split(cfg.data, 0, "sft")

    def number(item: dict) -> str:  # which problem a conversation asks, in either spelling
        return re.search(r"\d+", item["messages"][0]["content"]).group()

    assert split.contaminated > 0 and len(split.held) == 20 - split.contaminated
    assert not {number(item) for item in split.held} & {number(item) for item in split.train}
    assert split.stats() == {"dropped": {}, "heldout_contaminated": split.contaminated}


def test_heldout_pairs_whose_prompt_is_in_training_are_dropped(tmp_path):
    pairs = []
    for n in range(40):
        prompt = [{"role": "user", "content": f"{n % 20}+1"}]  # every prompt twice
        pairs.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": str(n % 20 + 1)}],
                      "rejected": [{"role": "assistant", "content": f"{n} no"}]})  # fmt: skip
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, pairs)
    split = pair_split(
        config_from_dict({"data": {"format": "preferences", "path": str(path), "heldout": 10}}).data, 0
    )
    train = {p["prompt"][0]["content"] for p in split.train}
    assert split.contaminated > 0 and len(split.held) == 10 - split.contaminated
    assert not {p["prompt"][0]["content"] for p in split.held} & train


def test_a_heldout_file_replaces_the_shuffle_and_is_still_decontaminated(tmp_path):
    def pair(a: int, b: int) -> dict:
        return {"prompt": [{"role": "user", "content": f"{a}+{b}"}],
                "chosen": [{"role": "assistant", "content": str(a + b)}],
                "rejected": [{"role": "assistant", "content": str(a + b + 1)}]}  # fmt: skip

    write_jsonl(tmp_path / "train.jsonl", [pair(a, 1) for a in range(20)])
    write_jsonl(tmp_path / "test.jsonl", [pair(a, 2) for a in range(12)] + [pair(3, 1)])  # 3+1 is trained on
    data = {
        "format": "preferences",
        "path": str(tmp_path / "train.jsonl"),
        "heldout_path": str(tmp_path / "test.jsonl"),
    }
    split = pair_split(config_from_dict({"data": {**data, "heldout": 0}}).data, 0)
    assert len(split.train) == 20 and split.contaminated == 1  # every training pair trains; 3+1 dropped
    assert [p["prompt"][0]["content"] for p in split.held] == [f"{a}+2" for a in range(12)]
    capped = pair_split(config_from_dict({"data": {**data, "heldout": 5}}).data, 0)
    assert len(capped.train) == 20 and len(capped.held) == 5
    chat = tmp_path / "chat.jsonl"
    write_jsonl(chat, [_chat(f"q{n}", "a") for n in range(6)])
    conversations = conversation_split(
        config_from_dict({"data": {"format": "chat", "path": str(chat), "heldout_path": str(chat), "heldout": 0}}).data,
        0, "sft",
    )  # fmt: skip
    assert len(conversations.train) == 6 and conversations.held == [] and conversations.contaminated == 6


# --- input that teaches nothing ---------------------------------------------------------------


def test_conversations_and_pairs_that_teach_nothing_are_dropped_with_a_reason(tmp_path):
    path = tmp_path / "chat.jsonl"
    records = [_chat(f"question {i}", f"answer {i}") for i in range(10)]
    records += [_chat("no reply", None), _chat("   ", "x"), _chat("y", ""), _chat("unanswered", None)]
    write_jsonl(path, records)
    data = config_from_dict({"data": {"format": "chat", "path": str(path), "heldout": 2}}).data
    split = conversation_split(data, 0, "sft")
    assert split.dropped == {"no_assistant_turn": 2, "empty_content": 2}
    assert len(split.train) + len(split.held) == 10
    assert {r["where"] for r in split.dropped_records} == {f"{path}:{n}" for n in (11, 12, 13, 14)}
    # For RL a conversation without a reply is a prompt, which is what it trains on.
    assert conversation_split(data, 0, "grpo").dropped == {"empty_content": 2}

    pairs = tmp_path / "pairs.jsonl"
    good = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
            "rejected": [{"role": "assistant", "content": "go away"}]}  # fmt: skip
    write_jsonl(pairs, [good] * 6 + [{**good, "rejected": good["chosen"]},
                                     {**good, "chosen": [{"role": "user", "content": "me"}]},
                                     {**good, "prompt": [{"role": "user", "content": ""}]}])  # fmt: skip
    split = pair_split(
        config_from_dict({"data": {"format": "preferences", "path": str(pairs), "heldout": 0}}).data, 0
    )
    assert split.dropped == {"identical_replies": 1, "no_assistant_turn": 1, "empty_content": 1}
    with pytest.raises(UserError, match=r"no training items \(3 records dropped: .*identical_replies"):
        write_jsonl(pairs, [{**good, "rejected": good["chosen"]}] * 3)
        pair_split(config_from_dict({"data": {"format": "preferences", "path": str(pairs)}}).data, 0)


def _sft(base_run: Path, out: Path, data: dict) -> dict:
    return config_from_dict({
        "stage": "sft", "run": {"init_from": str(base_run), "out": str(out), "seed": 0},
        "data": data, "optim": {"lr": 1e-3, "steps": 1, "batch_size": 2, "seq_len": 64, "log_every": 1},
    })  # fmt: skip


def test_sft_counts_dropped_input_in_its_stats(base_run, tmp_path):
    path = tmp_path / "chat.jsonl"
    write_jsonl(
        path, [_chat(f"{i}+1", str(i + 1)) for i in range(8)] + [_chat("no reply", None), _chat("x", "")]
    )
    out = tmp_path / "sft"
    summary = run_sft(_sft(base_run, out, {"format": "chat", "path": str(path), "heldout": 2}))
    expected = {"no_assistant_turn": 1, "empty_content": 1}
    assert summary["dropped"] == expected and summary["train_items"] + summary["heldout_items"] == 8
    start = json.loads((out / "train" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["dropped"] == expected
    assert json.loads((out / "train" / "run.json").read_text())["dropped"] == expected
    assert [json.loads(line)["reason"] for line in (out / "train" / "dropped.jsonl").read_text().splitlines()] == [
        "no_assistant_turn", "empty_content"]  # fmt: skip
    assert not (out / ".locks").exists()


# --- no stub, no lock left ----------------------------------------------------------------------


def test_a_run_that_fails_on_input_leaves_no_stub_and_no_lock(base_run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}\n{oops\n'
    )
    out = tmp_path / "runs" / "sft-x"
    with pytest.raises(UserError, match=r"bad.jsonl line 2 is not JSON"):
        run_sft(_sft(base_run, out, {"format": "chat", "path": str(bad), "heldout": 0}))
    assert not (tmp_path / "runs").exists()  # neither the run nor the folder made for it
    # A run directory that was there before stays, without the lock.
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"data file .*missing.jsonl does not exist"):
        run_sft(_sft(base_run, out, {"format": "chat", "path": str(tmp_path / "missing.jsonl")}))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_locks_are_removed_on_every_exit_path(base_run, tmp_path, monkeypatch):
    import smelt.posttrain.sft as sft

    data = {"format": "addition", "addition_items": 40, "addition_digits": 1, "heldout": 4}
    out = tmp_path / "sft"

    def failing(kind):
        def fail(*args, **kwargs):
            if kind == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # its handler raises SystemExit(143)
            raise KeyboardInterrupt() if kind == "interrupt" else RuntimeError("boom")

        return fail

    for kind, expected in (("bug", RuntimeError), ("interrupt", KeyboardInterrupt), ("sigterm", SystemExit)):
        monkeypatch.setattr(sft, "make_optimizer", failing(kind))
        with pytest.raises(expected) as caught:
            run_sft(_sft(base_run, out, data))
        if kind == "sigterm":
            assert caught.value.code == 143
        assert (out / "train" / "run.json").is_file()  # failed after it started writing: the run stays
        assert not (out / ".locks").exists(), kind
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.undo()
    run_sft(_sft(base_run, out, data))
    assert not (out / ".locks").exists()
    # A second command on a run.out being written stops, and leaves the holder's lock alone.
    with stage_lock(out, "sft"):
        with pytest.raises(UserError, match=r"stage 'sft' of .* is being written by another smelt command"):
            run_sft(_sft(base_run, tmp_path / "sft", data))
        assert (out / ".locks" / "sft.lock").is_file()


# --- evaluation defaults and decontamination --------------------------------------------------------


def _fake_run(run_dir: Path, data: dict, stage: str = "sft", parent: Path | None = None) -> Path:
    """RUN/train/run.json as a post-training stage writes it (no checkpoint)."""
    cfg = config_from_dict({"stage": stage, "data": data})
    record = {"stage": stage, "posttrain_config": cfg.to_dict(), "dropped": {}, "heldout_contaminated": 0,
              "parent": {"run_dir": str(parent.resolve()) if parent else None}}  # fmt: skip
    (run_dir / "train").mkdir(parents=True)
    (run_dir / "train" / "run.json").write_text(json.dumps(record))
    return run_dir


def test_eval_defaults_to_the_addition_digits_the_lineage_trained_on(tmp_path):
    sft = _fake_run(tmp_path / "sft", {"format": "addition", "addition_digits": 3})
    grpo = _fake_run(tmp_path / "grpo", {"format": "gsm8k", "path": "x"}, "grpo", parent=sft)
    assert [d for d, _ in lineage_configs(grpo)] == [grpo, sft.resolve()]
    assert trained_addition_digits(lineage_configs(grpo)) == (3, str(sft.resolve() / "train" / "run.json"))
    assert trained_addition_digits(lineage_configs(tmp_path / "pretrain"))[0] == 2
    # A stage written before the split cannot be rebuilt: it is named, not silently trusted.
    old = json.loads((sft / "train" / "run.json").read_text())
    del old["dropped"]
    (sft / "train" / "run.json").write_text(json.dumps(old))
    texts, unchecked = lineage_training_texts(lineage_configs(grpo))
    assert len(unchecked) == 2 and "written before stages split their data" in unchecked[1]
    assert "data file x does not exist" in unchecked[0]
    from smelt.cli.posttrain import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["posttrain", "eval", "RUN", "--addition", "5"]).addition_digits is None


def test_eval_scores_what_was_trained_on_held_out_problems_and_drops_contaminated_items(base_run, tmp_path):
    out = tmp_path / "sft"
    chat = tmp_path / "chat.jsonl"
    write_jsonl(chat, [_chat(LONG.format(n=n), str(n)) for n in range(10)])
    run_sft(_sft(base_run, tmp_path / "sft-chat", {"format": "chat", "path": str(chat), "heldout": 0}))
    run_sft(_sft(tmp_path / "sft-chat", out, {"format": "addition", "addition_items": 50, "addition_digits": 1,
                                              "heldout": 4}))  # fmt: skip
    gsm8k = tmp_path / "test.jsonl"
    write_jsonl(gsm8k, [{"question": LONG.format(n=n), "answer": f"so #### {n}"} for n in (3, 7, 100, 200)])
    result = evaluate_run(out, gsm8k=gsm8k, addition=25, limit=0, max_new_tokens=2)
    add = result["addition_chat"]
    assert add["digits"] == 1 and add["digits_from"] == str(out / "train" / "run.json")
    assert add["asked"] == add["items"] == 25 and add["contaminated_dropped"] == 0
    assert all(len(s["prompt"]) == 3 for s in add["samples"])  # `a+b`, one digit each
    # Two of the GSM8K questions are training conversations of the SFT before: dropped, counted.
    assert result["gsm8k_chat"]["asked"] == 4 and result["gsm8k_chat"]["contaminated_dropped"] == 2
    assert result["gsm8k_chat"]["items"] == 2
    assert result["decontamination"]["against"] == [str(out), str((tmp_path / "sft-chat").resolve())]
    assert result["decontamination"]["unchecked"] == []
