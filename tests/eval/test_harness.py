"""Scoring: batch-size independence, exact log-likelihoods, the metrics of each formulation, overlong items."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import build_model, tiny_model_config
from smelt.errors import UserError
from smelt.eval.harness import extract_answer, normalize_number, prepare, score_pairs, score_prepared
from smelt.eval.tasks import Task, TaskSpec, get_spec, load_task

CPU = torch.device("cpu")


class ByteTokenizer:
    """One token per UTF-8 byte and an EOS: token counts are byte counts, which the tests rely on."""

    eos_id = 256
    vocab_size = 384

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class Uniform(torch.nn.Module):
    """Equal logits everywhere: every token costs ln V, and the argmax is token 0."""

    def __init__(self, vocab_size: int = 384):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, idx):
        return torch.zeros(*idx.shape, self.vocab_size), None


def mc_task(records, formulation="cloze", template="{query}", **kw) -> Task:
    spec = TaskSpec("t", "t.jsonl", "mosaic", formulation, template, **kw)
    return Task(spec, records, total=len(records))


def random_pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ctx = torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
        cont = torch.randint(0, 256, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
        out.append(([256, *ctx], cont))
    return out


def test_scores_do_not_depend_on_batch_size():
    model = build_model(tiny_model_config())
    pairs = random_pairs(37)
    one = score_pairs(model, pairs, batch_size=1, device=CPU)
    sixteen = score_pairs(model, pairs, batch_size=16, device=CPU)
    for (a, ga), (b, gb) in zip(one, sixteen, strict=True):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a))
        assert ga == gb
    assert len({round(s, 3) for s, _ in one}) > 30  # distinct requests really got distinct scores


def test_score_is_the_log_likelihood_of_the_continuation():
    model = build_model(tiny_model_config())
    ctx, cont = [256, 10, 20, 30], [40, 50]
    ((logprob, greedy),) = score_pairs(model, [(ctx, cont)], batch_size=1, device=CPU)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ctx + cont[:-1]]))
    lp = F.log_softmax(logits[0].double(), dim=-1)
    expected = lp[3, 40] + lp[4, 50]
    assert logprob == pytest.approx(expected.item(), abs=1e-4)
    assert greedy == bool(lp[3].argmax() == 40 and lp[4].argmax() == 50)
    assert model.training  # the mode the caller had is restored


def test_cloze_metrics_follow_their_normalization():
    # Under equal logits the raw sum prefers the shortest choice; per token and per character every
    # choice ties, and a tie goes to the first.
    records = [{"id": i, "query": "Q", "choices": ["a longer answer", "short"], "gold": 1} for i in range(3)]
    prep = prepare(mc_task(records), ByteTokenizer(), max_len=64)
    result = score_prepared(Uniform(), ByteTokenizer(), prep, batch_size=2, device=CPU)
    assert result["acc"] == 1.0 and result["acc_per_token"] == 0.0 and result["acc_per_char"] == 0.0
    assert result["chance"] == 0.5 and result["items"] == 3 and result["score"] == result["acc"]


def test_multiple_choice_letters_prompt_and_continuations():
    records = [{"id": 0, "query": "Question: 2+2?", "choices": ["3", "4", "5"], "gold": 1}]
    prep = prepare(mc_task(records, "mc"), ByteTokenizer(), max_len=128)
    tok = ByteTokenizer()
    assert tok.decode(prep.pairs[0][0]) == "Question: 2+2?\nA. 3\nB. 4\nC. 5\nAnswer:"
    assert [tok.decode(c) for _, c in prep.pairs] == [" A", " B", " C"]
    result = score_prepared(Uniform(), tok, prep, batch_size=4, device=CPU)
    assert result["acc"] == 0.0 and "acc_per_char" not in result  # all letters tie: index 0 wins


def test_few_shot_examples_precede_each_prompt_with_their_gold_answer():
    records = [{"id": i, "query": f"q{i}", "choices": [f"x{i}", f"y{i}"], "gold": i % 2} for i in range(10)]
    spec = TaskSpec("t", "t", "mosaic", "cloze", "{query} =", shots=2)
    task = Task(spec, records[2:], shots=records[:2], n_shots=2, total=10)
    prep = prepare(task, ByteTokenizer(), max_len=128)
    assert ByteTokenizer().decode(prep.pairs[0][0]) == "q0 = x0\n\nq1 = y1\n\nq2 ="


def test_schema_and_lastword():
    tok = ByteTokenizer()
    records = [{"id": 0, "contexts": ["The cat", "The dog"], "continuation": "sat.", "gold": 1}]
    prep = prepare(mc_task(records, "schema"), tok, 64)
    assert [tok.decode(c) for c, _ in prep.pairs] == ["The cat", "The dog"]
    assert {tok.decode(k) for _, k in prep.pairs} == {" sat."}
    lastword = prepare(mc_task([{"id": 0, "context": "a b", "continuation": "cde"}], "lastword"), tok, 64)
    result = score_prepared(Uniform(), tok, lastword, 1, CPU)
    assert result["acc"] == 0.0  # token 0 is the argmax, never a letter
    assert result["perplexity"] == pytest.approx(math.exp(4 * math.log(384)), rel=1e-6)


def test_overlong_items_are_an_error_or_skipped_and_counted():
    records = [
        {"id": 0, "query": "short", "choices": ["a", "b"], "gold": 0},
        {"id": 7, "query": "x" * 100, "choices": ["a", "b"], "gold": 1},
    ]
    with pytest.raises(UserError, match=r"item 7.*context is 50.*eval.overlong"):
        prepare(mc_task(records), ByteTokenizer(), max_len=50)
    prep = prepare(mc_task(records), ByteTokenizer(), max_len=50, overlong="skip")
    assert prep.skipped == 1 and len(prep.items) == 1 and len(prep.pairs) == 2
    result = score_prepared(Uniform(), ByteTokenizer(), prep, 2, CPU)
    assert result["items"] == 1 and result["skipped"] == 1
    none_fit = score_prepared(
        Uniform(), ByteTokenizer(), prepare(mc_task(records), ByteTokenizer(), 5, "skip"), 2, CPU
    )
    assert none_fit["items"] == 0 and none_fit["skipped"] == 2 and none_fit["score"] is None


def test_template_with_unknown_field_is_a_user_error():
    records = [{"id": 0, "query": "q", "choices": ["a"], "gold": 0}]
    with pytest.raises(UserError, match="field 'subject'"):
        prepare(mc_task(records, template="{subject}: {query}"), ByteTokenizer(), 64)


def test_answer_extraction():
    assert extract_answer("so 3 + 4 = 7\n#### 1,234.", r"#### *(-?[0-9.,]+)") == "1234"
    assert extract_answer("The answer is $18.00 dollars", r"#### *(-?[0-9.,]+)") == "18"
    assert extract_answer("no number here", "") == ""
    assert normalize_number("-3.50") == "-3.5" and normalize_number(" 42 ") == "42"


def test_generation_is_greedy_cut_at_stop_strings_and_batch_independent(tiny_run):
    from smelt.tokenizer.load import Tokenizer

    root, cfg = tiny_run
    tok = Tokenizer.load(root / "tokenizer")
    spec = get_spec("gsm8k")
    spec = spec.__class__(**{**spec.__dict__, "max_new_tokens": 12})  # enough to reach a stop string
    task = load_task(spec, root.parent / "tasks", shots=1)
    model = build_model(tiny_model_config(max_seq_len=128), vocab=tok.vocab_size)
    prep = prepare(task, tok, 128)
    assert len(prep.golds) == 5 and all(int(g) % 2 == 0 for g in prep.golds)  # one item became the shot
    one = score_prepared(model, tok, prep, batch_size=1, device=CPU, details=True)
    four = score_prepared(model, tok, prep, batch_size=4, device=CPU, details=True)
    assert [d["completion"] for d in one["details"]] == [d["completion"] for d in four["details"]]
    assert all("Question:" not in d["completion"] for d in one["details"])
    assert one["exact_match"] == sum(d["answer"] == d["gold"] for d in one["details"]) / len(prep.items)
