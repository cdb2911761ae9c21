"""Scoring benchmark tasks: cloze, multiple-choice letters, schema, last word, and greedy generation.

cloze     the sum of log-probabilities of each choice, as a continuation of the prompt; accuracy of
          the raw sum, of the sum per character of the choice, and per token of the choice
mc        the choices listed under the question with letters A, B, ...; the scored continuations
          are the letters (" A", " B", ...): accuracy
schema    one context per choice and a shared continuation (WinoGrande, WSC): the continuation's
          log-probability after each context; accuracy
lastword  the continuation is the target word (LAMBADA): accuracy = every token of it is the greedy
          choice; perplexity = exp(-mean log-probability of it)
generate  greedy decoding until a stop string; exact match of the regex-extracted answer
passkey   generated pass-key retrieval at several lengths and depths (see passkey.py): the true key
          against distractors by log-probability, per length and depth

Prompt convention (eval.convention): "lm-eval" (the default) tokenizes requests as
lm-evaluation-harness does for a Hugging Face model: the context's trailing whitespace moves to the
front of the continuation, the context is encoded without any special token, the continuation is the
tokens of context + continuation past the context's, and only an empty context becomes one EOS (its
end-of-text token). "eos" puts one EOS before every context (and generation prompt), as training
documents start after one, and splits context and continuation at the context's tokens where they
merge. Requests are sorted by length and right-padded into batches: a causal model never attends to
the padding after a row, so a request's score does not depend on which others share its batch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from smelt.errors import UserError
from smelt.eval.passkey import PasskeyPrepared, prepare_passkey, score_passkey
from smelt.eval.tasks import LETTERS, Record, Task
from smelt.progress import progress

OVERLONG = ("error", "skip")
CONVENTIONS = ("lm-eval", "eos")


@dataclass
class Prepared:
    """A task turned into token ids: one (context, continuation) pair per choice, or one prompt per
    generation item; what is scored at every checkpoint, tokenized once."""

    task: Task
    items: list[Record]  # the records kept (all of them unless overlong ones were skipped)
    pairs: list[tuple[list[int], list[int]]] = field(default_factory=list)
    owner: list[tuple[int, int]] = field(default_factory=list)  # (item, choice) of each pair
    cont_chars: list[int] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)  # generate
    golds: list[Any] = field(default_factory=list)
    max_new_tokens: list[int] = field(default_factory=list)
    skipped: int = 0
    convention: str = "lm-eval"
    passkey: PasskeyPrepared | None = None  # the passkey formulation's own requests (passkey.py)


def _fill(template: str, record: Record, task_name: str) -> str:
    try:
        return template.format(**record)
    except KeyError as exc:
        raise UserError(f"task {task_name!r}: its template names field {exc} that its records lack.") from exc


def _letters_block(record: Record) -> tuple[str, list[str]]:
    """Choices that are already letters (the question lists them) stay; others are listed A., B., ..."""
    choices = record["choices"]
    if all(len(c) == 1 and c in LETTERS for c in choices):
        return "", [f" {c}" for c in choices]
    block = "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(choices)) + "\nAnswer:"
    return block, [f" {LETTERS[i]}" for i in range(len(choices))]


def render(task: Task, record: Record) -> tuple[list[str], list[str], Any]:
    """(one prompt per request, one continuation per request, gold) of a record, without its shots."""
    spec = task.spec
    form = spec.formulation
    if form == "cloze":
        prompt = _fill(spec.template, record, spec.name)
        return [prompt] * len(record["choices"]), [f" {c}" for c in record["choices"]], record["gold"]
    if form == "mc":
        block, letters = _letters_block(record)
        prompt = _fill(spec.template, record, spec.name) + block
        return [prompt] * len(letters), letters, record["gold"]
    if form == "schema":
        cont = f" {record['continuation']}"
        return list(record["contexts"]), [cont] * len(record["contexts"]), record["gold"]
    if form == "lastword":
        return [record["context"]], [f" {record['continuation']}"], 0
    if form == "generate":
        prompt = _fill(spec.template, record, spec.name)
        return [prompt], [f" {record['answer']}"], normalize_number(record["answer"].split("####")[-1])
    raise ValueError(f"unknown formulation {form!r}")


def check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise UserError(f"eval.convention = {convention!r} is not one of {', '.join(CONVENTIONS)}.")


def prompt_ids(tokenizer: Any, text: str, convention: str = "lm-eval") -> list[int]:
    """The token ids a prompt is fed as (a generation prompt, a gallery prompt): under "lm-eval" the
    text's own tokens, one EOS for an empty text; under "eos" one EOS and then the text's tokens.
    `transformers` generate on the exported model reproduces a greedy completion from these ids:
    `tokenizer(text)` gives the same ids for the first convention (the export adds no special token)."""
    check_convention(convention)
    ids = tokenizer.encode(text) if text else []
    return ids if convention == "lm-eval" and ids else [tokenizer.eos_id, *ids]


def split_request(context: str, continuation: str, convention: str) -> tuple[str, str]:
    """lm-eval moves a context's trailing whitespace to the front of its continuation (so "Answer: "
    + "B" is scored as "Answer:" + " B"); the "eos" convention keeps the texts as rendered."""
    if convention != "lm-eval":
        return context, continuation
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def _shot_text(task: Task, shot: Record) -> str:
    prompts, conts, gold = render(task, shot)
    index = 0 if task.spec.formulation in ("lastword", "generate") else int(shot["gold"])
    return prompts[index] + conts[index]


def prepare(
    task: Task, tokenizer: Any, max_len: int, overlong: str = "error", convention: str = "lm-eval"
) -> Prepared:
    """Tokenize a task's requests under `convention` (see the module docstring); a request longer than
    max_len tokens is a UserError (or, with overlong = "skip", its item is dropped and counted)."""
    check_convention(convention)
    spec = task.spec
    if spec.formulation == "passkey":
        passkey = prepare_passkey(task.records, tokenizer, max_len, convention)
        return Prepared(task, passkey.items, skipped=passkey.skipped, convention=convention, passkey=passkey)
    generate = spec.formulation == "generate"
    texts: list[tuple[int, str, str, int]] = []  # (item, context, continuation, rendered answer chars)
    golds: dict[int, Any] = {}
    for index, record in enumerate(task.records):
        prefix = "".join(_shot_text(task, s) + spec.shot_separator for s in task.shots_for(record))
        prompts, conts, gold = render(task, record)
        golds[index] = gold
        for prompt, cont in zip(prompts, conts, strict=True):
            context, continuation = prefix + prompt, cont
            if not generate:
                context, continuation = split_request(context, continuation, convention)
            texts.append((index, context, continuation, len(cont)))
    contexts = tokenizer.encode_batch([t[1] for t in texts])
    wholes = tokenizer.encode_batch([t[1] + t[2] for t in texts]) if not generate else None
    conts = tokenizer.encode_batch([t[2] for t in texts]) if not generate else None
    eos = tokenizer.eos_id
    too_long: set[int] = set()
    rows = []
    for i, (index, context, _cont, n_chars) in enumerate(texts):
        if generate:
            ctx = [eos, *contexts[i]] if convention == "eos" or not context else contexts[i]
            need = len(ctx) + 1
        else:
            n, whole = len(contexts[i]), wholes[i]
            if not context:  # lm-eval scores a continuation of nothing after its end-of-text token
                ctx, cont_ids = [eos], conts[i]
            elif convention == "lm-eval":
                ctx, cont_ids = contexts[i], whole[n:] or conts[i]
            else:
                # Context and continuation tokenized together (as the text would be seen), falling back
                # to separate encodings when a token merges across the boundary.
                ctx = [eos, *contexts[i]]
                cont_ids = whole[n:] if whole[:n] == contexts[i] and len(whole) > n else conts[i]
            need = len(ctx) + len(cont_ids) - 1
            rows.append((index, ctx, cont_ids, n_chars))
        if need > max_len:
            too_long.add(index)
            if overlong == "error":
                raise UserError(
                    f"task {spec.name!r}, item {task.records[index].get('id', index)}: the prompt"
                    f"{'' if generate else ' and answer'} take {need} tokens but the "
                    f"model's context is {max_len}. Use fewer shots (eval.shots, now {task.n_shots}), drop "
                    f'the task, or set eval.overlong = "skip" to leave such items out (they are counted).'
                )
        if generate and index not in too_long:
            rows.append((index, ctx, [], 0))
    kept = sorted(set(golds) - too_long)
    renumber = {old: new for new, old in enumerate(kept)}
    prep = Prepared(task, [task.records[i] for i in kept], skipped=len(too_long), convention=convention)
    prep.golds = [golds[i] for i in kept]
    choice = -1
    last = None
    for index, ctx, cont_ids, n_chars in rows:
        if index in too_long:
            continue
        choice = choice + 1 if index == last else 0
        last = index
        if generate:
            prep.prompts.append(ctx)
            prep.max_new_tokens.append(min(spec.max_new_tokens, max_len - len(ctx)))
        else:
            prep.pairs.append((ctx, cont_ids))
            prep.owner.append((renumber[index], choice))
            prep.cont_chars.append(n_chars)
    return prep


@torch.no_grad()
def score_pairs(
    model: torch.nn.Module,
    pairs: list[tuple[list[int], list[int]]],
    batch_size: int,
    device: torch.device,
    desc: str = "score",
) -> list[tuple[float, bool]]:
    """(sum of log-probabilities of the continuation, whether each of its tokens is the argmax) per
    (context, continuation) pair; longest first, in batches of batch_size, right-padded."""
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
    was_training = model.training
    model.eval()
    try:
        for first in progress(range(0, len(order), batch_size), desc=desc, unit="batch"):
            chunk = order[first : first + batch_size]
            width = max(len(pairs[i][0]) + len(pairs[i][1]) - 1 for i in chunk)
            inputs = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                seq = pairs[i][0] + pairs[i][1]
                inputs[row, : len(seq) - 1] = torch.tensor(seq[:-1], dtype=torch.long)
            logits, _ = model(inputs.to(device))
            for row, i in enumerate(chunk):
                ctx, cont = pairs[i]
                start = len(ctx) - 1
                part = F.log_softmax(logits[row, start : start + len(cont)].float(), dim=-1)
                target = torch.tensor(cont, dtype=torch.long, device=part.device)
                logprob = part.gather(-1, target[:, None]).squeeze(-1).double().sum().item()
                greedy = bool((part.argmax(dim=-1) == target).all().item())
                out[i] = (logprob, greedy)
    finally:
        model.train(was_training)
    return out


def normalize_number(text: str) -> str:
    text = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value == int(value) else str(value)


_NUMBER = re.compile(r"-?[$0-9.,]*[0-9]")


def extract_answer(completion: str, pattern: str) -> str:
    """The answer of a generated completion: group 1 of `pattern`, else the last number in it."""
    if pattern:
        found = re.search(pattern, completion)
        if found:
            return normalize_number(found.group(1))
    numbers = _NUMBER.findall(completion)
    return normalize_number(numbers[-1]) if numbers else ""


def generate_answers(
    model: torch.nn.Module, tokenizer: Any, prep: Prepared, batch_size: int
) -> list[dict[str, str]]:
    """Greedy completions of the prepared prompts, cut at the first stop string, answers extracted."""
    from smelt.model.generate import generate

    spec = prep.task.spec
    order = sorted(range(len(prep.prompts)), key=lambda i: -len(prep.prompts[i]))
    out: list[dict[str, str]] = [{}] * len(prep.prompts)
    for first in progress(range(0, len(order), batch_size), desc=spec.name, unit="batch"):
        chunk = order[first : first + batch_size]
        steps = max(prep.max_new_tokens[i] for i in chunk)
        rows = generate(
            model, [prep.prompts[i] for i in chunk], steps, temperature=0.0, eos_id=tokenizer.eos_id
        )
        for i, row in zip(chunk, rows, strict=True):
            new = row[len(prep.prompts[i]) :][: prep.max_new_tokens[i]]
            if new and new[-1] == tokenizer.eos_id:
                new = new[:-1]
            text = tokenizer.decode(new)
            for stop in spec.stop:
                text = text.split(stop, 1)[0]
            out[i] = {"completion": text, "answer": extract_answer(text, spec.extract)}
    return out


def _acc_stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


def score_prepared(
    model: torch.nn.Module,
    tokenizer: Any,
    prep: Prepared,
    batch_size: int,
    device: torch.device,
    details: bool = False,
) -> dict[str, Any]:
    """The metrics of one prepared task (and, with details, each item's scores and prediction)."""
    if prep.passkey is not None:
        return score_passkey(model, prep.passkey, device, details)
    spec = prep.task.spec
    n = len(prep.items)
    result: dict[str, Any] = {
        "formulation": spec.formulation,
        "metric": spec.metric,
        "items": n,
        "skipped": prep.skipped,
        "shots": prep.task.n_shots,
        "convention": prep.convention,
    }
    per_item: list[dict[str, Any]] = []
    if n == 0:  # every item was longer than the context: no score rather than a misleading 0
        return {**result, "score": None, "stderr": None, **({"details": []} if details else {})}
    if spec.formulation == "generate":
        answers = generate_answers(model, tokenizer, prep, batch_size)
        hits = [a["answer"] == g for a, g in zip(answers, prep.golds, strict=True)]
        result["exact_match"] = sum(hits) / max(n, 1)
        per_item = [{**a, "gold": g} for a, g in zip(answers, prep.golds, strict=True)]
    else:
        scores = score_pairs(model, prep.pairs, batch_size, device, desc=spec.name)
        choices: list[list[tuple[float, bool, int, int]]] = [[] for _ in range(n)]
        for (item, _choice), (logprob, greedy), (_ctx, cont), chars in zip(
            prep.owner, scores, prep.pairs, prep.cont_chars, strict=True
        ):
            choices[item].append((logprob, greedy, len(cont), chars))
        if spec.formulation == "lastword":
            result["acc"] = sum(c[0][1] for c in choices) / max(n, 1)
            mean = sum(c[0][0] for c in choices) / max(n, 1)
            result["perplexity"] = math.exp(-mean)
            per_item = [{"logprob": c[0][0], "greedy": c[0][1]} for c in choices]
        else:
            keys = {"acc": lambda c: c[0]}
            if spec.formulation == "cloze":
                keys["acc_per_token"] = lambda c: c[0] / max(c[2], 1)
                keys["acc_per_char"] = lambda c: c[0] / max(c[3], 1)
            for key, fn in keys.items():
                preds = [max(range(len(c)), key=lambda j, c=c: fn(c[j])) for c in choices]
                result[key] = sum(p == g for p, g in zip(preds, prep.golds, strict=True)) / max(n, 1)
            result["chance"] = sum(1 / len(c) for c in choices) / max(n, 1)
            per_item = [
                {"logprobs": [x[0] for x in c], "gold": g} for c, g in zip(choices, prep.golds, strict=True)
            ]
    result["score"] = result[spec.metric]
    result["stderr"] = _acc_stderr(result["score"], n) if spec.metric != "perplexity" else None
    if details:
        result["details"] = [{"id": rec.get("id"), **d} for rec, d in zip(prep.items, per_item, strict=True)]
    return result
