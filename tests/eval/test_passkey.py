"""The passkey task: deterministic items, prompts of the asked length with the key at the asked depth,
exact candidate log-probabilities, results per length and depth, and `smelt eval --tasks passkey`."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers import build_model, tiny_model_config
from smelt.cli import main
from smelt.errors import UserError
from smelt.eval import passkey as pk
from smelt.manifest import write_json

CPU = torch.device("cpu")


class WordTokenizer:
    """One token per word, digit or punctuation mark: prompt lengths are easy to reason about."""

    eos_id = 0

    def __init__(self) -> None:
        words: set[str] = set()
        for text in (pk.INTRO, *pk.FILLER, pk.NEEDLE, pk.QUESTION):
            words.update(self.split(text.replace("{key}", "")))
        self.vocab = ["<eos>", *"0123456789", *sorted(words)]
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        self.vocab_size = len(self.vocab)

    @staticmethod
    def split(text: str) -> list[str]:
        return re.findall(r"\d|[A-Za-z]+|[^\sA-Za-z\d]", text)

    def encode(self, text: str) -> list[int]:
        return [self.ids[w] for w in self.split(text)]

    def decode(self, ids) -> str:
        return " ".join(self.vocab[i] for i in ids)


def test_records_are_fixed_and_cover_every_cell():
    records = pk.passkey_records(limit=50)
    assert records == pk.passkey_records(limit=50)  # same items every time, whatever the run
    assert len(records) == 60  # rounded up to whole rounds of the 4 x 5 cells
    cells = {(r["fraction"], r["depth"]) for r in records}
    assert cells == {(f, d) for f in pk.FRACTIONS for d in pk.DEPTHS}
    for r in records:
        assert len(r["key"]) == 5 and r["key"].isdigit()
        assert len(set(r["distractors"])) == pk.DISTRACTORS and r["key"] not in r["distractors"]
    assert len(pk.passkey_records()) == pk.PER_CELL * 20  # limit 0: the default count


def test_prompts_fill_the_length_and_put_the_key_at_its_depth():
    tok = WordTokenizer()
    records = [r for r in pk.passkey_records(limit=20) if r["fraction"] == 1.0]
    prep = pk.prepare_passkey(records, tok, max_len=200)
    assert prep.skipped == 0 and len(prep.items) == 5
    longest_sentence = max(len(tok.encode(s)) for s in pk.FILLER)
    needle_at = []
    for context, candidates, record in zip(prep.contexts, prep.candidates, prep.items, strict=True):
        total = len(context) + len(candidates[0])
        assert 200 - longest_sentence < total <= 200
        assert context[0] == tok.eos_id  # the "eos" convention: a document starts after one EOS
        assert tok.decode(candidates[0]) == " ".join(record["key"])
        needle = tok.encode(pk.NEEDLE.format(key=record["key"]))
        starts = [i for i in range(len(context)) if context[i : i + len(needle)] == needle]
        assert len(starts) == 1
        needle_at.append(starts[0] / len(context))
        assert tok.decode(context[-len(tok.encode(pk.QUESTION)) :]) == tok.decode(tok.encode(pk.QUESTION))
    # Depths 0, 0.25, ..., 1 in order: the needle moves from right after the introduction to right
    # before the question.
    assert [r["depth"] for r in prep.items] == list(pk.DEPTHS)
    assert needle_at == sorted(needle_at)
    assert needle_at[0] < 0.1 and needle_at[-1] > 0.8
    # The filler comes from the record's seed: the same prompt again, another seed another filler.
    again = pk.prepare_passkey(records, tok, max_len=200)
    assert again.contexts == prep.contexts
    reseeded = [{**records[2], "filler_seed": records[2]["filler_seed"] + 1}]
    assert pk.prepare_passkey(reseeded, tok, max_len=200).contexts[0] != prep.contexts[2]


def test_lengths_follow_the_context_and_too_short_cells_are_skipped():
    tok = WordTokenizer()
    prep = pk.prepare_passkey(pk.passkey_records(limit=20), tok, max_len=256)
    # 1/8 of 256 = 32 tokens cannot hold the prompt without filler: those 5 items are counted, not scored.
    assert prep.skipped == 5 and sorted(set(prep.lengths)) == [64, 128, 256]
    lm_eval = pk.prepare_passkey(pk.passkey_records(limit=20), tok, max_len=256, convention="lm-eval")
    assert lm_eval.contexts[0][0] != tok.eos_id


def test_candidate_logprobs_with_a_shared_cache_equal_full_forwards():
    tok = WordTokenizer()
    model = build_model(tiny_model_config(max_seq_len=128), vocab=tok.vocab_size)
    prep = pk.prepare_passkey(pk.passkey_records(limit=20)[17:18], tok, max_len=128)
    context, candidates = prep.contexts[0], prep.candidates[0]
    logprobs, greedy = pk.candidate_logprobs(model, context, candidates, CPU)
    for cand, got, best in zip(candidates, logprobs, greedy, strict=True):
        seq = torch.tensor([context + cand[:-1]])
        with torch.no_grad():
            logits, _ = model(seq)
        part = F.log_softmax(logits[0, len(context) - 1 :].float(), dim=-1)
        target = torch.tensor(cand)
        assert got == pytest.approx(part.gather(-1, target[:, None]).sum().item(), abs=1e-4)
        assert best == bool((part.argmax(-1) == target).all())


def test_results_per_length_depth_and_cell(monkeypatch):
    tok = WordTokenizer()
    prep = pk.prepare_passkey(pk.passkey_records(limit=40), tok, max_len=256)
    depth_of = {id(c): r["depth"] for c, r in zip(prep.contexts, prep.items, strict=True)}

    def reads_the_second_half(model, context, candidates, device):
        """The true key (first) ranks first, and is the greedy one, when the key sits at depth >= 0.5."""
        found = depth_of[id(context)] >= 0.5
        return [0.0 if found else -9.0] + [-5.0] * (len(candidates) - 1), [found] * len(candidates)

    monkeypatch.setattr(pk, "candidate_logprobs", reads_the_second_half)
    model = build_model(tiny_model_config(), vocab=tok.vocab_size)
    result = pk.score_passkey(model, prep, CPU, details=True)
    assert result["items"] == 30 and result["skipped"] == 10  # 2 rounds; the 32-token cells skipped
    assert result["acc"] == pytest.approx(0.6) and result["exact_match"] == pytest.approx(0.6)
    assert result["score"] == result["acc"] and result["chance"] == pytest.approx(0.1)
    assert list(result["by_length"]) == ["64", "128", "256"]
    assert all(
        cell["acc"] == pytest.approx(0.6) and cell["items"] == 10 for cell in result["by_length"].values()
    )
    assert {d: c["acc"] for d, c in result["by_depth"].items()} == {
        "0.0": 0.0, "0.25": 0.0, "0.5": 1.0, "0.75": 1.0, "1.0": 1.0
    }  # fmt: skip
    assert result["by_cell"]["128"] == {"0.0": 0.0, "0.25": 0.0, "0.5": 1.0, "0.75": 1.0, "1.0": 1.0}
    assert [d["correct"] for d in result["details"]] == [r["depth"] >= 0.5 for r in prep.items]


def test_an_item_longer_than_the_model_context_is_a_user_error():
    tok = WordTokenizer()
    model = build_model(tiny_model_config(max_seq_len=64), vocab=tok.vocab_size)
    with pytest.raises(
        UserError, match=r"takes \d+ tokens but the model's context \(model.max_seq_len\) is 64"
    ):
        pk.evaluate_passkey(model, tok, lengths=(128,), per_cell=1)


@pytest.fixture
def run(tiny_run, tmp_path):
    root, cfg = tiny_run
    copy_root = tmp_path / "run"
    shutil.copytree(root, copy_root)
    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.name = str(tmp_path), "run"
    return copy_root, cfg


def test_smelt_eval_tasks_passkey_without_benchmark_files(run, capsys):
    root, cfg = run
    cfg.eval.tasks_dir = str(root / "no-benchmarks-here")  # a file-based task would stop on this
    write_json(root / "config.json", cfg.to_dict())
    assert main(["eval", str(root), "--tasks", "passkey", "--limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "passkey: acc" in out and "chance 0.100" in out
    step = json.loads((root / "eval" / "step_0000002.json").read_text())
    result = step["tasks"]["passkey"]
    # The tiny run's model has a context of 128: lengths 1/8 .. 1 of it, the shortest too short.
    assert set(result["by_length"]) <= {"32", "64", "128"} and "128" in result["by_length"]
    assert result["items"] + result["skipped"] == 20 and 0.0 <= result["acc"] <= 1.0
    assert set(result["by_depth"]) == {"0.0", "0.25", "0.5", "0.75", "1.0"}
    curves = [json.loads(line) for line in (root / "eval" / "curves.jsonl").read_text().splitlines()]
    assert curves[-1]["tasks"]["passkey"]["acc"] == result["acc"]


@pytest.mark.slow
def test_loss_by_position_has_an_edge_at_the_length_the_checkpoint_was_trained_at(run):
    """A checkpoint trained at 48 tokens, scored at the run's 64: positions 48-63 are a bucket."""
    from smelt.checkpoint.store import save_checkpoint
    from smelt.eval.run import evaluate_checkpoints
    from smelt.model.transformer import Transformer
    from smelt.tokenizer.load import Tokenizer

    root, cfg = run
    cfg.train.doc_masking = False  # positions run across the short documents, up to 63
    torch.manual_seed(0)
    model = Transformer(cfg.model, Tokenizer.load(root / "tokenizer").vocab_size)
    meta = {"model_config": cfg.model, "vocab_size": model.vocab_size, "tokens": 3000,
            "config": {"train": {"seq_len": 48}}}  # fmt: skip
    save_checkpoint(root / "train" / "checkpoints", 3, model, None, meta)
    (result,) = evaluate_checkpoints(cfg, root, "3", tasks=[])
    buckets = result["heldout"]["overall"]["loss_by_position"]
    assert list(buckets) == ["0-7", "8-31", "32-47", "48-127"]
    assert sum(b["tokens"] for b in buckets.values()) == result["heldout"]["overall"]["tokens"]
