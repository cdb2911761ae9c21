"""Preference optimisation on pairs: DPO (against a frozen reference) or SimPO (reference-free).

DPO (Rafailov et al. 2023): loss = -log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r))))
over the summed log-probs of each reply given the shared prompt. The reference is the parent, and its
log-probs are computed once, before the first step, and cached in RUN/train/reference_logps.json (keyed
by the parent checkpoint, the pairs and the sequence length), so no second model is held in memory.
With the policy equal to the reference the margin is 0 and the loss ln 2.

SimPO (Meng et al. 2024): loss = -log sigmoid(beta * (mean log pi(c) - mean log pi(r)) - gamma), the
per-token mean log-prob as the reward, so no reference and no length bias toward long replies.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from smelt.chat_template import ChatFormat
from smelt.config import hash_json
from smelt.model.transformer import IGNORE_INDEX
from smelt.posttrain.config import DPOSection, PostTrainConfig
from smelt.posttrain.data import pair_split
from smelt.posttrain.stage import (
    Stage,
    begin,
    finish,
    guarded,
    log_record,
    make_optimizer,
    make_schedule,
    open_stage,
    optimizer_step,
    start_event,
    timed,
)
from smelt.progress import log, progress

REFERENCE_FILE = "reference_logps.json"


@dataclass
class PairIds:
    """One pair as two rows: prompt + reply ids, and which ids are reply targets."""

    chosen: tuple[list[int], list[bool]]
    rejected: tuple[list[int], list[bool]]
    truncated: bool


def encode_pair(chat: ChatFormat, pair: dict[str, Any], seq_len: int) -> PairIds:
    """Ids of prompt + each side; a prompt too long is cut from its start (the EOS kept), a reply at its end."""
    prompt_len = len(chat.encode(pair["prompt"]).ids)
    rows, cut = [], False
    for side in ("chosen", "rejected"):
        encoded = chat.encode(pair["prompt"] + pair[side])
        ids, mask = encoded.ids, [False] * prompt_len + encoded.mask[prompt_len:]
        if len(ids) > seq_len:
            cut = True
            reply = len(ids) - prompt_len
            keep_prompt = max(1, seq_len - min(reply, seq_len * 3 // 4))
            drop = prompt_len - keep_prompt
            ids, mask = ids[:1] + ids[1 + drop :], mask[:1] + mask[1 + drop :]
            ids, mask = ids[:seq_len], mask[:seq_len]
        rows.append((ids, mask))
    return PairIds(rows[0], rows[1], cut)


def batch_rows(rows: list[tuple[list[int], list[bool]]], pad_id: int, device: torch.device):
    """Right-padded inputs and targets (-100 except reply tokens) [B, T - 1]."""
    width = max(len(ids) for ids, _ in rows) - 1
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        n = len(ids) - 1
        inputs[i, :n] = torch.tensor(ids[:-1])
        targets[i, :n] = torch.tensor(
            [t if m else IGNORE_INDEX for t, m in zip(ids[1:], mask[1:], strict=True)]
        )
    return inputs.to(device), targets.to(device)


def sequence_logps(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-prob of each row's targets [B], number of targets [B])."""
    _, parts = model(inputs, targets, reduction="none", loss_parts=True)
    counts = (targets != IGNORE_INDEX).sum(dim=1)
    return -parts["ce"].sum(dim=1), counts


def pair_logps(
    stage_model: torch.nn.Module, pairs: list[PairIds], pad_id: int, device, precision
) -> dict[str, torch.Tensor]:
    """Chosen and rejected summed log-probs and lengths of a batch of pairs (one forward for both)."""
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    inputs, targets = batch_rows(rows, pad_id, device)
    with precision.autocast():
        logps, counts = sequence_logps(stage_model, inputs, targets)
    n = len(pairs)
    return {"chosen": logps[:n].float(), "rejected": logps[n:].float(),
            "chosen_len": counts[:n].float(), "rejected_len": counts[n:].float()}  # fmt: skip


def preference_loss(
    policy: dict[str, torch.Tensor], reference: dict[str, torch.Tensor] | None, cfg: DPOSection
) -> dict[str, torch.Tensor]:
    """The loss (mean over pairs) and per-pair rewards of the chosen and rejected replies."""
    if cfg.loss == "simpo":
        chosen = cfg.simpo_beta * policy["chosen"] / policy["chosen_len"].clamp(min=1)
        rejected = cfg.simpo_beta * policy["rejected"] / policy["rejected_len"].clamp(min=1)
        logits = chosen - rejected - cfg.simpo_gamma
    else:
        if reference is None:
            raise ValueError("DPO needs reference log-probs")
        chosen = cfg.beta * (policy["chosen"] - reference["chosen"])
        rejected = cfg.beta * (policy["rejected"] - reference["rejected"])
        logits = chosen - rejected
    return {"loss": -F.logsigmoid(logits).mean(), "chosen_reward": chosen, "rejected_reward": rejected}


@torch.no_grad()
def reference_logps(stage: Stage, encoded: list[PairIds], batch_size: int) -> dict[str, list[float]]:
    """Summed log-probs of every pair under the stage's model as it is now (the parent): the reference."""
    was = stage.model.training
    stage.model.eval()
    out: dict[str, list[float]] = {"chosen": [], "rejected": []}
    for start in range(0, len(encoded), batch_size):
        got = pair_logps(stage.model, encoded[start : start + batch_size], stage.tokenizer.pad_id, stage.device,
                         stage.precision)  # fmt: skip
        out["chosen"] += got["chosen"].tolist()
        out["rejected"] += got["rejected"].tolist()
    stage.model.train(was)
    return out


def cached_reference(
    stage: Stage, encoded: list[PairIds], key: dict[str, Any], batch_size: int
) -> dict[str, list[float]]:
    """Reference log-probs from RUN/train/reference_logps.json when its key matches, else computed and cached."""
    path = stage.train_dir / REFERENCE_FILE
    digest = hash_json(key)
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == digest:
            return saved["logps"]
    logps = reference_logps(stage, encoded, batch_size)
    path.write_text(json.dumps({"key": digest, "what": key, "logps": logps}))
    return logps


@torch.no_grad()
def heldout_metrics(
    stage: Stage, encoded: list[PairIds], reference: dict[str, list[float]] | None, batch_size: int
) -> dict[str, float]:
    """Preference accuracy on held-out pairs: `logp_accuracy` (mean token log-prob of the chosen reply above
    the rejected one's), and with a reference `reward_accuracy` (DPO's implicit reward margin > 0, a tie
    counting half) and the mean margin."""
    if not encoded:
        return {}
    was = stage.model.training
    stage.model.eval()
    wins, reward_wins, margins = 0.0, 0.0, []
    for start in range(0, len(encoded), batch_size):
        got = pair_logps(stage.model, encoded[start : start + batch_size], stage.tokenizer.pad_id, stage.device,
                         stage.precision)  # fmt: skip
        chosen_mean = got["chosen"] / got["chosen_len"].clamp(min=1)
        rejected_mean = got["rejected"] / got["rejected_len"].clamp(min=1)
        wins += float((chosen_mean > rejected_mean).sum())
        if reference is not None:
            ref_c = torch.tensor(reference["chosen"][start : start + batch_size])
            ref_r = torch.tensor(reference["rejected"][start : start + batch_size])
            margin = (got["chosen"].cpu() - ref_c) - (got["rejected"].cpu() - ref_r)
            reward_wins += float((margin > 0).sum() + 0.5 * (margin == 0).sum())
            margins += margin.tolist()
    stage.model.train(was)
    out = {"logp_accuracy": wins / len(encoded), "pairs": len(encoded)}
    if reference is not None:
        out["reward_accuracy"] = reward_wins / len(encoded)
        out["reward_margin"] = sum(margins) / len(margins)
    return out


def run_dpo(cfg: PostTrainConfig, force: bool = False, stage: Stage | None = None) -> dict[str, Any]:
    """Train the parent on preference pairs; returns the summary (also RUN/summary.json)."""
    with guarded(cfg, "dpo"):
        return _run_dpo(cfg, force, stage)


def _run_dpo(cfg: PostTrainConfig, force: bool, stage: Stage | None) -> dict[str, Any]:
    split = pair_split(cfg.data, cfg.run.seed)
    train_pairs, held = split.train, split.held
    stage = stage or open_stage(cfg, "dpo", force)
    encoded = [encode_pair(stage.chat, p, stage.seq_len) for p in train_pairs]
    held_encoded = [encode_pair(stage.chat, p, stage.seq_len) for p in held]
    o, d = cfg.optim, cfg.dpo
    use_reference = d.loss == "dpo"
    key = {"parent": str(stage.parent.checkpoint), "parent_step": stage.parent.step, "seq_len": stage.seq_len,
           "pairs": hash_json([train_pairs, held]), "precision": stage.precision.name}  # fmt: skip
    reference = held_reference = None
    begin(stage, split)
    if use_reference:
        both = cached_reference(stage, encoded + held_encoded, key, o.batch_size)
        n = len(encoded)
        reference = {k: torch.tensor(v[:n]) for k, v in both.items()}
        held_reference = {k: v[n:] for k, v in both.items()}
    else:  # SimPO: the parent's margins still tell how far the policy moved on held-out pairs
        held_reference = reference_logps(stage, held_encoded, o.batch_size)
    optimizer, schedule = make_optimizer(stage), make_schedule(stage)
    start_event(stage, o.steps, loss=d.loss, train_pairs=len(encoded), heldout_pairs=len(held),
                truncated=sum(p.truncated for p in encoded), **split.stats())  # fmt: skip
    log(f"[dpo] {d.loss}: {len(encoded)} pairs, {len(held)} held out; {o.steps} steps of {o.batch_size}")
    before = heldout_metrics(stage, held_encoded, held_reference, o.batch_size)
    log_record(
        stage, {"kind": "eval", "step": 0, "tokens": 0, **{f"heldout_{k}": v for k, v in before.items()}}
    )
    rng = random.Random(cfg.run.seed + 1)
    order: list[int] = []
    stage.model.train()
    bar = progress(total=o.steps, desc=d.loss, unit="step")
    first_loss = None
    for step in range(o.steps):
        index = []
        while len(index) < o.batch_size:
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            index.append(order.pop())
        batch = [encoded[i] for i in index]
        lr = schedule(step)
        tokens = sum(len(p.chosen[0]) + len(p.rejected[0]) for p in batch)

        def work(batch=batch, index=index, lr=lr) -> tuple[dict[str, Any], float]:
            policy = pair_logps(stage.model, batch, stage.tokenizer.pad_id, stage.device, stage.precision)
            ref = None
            if reference is not None:
                at = torch.tensor(index)
                ref = {k: v[at].to(stage.device) for k, v in reference.items()}
            out = preference_loss(policy, ref, d)
            out["loss"].backward()
            stats = {
                "loss": float(out["loss"].detach()),
                "reward_margin": float((out["chosen_reward"] - out["rejected_reward"]).detach().mean()),
                "reward_accuracy": float((out["chosen_reward"] > out["rejected_reward"]).float().mean()),
                "chosen_reward": float(out["chosen_reward"].detach().mean()),
                "rejected_reward": float(out["rejected_reward"].detach().mean()),
                "logp_chosen": float((policy["chosen"] / policy["chosen_len"].clamp(min=1)).detach().mean()),
                "logp_rejected": float(
                    (policy["rejected"] / policy["rejected_len"].clamp(min=1)).detach().mean()
                ),
            }
            return stats, optimizer_step(stage, optimizer, lr)

        stats, norm = timed(stage, work, tokens)
        first_loss = stats["loss"] if first_loss is None else first_loss
        if (step + 1) % o.log_every == 0 or step == 0 or step + 1 == o.steps:
            log_record(stage, {"kind": "train", "step": step + 1, "tokens": stage.tokens, **stats, "lr": lr,
                               "grad_norm": norm, "tokens_per_s": stage.tokens_per_s()})  # fmt: skip
        if o.eval_every and (step + 1) % o.eval_every == 0 and step + 1 < o.steps:
            mid = heldout_metrics(stage, held_encoded, held_reference, o.batch_size)
            log_record(stage, {"kind": "eval", "step": step + 1, "tokens": stage.tokens,
                               **{f"heldout_{k}": v for k, v in mid.items()}})  # fmt: skip
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.3f}")
    bar.close()
    after = heldout_metrics(stage, held_encoded, held_reference, o.batch_size)
    log_record(stage, {"kind": "eval", "step": o.steps, "tokens": stage.tokens,
                       **{f"heldout_{k}": v for k, v in after.items()}})  # fmt: skip
    return finish(stage, o.steps, {
        "loss": d.loss, "first_loss": first_loss, "ln2": math.log(2), "final_loss": stats["loss"],
        "heldout_before": before, "heldout_after": after, "train_pairs": len(encoded),
        "heldout_pairs": len(held), **split.stats(),
    })  # fmt: skip
