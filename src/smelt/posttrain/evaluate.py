"""Generative evaluation of chat models: exact match on verifiable answers (GSM8K, arithmetic) in the
chat format and as a few-shot plain-text prompt, preference accuracy, and a sample gallery.

Replies are decoded greedily with the KV-cache generator in batches; a chat reply stops at
`<|end_of_turn|>`, a few-shot answer at the end of its line block (the next `Question:`) or EOS. The
answer compared is the number after `####`, else the last number of the reply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from smelt.chat_template import ChatFormat
from smelt.layout import checkpoints_dir, is_committed
from smelt.model.generate import generate
from smelt.posttrain.chat import final_number, normalize_number, prompt_of, prompt_text, read_gsm8k
from smelt.posttrain.rewards import Reward
from smelt.progress import log

GALLERY_PROMPTS = (
    "What is 17+25?",
    "Janet has 3 apples and buys 5 more. How many apples does she have?",
    "Can you tell me how to make a cup of tea?",
    "What is the capital of France?",
    "Write one sentence about the sea.",
)


def generate_replies(
    model: torch.nn.Module,
    prompts: list[list[int]],
    stop_id: int,
    max_new_tokens: int,
    batch_size: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[int]]:
    """The new ids of each prompt (greedy at temperature 0), decoded in batches against a KV cache."""
    replies: list[list[int]] = []
    limit = model.cfg.max_seq_len
    for start in range(0, len(prompts), batch_size):
        chunk = [p[-(limit - max_new_tokens) :] if len(p) + max_new_tokens > limit else p
                 for p in prompts[start : start + batch_size]]  # fmt: skip
        out = generate(
            model, chunk, max_new_tokens, temperature=temperature, seed=seed + start, eos_id=stop_id
        )
        replies += [o[len(p) :] for p, o in zip(chunk, out, strict=True)]
    return replies


def chat_exact_match(
    model: torch.nn.Module,
    chat: ChatFormat,
    items: list[dict[str, Any]],
    max_new_tokens: int,
    batch_size: int = 16,
    samples: int = 3,
) -> dict[str, Any]:
    """Exact match of the chat format's greedy replies to each item's "answer"."""
    prompts = [chat.prompt_ids(prompt_of(item)) for item in items]
    replies = [
        chat.decode_reply(r)
        for r in generate_replies(model, prompts, chat.end_of_turn_id, max_new_tokens, batch_size)
    ]
    return _scored(items, replies, samples)


def few_shot_prompt(shots: list[dict[str, Any]], question: str) -> str:
    blocks = [
        f"Question: {s['messages'][0]['content']}\nAnswer: {s['messages'][-1]['content']}" for s in shots
    ]
    return "\n\n".join([*blocks, f"Question: {question}\nAnswer:"])


def few_shot_exact_match(
    model: torch.nn.Module,
    chat: ChatFormat,
    items: list[dict[str, Any]],
    shots: list[dict[str, Any]],
    max_new_tokens: int,
    batch_size: int = 8,
    samples: int = 3,
) -> dict[str, Any]:
    """Exact match with a plain-text k-shot prompt (`Question: ...\\nAnswer: ...`), for base models."""
    tokenizer = chat.tokenizer
    prompts = [[tokenizer.eos_id] + tokenizer.encode(few_shot_prompt(shots, prompt_of(item)[-1]["content"]))
               for item in items]  # fmt: skip
    raw = generate_replies(model, prompts, tokenizer.eos_id, max_new_tokens, batch_size)
    replies = [tokenizer.decode(r, skip_special_tokens=True).split("\n\nQuestion")[0].strip() for r in raw]
    return {**_scored(items, replies, samples), "shots": len(shots)}


def _scored(items: list[dict[str, Any]], replies: list[str], samples: int) -> dict[str, Any]:
    correct = [
        final_number(r) == normalize_number(str(item["answer"]))
        for item, r in zip(items, replies, strict=True)
    ]
    return {
        "exact_match": sum(correct) / len(items) if items else None,
        "items": len(items),
        "samples": [
            {
                "prompt": prompt_of(item)[-1]["content"],
                "reply": reply,
                "answer": item["answer"],
                "correct": ok,
            }
            for item, reply, ok in list(zip(items, replies, correct, strict=True))[:samples]
        ],  # fmt: skip
    }


def mean_reward(
    model: torch.nn.Module,
    chat: ChatFormat,
    items: list[dict[str, Any]],
    reward: Reward,
    max_new_tokens: int,
    batch_size: int = 64,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
) -> float | None:
    """The mean reward of chat replies: greedy, or `samples` replies per item at `temperature`."""
    if not items:
        return None
    owners = [item for item in items for _ in range(samples)]
    prompts = [chat.prompt_ids(prompt_of(item)) for item in owners]
    replies = generate_replies(
        model, prompts, chat.end_of_turn_id, max_new_tokens, batch_size, temperature, seed
    )
    return sum(reward(chat.decode_reply(r), item) for r, item in zip(replies, owners, strict=True)) / len(
        owners
    )


def gallery(
    model: torch.nn.Module,
    chat: ChatFormat,
    prompts: tuple[str, ...] = GALLERY_PROMPTS,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> list[dict[str, str]]:
    """A greedy and a sampled (temperature 0.8) reply to each prompt."""
    ids = [chat.prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    greedy = generate_replies(model, ids, chat.end_of_turn_id, max_new_tokens)
    sampled = generate_replies(model, ids, chat.end_of_turn_id, max_new_tokens, temperature=0.8, seed=seed)
    return [{"prompt": p, "greedy": chat.decode_reply(g), "sampled": chat.decode_reply(s)}
            for p, g, s in zip(prompts, greedy, sampled, strict=True)]  # fmt: skip


def gsm8k_items(path: str | Path, limit: int) -> list[dict[str, Any]]:
    items = read_gsm8k(path)
    return items[:limit] if limit else items


def preference_accuracy(
    model: torch.nn.Module, chat: ChatFormat, pairs: list[dict[str, Any]], seq_len: int, batch_size: int = 16
) -> dict[str, Any]:
    """The share of pairs whose chosen reply has the higher mean token log-prob (no reference needed)."""
    from smelt.posttrain.dpo import encode_pair, pair_logps
    from smelt.train.precision import Precision

    device = model.tok_emb.weight.device
    encoded = [encode_pair(chat, p, seq_len) for p in pairs]
    wins = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            got = pair_logps(model, encoded[start : start + batch_size], chat.tokenizer.pad_id, device,
                             Precision("fp32", device.type))  # fmt: skip
            wins += int(
                (
                    got["chosen"] / got["chosen_len"].clamp(min=1)
                    > got["rejected"] / got["rejected_len"].clamp(min=1)
                ).sum()
            )
    model.train(was)
    return {"logp_accuracy": wins / len(pairs) if pairs else None, "pairs": len(pairs)}


def lineage_configs(run_dir: str | Path) -> list[tuple[Path, Any]]:
    """(run directory, post-training config) of a run and of each post-training stage before it, nearest
    first, from their train/run.json; empty for a pretraining run."""
    from smelt.posttrain.config import config_from_dict

    out: list[tuple[Path, Any]] = []
    current, seen = Path(run_dir), set()
    while current.resolve() not in seen:
        seen.add(current.resolve())
        path = current / "train" / "run.json"
        record = json.loads(path.read_text()) if path.is_file() else {}
        if "posttrain_config" not in record:
            break
        out.append((current, config_from_dict(record["posttrain_config"])))
        parent = (record.get("parent") or {}).get("run_dir")
        if not parent:
            break
        current = Path(parent)
    return out


def trained_addition_digits(lineage: list[tuple[Path, Any]]) -> tuple[int, str]:
    """The operand digits the nearest stage that trained on addition used, and where that was read; else
    2 (the config default)."""
    for run_dir, cfg in lineage:
        if cfg.data.format == "addition":
            return cfg.data.addition_digits, str(run_dir / "train" / "run.json")
    return 2, "default (no stage of the run trained on addition)"


def lineage_training_texts(lineage: list[tuple[Path, Any]]) -> tuple[list[str], list[str]]:
    """The training texts of every post-training stage of the lineage (rebuilt from its saved config, as
    the stage split them), and a line for each stage whose data could not be read."""
    from smelt.errors import UserError
    from smelt.posttrain.data import conversation_split, pair_split

    texts: list[str] = []
    unchecked: list[str] = []
    for run_dir, cfg in lineage:
        if "dropped" not in json.loads((run_dir / "train" / "run.json").read_text()):
            unchecked.append(
                f"{run_dir}: written before stages split their data into disjoint training and held-out "
                f"items (train/run.json has no 'dropped'); its training items cannot be rebuilt, and an "
                f"addition run of then trained on every problem. Rerun the stage to evaluate it cleanly."
            )
            continue
        try:
            if cfg.stage == "dpo":
                split = pair_split(cfg.data, cfg.run.seed)
            else:
                split = conversation_split(cfg.data, cfg.run.seed, cfg.stage)
        except UserError as exc:
            unchecked.append(f"{run_dir}: {exc}")
            continue
        texts += split.train_texts
    return texts, unchecked


def _item_prompt(item: dict[str, Any]) -> str:
    return prompt_text(prompt_of(item))


def _clean(items: list[Any], texts: list[str], prompt: Any) -> tuple[list[Any], dict[str, int]]:
    """The items whose prompt the training texts do not contain, and the counts the result records."""
    from smelt.posttrain.data import decontaminate

    kept, dropped = decontaminate(items, texts, prompt)
    return kept, {"asked": len(items), "contaminated_dropped": dropped}


def evaluate_run(
    run_dir: str | Path,
    checkpoint: str = "latest",
    gsm8k: str | Path | None = None,
    pairs: str | Path | None = None,
    addition: int = 0,
    addition_digits: int | None = None,
    limit: int = 64,
    few_shot: int = 0,
    shots_from: str | Path | None = None,
    max_new_tokens: int = 128,
    device: str = "cpu",
) -> dict[str, Any]:
    """Score one checkpoint of a run: GSM8K exact match (chat, and k-shot when few_shot > 0), addition
    exact match, preference accuracy and the gallery; written to RUN/posttrain_eval/step_NNNNNNN.json.

    Every set is decontaminated against the training data of the run's post-training stages: an item
    whose prompt that data contains (curation's 13-gram rule; exact match for prompts shorter than 13
    words) is dropped and counted (`contaminated_dropped`). Addition problems come from the held-out
    partition, with the operand digits the run trained on unless `addition_digits` is given."""
    from smelt.checkpoint.store import latest_checkpoint, load_model, step_dir_name
    from smelt.errors import UserError
    from smelt.manifest import write_json
    from smelt.posttrain.chat import addition_items, read_hh_rlhf, read_preferences
    from smelt.posttrain.data import (
        ADDITION_HELDOUT_SEED,
        DECONTAM_NGRAM,
        DECONTAM_THRESHOLD,
        check_addition_heldout,
    )
    from smelt.tokenizer.load import Tokenizer

    run_dir = Path(run_dir)
    lineage = lineage_configs(run_dir)
    digits_from = "--addition-digits"
    if addition_digits is None:
        addition_digits, digits_from = trained_addition_digits(lineage)
    if addition:
        check_addition_heldout(addition, addition_digits, "--addition",
                               "Pass --addition {have} or fewer, or a larger --addition-digits.")  # fmt: skip
    folder = checkpoints_dir(run_dir)
    path = latest_checkpoint(folder) if checkpoint == "latest" else folder / step_dir_name(int(checkpoint))
    if path is None or not is_committed(path):
        raise UserError(
            f"no committed checkpoint {checkpoint!r} under {folder}; pass a run directory written by a training "
            f"or post-training stage, and --checkpoint latest or a step listed there."
        )
    model, meta = load_model(path, device)
    model.eval()
    chat = ChatFormat(Tokenizer.load(run_dir / "tokenizer"))
    texts, unchecked = lineage_training_texts(lineage) if (gsm8k or addition or pairs) else ([], [])
    for line in unchecked:
        log(f"[posttrain eval] warning: not decontaminated against {line}")
    result: dict[str, Any] = {"run_dir": str(run_dir), "checkpoint": str(path), "step": meta.get("step"),
                              "stage": meta.get("stage", "pretrain"),
                              "decontamination": {"against": [str(d) for d, _ in lineage], "unchecked": unchecked,
                                                  "ngram": DECONTAM_NGRAM, "threshold": DECONTAM_THRESHOLD}}  # fmt: skip
    if gsm8k:
        asked = gsm8k_items(gsm8k, limit)
        items, counts = _clean(asked, texts, _item_prompt)
        result["gsm8k_chat"] = {**chat_exact_match(model, chat, items, max_new_tokens), **counts}
        if few_shot:
            shots = gsm8k_items(shots_from or gsm8k, few_shot + len(asked))[-few_shot:]
            result["gsm8k_few_shot"] = {
                **few_shot_exact_match(model, chat, items, shots, max_new_tokens),
                **counts,
            }
    if addition:
        asked = addition_items(addition, ADDITION_HELDOUT_SEED, addition_digits, heldout=True)
        items, counts = _clean(asked, texts, _item_prompt)
        result["addition_chat"] = {**chat_exact_match(model, chat, items, 16), **counts,
                                   "digits": addition_digits, "digits_from": digits_from}  # fmt: skip
    if pairs:
        if str(pairs).endswith(".gz"):
            loaded, _ = read_hh_rlhf(pairs)
        else:
            loaded = read_preferences(pairs)
        kept, counts = _clean(loaded[-limit:] if limit else loaded, texts, lambda p: prompt_text(p["prompt"]))
        result["preference"] = {**preference_accuracy(model, chat, kept, model.cfg.max_seq_len), **counts}
    result["gallery"] = gallery(model, chat)
    out = run_dir / "posttrain_eval" / f"{path.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    result["path"] = str(out)
    return result
